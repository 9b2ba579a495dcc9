"""The ACP agent: ``initialize``, ``session/new``, ``session/load``, ``session/prompt``,
``session/cancel`` and ``session/set_mode``, on a :class:`backend.acp.sessions.SessionBackend`.

The JSON-RPC is the ``agent-client-protocol`` package's (its router validates
every request against the protocol's schema and answers unknown methods with
``-32601``); this class is the agent behind it. Each ACP session is one
Flywheel session (the same id), followed by one *pump* task that reads the
session's event stream and sends what it means to the editor
(:class:`backend.acp.updates.UpdateMapper`), asks the editor's permission
for held calls (:mod:`backend.acp.permission`), and ends the waiting
``session/prompt`` at the turn's ``turn_end``:

=================  ==================
``turn_end``       ``stopReason``
=================  ==================
``completed``      ``end_turn``
``max_steps``      ``max_turn_requests``
``max_tokens``     ``max_tokens``
``interrupted``    ``cancelled``
``shutdown``       ``cancelled``
``timeout``        ``end_turn`` (the reason is sent as a message chunk first)
``error``          a JSON-RPC error (``-32603``) whose message is the reason
=================  ==================

``session/cancel`` interrupts the turn (running tools are cancelled and
sandboxed processes killed; a file write in progress completes, so no file is
half-written) and withdraws open permission questions; the prompt then
answers ``cancelled``. ``session/load`` streams the recorded session back as
updates (user messages included) before it answers, then follows it live.

The mode (``ask``/``agent``/``auto``) is kept with the session
(``SessionBackend.set_mode``) and restored by ``session/load``. The
``mcpServers`` of ``session/new`` and ``session/load`` are connected for the
session (:mod:`backend.acp.mcp_servers`): one that is down does not fail the
request; the response's ``_meta.flywheel.mcpServers`` says, per server, whether
it connected (and why not), and the reason is shown as a message chunk before
the session's next turn.

Not guaranteed: with ``--server`` (the thin bridge) neither the mode nor the
``mcpServers`` reach the server (:mod:`backend.acp.remote`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from acp import PROTOCOL_VERSION, RequestError, start_tool_call, update_agent_message_text, update_tool_call
from acp.schema import (
    AgentCapabilities,
    ClientCapabilities,
    EmbeddedResourceContentBlock,
    Implementation,
    InitializeResponse,
    LoadSessionResponse,
    McpCapabilities,
    NewSessionResponse,
    PromptCapabilities,
    PromptResponse,
    ResourceContentBlock,
    SetSessionModeResponse,
    TextContentBlock,
    TextResourceContents,
    ToolCallLocation,
    ToolCallUpdate,
)

from agent.approval import ApprovalDecision
from agent.events import ApprovalRequested, Event, TurnEnd
from backend.acp.defaults import DEFAULT_MODE, DEFAULT_PERMISSION_TIMEOUT_S, MODES
from backend.acp.fs_bridge import EDITOR_FS_TIMEOUT_S, DiskFiles, EditorFiles, ProjectFiles
from backend.acp.permission import Permissions, mode_state
from backend.acp.sessions import EditorLink, NewSession, Opened, SessionBackend, SessionError
from backend.acp.updates import UpdateMapper, tool_kind

log = logging.getLogger(__name__)

STOP_REASONS = {"completed": "end_turn", "max_steps": "max_turn_requests", "max_tokens": "max_tokens",
                "interrupted": "cancelled", "shutdown": "cancelled", "timeout": "end_turn"}
MAX_PROMPT_CHARS = 1 << 20


@dataclass(eq=False)
class _Open:
    """One ACP session this process follows."""

    id: str
    cwd: Path
    mapper: UpdateMapper
    permissions: Permissions
    last_seq: int = 0
    replay_until: int = 0
    replayed: asyncio.Event = field(default_factory=asyncio.Event)
    pump: asyncio.Task[None] | None = None
    turn: asyncio.Future[TurnEnd] | None = None
    turn_after: int = 0
    asks: set[asyncio.Task[None]] = field(default_factory=set)
    failure: BaseException | None = None
    notices: list[str] = field(default_factory=list)  # shown before the next turn


def _version() -> str:
    try:
        return version("flywheel")
    except PackageNotFoundError:
        return "0"


def bad_params(message: str) -> RequestError:
    return RequestError(-32602, message, {"details": message})


def bad_request(message: str) -> RequestError:
    return RequestError(-32600, message, {"details": message})


def internal(message: str) -> RequestError:
    return RequestError(-32603, message, {"details": message})


def _error(exc: SessionError) -> RequestError:
    """A refusal of the sessions as a JSON-RPC error whose message is the reason."""
    if exc.kind == "not_found":
        return RequestError(-32002, str(exc), {"details": str(exc)})
    return bad_request(str(exc)) if exc.kind == "conflict" else bad_params(str(exc))


class FlywheelAgent:
    """An ACP agent over ``sessions``. ``permission_timeout_s``: how long a permission
    question may stay unanswered before it counts as a refusal."""

    def __init__(self, sessions: SessionBackend, *, permission_timeout_s: float = DEFAULT_PERMISSION_TIMEOUT_S,
                 fs_timeout_s: float = EDITOR_FS_TIMEOUT_S, default_mode: str = DEFAULT_MODE) -> None:
        if default_mode not in MODES:
            raise ValueError(f"unknown mode {default_mode!r}: use one of {', '.join(MODES)}")
        self.sessions = sessions
        self.permission_timeout_s = permission_timeout_s
        self.fs_timeout_s = fs_timeout_s
        self.default_mode = default_mode
        self._conn: Any = None
        self._caps = ClientCapabilities()
        self._open: dict[str, _Open] = {}

    def on_connect(self, conn: Any) -> None:
        self._conn = conn

    # -- ACP methods --------------------------------------------------------------

    async def initialize(self, protocol_version: int, client_capabilities: ClientCapabilities | None = None,
                         client_info: Implementation | None = None, **kwargs: Any) -> InitializeResponse:
        self._caps = client_capabilities or ClientCapabilities()
        return InitializeResponse(
            protocol_version=min(protocol_version, PROTOCOL_VERSION),
            agent_capabilities=AgentCapabilities(
                load_session=True,
                prompt_capabilities=PromptCapabilities(image=False, audio=False, embedded_context=True),
                mcp_capabilities=McpCapabilities(http=True, sse=True),
            ),
            auth_methods=[],
            agent_info=Implementation(name="flywheel", title="Flywheel", version=_version()),
        )

    async def new_session(self, cwd: str, mcp_servers: list[Any] | None = None, **kwargs: Any) -> NewSessionResponse:
        path = self._cwd(cwd)
        holder: list[str] = []
        link = self._link(path, holder)
        new = NewSession(path, f"editor: {path.name}", list(mcp_servers or []), self.default_mode)
        try:
            opened = await self.sessions.create(new, link)
        except SessionError as exc:
            raise _error(exc) from None
        holder.append(opened.session_id)
        s = self._follow(opened.session_id, path, after=0, until=0, mode=self.default_mode, link=link)
        s.notices += opened.notices
        return NewSessionResponse(session_id=opened.session_id, modes=mode_state(self.default_mode),
                                  field_meta=_meta(opened, mcp_servers))

    async def load_session(self, cwd: str, session_id: str, mcp_servers: list[Any] | None = None,
                           **kwargs: Any) -> LoadSessionResponse:
        path = self._cwd(cwd)
        old = self._open.pop(session_id, None)
        if old is not None:
            await self._stop(old)
        link = self._link(path, [session_id])
        try:
            opened = await self.sessions.open(session_id, path, link, list(mcp_servers or []))
        except SessionError as exc:
            raise _error(exc) from None
        mode = opened.mode if opened.mode in MODES else self.default_mode
        s = self._follow(session_id, path, after=0, until=opened.last_seq, mode=mode, link=link)
        s.notices += opened.notices
        waiter = asyncio.ensure_future(s.replayed.wait())
        await asyncio.wait([waiter, s.pump], return_when=asyncio.FIRST_COMPLETED)  # type: ignore[list-item]
        if not s.replayed.is_set():
            waiter.cancel()
            raise internal(f"replaying the session failed: {s.failure}")
        return LoadSessionResponse(modes=mode_state(mode), field_meta=_meta(opened, mcp_servers))

    async def set_session_mode(self, mode_id: str, session_id: str, **kwargs: Any) -> SetSessionModeResponse:
        s = self._session(session_id)
        if mode_id not in MODES:
            raise bad_params(f"unknown mode {mode_id!r}: use one of {', '.join(MODES)}")
        s.permissions.mode = mode_id
        try:
            await self.sessions.set_mode(session_id, mode_id)
        except SessionError as exc:
            raise _error(exc) from None
        return SetSessionModeResponse()

    async def prompt(self, prompt: list[Any], session_id: str, **kwargs: Any) -> PromptResponse:
        s = self._session(session_id)
        text = _prompt_text(prompt)
        if s.turn is not None and not s.turn.done():
            raise bad_request("a prompt is already running in this session; cancel it first")
        if s.failure is not None:
            raise internal(f"the session's event stream failed: {s.failure}")
        s.turn = asyncio.get_running_loop().create_future()
        s.turn_after = s.last_seq
        notices, s.notices = s.notices, []
        for line in notices:
            with contextlib.suppress(Exception):  # a notice that cannot be shown must not stop the turn
                await self._conn.session_update(session_id=session_id,
                                                update=update_agent_message_text(f"[{line}]\n\n"))
        try:
            await self.sessions.send(session_id, text)
        except SessionError as exc:
            s.turn = None
            raise _error(exc) from None
        end = await s.turn
        if end.reason == "error":
            raise internal(f"the turn failed: {end.detail}")
        return PromptResponse(stop_reason=STOP_REASONS.get(end.reason, "end_turn"))  # type: ignore[arg-type]

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        s = self._open.get(session_id)
        if s is None:
            return
        for task in list(s.asks):
            task.cancel()
        with contextlib.suppress(SessionError):
            await self.sessions.interrupt(session_id)

    async def close(self) -> None:
        """The editor went away: stop every session's pump, then the sessions."""
        for s in list(self._open.values()):
            await self._stop(s)
        self._open.clear()
        await self.sessions.close()

    # -- sessions -----------------------------------------------------------------

    def _session(self, session_id: str) -> _Open:
        s = self._open.get(session_id)
        if s is None:
            raise bad_params(f"unknown session {session_id!r}: start one with session/new or session/load")
        return s

    @staticmethod
    def _cwd(cwd: str) -> Path:
        path = Path(cwd)
        if not path.is_absolute():
            raise bad_params(f"cwd must be an absolute path, got {cwd!r}")
        if not path.is_dir():
            raise bad_params(f"cwd {cwd!r} is not a directory")
        return path

    def _files(self, cwd: Path, holder: list[str]) -> ProjectFiles | None:
        """The editor's files for a session on ``cwd`` (``holder[0]``: its id, once known)."""
        if not self.sessions.edits_reach_editor:
            return None
        fs = self._caps.fs
        if fs is None or not (fs.read_text_file or fs.write_text_file):
            return DiskFiles(cwd)
        conn = self._conn

        async def read(path: str) -> str:
            return (await conn.read_text_file(session_id=holder[0], path=path)).content  # type: ignore[no-any-return]

        async def write(path: str, text: str) -> None:
            await conn.write_text_file(session_id=holder[0], path=path, content=text)

        return EditorFiles(cwd, read=read if fs.read_text_file else None, write=write if fs.write_text_file else None,
                           loop=asyncio.get_running_loop(), timeout_s=self.fs_timeout_s)

    def _link(self, cwd: Path, holder: list[str]) -> EditorLink | None:
        """How the session's tools reach the editor (``holder[0]``: its id, once known)."""
        files = self._files(cwd, holder)
        if files is None:
            return None

        async def approve(call_id: str | None, paths: list[str]) -> ApprovalDecision:
            """Asked before a command's files are written back; in the ``ask`` mode the question
            is a call of its own (``<call id>.write-back``, kind ``edit``), shown as completed or failed."""
            s = self._open.get(holder[0]) if holder else None
            if s is None:
                return ApprovalDecision(False, "the session is not open in the editor")
            if not s.permissions.write_back_needs_editor():
                return await s.permissions.decide_write_back(ToolCallUpdate(tool_call_id=call_id or "write-back"))
            shown = ", ".join(paths[:5]) + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")
            title = f"Write the files the command changed: {shown}"
            locations = [ToolCallLocation(path=p) for p in map(s.mapper.absolute, paths) if p is not None]
            wb_id = f"{call_id or 'command'}.write-back"
            await self._conn.session_update(session_id=s.id, update=start_tool_call(
                wb_id, title, kind="edit", status="pending", locations=locations))
            decision = await s.permissions.decide_write_back(ToolCallUpdate(
                tool_call_id=wb_id, title=title, kind="edit", status="pending", locations=locations))
            with contextlib.suppress(Exception):
                await self._conn.session_update(session_id=s.id, update=update_tool_call(
                    wb_id, status="completed" if decision.approved else "failed"))
            return decision

        return EditorLink(files, approve)

    def _follow(self, sid: str, cwd: Path, *, after: int, until: int, mode: str,
                link: EditorLink | None) -> _Open:
        mapper = UpdateMapper(cwd, texts=self.sessions.edit_texts(sid), notes=link.reports if link else None)

        async def ask(tool_call: ToolCallUpdate, options: list[Any]) -> Any:
            return await self._conn.request_permission(session_id=sid, tool_call=tool_call, options=options)

        s = _Open(sid, cwd, mapper, Permissions(ask, self.permission_timeout_s, mode),
                  last_seq=after, replay_until=until)
        if until <= after:
            s.replayed.set()
        s.pump = asyncio.create_task(self._pump(s), name=f"acp-pump:{sid}")
        self._open[sid] = s
        return s

    async def _stop(self, s: _Open) -> None:
        for task in [*s.asks, s.pump]:
            if task is not None:
                task.cancel()
        await asyncio.gather(*(t for t in [*s.asks, s.pump] if t is not None), return_exceptions=True)
        if s.turn is not None and not s.turn.done():
            s.turn.set_exception(internal("the session was closed"))
        with contextlib.suppress(SessionError):
            await self.sessions.release(s.id)

    async def _pump(self, s: _Open) -> None:
        try:
            async for event in self.sessions.stream(s.id, s.last_seq):
                await self._on_event(s, event)
            raise SessionError("the session's event stream ended")
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the editor or the server went away: fail the waiting prompt
            log.warning("session %s: %s", s.id, exc)
            s.failure = exc
            if s.turn is not None and not s.turn.done():
                s.turn.set_exception(internal(str(exc)))

    async def _on_event(self, s: _Open, event: Event) -> None:
        replaying = not s.replayed.is_set()
        s.last_seq = event.seq
        for update in s.mapper.map(event, replaying=replaying):
            await self._conn.session_update(session_id=s.id, update=update)
        if isinstance(event, ApprovalRequested) and not replaying:
            task = asyncio.create_task(self._approve(s, event), name=f"acp-permission:{event.call_id}")
            s.asks.add(task)
            task.add_done_callback(s.asks.discard)
        if isinstance(event, TurnEnd) and not replaying and s.turn is not None and not s.turn.done() \
                and event.seq > s.turn_after:
            s.turn.set_result(event)
        if replaying and event.seq >= s.replay_until:
            s.replayed.set()

    async def _approve(self, s: _Open, event: ApprovalRequested) -> None:
        kind = tool_kind(s.mapper.tools.get(event.name), event.args)
        tool_call = ToolCallUpdate(tool_call_id=event.call_id, title=_title_of(event), kind=kind, status="pending",
                                   raw_input=dict(event.args), locations=s.mapper.locations(event.name, event.args))
        decision = await s.permissions.decide(event, tool_call)
        try:
            await self.sessions.answer(s.id, event.call_id, approved=decision.approved, reason=decision.reason)
        except SessionError as exc:  # the turn ended meanwhile
            log.info("session %s: approval for %s not delivered: %s", s.id, event.call_id, exc)


