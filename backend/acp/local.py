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
decided by :mod:`backend.acp.permission`. The ACP mode is kept in the session's
``source`` (``acp_mode``: set at ``session/new``, updated by ``session/set_mode``)
and restored by ``session/load``.

External tools: the MCP servers a client names in ``session/new`` or
``session/load`` are connected for that session alone
(:mod:`backend.acp.mcp_servers`; ``Hub.session_tools``), their tools' specs are
recorded in the session's ``source`` (``external_tools``, extended at a load that
brings new ones), so a replay answers their calls from the recording, and the
servers are stopped when the session is released (the editor closed it, loaded it
again, or went away) -- after the turn that is running, if one is.

Commands: the hub's sandbox is wrapped so a command run in a session this
process holds is followed by the write-back of the files it changed
(:mod:`backend.acp.command_sync`).

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
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from agent.events import Event
from agent.history import closing_events
from agent.recorded_tools import spec_record
from backend.acp.mcp_servers import McpStatus
from backend.acp.mcp_servers import connect as connect_mcp
from backend.acp.command_sync import CommandSync, WriteBackSandbox
from backend.acp.fs_bridge import EditorWorkspace, EditTextLog
from backend.acp.sessions import EditorLink, NewSession, Opened, SessionError
from backend.db.log import SessionInfo, SessionLog
from backend.hub import Hub, HubError
from backend.policies import PolicyConfigError
from backend.settings import Settings
from tools.mcp_client import McpToolset
from tools.workspace import WorkspaceError, WorkspaceStore

log = logging.getLogger(__name__)

OWNER = "acp"
"""The owner recorded for sessions started from an editor."""


