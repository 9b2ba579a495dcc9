"""The ``flywheel`` command line.

Heavy modules are imported inside the subcommands so ``flywheel --help``
stays fast.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fastapi import FastAPI

    from backend.db.log import SessionLog
    from backend.run_log import RunRecorder
    from backend.settings import Settings
    from tools.base import ToolSpec
    from tools.mcp_client import McpToolset
    from tools.workspace import Workspace

DEMO_DIR = Path(__file__).with_name("demo")


def _add_run(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="run one agent turn on a workspace and print the live transcript",
        description=(
            "Run one agent turn on an isolated copy of a workspace. With no --workspace/--git "
            "and no request, runs the bundled demo (a scripted policy fixing a bug). At the end the changes "
            "are shown as a diff: apply them to the original directory (refused, with nothing written, if a "
            "file they touch changed there meanwhile), export a patch, or discard them. On a terminal it asks; "
            "for scripts use --apply/--yes, --export-patch FILE or --discard."
        ),
    )
    p.add_argument("request", nargs="?", help="what to ask the agent (default: the demo's request)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--workspace", type=Path, help="local directory the session works on (never written): the "
                     "read-only lower layer of a copy-on-write workspace where overlays work (root, no --data-dir), "
                     "else copied")
    src.add_argument("--git", type=Path, metavar="REPO", help="git repository to check out (with --commit)")
    p.add_argument("--commit", default="HEAD", help="commit for --git (default: HEAD)")
    p.add_argument(
        "--policy", default=None,
        help="scripted:FILE.json (recorded outputs) or openai[:MODEL] (default: `policy` in the config file; "
        "the demo script when no --workspace/--git is given)",
    )
    p.add_argument("--base-url", help="OpenAI-compatible base URL (env FLYWHEEL_OPENAI_BASE_URL)")
    p.add_argument("--model", help="model name for --policy openai (env FLYWHEEL_OPENAI_MODEL)")
    p.add_argument("--api-key", help="API key (env FLYWHEEL_OPENAI_API_KEY)")
    p.add_argument("--api", choices=["chat", "completions"],
                   help="chat (default) or completions: send the runtime's own rendered prompt, byte for byte "
                   "what a local policy sees, and get token ids back (use with `flywheel policy serve`)")
    p.add_argument("--json", action="store_true", help="print events as JSON lines instead of a transcript")
    _add_end_choice(p, "the original directory (--workspace, or the --git repository's working tree)",
                    "at the end, discard the changes without asking (the temporary copy is deleted)")
    p.add_argument("--max-steps", type=int, default=30, help="model calls per turn (default 30)")
    p.add_argument("--timeout", type=float, default=1800.0, help="wall-clock limit for the turn, seconds")
    p.add_argument("--data-dir", type=Path, help="keep the workspace here (default: a temporary directory)")
    p.add_argument("--copy", action="store_true",
                   help="copy --workspace into the session's workspace instead of mounting it in place "
                   "(isolated from your later edits; slow for a big tree)")
    p.add_argument("--no-record", action="store_true",
                   help="do not record the session in the local session log (by default it is, where `flywheel "
                   "serve` keeps it: FLYWHEEL_DB_URL, else FLYWHEEL_DATA_DIR, else ~/.local/share/flywheel, so "
                   "`flywheel sessions` and `flywheel replay` show it)")
    p.add_argument("--semantic-search", action="store_true",
                   help="index the workspace (embeddings + BM25) and give the agent the semantic_search tool")
    p.add_argument(
        "--unsafe-no-sandbox", action="store_true",
        help="run commands WITHOUT isolation if bubblewrap is missing (dangerous)",
    )
    p.add_argument("--mcp", action="append", default=[], metavar="NAME=COMMAND|URL",
                   help="give the agent an external MCP server's tools (as mcp__NAME__TOOL): NAME=COMMAND ARGS... "
                   "starts it over stdio, NAME=http(s)://... connects over streamable HTTP (repeatable)")
    p.add_argument("--mcp-config", type=Path, metavar="FILE",
                   help='MCP servers from a file: JSON {"mcpServers": {NAME: {command, args, env} | {url, headers}}} '
                   "or TOML [mcp_servers.NAME] tables")
    p.set_defaults(func=_cmd_run)


def _add_end_choice(p: argparse.ArgumentParser, original: str, discard: str) -> None:
    """``--apply``/``--yes``, ``--export-patch``, ``--discard`` and ``--approval-mode`` (run and chat)."""
    end = p.add_mutually_exclusive_group()
    end.add_argument("--apply", action="store_true",
                     help=f"at the end, apply the session's changes to {original} without asking; "
                     "if a file they touch changed there since the session started, apply nothing and exit 1")
    end.add_argument("--export-patch", type=Path, metavar="FILE",
                     help="at the end, write the changes as a patch for `git apply` instead of asking")
    end.add_argument("--discard", action="store_true", help=discard)
    p.add_argument("--approval-mode", choices=["ask-commands", "ask-edits", "auto"],
                   help="ask before every command; before every edit and every command (a command can "
                   "rewrite files too); or never (default: `approval_mode` in the config file, else auto). "
                   "Asking needs a terminal, or --yes")
    p.add_argument("--yes", "-y", action="store_true",
                   help="answer yes to every question: approve each call the approval mode asks about, and "
                   "at the end apply the changes as --apply does (unless --export-patch or --discard is given)")


def _ask(prompt: str) -> str | None:
    """One answer from the terminal; None at end of input."""
    try:
        return input(prompt)
    except EOFError:
        return None


def _add_serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve", help="start the API server (FastAPI on uvicorn)",
        description="Start the server. Settings come from FLYWHEEL_* env vars (see backend/settings.py); "
        "flags override them. On a loopback address with no token yet, a staff token named 'local' is "
        "created and printed.",
    )
    p.add_argument("--host", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default 8421; 0 picks a free one)")
    p.add_argument("--db", help="SQLAlchemy URL, e.g. postgresql+psycopg://user@host/db (default: SQLite)")
    p.add_argument("--data-dir", type=Path, help="database, workspaces and snapshots")
    p.add_argument("--allow-root", action="append", type=Path, default=None,
                   help="directory sessions may copy workspaces from (repeatable; default: the demo)")
    p.add_argument("--openai-base-url", help="OpenAI-compatible model server for policy 'openai'")
    p.add_argument("--openai-model", help="default model name for policy 'openai'")
    p.add_argument("--mcp-config", type=Path, metavar="FILE",
                   help="external MCP servers whose tools every session gets (JSON mcpServers or TOML "
                   "[mcp_servers.NAME]; default: the [mcp_servers] tables of the config file)")
    p.add_argument("--log-level", default="info")
    p.set_defaults(func=_cmd_serve)


def _add_chat(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "chat", help="chat with an agent on a running server (terminal client of the WebSocket protocol)",
        description="Start a session on a workspace (--workspace) or attach to one (--session) on a running "
        "`flywheel serve`, then send each input line as a user message and show the live transcript. "
        "Ctrl-C interrupts the turn (at the prompt it quits); /quit or EOF ends the chat, then the session's "
        "changes are shown with the choice to apply them, export a patch or leave them. /help lists the "
        "commands (/diff, /apply, /undo, /model).",
    )
    p.add_argument("--server", help="server URL (env FLYWHEEL_SERVER, or `server` in the config file; "
                   "default http://127.0.0.1:8421)")
    p.add_argument("--token", help="API token (env FLYWHEEL_TOKEN, or `token` in the config file)")
    target = p.add_mutually_exclusive_group()
    target.add_argument("--workspace", type=Path, help="start a new session on this directory (on the server)")
    target.add_argument("--session", metavar="ID", help="attach to an existing session (its history is shown first)")
    p.add_argument("--policy", metavar="POLICY",
                   help='policy for a new session: JSON such as {"kind": "openai"}, openai[:MODEL], '
                   'scripted:FILE.json, or "demo" for the bundled scripted demo (default: `policy` in the config '
                   'file, else {"kind": "openai"})')
    p.add_argument("--json", action="store_true", help="print events as JSON lines instead of a transcript")
    _add_end_choice(p, "the session's directory (on this machine)",
                    "at the end, write nothing to your directory, without asking (the session keeps its changes "
                    "in its workspace on the server: --session ID --apply applies them later)")

    def run(args: argparse.Namespace) -> int:
        from backend.chat import run_chat

        return run_chat(args)

    p.set_defaults(func=run)


def _add_policy(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("policy", help="Flywheel's own policy model (serve it over an OpenAI-compatible API)")
    psub = p.add_subparsers(dest="policy_command", metavar="ACTION", required=True)
    s = psub.add_parser(
        "serve", help="serve a checkpoint at /v1 (chat/completions, completions, models)",
        description="Serve a model checkpoint with continuous batching over an OpenAI-compatible API. "
        "Prints the base URL once it listens. `flywheel run --policy openai --base-url URL` (or a server "
        "with FLYWHEEL_OPENAI_BASE_URL) can then use it; /v1/completions also takes and returns token ids.",
    )
    s.add_argument("checkpoint", type=Path, help="checkpoint directory (weights, config, tokenizer)")
    s.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1; others need --api-key)")
    s.add_argument("--port", type=int, default=8000,
                   help="port (default 8000, the OpenAI policy's default; 0 picks a free one)")
    s.add_argument("--model-name", help="model id to serve under (default: the checkpoint directory's name)")
    s.add_argument("--max-slots", type=int, default=32, help="sequences decoded together (default 32)")
    s.add_argument("--device", default="cpu", help="torch device (default cpu)")
    s.add_argument("--api-key", help="require this bearer token (env FLYWHEEL_POLICY_API_KEY)")
    s.add_argument("--log-level", default="info")

    def run(args: argparse.Namespace) -> int:
        from backend.policy_server import serve

        return serve(args)

    s.set_defaults(func=run)


def _add_model(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("model", help="train Flywheel's own mixture-of-experts policy model")
    msub = p.add_subparsers(dest="model_command", metavar="ACTION", required=True)
    t = msub.add_parser(
        "train", help="pretrain the MoE model on the local code corpus and write a checkpoint",
        description="Pretrain the MoE policy on Python code available offline (the standard library and "
        "installed packages) plus synthetic tool-call transcripts. Trains the tokenizer first unless "
        "--tokenizer is given or OUT already has one. Writes OUT/metrics.jsonl and a checkpoint in OUT.",
    )
    t.add_argument("--preset", choices=["tiny", "mini", "small", "1b"], default="tiny", help="model size (default tiny)")
    t.add_argument("--steps", type=int, default=300, help="optimizer steps (default 300)")
    t.add_argument("--precision", choices=["fp32", "bf16", "mxfp8"], default="fp32",
                   help="matmul numerics (mxfp8 needs the kernels in kernels/)")
    t.add_argument("--mxfp8-scope", choices=["all", "experts"], default="all",
                   help="with --precision mxfp8: all = experts, shared expert and attention projections; "
                   "experts = only the routed experts (the rest fp32). Default all")
    t.add_argument("--out", type=Path, default=Path("runs/model"), help="output directory (default runs/model)")
    t.add_argument("--seq-len", type=int, default=256, help="tokens per sequence (default 256)")
    t.add_argument("--batch", type=int, default=8, help="sequences per step (default 8)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--lr", type=float, help="peak learning rate (default: the preset's: tiny 3e-3, small 1e-3)")
    t.add_argument("--tokenizer", type=Path, metavar="DIR", help="directory with a tokenizer.json to reuse")
    t.add_argument("--corpus-mb", type=float, default=64.0, help="corpus size cap in MiB (default 64)")
    t.add_argument("--corpus-sources", nargs="+", choices=["stdlib", "site-packages"],
                   help="code the corpus is drawn from (default both; stdlib alone depends on the Python version only)")
    t.add_argument("--log-every", type=int, default=10, help="print a line every N steps (default 10)")
    t.add_argument("--eval-every", type=int, default=0, help="validation loss every N steps (default: at the end)")
    t.add_argument("--device", default="cpu", help="torch device, e.g. cuda (default cpu)")
    t.add_argument("--prompt-profile", metavar="NAME",
                   help="prompt profile stored with the checkpoint and used for its training transcripts: "
                   "compact or default (default: compact for tiny and small, default for 1b)")
    t.add_argument("--copy-head", action="store_true",
                   help="a pointer-sentinel copy head (agent/model/copy_head.py): copying from the context is "
                   "one attention lookup; RL configs then set model.copy_head: true")
    t.add_argument("--copy-min-distance", type=int, default=1, metavar="D",
                   help="with --copy-head: the pointer may copy only from positions at least D tokens back "
                   "(default 1; a larger D stops it looping on its own last copies; RL configs then set "
                   "model.copy_min_distance: D)")
    t.add_argument("--copy-successor-keys", action="store_true",
                   help="with --copy-head: every pointer entry's score also sees the token it would emit "
                   "(agent/model/copy_head.py; RL configs then set model.copy_successor_keys: true)")
    t.add_argument("--copy-context-only", action="store_true",
                   help="with --copy-head: the pointer may not copy from the model output it is writing, only "
                   "from the context before it (agent/model/copy_head.py; RL configs then set "
                   "model.copy_context_only: true)")

    def run(args: argparse.Namespace) -> int:
        from agent.model.train import run_cli

        return run_cli(args)

    t.set_defaults(func=run)


def _add_index(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "index", help="build or refresh the semantic search index of a directory",
        description="Chunk, embed and index a directory for semantic_search. Content already embedded "
        "(in any indexed tree, by the same model) is reused, never embedded again.",
    )
    p.add_argument("path", type=Path, help="directory to index")
    p.add_argument("--model", default=None, help="sentence-transformers model name or path "
                   "(default: the bundled all-MiniLM-L6-v2)")
    p.add_argument("--data-dir", type=Path, default=None,
                   help="where indexes and the shared embedding cache live "
                   "(default: the server's index directory, FLYWHEEL_INDEX_DIR or FLYWHEEL_DATA_DIR/index, "
                   "else ~/.local/share/flywheel/index: the cache flywheel serve and run --semantic-search use too)")

    def run(args: argparse.Namespace) -> int:
        from backend.settings import LocalSettings, SettingsError, load_settings
        from embeddings.embedder import DEFAULT_MODEL, SentenceTransformerEmbedder
        from embeddings.index import WorkspaceIndex

        if not args.path.is_dir():
            print(f"flywheel index: not a directory: {args.path}", file=sys.stderr)
            return 2
        try:
            data_dir = args.data_dir or load_settings(LocalSettings).search_index_dir
        except SettingsError as exc:
            print(f"flywheel index: {exc}", file=sys.stderr)
            return 2
        index = WorkspaceIndex(args.path, embedder=SentenceTransformerEmbedder(args.model or DEFAULT_MODEL),
                               data_dir=data_dir)
        stats = index.refresh(progress=True)
        print(f"indexed {index.root}: {stats.files} files, {stats.chunks} chunks; "
              f"embedded {stats.embedded} now, reused {stats.reused} from the cache, "
              f"{stats.chunks - stats.embedded - stats.reused} unchanged; removed {stats.removed_files} files; "
              f"{stats.seconds:.1f} s; root {index.root_hash[:12]}; index {index.manifest_path.parent}")
        index.close()
        return 0

    p.set_defaults(func=run)


def _add_embeddings(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("embeddings", help="the semantic-search embedder: fine-tune it on agent trajectories")
    esub = p.add_subparsers(dest="embeddings_command", metavar="ACTION", required=True)
    t = esub.add_parser(
        "train", help="fine-tune the embedder on (query, chunk) pairs from sessions; keep it only if it wins",
        description="Collect (query, chunk) pairs from recorded sessions (the user's request or the agent's "
        "search query -> the chunks it then read or edited), fine-tune the embedder with in-batch negatives "
        "(MultipleNegativesRankingLoss), evaluate base and fine-tuned on held-out repositories, and keep the "
        "fine-tuned model only if it is better there. Writes OUT/report.json (both scores, the decision, "
        "selected_model) and OUT/model when the fine-tuned model wins.",
    )
    src = t.add_mutually_exclusive_group(required=True)
    src.add_argument("--sessions", metavar="DB_URL", help="SQLAlchemy URL of a session log, e.g. sqlite:///data/flywheel.db")
    src.add_argument("--events", type=Path, metavar="FILE.jsonl", help="events as JSON lines (flywheel run --json)")
    src.add_argument("--synthetic", metavar="PKGS",
                     help="SYNTHETIC pairs from installed packages (docstring -> function), for trying the pipeline")
    t.add_argument("--workspace-root", type=Path, help="with --events: the sessions' starting tree (for chunking)")
    t.add_argument("--out", type=Path, default=Path("runs/embedder"), help="output directory (default runs/embedder)")
    t.add_argument("--epochs", type=float, default=1.0, help="training epochs (default 1)")
    t.add_argument("--max-steps", type=int, default=-1, help="stop after N optimizer steps (default: no limit)")
    t.add_argument("--batch-size", type=int, default=16, help="pairs per batch = in-batch negatives + 1 (default 16)")
    t.add_argument("--lr", type=float, default=2e-5, help="learning rate (default 2e-5)")
    t.add_argument("--base-model", default="all-MiniLM-L6-v2", help="model name or path (default: bundled MiniLM)")
    t.add_argument("--held-out", metavar="REPO[,REPO]", help="repositories to evaluate on (default: ~30%% of pairs)")
    t.add_argument("--min-gain", type=float, default=0.0, help="MRR@10 margin the fine-tuned model must exceed")
    t.add_argument("--max-pairs-per-repo", type=int, default=None, help="with --synthetic: cap pairs per package")
    t.add_argument("--pairs-out", type=Path, help="also write the collected pairs here (JSONL)")
    t.add_argument("--seed", type=int, default=0)

    def run(args: argparse.Namespace) -> int:
        from backend.embeddings_train import run_cli

        return run_cli(args)

    t.set_defaults(func=run)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flywheel",
        description="Flywheel: an agent IDE backend with a built-in RL flywheel.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_run(sub)
    _add_serve(sub)
    from backend import sessions_cli, tokens_cli

    tokens_cli.add_parser(sub)
    sessions_cli.add_parser(sub)
    from backend import replay_cli

    replay_cli.add_parser(sub)
    _add_chat(sub)
    _add_policy(sub)
    _add_model(sub)
    _add_index(sub)
    _add_embeddings(sub)
    from backend import rl_cli

    rl_cli.add_parser(sub)
    from backend.acp import cli as acp_cli

    acp_cli.add_parser(sub)
    from backend import mcp_cli

    mcp_cli.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from backend.cli_checks import quiet_third_party

    quiet_third_party()  # known third-party log noise (torchao's CUDA kernels, ...) off for every command
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130


def _cmd_run(args: argparse.Namespace) -> int:
    from agent.policy import PolicyError

    try:
        return asyncio.run(_run(args))
    except (PolicyError, CliError) as exc:
        from agent.text_safety import inert

        print(inert(f"flywheel run: {exc}"), file=sys.stderr)  # may quote the model server
        return 1


class CliError(Exception):
    """A user-facing error: printed without a traceback."""


async def _run(args: argparse.Namespace) -> int:
    from agent.events import CallbackSink, FanoutSink, event_to_json
    from agent.text_safety import inert
    from agent.policies import build_policy, parse_policy_spec
    from agent.runtime import SessionParts, build_session
    from agent.session import Limits
    from backend.terminal_input import YES, StdinLines, TerminalApprover, check_can_ask
    from backend.transcript import Transcript
    from tools.sandbox import SandboxUnavailable, make_sandbox
    from tools.workspace import WorkspaceError, WorkspaceStore

    from backend.settings import ClientSettings, LocalSettings, SettingsError, load_settings

    try:  # FLYWHEEL_UNSAFE_NO_SANDBOX and the index directory, as the server reads them
        local = load_settings(LocalSettings, unsafe_no_sandbox=args.unsafe_no_sandbox or None)
        client = load_settings(ClientSettings, approval_mode=args.approval_mode)  # the config file's defaults
    except SettingsError as exc:
        raise CliError(str(exc)) from None
    # The session's approval mode (ask-commands | ask-edits | auto): asked on this terminal
    # (backend.terminal_input), or approved by --yes; with nobody to ask, refuse before anything runs.
    why = check_can_ask(client.approval_mode, interactive=sys.stdin is not None and sys.stdin.isatty(),
                        yes=args.yes, command="flywheel run")
    if why is not None:
        raise CliError(why)
    demo = args.workspace is None and args.git is None
    if args.copy and args.workspace is None:
        raise CliError("--copy applies to --workspace DIR (--git always checks out a copy)")
    request = args.request
    policy_spec = args.policy
    if demo:
        script = json.loads((DEMO_DIR / "script.json").read_text())
        request = request or script["request"]
        policy_spec = policy_spec or f"scripted:{DEMO_DIR / 'script.json'}"
    elif policy_spec is None and client.policy is not None:
        policy_spec = _policy_spec(client.policy)
    if not request:
        raise CliError("give a request, e.g. flywheel run --workspace . \"fix the failing test\"")
    if policy_spec is None:
        raise CliError("choose a policy: --policy scripted:FILE.json or --policy openai[:MODEL] "
                       "(or set `policy` in the config file)")
    if policy_spec == "demo":
        policy_spec = f"scripted:{DEMO_DIR / 'script.json'}"
    policy_config = parse_policy_spec(policy_spec, base_url=args.base_url, model=args.model, api_key=args.api_key,
                                      api=args.api)
    policy = build_policy(policy_config)
    allow_unsafe = local.unsafe_no_sandbox
    tmp = None
    if args.data_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="flywheel-")
        store_root = Path(tmp.name)
    else:
        store_root = args.data_dir
    # A temporary store mounts copy-on-write workspaces where overlays work here (else copies); a kept
    # one (--data-dir) holds a plain copy, since a mount would not outlive this process.
    store = WorkspaceStore(store_root, overlay=None if tmp is not None else False)
    try:
        try:
            sandbox = make_sandbox(allow_unsandboxed=allow_unsafe, hide=[store.root], extra_ro=local.sandbox_extra_ro)
        except SandboxUnavailable as exc:
            raise CliError(str(exc)) from None
        try:
            if args.git is not None:
                workspace = store.from_git(args.git, args.commit)
            else:
                src = args.workspace or DEMO_DIR / "workspace"
                if not src.is_dir():
                    raise CliError(f"--workspace {src} is not a directory")
                workspace = store.from_dir(src, in_place=not args.copy)
        except (OSError, ValueError, WorkspaceError) as exc:
            raise CliError(f"could not create the workspace: {exc}") from None

        toolset = await _mcp_toolset(args)
        out = sys.stdout
        sink_fn = (lambda e: print(event_to_json(e), file=out, flush=True)) if args.json else Transcript(out)
        recorder = None if args.no_record else _start_recording(
            args, workspace, request=request, policy_config=policy_config, approval_mode=client.approval_mode,
            kept_in=None if tmp is not None else store.root, external_tools=[t.spec for t in toolset.tools])
        sink = CallbackSink(sink_fn) if recorder is None else FanoutSink(recorder, CallbackSink(sink_fn))
        index = None
        if args.semantic_search:
            from embeddings.index import WorkspaceIndex

            print("indexing the workspace for semantic_search…", file=sys.stderr)
            index = WorkspaceIndex(workspace.root, data_dir=local.search_index_dir)
            stats = await asyncio.to_thread(index.refresh, progress=sys.stderr.isatty())
            print(f"indexed {stats.files} files, {stats.chunks} chunks ({stats.embedded} embedded now)",
                  file=sys.stderr)
        loop = asyncio.get_running_loop()
        lines = approver = None
        if client.approval_mode != "auto":
            if args.yes:
                approver = YES
            else:
                lines = StdinLines(loop)
                lines.start()
                approver = TerminalApprover(lines.queue.get, sys.stderr if args.json else out)
        session = build_session(
            SessionParts(workspace=workspace, sandbox=sandbox, search_index=index, extra_tools=tuple(toolset.tools)),
            policy=policy, limits=Limits(max_steps=args.max_steps, max_wall_s=args.timeout), sink=sink,
            approval_mode=client.approval_mode, approver=approver, session_id=recorder.session_id if recorder else None,
        )
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGINT, session.interrupt)
        from backend.db.writer import EventRejected, LogUnavailable

        try:
            outcome = await session.run_turn(request)
        except (LogUnavailable, EventRejected) as exc:
            raise CliError(f"recording the session failed ({exc}); --no-record runs without recording") from None
        finally:
            if lines is not None:
                lines.stop()  # the review below reads its answer with input()
            if recorder is not None:
                problem = await recorder.finish(workspace)
                note = f"recorded as session {recorder.session_id} (flywheel sessions show {recorder.session_id[:12]})"
                print(note + (f"; {problem}" if problem else ""), file=sys.stderr if args.json else out)
            await policy.aclose()
            await toolset.close()
            if index is not None:
                index.close()
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(signal.SIGINT)  # Ctrl-C at the prompt below quits
        if not args.json:
            changed = workspace.diff()
            print()
            if changed:
                print(f"workspace changes ({len(workspace.changed_paths())} file(s)):")
                changed = inert(changed)  # file names and contents are untrusted
                print(changed, end="" if changed.endswith("\n") else "\n")
            else:
                print("no workspace changes")
            if tmp is None:
                print(f"workspace kept at {workspace.root}")
        status = 0 if outcome.reason == "completed" else 1
        status = max(status, _review(args, workspace, None if demo else (args.workspace or args.git)))
        if tmp is None:  # the host's git may now touch the kept tree: disable planted hooks and config
            print(workspace.neutralise_git().summary(), file=sys.stderr)
        return status
    finally:
        if tmp is not None:  # unmounted first: a temporary store must not be removed while mounted
            store.blobs.wait()  # nor while the starting files' bytes are still being stored into it
            store.unmount_all()
            tmp.cleanup()


def _start_recording(args: argparse.Namespace, workspace: Workspace, *, request: str, policy_config: object,
                     approval_mode: str, kept_in: Path | None, external_tools: list[ToolSpec]) -> RunRecorder:
    """Open the local session log and record the run's session there (:mod:`backend.run_log`),
    with the specs of its ``--mcp`` tools (for replays)."""
    from backend.local_log import LogNotFound, log_settings
    from backend.run_log import RunRecorder, policy_record

    if args.git is not None:
        source: dict[str, object] = {"kind": "git", "path": os.path.realpath(args.git), "commit": args.commit}
    else:
        source = {"kind": "dir", "path": os.path.realpath(args.workspace or DEMO_DIR / "workspace")}
    try:
        recorder = RunRecorder.open(log_settings())
        recorder.start(workspace, title=request, source=source, policy=policy_record(policy_config),
                       approval_mode=approval_mode, kept_in=kept_in, external_tools=external_tools)
    except (LogNotFound, OSError) as exc:
        raise CliError(f"cannot record the session: {exc} (--no-record runs without recording)") from None
    return recorder


async def _mcp_toolset(args: argparse.Namespace) -> McpToolset:
    """The external MCP servers of ``--mcp`` and ``--mcp-config``, connected (none: an empty set).
    A server that does not connect is left out with a message; a bad flag or file is a :class:`CliError`."""
    from backend.mcp_config import load_mcp_file, open_toolset, parse_mcp_flag
    from tools.mcp_client import McpConfigError, McpToolset

    try:
        configs = [parse_mcp_flag(v) for v in args.mcp]
        if args.mcp_config is not None:
            configs += load_mcp_file(args.mcp_config)
        if not configs:
            return McpToolset()
        return await open_toolset(configs, lambda line: print(line, file=sys.stderr, flush=True))
    except McpConfigError as exc:
        raise CliError(str(exc)) from None


def _review(args: argparse.Namespace, workspace: Workspace, original: Path | None) -> int:
    """The end of ``flywheel run``: apply the changes to ``original``, export them, or discard them."""
    from backend.apply_back import ApplyError, ChangeSet
    from backend.review import end_choice, finish

    say = sys.stderr if args.json else sys.stdout
    try:
        changes = ChangeSet.from_workspace(workspace)
    except ApplyError as exc:
        print(f"flywheel run: {exc}", file=sys.stderr)
        return 1
    interactive = not args.json and sys.stdin.isatty() and sys.stdout.isatty()
    again = "run again with --apply, or with --export-patch FILE to get a patch"
    outcome = finish(
        changes, Path(os.path.realpath(original)) if original is not None else None, choice=end_choice(args),
        say=say, patch_file=args.export_patch, ask=_ask if interactive else None, retry_hint=again,
        no_target="the demo works on Flywheel's bundled example, so its changes are not applied anywhere; "
        "use --workspace DIR for your own project",
    )
    return outcome.status


def _policy_spec(value: str | dict[str, object]) -> str:
    """A config-file ``policy`` as a ``--policy`` spec (an ``openai`` object becomes ``openai:MODEL``)."""
    if isinstance(value, str):
        return value
    if value.get("kind") == "openai" and set(value) <= {"kind", "model"}:
        return f"openai:{value['model']}" if value.get("model") else "openai"
    raise CliError(f"`policy` in the config file is an object {value!r}; flywheel run takes a spec string "
                   "such as \"openai:MODEL\" or \"scripted:FILE.json\"")


def _settings(args: argparse.Namespace) -> Settings:
    """The server's settings with the flags applied; :class:`CliError` names a bad flag or variable."""
    from backend.settings import Settings, SettingsError, load_settings

    overrides = {
        "host": getattr(args, "host", None), "port": getattr(args, "port", None), "db_url": getattr(args, "db", None),
        "data_dir": getattr(args, "data_dir", None), "allowed_roots": getattr(args, "allow_root", None),
        "openai_base_url": getattr(args, "openai_base_url", None), "openai_model": getattr(args, "openai_model", None),
        "mcp_config": getattr(args, "mcp_config", None),
    }
    try:
        return load_settings(Settings, **overrides)
    except SettingsError as exc:
        raise CliError(str(exc)) from None


