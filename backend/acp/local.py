"""In-process sessions for ``flywheel acp``: a :class:`backend.hub.Hub` on the embedded log.

The hub, session log, workspace store and sandbox are the ones ``flywheel
serve`` uses (built by :func:`backend.app.make_hub` from the same
:class:`backend.settings.Settings`: ``--data-dir``/``FLYWHEEL_DATA_DIR``,
``--db``), so a session started in the editor is in ``flywheel sessions
list``, ``flywheel replay ID`` re-executes it, and a server on the same data
directory can open it later. Each session's workspace is a copy of the
editor's project directory, and its file tools go through the editor
(:mod:`backend.acp.fs_bridge`, via ``Hub(workspace_view=...)``).

Sessions run in the runtime's ``ask-edits`` approval mode; what is asked is
decided by :mod:`backend.acp.permission`.

A session is driven by one process at a time: opening it takes an exclusive
lock (``DATA_DIR/acp/<id>.lock``, held while this process has it open, dropped
by the kernel when the process dies). Opening a session the log shows as
``running`` whose lock is free (its process died) first closes the turn it
left open, as a restarted server does (:func:`agent.history.closing_events`).

Not guaranteed: a ``flywheel serve`` on the same data directory is not kept
from driving a session an editor holds, and its start closes every turn that
is running, this process's included.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from agent.events import Event
from agent.history import closing_events
from backend.acp.fs_bridge import EditorWorkspace, EditTextLog, ProjectFiles
from backend.acp.sessions import NewSession, SessionError
from backend.db.log import SessionInfo, SessionLog
from backend.hub import Hub, HubError
from backend.policies import PolicyConfigError
from backend.settings import Settings
from tools.workspace import WorkspaceError, WorkspaceStore

OWNER = "acp"
"""The owner recorded for sessions started from an editor."""


class LocalSessions:
    """:class:`backend.acp.sessions.SessionBackend` on an in-process hub."""

    edits_reach_editor = True

    def __init__(self, settings: Settings, policy: dict[str, Any]) -> None:
        self.settings = settings
        self.policy = policy
        self.hub: Hub | None = None
        self._files: dict[str, ProjectFiles] = {}
        self._texts: dict[str, EditTextLog] = {}
        self._locks: dict[str, int] = {}
        self._engine: Any = None

    async def start(self) -> None:
        """Open the log (creating and migrating it), the store and the hub; check the policy."""
        from backend.app import make_hub
        from backend.db.engine import make_engine, migrate

        self._engine = make_engine(self.settings.database_url)
        await asyncio.to_thread(migrate, self._engine)
        log = SessionLog(self._engine)
        store = WorkspaceStore(self.settings.data_dir / "workspaces")
        self.hub = make_hub(self.settings, log, store, workspace_view=self._view)
        try:
            self.policy = self.hub.policies.validate(self.policy)
        except PolicyConfigError as exc:
            raise SessionError(f"bad policy: {exc}") from None
        (self.settings.data_dir / "acp").mkdir(parents=True, exist_ok=True)

    def _view(self, info: SessionInfo, workspace: Any) -> Any:
        files = self._files.get(info.id)
        if files is None:
            return workspace
        return EditorWorkspace(workspace, files, self._texts.setdefault(info.id, EditTextLog()))

    def edit_texts(self, session_id: str) -> EditTextLog | None:
        """Whole-file texts of the session's edits (for diff updates), while this process holds it."""
        return self._texts.setdefault(session_id, EditTextLog()) if session_id in self._files else None

    @property
    def _hub(self) -> Hub:
        if self.hub is None:
            raise RuntimeError("LocalSessions.start() was not called")
        return self.hub

    async def _info(self, session_id: str) -> SessionInfo:
        info = await asyncio.to_thread(self._hub.log.get_session, session_id)
        if info is None:
            raise SessionError(f"no session {session_id!r} in {self.settings.data_dir}", "not_found")
        return info

    # -- sessions ---------------------------------------------------------------

    async def create(self, new: NewSession, files: ProjectFiles | None) -> str:
        cwd = Path(os.path.realpath(new.cwd))
        if not cwd.is_dir():
            raise SessionError(f"the working directory {new.cwd} is not a directory")
        try:
            workspace = await asyncio.to_thread(self._hub.store.from_dir, cwd)
        except (OSError, WorkspaceError) as exc:
            raise SessionError(f"cannot copy {cwd} into a workspace: {exc}") from None
        source: dict[str, Any] = {"kind": "dir", "path": str(cwd), "client": "acp"}
        if new.mcp_servers:
            source["mcp_servers"] = new.mcp_servers
        info = await self._hub.create(owner=OWNER, workspace=workspace, policy=self.policy, title=new.title,
                                      source=source, approval_mode="ask-edits")
        self._take_lock(info.id)
        if files is not None:
            self._files[info.id] = files
        return info.id

    async def open(self, session_id: str, cwd: Path, files: ProjectFiles | None) -> int:
        info = await self._info(session_id)
        recorded = info.source.get("path")
        if recorded and os.path.realpath(recorded) != os.path.realpath(cwd):
            raise SessionError(f"session {session_id} works on {recorded}, not on {cwd}; open it from there")
        if session_id not in self._locks:
            self._take_lock(session_id)
            if info.status == "running" and session_id not in self._hub.live:
                await self._close_open_turn(info)
        if files is not None:
            self._files[session_id] = files
        info = await self._info(session_id)
        return info.last_seq

    async def _close_open_turn(self, info: SessionInfo) -> None:
        """The process that ran this session died mid-turn: close the turn as a restart would."""
        hub = self._hub
        events = await asyncio.to_thread(hub.log.all_events, info.id)
        for event in closing_events(events, detail="the editor's agent process stopped during this turn"):
            await hub.writer.append(event)
        await asyncio.to_thread(hub.log.set_status, info.id, "idle")

    def _take_lock(self, session_id: str) -> None:
        path = self.settings.data_dir / "acp" / f"{session_id}.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise SessionError(f"session {session_id} is open in another flywheel acp process", "conflict") from None
        self._locks[session_id] = fd

    async def stream(self, session_id: str, after: int) -> AsyncIterator[Event]:
        info = await self._info(session_id)
        async for event in self._hub.stream(info, after):
            yield event

    async def send(self, session_id: str, text: str) -> None:
        try:
            await self._hub.send(await self._info(session_id), text)
        except HubError as exc:
            raise SessionError(str(exc), "conflict" if exc.status == 409 else "invalid") from None

    async def interrupt(self, session_id: str) -> None:
        await self._hub.interrupt(await self._info(session_id))

    async def answer(self, session_id: str, call_id: str, *, approved: bool, reason: str) -> None:
        try:
            await self._hub.answer_approval(await self._info(session_id), call_id, approved=approved, reason=reason)
        except HubError as exc:
            raise SessionError(str(exc), "conflict") from None

    async def release(self, session_id: str) -> None:
        self._files.pop(session_id, None)
        self._texts.pop(session_id, None)
        fd = self._locks.pop(session_id, None)
        if fd is not None:
            os.close(fd)

    async def close(self) -> None:
        if self.hub is not None:
            await self.hub.shutdown()
            self.hub.writer.close()
        if self._engine is not None:
            self._engine.dispose()
        for sid in list(self._locks):
            await self.release(sid)