def _title_of(event: ApprovalRequested) -> str:
    command = event.args.get("command")
    if event.kind == "command" and isinstance(command, str):
        return f"Run: {command.strip()[:200]}"
    return f"{event.name} {event.args.get('path', '')}".strip()


def _meta(opened: Opened, asked: list[Any] | None) -> dict[str, Any] | None:
    """``_meta.flywheel.mcpServers``: what became of each server the client named."""
    return {"flywheel": {"mcpServers": opened.mcp_servers}} if asked else None


def _prompt_text(blocks: list[Any]) -> str:
    """The user's message from the prompt's content blocks (text, resource links, embedded text)."""
    parts: list[str] = []
    for block in blocks:
        if isinstance(block, TextContentBlock):
            parts.append(block.text)
        elif isinstance(block, ResourceContentBlock):
            parts.append(f"[@{block.name}]({block.uri})")
        elif isinstance(block, EmbeddedResourceContentBlock) and isinstance(block.resource, TextResourceContents):
            parts.append(f"\n\nContent of {block.resource.uri}:\n```\n{block.resource.text}\n```\n")
        else:
            what = getattr(block, "type", type(block).__name__)
            raise bad_params(f"this agent takes text and resources only, not {what} content")
    text = "".join(parts) if all(isinstance(b, TextContentBlock) for b in blocks) else " ".join(parts)
    if not text.strip():
        raise bad_params("the prompt is empty")
    if len(text) > MAX_PROMPT_CHARS:
        raise bad_params(f"the prompt is longer than {MAX_PROMPT_CHARS} characters")
    return text
