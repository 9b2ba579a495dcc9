"""``flywheel acp``: run as an Agent Client Protocol agent on stdio (started by an editor)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path

from backend.acp.defaults import DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_MODE, DEFAULT_PERMISSION_TIMEOUT_S, MODES

DESCRIPTION = """\
Speak the Agent Client Protocol (JSON-RPC on stdin/stdout) for an editor that starts this command:
Zed, JetBrains IDEs, Neovim (CodeCompanion, avante.nvim), Emacs (agent-shell) and others
(docs/editors.md has the settings). By default sessions run in this process on a copy of the
editor's project directory, recorded in the same session log as `flywheel serve` (--data-dir,
--db), so `flywheel sessions list` and `flywheel replay ID` show them; file reads see the
editor's unsaved buffers and edits land through the editor. With --server URL --token T it is a
thin bridge to a running `flywheel serve` instead. Nothing but the protocol is written to stdout;
logs go to stderr."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("acp", help="run as an ACP agent on stdio for editors (Zed, JetBrains, Neovim, Emacs)",
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--policy", help="demo, openai[:MODEL], scripted:FILE.json or a JSON policy object (default: "
                   "`policy` in the config file, else openai with FLYWHEEL_OPENAI_BASE_URL)")
    p.add_argument("--mode", choices=list(MODES), default=DEFAULT_MODE,
                   help="what to ask before a call runs: ask (edits and commands), agent (commands; the default), "
                   "auto (nothing). The editor can switch it per session (session/set_mode)")
    p.add_argument("--permission-timeout", type=float, default=DEFAULT_PERMISSION_TIMEOUT_S, metavar="S",
                   help=f"seconds a permission question may stay unanswered; then the call is refused "
                   f"(default {DEFAULT_PERMISSION_TIMEOUT_S:g})")
    p.add_argument("--fs-timeout", type=float, default=10.0, metavar="S",
                   help="seconds the editor may take to answer a file read or write (default 10)")
    p.add_argument("--max-message-bytes", type=int, default=DEFAULT_MAX_MESSAGE_BYTES, metavar="N",
                   help=f"largest JSON-RPC message accepted (default {DEFAULT_MAX_MESSAGE_BYTES})")
    local = p.add_argument_group("in-process sessions (the default)")
    local.add_argument("--data-dir", type=Path, help="the session log, workspaces and snapshots "
                       "(default: flywheel serve's, FLYWHEEL_DATA_DIR or ~/.local/share/flywheel)")
    local.add_argument("--db", help="SQLAlchemy URL of the session log (default: SQLite in the data directory)")
    local.add_argument("--openai-base-url", help="OpenAI-compatible model server for policy openai "
                       "(env FLYWHEEL_OPENAI_BASE_URL)")
    local.add_argument("--openai-model", help="default model name for policy openai")
    bridge = p.add_argument_group("thin bridge to a running server")
    bridge.add_argument("--server", metavar="URL", help="a `flywheel serve` URL: sessions run there")
    bridge.add_argument("--token", help="its API token (env FLYWHEEL_TOKEN, or `token` in the config file)")
    p.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"],
                   help="stderr log level (default warning)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(stream=sys.stderr, level=args.log_level.upper(),
                        format="flywheel acp: %(levelname)s %(name)s: %(message)s")
    # The protocol gets private copies of stdin and stdout; fd 1 then points at stderr and
    # fd 0 at /dev/null, so a stray print or a child process can never corrupt the stream.
    proto_in, proto_out = os.dup(0), os.dup(1)
    os.dup2(2, 1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    try:
        return asyncio.run(_serve(args, proto_in, proto_out))
    except _Refused as exc:
        print(f"flywheel acp: {exc}", file=sys.stderr)
        return 1


class _Refused(Exception):
    """A setting or start-up failure, printed as one line."""


async def _serve(args: argparse.Namespace, proto_in: int, proto_out: int) -> int:
    from acp.core import AgentSideConnection

    from backend.acp.agent import FlywheelAgent
    from backend.acp.sessions import SessionBackend, SessionError
    from backend.acp.transport import StdioTransport
    from backend.chat import ChatError, policy_config
    from backend.settings import ClientSettings, Settings, SettingsError, load_settings

    try:
        client = load_settings(ClientSettings)
        policy = policy_config(args.policy or client.policy)
        sessions: SessionBackend
        if args.server:
            from backend.acp.remote import RemoteSessions

            token = args.token or client.token
            if not token:
                raise _Refused("--server needs --token (or FLYWHEEL_TOKEN, or `token` in the config file)")
            sessions = RemoteSessions(args.server, token, policy)
        else:
            from backend.acp.local import LocalSessions

            settings = load_settings(Settings, data_dir=args.data_dir, db_url=args.db,
                                     openai_base_url=args.openai_base_url, openai_model=args.openai_model)
            sessions = LocalSessions(settings, policy)
        await sessions.start()  # type: ignore[attr-defined]
    except (SettingsError, ChatError, SessionError) as exc:
        raise _Refused(str(exc)) from None
    agent = FlywheelAgent(sessions, permission_timeout_s=args.permission_timeout, fs_timeout_s=args.fs_timeout,
                          default_mode=args.mode)
    transport = await StdioTransport.open(proto_in, proto_out, max_message_bytes=args.max_message_bytes)
    conn = AgentSideConnection(agent, transport, listening=False)
    try:
        await conn.listen()
    finally:
        await agent.close()
        await conn.close()
    return 0