def _open_log(settings: Settings) -> SessionLog:
    """The session log at ``settings.database_url``, migrated; a bad URL or an unreachable
    database is a one-line :class:`CliError` (backend.cli_checks), never a traceback."""
    from backend.cli_checks import CliCheckError, open_log_engine
    from backend.db.log import SessionLog

    try:
        return SessionLog(open_log_engine(settings.database_url))
    except CliCheckError as exc:
        raise CliError(str(exc)) from None


def _cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from backend.app import create_app, tune_gc_for_serving
    from backend.settings import InsecureSettings

    try:
        settings = _settings(args)
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        lock = lock_data_dir(settings.data_dir)  # held (open) for the server's life
    except OSError as exc:
        print(f"flywheel serve: cannot use the data directory: {exc}", file=sys.stderr)
        return 1
    except CliError as exc:
        print(f"flywheel serve: {exc}", file=sys.stderr)
        return 1
    from backend.mcp_config import config_file_servers, load_mcp_file
    from tools.mcp_client import McpConfigError

    try:  # checked here so a bad file is one line, not a traceback from the app's start
        load_mcp_file(settings.mcp_config) if settings.mcp_config is not None else config_file_servers()
    except McpConfigError as exc:
        os.close(lock)
        print(f"flywheel serve: {exc}", file=sys.stderr)
        return 1
    try:
        log = _open_log(settings)
    except CliError as exc:
        os.close(lock)
        print(f"flywheel serve: {exc}", file=sys.stderr)
        return 1
    token_file = settings.data_dir / "local-token"
    if settings.is_loopback and log.token_count() == 0:
        token = log.create_token(_free_token_name(log, "local"), "staff")
        token_file.write_text(token + "\n")
        token_file.chmod(0o600)
    if token_file.exists() and log.verify_token(token_file.read_text().strip()) is None:
        token_file.unlink()  # revoked (`flywheel token revoke`): do not print it as the way in
    try:
        settings.check_secure(token_count=log.token_count())
    except InsecureSettings as exc:
        print(f"flywheel serve: {exc}", file=sys.stderr)
        return 1
    from backend.net import bind_socket

    try:
        sock = bind_socket(settings.host, settings.port)
    except OSError as exc:
        print(f"flywheel serve: cannot listen on {settings.host}:{settings.port}: {exc}", file=sys.stderr)
        return 1
    port = sock.getsockname()[1]
    url = f"http://{settings.host}:{port}"
    print(f"Flywheel is serving at {url}  (API docs: {url}/docs)", flush=True)
    from backend.web_app import is_built

    if is_built(settings.web_dist):
        print(f"web app: {url}/  (sign in with a token)", flush=True)
    else:
        print(f"web app: not built ({settings.web_dist} is missing); run scripts/setup.sh, or "
              "`cd web && npm ci && npm run build` (Node.js >= 18)", flush=True)
    if token_file.exists():
        print(f"token: {token_file.read_text().strip()}  (staff; stored in {token_file})", flush=True)
    if token_file.exists():
        demo = DEMO_DIR / "workspace"
        if any(demo.resolve().is_relative_to(r) for r in settings.allowed_roots):
            script = json.loads((DEMO_DIR / "script.json").read_text())
            print(f"try the demo in another terminal:\n  flywheel chat --server {url} --token "
                  f"{token_file.read_text().strip()} --workspace {demo} --policy demo\n"
                  f"  then type: {script['request']}", flush=True)
    print(f"database: {settings.database_url.split('@')[-1]}", flush=True)
    from backend.api.ws import MAX_MESSAGE_BYTES

    config = uvicorn.Config(with_change_routes(create_app(settings)), log_level=args.log_level,
                            ws_max_size=MAX_MESSAGE_BYTES,  # uvicorn refuses bigger WebSocket messages before reading them
                            ws="websockets-sansio",
                            ws_per_message_deflate=False)  # events are small: compressing each cost more CPU than it saved
    server = uvicorn.Server(config)
    tune_gc_for_serving()
    try:
        server.run(sockets=[sock])
    finally:
        os.close(lock)
    return 0