class LocalSessions:
    """:class:`backend.acp.sessions.SessionBackend` on an in-process hub."""

    edits_reach_editor = True

    def __init__(self, settings: Settings, policy: dict[str, Any]) -> None:
        self.settings = settings
        self.policy = policy
        self.hub: Hub | None = None
        self._links: dict[str, EditorLink] = {}
        self._texts: dict[str, EditTextLog] = {}
        self._agreed: dict[str, dict[str, str]] = {}
        self._syncs: dict[str, CommandSync] = {}  # by the copy's root
        self._sync_of: dict[str, CommandSync] = {}  # by session id
        self._reopened: set[str] = set()
        self._roots: dict[str, str] = {}  # session id -> the copy's root
        self._toolsets: dict[str, McpToolset] = {}
        self._background: set[asyncio.Task[None]] = set()
        self._locks: dict[str, int] = {}
        self._engine: Any = None

    async def start(self) -> None:
        """Open the log (creating and migrating it), the store and the hub; check the policy."""
        from backend.app import make_hub
        from backend.db.engine import make_engine, migrate

        self._engine = make_engine(self.settings.database_url)
        await asyncio.to_thread(migrate, self._engine)
        session_log = SessionLog(self._engine)
        # Copy-on-write like the server's, but shared: other editor windows' agents may have their
        # sessions of this data directory mounted now, so nothing is cleaned at start and only this
        # process's sessions are unmounted at close (a killed agent's mounts go with its reaper).
        store = WorkspaceStore(self.settings.data_dir / "workspaces",
                               overlay=None if self.settings.workspace_overlay == "auto" else False)
        self.hub = make_hub(self.settings, session_log, store, workspace_view=self._view)
        self.hub.shared_store = True
        if self.hub.sandbox is not None:
            self.hub.sandbox = WriteBackSandbox(self.hub.sandbox, self._syncs)
        try:
            self.policy = self.hub.policies.validate(self.policy)
        except PolicyConfigError as exc:
            raise SessionError(f"bad policy: {exc}") from None
        (self.settings.data_dir / "acp").mkdir(parents=True, exist_ok=True)

    def _view(self, info: SessionInfo, workspace: Any) -> Any:
        link = self._links.get(info.id)
        if link is None:
            return workspace
        view = EditorWorkspace(workspace, link.files, self._texts.setdefault(info.id, EditTextLog()),
                               agreed=self._agreed.setdefault(info.id, {}))
        sync = self._sync_of.get(info.id)
        if sync is None:  # a session opened again: its copy may hold changes made before
            sync = self._sync_of[info.id] = CommandSync(view, approve=link.approve_write_back, reports=link.reports,
                                                        baseline=info.id in self._reopened)
            look = asyncio.get_running_loop().create_task(sync.before_command(), name=f"acp-look:{info.id}")
            self._background.add(look)  # the first look now, not when the first command starts
            look.add_done_callback(self._background.discard)
        sync.workspace = view
        root = str(workspace.root)
        self._roots[info.id] = root
        self._syncs[root] = sync
        return view

    def edit_texts(self, session_id: str) -> EditTextLog | None:
        """Whole-file texts of the session's edits (for diff updates), while this process holds it."""
        return self._texts.setdefault(session_id, EditTextLog()) if session_id in self._links else None

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

    async def create(self, new: NewSession, link: EditorLink | None) -> Opened:
        cwd = Path(os.path.realpath(new.cwd))
        if not cwd.is_dir():
            raise SessionError(f"the working directory {new.cwd} is not a directory")
        try:
            workspace = await asyncio.to_thread(self._hub.store.from_dir, cwd,
                                                in_place=self.settings.workspace_source == "in-place")
        except (OSError, WorkspaceError) as exc:
            raise SessionError(f"cannot open {cwd} as a workspace: {exc}") from None
        status = await connect_mcp(new.mcp_servers)
        source: dict[str, Any] = {"kind": "dir", "path": str(cwd), "client": "acp", "acp_mode": new.mode}
        if status.servers:
            source["mcp_servers"] = status.servers
        try:
            info = await self._hub.create(owner=OWNER, workspace=workspace, policy=self.policy, title=new.title,
                                          source=source, approval_mode="ask-edits",
                                          extra_tools=tuple(status.toolset.tools))
            self._take_lock(info.id)
        except BaseException:
            await status.toolset.close()
            raise
        self._toolsets[info.id] = status.toolset
        if link is not None:
            self._links[info.id] = link
        return Opened(info.id, info.last_seq, new.mode, status.servers, self._warn(info.id, status))

    async def open(self, session_id: str, cwd: Path, link: EditorLink | None,
                   mcp_servers: list[Any] | None = None) -> Opened:
        info = await self._info(session_id)
        recorded = info.source.get("path")
        if recorded and os.path.realpath(recorded) != os.path.realpath(cwd):
            raise SessionError(f"session {session_id} works on {recorded}, not on {cwd}; open it from there")
        if session_id not in self._locks:
            self._take_lock(session_id)
            if info.status == "running" and session_id not in self._hub.live:
                await self._close_open_turn(info)
        await self._drop_tools(session_id)
        status = await connect_mcp(mcp_servers or [])
        if status.toolset.tools:
            self._toolsets[session_id] = status.toolset
            self._hub.session_tools[session_id] = tuple(status.toolset.tools)
            await self._record_tools(info, status)
        else:
            await status.toolset.close()
        if link is not None:
            self._links[session_id] = link
            self._reopened.add(session_id)
        info = await self._info(session_id)
        mode = info.source.get("acp_mode")
        return Opened(session_id, info.last_seq, mode if isinstance(mode, str) else None, status.servers,
                      self._warn(session_id, status))

    @staticmethod
    def _warn(session_id: str, status: McpStatus) -> list[str]:
        for line in status.problems:
            log.warning("session %s: %s", session_id, line)
        return status.problems

    async def _record_tools(self, info: SessionInfo, status: McpStatus) -> None:
        """Add the specs of tools connected at a load to the session's record (replay needs them)."""
        recorded = info.source.get("external_tools")
        specs = {r["name"]: r for r in recorded if isinstance(r, dict) and "name" in r} \
            if isinstance(recorded, list) else {}
        specs.update({t.spec.name: spec_record(t.spec) for t in status.toolset.tools})
        await asyncio.to_thread(self._hub.log.merge_source, info.id, {
            "external_tools": list(specs.values()), "mcp_servers": status.servers})

    async def _drop_tools(self, session_id: str) -> None:
        """Stop the session's MCP servers: now, or when its running turn ends."""
        self._hub.session_tools.pop(session_id, None)
        toolset = self._toolsets.pop(session_id, None)
        if toolset is None:
            return
        live = self._hub.live.get(session_id)
        turn = live.turn_task if live is not None and live.running else None
        if turn is None:
            await toolset.close()
            return

        async def after_turn() -> None:
            await asyncio.wait([turn])
            await toolset.close()

        task = asyncio.create_task(after_turn(), name=f"acp-mcp-close:{session_id}")
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def set_mode(self, session_id: str, mode: str) -> None:
        try:
            await asyncio.to_thread(self._hub.log.merge_source, session_id, {"acp_mode": mode})
        except KeyError:
            raise SessionError(f"no session {session_id!r} in {self.settings.data_dir}", "not_found") from None

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
        self._links.pop(session_id, None)
        self._texts.pop(session_id, None)
        self._agreed.pop(session_id, None)
        self._sync_of.pop(session_id, None)
        self._reopened.discard(session_id)
        root = self._roots.pop(session_id, None)
        if root is not None:
            self._syncs.pop(root, None)
        if self.hub is not None:
            await self._drop_tools(session_id)
        fd = self._locks.pop(session_id, None)
        if fd is not None:
            os.close(fd)

    async def close(self) -> None:
        if self.hub is not None:
            await self.hub.shutdown()
        for sid in list(self._locks):
            await self.release(sid)
        await asyncio.gather(*self._background, return_exceptions=True)  # looks; servers of turns just stopped
        if self.hub is not None:
            self.hub.writer.close()
        if self._engine is not None:
            self._engine.dispose()
