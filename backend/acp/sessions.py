"""Where ``flywheel acp`` runs its sessions: the seam between the ACP agent and Flywheel.

Two implementations of :class:`SessionBackend`:

* :class:`backend.acp.local.LocalSessions` (the default) -- an in-process
  :class:`backend.hub.Hub` on the embedded session log, the same hub
  ``flywheel serve`` drives, so an editor session is recorded, listed and
  replayed like any other;
* :class:`backend.acp.remote.RemoteSessions` (``--server URL --token T``) --
  a thin bridge to a running ``flywheel serve`` over its REST API and
  WebSocket (``docs/protocol.md``).

Both speak in Flywheel events; :mod:`backend.acp.agent` turns them into ACP.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from agent.events import Event
from backend.acp.command_sync import Approve, CommandReports
from backend.acp.defaults import DEFAULT_MODE
from backend.acp.fs_bridge import ProjectFiles
from backend.acp.updates import EditTexts


class SessionError(Exception):
    """A request the sessions refuse; one line for the editor. ``kind``: ``not_found``,
    ``conflict`` (a turn is already running, the session is open elsewhere) or ``invalid``."""

    def __init__(self, message: str, kind: str = "invalid") -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True, slots=True)
class NewSession:
    """What ``session/new`` asks for: the project, a title, the client's ``mcpServers``
    (the SDK's models; :mod:`backend.acp.mcp_servers`) and the mode it starts in."""

    cwd: Path
    title: str = ""
    mcp_servers: list[Any] = field(default_factory=list)
    mode: str = DEFAULT_MODE


@dataclass(frozen=True, slots=True)
class Opened:
    """A session this process now drives: its id, its last event's ``seq``, the mode
    stored with it (None: none stored), what became of the client's MCP servers
    (:class:`backend.acp.mcp_servers.McpStatus` ``servers``) and lines to show the user."""

    session_id: str
    last_seq: int = 0
    mode: str | None = None
    mcp_servers: list[dict[str, Any]] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)


@dataclass(eq=False)
class EditorLink:
    """How one session's tools reach the editor: its ``files``; asked before a command's
    changed files are written back (``approve_write_back``, the mode decides); where
    the write-back reports wait for the command's result (``reports``)."""

    files: ProjectFiles
    approve_write_back: Approve | None = None
    reports: CommandReports = field(default_factory=CommandReports)


class SessionBackend(Protocol):
    """Sessions for one ``flywheel acp`` process. Session ids are Flywheel's (the ACP ids)."""

    @property
    def edits_reach_editor(self) -> bool:
        """Whether file edits are written to the editor's project (in-process) or stay
        in the server's workspace (the thin bridge)."""
        ...

    def edit_texts(self, session_id: str) -> EditTexts | None:
        """Whole-file (old, new) texts of the session's edits, where this process sees them."""
        ...

    async def create(self, new: NewSession, link: EditorLink | None) -> Opened:
        """A new session on a copy of ``new.cwd`` with the tools of ``new.mcp_servers`` that
        connect; ``link`` ties its tools to the editor."""
        ...

    async def open(self, session_id: str, cwd: Path, link: EditorLink | None,
                   mcp_servers: list[Any] | None = None) -> Opened:
        """Attach to a recorded session, with the tools of ``mcp_servers`` that connect."""
        ...

    async def set_mode(self, session_id: str, mode: str) -> None:
        """Keep ``mode`` with the session (where the backend can), for the next ``open``."""
        ...

    def stream(self, session_id: str, after: int) -> AsyncIterator[Event]:
        """Every event with ``seq > after``: the recorded ones, then live ones, in order."""
        ...

    async def send(self, session_id: str, text: str) -> None:
        """Start a turn (:class:`SessionError` ``conflict`` while one runs)."""
        ...

    async def interrupt(self, session_id: str) -> None:
        """Stop the running turn; returns when it has ended (its ``turn_end`` is out)."""
        ...

    async def answer(self, session_id: str, call_id: str, *, approved: bool, reason: str) -> None:
        """Answer the open approval request of ``call_id``."""
        ...

    async def release(self, session_id: str) -> None:
        """This process no longer drives the session (another may open it)."""
        ...

    async def close(self) -> None:
        """Stop running turns (they end as ``shutdown``) and release everything."""
        ...