def with_change_routes(app: FastAPI) -> FastAPI:
    """``app`` with the routes ``flywheel chat`` applies and undoes with
    (``backend/api/routes/changes.py``), unless the app factory already has them."""
    from backend.api.routes import changes

    if not any(getattr(r, "original_router", None) is changes.router
               or getattr(r, "path", "") == "/v1/sessions/{session_id}/changes" for r in app.routes):
        app.include_router(changes.router)
    return app


def lock_data_dir(data_dir: Path) -> int:
    """Take the data directory's ``serve.lock`` (``flock``, exclusive) and return its fd;
    :class:`CliError` if another ``flywheel serve`` holds it. The lock lasts while the fd
    is open (the kernel drops it when the process dies, however it dies); the fd is not
    inherited by the commands the server runs. Not guaranteed: two servers with different
    data directories but one ``--db`` are not detected."""
    import fcntl

    path = data_dir / "serve.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip()
        os.close(fd)
        pid = f" (pid {holder})" if holder.isdigit() else ""
        raise CliError(f"another flywheel serve{pid} is using the data directory {data_dir}; stop it first, "
                       "or give this one its own --data-dir") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _free_token_name(log: SessionLog, name: str) -> str:
    """``name``, or ``name-2``, ``name-3``... if a (revoked) token already has it."""
    from sqlalchemy import select
    from sqlalchemy.orm import Session as DbSession

    from backend.db.models import TokenRow

    with DbSession(log.engine) as db:
        taken = set(db.scalars(select(TokenRow.name).where(TokenRow.name.startswith(name))))
    n = 1
    while (candidate := name if n == 1 else f"{name}-{n}") in taken:
        n += 1
    return candidate


if __name__ == "__main__":
    raise SystemExit(main())
