"""``flywheel mcp``: the command line of :mod:`backend.mcp_server`."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from backend.net import is_loopback

DEFAULT_PORT = 8765
APPROVAL_MODES = ("ask-edits", "ask-commands", "auto")  # agent.approval's, without importing it for --help
DEFAULT_APPROVAL_TIMEOUT_S = 300.0  # backend.mcp_approval's


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "mcp", help="serve Flywheel's tools (read, edit, grep, sandboxed commands, …) on a directory over MCP",
        description="Serve the runtime's tools over the Model Context Protocol, on a workspace directory used in "
        "place (edits land there; paths outside it are refused; commands run in bubblewrap with the directory at "
        "/workspace). stdio (default): an MCP client starts this command as a subprocess. --transport http: "
        f"streamable HTTP at http://HOST:PORT/mcp, loopback by default, every request needing "
        "'Authorization: Bearer TOKEN' (--token, FLYWHEEL_MCP_TOKEN, or one made and printed at start). "
        "Before a call that edits a file or runs a command, the client's user is asked with MCP elicitation "
        "(--approval-mode); a client that cannot be asked gets an error result instead, never a silent run.",
    )
    p.add_argument("--workspace", type=Path, default=Path("."), help="the directory to serve (default: .)")
    p.add_argument("--transport", choices=["stdio", "http"], default="stdio", help="stdio (default) or http")
    p.add_argument("--host", default="127.0.0.1", help="http: bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"http: port (default {DEFAULT_PORT}; 0 picks one)")
    p.add_argument("--token", help="http: the bearer token clients must send (at least 16 characters)")
    p.add_argument("--semantic-search", action="store_true",
                   help="add semantic_search (the directory is indexed at the first search)")
    p.add_argument("--no-commands", action="store_true", help="leave out run_command")
    p.add_argument("--approval-mode", choices=list(APPROVAL_MODES),
                   help="what the client's user is asked before a call: ask-edits (before editing a file or "
                   "running a command; the default), ask-commands (before running a command), or auto (never: "
                   "the client decides). Default: FLYWHEEL_MCP_APPROVAL_MODE, else `mcp_approval_mode` in the "
                   "config file, else ask-edits")
    p.add_argument("--approval-timeout", type=float, default=DEFAULT_APPROVAL_TIMEOUT_S, metavar="SECONDS",
                   help="refuse a call whose question is not answered in time "
                   f"(default {DEFAULT_APPROVAL_TIMEOUT_S:g})")
    p.add_argument("--unsafe-no-sandbox", action="store_true",
                   help="run commands WITHOUT isolation if bubblewrap is missing (dangerous)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from backend.mcp_approval import McpApprovals
    from backend.mcp_server import open_parts
    from backend.settings import ClientSettings, McpSettings, SettingsError, load_settings
    from tools.sandbox import SandboxUnavailable
    from tools.workspace import WorkspaceError

    def fail(message: str) -> int:
        print(f"flywheel mcp: {message}", file=sys.stderr)
        return 2

    try:
        settings = load_settings(McpSettings, mcp_token=args.token,
                                 unsafe_no_sandbox=args.unsafe_no_sandbox or None)
        mode = load_settings(ClientSettings, mcp_approval_mode=args.approval_mode).mcp_approval_mode
    except SettingsError as exc:
        return fail(str(exc))
    if not 0 < args.approval_timeout < float("inf"):
        return fail(f"--approval-timeout {args.approval_timeout:g} must be a positive number of seconds")
    if not 0 <= args.port <= 65535:
        return fail(f"--port {args.port} is not a port number (0-65535)")
    if args.transport == "stdio" and args.token:
        return fail("--token is for --transport http (stdio needs none: the client starts this process)")
    try:
        served = open_parts(args.workspace, commands=not args.no_commands, semantic_search=args.semantic_search,
                            allow_unsandboxed=settings.unsafe_no_sandbox, extra_ro=settings.sandbox_extra_ro,
                            index_dir=settings.search_index_dir)
    except (WorkspaceError, SandboxUnavailable, OSError) as exc:
        return fail(str(exc))
    approvals = McpApprovals(mode, args.approval_timeout, str(served.parts.workspace.root))
    try:
        return asyncio.run(_serve(args, served.parts, settings.mcp_token, approvals))
    except KeyboardInterrupt:
        return 0
    except OSError as exc:
        return fail(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}")
    finally:
        served.close()


async def _serve(args: argparse.Namespace, parts: object, token: str | None, approvals: object) -> int:
    from agent.runtime import SessionParts
    from agent.tool_runner import ToolRunner
    from backend.mcp_approval import McpApprovals
    from backend.mcp_server import HttpListening, new_token, serve_http, serve_stdio

    assert isinstance(parts, SessionParts) and isinstance(approvals, McpApprovals)
    runner = ToolRunner(parts)
    names = ", ".join(s.name for s in runner.specs)
    asks = {"ask-edits": "asks before edits and commands", "ask-commands": "asks before commands",
            "auto": "never asks: the client decides"}[approvals.mode]
    names += f"; --approval-mode {approvals.mode}: {asks}"
    if args.transport == "stdio":
        print(f"flywheel mcp: serving {parts.workspace.root} over stdio ({names})", file=sys.stderr, flush=True)
        await serve_stdio(runner, approvals=approvals)
        return 0
    if not is_loopback(args.host):
        print(f"flywheel mcp: WARNING: listening on {args.host}, beyond this machine; anyone with the token "
              "can edit the directory and run commands in it", file=sys.stderr)

    def listening(at: HttpListening) -> None:
        print(f"flywheel mcp: serving {parts.workspace.root} at {at.url} ({names})", file=sys.stderr)  # type: ignore[attr-defined]
        print(f"flywheel mcp: token: {at.token}  (send 'Authorization: Bearer {at.token}')", file=sys.stderr,
              flush=True)

    await serve_http(runner, host=args.host, port=args.port, token=token or new_token(), approvals=approvals,
                     on_listening=listening)
    return 0
