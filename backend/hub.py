"""Live sessions: drive ``agent.Session``, persist every event, fan it out.

Each live session has one sink that first commits the event to the log
(:class:`backend.db.writer.EventWriter`, group commit) and only then offers
it to the session's subscribers -- the same :class:`backend.db.log.StoredEvent`
(the event and its JSON line, encoded once) to each. The session's status
follows its events in the same commits (a turn's first event: running; its
``turn_end``: idle). A subscriber is a bounded queue: a client that falls
``client_queue_events`` behind is dropped (its socket closed with a "too
slow" reason) and can reconnect from the last ``seq`` it saw; nobody else
waits for it.

One turn at a time: a message while a turn runs is refused (409), but a turn
counts as ended from the moment its ``turn_end`` is handed to the writer, so a
message sent the moment a client sees it (over the socket or in ``GET /events``)
waits the few loop iterations the finished turn's task needs to tear down
(it may evict the session: the message then loads it again) and starts the next turn.

Reconnect is lossless: :meth:`Hub.stream_stored` registers the queue *before*
reading the backlog from the log, so every event is either in the backlog or
in the queue (duplicates are dropped by ``seq``).

Approvals: a session's approval mode (``auto``, ``ask-commands``,
``ask-edits``; :mod:`agent.approval`) is chosen when it is created and kept
with it (in its ``source``, key ``approval_mode``, absent for ``auto``). Each
live session has a :class:`agent.approval.PendingApprovals`; its requests are
events (``approval_requested``) and :meth:`Hub.answer_approval` answers them
(the WebSocket's ``approval`` message). A branch re-applies the answers
recorded for the steps it re-executes.

Workspace views: ``Hub(workspace_view=f)`` gives each live session's tools
``f(info, workspace)`` instead of the workspace (any
:class:`tools.protocols.Workspace`; ``flywheel acp`` wraps it so the file tools
read and write through the editor, :mod:`backend.acp.fs_bridge`). Diffs,
changes and replay still use the workspace itself.

Sockets: :class:`SocketLimit` caps the WebSockets one token holds open at a
time (``max_sockets_per_token``); ``send_stall_s`` is how long a send to a
client may block before the client counts as too slow (``backend.api.ws``).

Not guaranteed: an open approval request does not survive the server (the
restarted server closes the turn, and the call reads as cancelled); answers
given while no live session holds the request are refused (409), not queued.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from agent.approval import ApprovalDecision, ApprovalError, ApprovalMode, PendingApprovals, parse_approval_mode, \
    recorded_decisions
from agent.events import Event, TurnEnd
from agent.history import closing_events, history_from_events
from agent.policy import Policy
from agent.recorded_tools import recorded_tools, spec_record
from agent.runtime import LazySearchIndex, SessionParts, build_session
from agent.session import Limits, Session
from backend.db.log import SessionInfo, SessionLog, StoredEvent
from backend.db.writer import EventWriter
from backend.policies import PolicyFactory
from tools.base import FileEdit, Tool
from tools.sandbox import Sandbox
from tools.snapshots import SnapshotError
from tools.workspace import Workspace, WorkspaceError, WorkspaceStore

if TYPE_CHECKING:
    from embeddings.background import IndexPool
    from tools.protocols import Workspace as WorkspaceLike

log = logging.getLogger(__name__)


class HubError(Exception):
    """A request the hub refuses; ``status`` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class Subscriber:
    def __init__(self, maxsize: int):
        self.queue: asyncio.Queue[StoredEvent | None] = asyncio.Queue(maxsize)
        self.dropped = False

    def offer(self, event: StoredEvent) -> None:
        if self.dropped:
            return
        try:
            self.queue.put_nowait(event)
        except asyncio.QueueFull:
            self.dropped = True  # the reader sees this and closes the socket
            self._wake()

    def close(self) -> None:
        self._wake()

    def _wake(self) -> None:
        try:
            self.queue.put_nowait(None)
        except asyncio.QueueFull:
            pass  # the reader is busy draining; it checks ``dropped`` as it goes


MAX_APPROVAL_REASON_CHARS = 2000
"""The longest reason a user may give with an approval answer (the model reads it)."""


def approval_mode_of(info: SessionInfo) -> ApprovalMode:
    """The approval mode a session was created with (``auto`` for sessions from before modes existed)."""
    try:
        return parse_approval_mode(info.source.get("approval_mode", "auto"))
    except ApprovalError:
        return "auto"


class SocketLimit:
    """How many WebSockets each token (by its name) holds open; at most ``per_token``."""

    def __init__(self, per_token: int) -> None:
        if per_token < 1:
            raise ValueError("per_token must be at least 1")
        self.per_token = per_token
        self._open: dict[str, int] = {}

    def acquire(self, key: str) -> bool:
        """Count one more socket for ``key``; False (and nothing counted) when it holds ``per_token``."""
        n = self._open.get(key, 0)
        if n >= self.per_token:
            return False
        self._open[key] = n + 1
        return True

    def release(self, key: str) -> None:
        n = self._open.get(key, 0) - 1
        if n > 0:
            self._open[key] = n
        else:
            self._open.pop(key, None)

    def open(self, key: str) -> int:
        return self._open.get(key, 0)


@dataclass(eq=False)
class LiveSession:
    info: SessionInfo
    session: Session
    workspace: Workspace
    approvals: PendingApprovals = field(default_factory=PendingApprovals)
    subscribers: set[Subscriber] = field(default_factory=set)
    turn_task: asyncio.Task[Any] | None = None
    cancelled: bool = False
    # The running turn's turn_end is being stored or stored: only its teardown is left, and a
    # new message waits for that instead of being refused (Hub._idle_live).
    turn_ended: bool = False

    @property
    def running(self) -> bool:
        """A task holds the turn slot (a turn, or a revert), ended or not."""
        return self.turn_task is not None and not self.turn_task.done()

    @property
    def busy(self) -> bool:
        """A turn is running that has not ended: a new message is refused."""
        return self.running and not self.turn_ended


class _PersistThenBroadcast:
    def __init__(self, hub: Hub, session_id: str):
        self.hub = hub
        self.session_id = session_id

    async def emit(self, event: Event) -> None:
        # Durable before anyone sees it; clients get what was stored (an error
        # event in place of one the log could not store, same seq), encoded
        # once: every subscriber is offered the same StoredEvent (one JSON line).
        if isinstance(event, TurnEnd):
            # Before the append, not after: the commit makes turn_end visible (GET /events) a few
            # loop iterations before this coroutine resumes, and a client may send its next
            # message the moment it sees it. From here on the turn counts as ended.
            ending = self.hub.live.get(self.session_id)
            if ending is not None:
                ending.turn_ended = True
        stored = await self.hub.writer.append(event)
        live = self.hub.live.get(self.session_id)
        if live is not None:
            for sub in list(live.subscribers):
                sub.offer(stored)


class Hub:
    def __init__(
        self, *, log_: SessionLog, writer: EventWriter, store: WorkspaceStore, sandbox: Sandbox | None,
        policies: PolicyFactory, client_queue_events: int = 2048, limits: Limits = Limits(),
        indexes: IndexPool | None = None, max_sockets_per_token: int = 32, send_stall_s: float = 10.0,
        workspace_view: Callable[[SessionInfo, Workspace], WorkspaceLike] | None = None,
        running_elsewhere: Callable[[str], bool] | None = None,
        extra_tools: tuple[Tool, ...] = (),
    ):
        self.log = log_
        self.writer = writer
        self.store = store
        self.sandbox = sandbox
        self.policies = policies
        self.client_queue_events = client_queue_events
        self.limits = limits
        self.indexes = indexes  # None: no semantic_search tool
        self.extra_tools = extra_tools  # external MCP servers' tools, shared by every session
        # One session's own external tools (an ACP client's mcpServers), by session id: they join
        # ``extra_tools`` whenever the session is made live. The driver that connected them sets
        # and removes the entry (``create(extra_tools=...)`` sets it) and closes them.
        self.session_tools: dict[str, tuple[Tool, ...]] = {}
        self.live: dict[str, LiveSession] = {}
        self._loading: dict[str, asyncio.Lock] = {}
        self.sockets = SocketLimit(max_sockets_per_token)
        self.send_stall_s = send_stall_s
        # What a live session's tools act on, given its workspace: the workspace itself
        # (None), or a view of it (``flywheel acp`` ties file tools to the editor's buffers).
        self.workspace_view = workspace_view
        # A session another process is recording right now (a `flywheel run`): not left open by a crash.
        self.running_elsewhere = running_elsewhere
        # Whether other processes may mount workspaces of this store at the same time (``flywheel
        # acp``: one process per editor window, sharing a data directory): shutdown then unmounts
        # only the workspaces this hub had live, never the others' (``flywheel serve`` owns its store).
        self.shared_store = False

    def live_parts(self, workspace: WorkspaceLike, extra_tools: tuple[Tool, ...] = ()) -> SessionParts:
        """Parts for a live session: the server's sandbox and the workspace's pooled
        background index, built on the pool's thread at its first search (a session that
        never searches costs no indexing and never loads the embedder); the server's
        external tools, then ``extra_tools`` (the session's own)."""
        index = self.indexes.get(workspace.root) if self.indexes is not None else None
        return SessionParts(workspace=workspace, sandbox=self.sandbox, search_index=index,
                            extra_tools=self.extra_tools + tuple(extra_tools))

    def replay_parts(self, workspace: Workspace, info: SessionInfo | None = None, events: list[Event] | None = None,
                     *, live_tools: bool = False, model_calls: int | None = None) -> SessionParts:
        """Parts for re-executing a recording: the same tool set as a live session, but
        an index built completely at the first ``semantic_search`` (a replay must not
        see "still being built"), so replaying a session that never searched never
        loads the embedder. The external tools are the ones ``info`` recorded, answered
        from ``events`` (:mod:`agent.recorded_tools`); with ``live_tools`` (a branch),
        calls the recording lacks go to the server's tool of that name, and ``model_calls``
        limits the recording to the steps the branch re-executes. Release with
        :meth:`release_parts`."""
        pool = self.indexes
        index = None
        if pool is not None:
            root = workspace.root
            index = LazySearchIndex(lambda: pool.build_now(root))
        records = info.source.get("external_tools", []) if info is not None else []
        live = {t.spec.name: t for t in self.extra_tools} if live_tools else None
        extra = tuple(recorded_tools(records, events or [], live, model_calls=model_calls)) \
            if isinstance(records, list) else ()
        return SessionParts(workspace=workspace, sandbox=self.sandbox, search_index=index, extra_tools=extra)

    @staticmethod
    def release_parts(parts: SessionParts) -> None:
        """Close what :meth:`replay_parts` built (its index); the workspace is the caller's."""
        if isinstance(parts.search_index, LazySearchIndex):
            parts.search_index.close()

    # -- lifecycle -------------------------------------------------------------

    async def recover(self) -> int:
        """After a restart: close the turns that were in flight when the server died.

        Each open turn gets what the session would have written had it stopped
        cleanly (:func:`agent.history.closing_events`): the partial model
        output of the step that was streaming, a cancelled result for every
        call that was running, and a ``turn_end`` (``shutdown``) with the true
        step count — so the conversation the model sees next includes every
        call whose effect may be in the workspace. Sessions ``running_elsewhere``
        (a ``flywheel run`` recording now) are left alone. Returns how many
        sessions were marked idle again.
        """
        stale = await asyncio.to_thread(self.log.sessions_with_status, "running")
        if self.running_elsewhere is not None:
            stale = [info for info in stale if not self.running_elsewhere(info.id)]
        for info in stale:
            events = await asyncio.to_thread(self.log.all_events, info.id)
            for event in closing_events(events, detail="the server stopped during this turn (closed at restart)"):
                await self.writer.append(event)
            await asyncio.to_thread(self.log.set_status, info.id, "idle")
        return len(stale)

    async def shutdown(self) -> None:
        for live in list(self.live.values()):
            await self._stop(live, "shutdown")
            for sub in list(live.subscribers):
                sub.close()
            await live.session.policy.aclose()
            self._release_index(live.session)
        if self.indexes is not None:
            self.indexes.close()
        # Synchronously, not left to the exit hook or the reaper: whoever removes or reuses the
        # data directory next finds nothing mounted (workspaces mount again when next opened).
        if not self.shared_store:
            await asyncio.to_thread(self.store.unmount_all)
        else:
            for live in list(self.live.values()):
                await asyncio.to_thread(self.store.unmount, live.workspace)

    # -- sessions --------------------------------------------------------------

    async def create(
        self, *, owner: str, workspace: Workspace, policy: dict[str, Any], title: str, source: dict[str, Any],
        parent_id: str | None = None, branch_step: int | None = None, approval_mode: str = "auto",
        extra_tools: tuple[Tool, ...] = (),
    ) -> SessionInfo:
        """Record a new session. ``approval_mode``: :data:`agent.approval.APPROVAL_MODES`
        (400 otherwise); kept in the session's ``source``. ``extra_tools``: the session's own
        external tools (:attr:`session_tools`); their specs are recorded with the server's."""
        try:
            mode = parse_approval_mode(approval_mode)
        except ApprovalError as exc:
            raise HubError(400, str(exc)) from None
        source = {k: v for k, v in source.items() if k != "approval_mode"}
        if mode != "auto":
            source["approval_mode"] = mode
        tools = self.extra_tools + tuple(extra_tools)
        if tools and "external_tools" not in source:  # for replays (agent.recorded_tools)
            source["external_tools"] = [spec_record(t.spec) for t in tools]
        await asyncio.to_thread(self.log.save_snapshot, workspace.base)
        info = await asyncio.to_thread(
            self.log.create_session, id=uuid.uuid4().hex, owner=owner, title=title[:200], source=source,
            workspace_id=workspace.id, base_snapshot=workspace.base.id, policy=policy,
            parent_id=parent_id, branch_step=branch_step,
        )
        if extra_tools:
            self.session_tools[info.id] = tuple(extra_tools)
        return info

    async def get_live(self, info: SessionInfo, *, policy: Policy | None = None) -> LiveSession:
        live = self.live.get(info.id)
        if live is not None:
            return live
        lock = self._loading.setdefault(info.id, asyncio.Lock())
        async with lock:
            live = self.live.get(info.id)
            if live is not None:
                return live
            events = await asyncio.to_thread(self.log.all_events, info.id)
            h = history_from_events(events)
            consumed = len(h.outputs) - self._unscripted_outputs(info, events)
            workspace = await self._open_workspace(info)
            approvals = PendingApprovals()
            view = self.workspace_view(info, workspace) if self.workspace_view is not None else workspace
            parts = self.live_parts(view, self.session_tools.get(info.id, ()))
            session = build_session(
                parts, policy=policy or self.policies.build(info.policy, consumed=consumed),
                limits=self.limits, sink=_PersistThenBroadcast(self, info.id), session_id=info.id, history=h,
                approval_mode=approval_mode_of(info), approver=approvals,
            )
            live = LiveSession(info, session, workspace, approvals, cancelled=info.status == "cancelled")
            self.live[info.id] = live
            return live

    @staticmethod
    def _unscripted_outputs(info: SessionInfo, events: list[Event]) -> int:
        """Model outputs in a session's log that its own (scripted) policy did not produce:
        a branch's re-executed steps, unless its script begins with them (the branch then
        continued the script, :func:`backend.replay.branch_consumed`). The branch's log
        begins with the same outputs as its parent's, so its own log answers."""
        if not info.branch_step:
            return 0
        from backend.replay import branch_consumed, recorded_turns

        return info.branch_step - branch_consumed(info.policy, recorded_turns(events), info.branch_step)

    async def _open_workspace(self, info: SessionInfo) -> Workspace:
        try:
            return await asyncio.to_thread(self.store.open, info.workspace_id)
        except (WorkspaceError, SnapshotError, OSError) as exc:
            raise HubError(410, f"this session's workspace is gone ({exc}); branch the session or create "
                                "a new one") from None

    async def answer_approval(self, info: SessionInfo, call_id: str, *, approved: bool, reason: str = "") -> None:
        """Answer the open approval request of call ``call_id``: 409 when none is open
        (never asked, answered already, or its turn ended), 400 for a reason over
        :data:`MAX_APPROVAL_REASON_CHARS`."""
        if len(reason) > MAX_APPROVAL_REASON_CHARS:
            raise HubError(400, f"the reason is longer than {MAX_APPROVAL_REASON_CHARS} characters")
        live = self.live.get(info.id)
        if live is None:
            raise HubError(409, f"no approval request is open for call {call_id!r}")
        try:
            live.approvals.answer(call_id, ApprovalDecision(approved, reason))
        except ApprovalError as exc:
            raise HubError(409, str(exc)) from None

    async def branch(
        self, info: SessionInfo, *, owner: str, from_step: int, policy: dict[str, Any], auto_continue: bool = True,
        approval_mode: str | None = None,
    ) -> SessionInfo:
        """A new session that re-executes ``info``'s first ``from_step`` model
        outputs from its starting workspace, then continues with ``policy``.

        The re-executed steps get the answers recorded for their calls (a refused
        call is refused again); the branch then asks per ``approval_mode``
        (default: the parent's).

        How it continues (:func:`backend.replay.plan_branch`): from a turn boundary
        (step 0 included) the next recorded turn starts over with its user message and
        ``policy``; from inside a turn, that turn runs again as one turn — its user
        message, its recorded steps, then ``policy``; from the recording's end only if
        the model owes an answer to tool results. ``auto_continue=False``: the branch
        stops at ``from_step`` and waits for a message. A scripted ``policy`` that begins
        with the recording's outputs (the demo's own script) continues the script after
        them (:func:`backend.replay.branch_consumed`) instead of restarting it."""
        from backend.replay import branch_consumed, plan_branch, recorded_turns, run_recording

        events = await asyncio.to_thread(self.log.all_events, info.id)
        turns = recorded_turns(events)
        total = sum(len(t.outputs) for t in turns)
        if not 0 <= from_step <= total:
            raise HubError(400, f"from_step must be between 0 and {total} (the session's model calls)")
        base = await asyncio.to_thread(self.log.load_snapshot, info.base_snapshot)
        workspace = await asyncio.to_thread(self.store.from_snapshot, base)
        new = await self.create(
            owner=owner, workspace=workspace, policy=policy, source=info.source, parent_id=info.id,
            branch_step=from_step, title=f"branch of {info.title or info.id[:8]} at step {from_step}",
            approval_mode=approval_mode if approval_mode is not None else approval_mode_of(info),
        )
        # The branch's own policy and limits are the session's defaults; the recorded
        # turns run with per-turn scripted policies (run_recording), then the continuation
        # (plan_branch): the cut turn's user message, its recorded steps, the new policy.
        plan = plan_branch(turns, from_step, auto_continue=auto_continue)
        approvals = PendingApprovals()
        session = build_session(
            self.replay_parts(workspace, info, events, live_tools=True, model_calls=from_step),
            policy=self.policies.build(policy, consumed=branch_consumed(policy, turns, from_step)),
            limits=self.limits, sink=_PersistThenBroadcast(self, new.id), session_id=new.id,
            approval_mode=approval_mode_of(new), approver=approvals,
            recorded_approvals=recorded_decisions(events, model_calls=from_step, unasked=True),
        )
        await run_recording(plan.recorded, session)
        live = LiveSession(new, session, workspace, approvals)
        self.live[new.id] = live
        go_on = plan.continuation
        if go_on is not None and go_on.only_if_tool_results:
            owes_answer = bool(session.conversation) and session.conversation[-1].role == "tool"
            go_on = go_on if owes_answer else None
        if go_on is not None:
            live.turn_ended = False
            live.turn_task = asyncio.create_task(
                self._turn(live, go_on.user_text, policy=go_on.policy(session.policy)), name=f"hub-turn:{new.id}")
        return new

    async def send(self, info: SessionInfo, text: str) -> None:
        """Start a turn; refuses (409) while one is running or when cancelled."""
        if info.status == "cancelled":
            raise HubError(409, "this session was cancelled; create a new one or branch it")
        live = await self._idle_live(info, "a turn is already running in this session; interrupt it first")
        if live.cancelled:
            raise HubError(409, "this session was cancelled; create a new one or branch it")
        # No await between _idle_live's check and this line: two messages that
        # arrive together cannot both start a turn.
        live.turn_ended = False
        live.turn_task = asyncio.create_task(self._turn(live, text), name=f"hub-turn:{info.id}")

    async def _idle_live(self, info: SessionInfo, busy: str) -> LiveSession:
        """The live session, with its turn slot free: refuses (409, ``busy``) while a turn runs
        that has not ended. A turn whose ``turn_end`` is out is waited for (its task tears
        down in a few loop iterations, and may evict the session: it is then loaded again),
        so a message sent the moment a client sees ``turn_end`` is accepted. The caller
        takes the slot (sets ``turn_task``) without awaiting anything first."""
        while True:
            live = await self.get_live(info)
            task = live.turn_task
            if task is None or task.done():
                return live
            if not live.turn_ended:
                raise HubError(409, busy)
            await asyncio.wait([task])
            if self.live.get(info.id) is not live:  # evicted: load it again as the log now has it
                info = await asyncio.to_thread(self.log.get_session, info.id) or info

    async def _turn(self, live: LiveSession, text: str | None, *, policy: Policy | None = None) -> None:
        """Run one turn (``policy``: this turn's only, e.g. a branch's recorded steps then
        its own policy; None: the session's).

        The status follows the turn's own events: turn_started commits "running" and
        turn_end "idle" in their transactions (SessionLog.append_stored), so no other
        write competes with the event writer for the database during a turn."""
        failed = False
        try:
            # A workspace opened in place stores its starting files' bytes in the background, read
            # from the user's directory: done before the turn's first edit may land there (an ACP
            # write-back), so the starting snapshot stays restorable. Milliseconds once stored.
            await asyncio.to_thread(self.store.blobs.wait)
            await live.session.run_turn(text, policy=policy)
        except Exception:
            failed = True  # e.g. the log failed: its turn_end may not be stored
            log.exception("session %s: turn failed", live.info.id)
        finally:
            if live.cancelled or failed:
                await asyncio.to_thread(self.log.set_status, live.info.id, "cancelled" if live.cancelled else "idle")
            await self._evict_if_unused(live, finishing=True)

    async def _evict_if_unused(self, live: LiveSession, *, finishing: bool = False) -> None:
        """Drop a session nobody watches and nothing runs in from memory; the
        log rebuilds it (conversation, seq, policy position) when it is next used.
        ``finishing``: called from the turn task itself, in its last step."""
        busy = live.running and not (finishing and live.turn_task is asyncio.current_task())
        if busy or live.subscribers or self.live.get(live.info.id) is not live:
            return
        del self.live[live.info.id]
        self._loading.pop(live.info.id, None)
        await live.session.policy.aclose()
        await asyncio.to_thread(self._release_index, live.session)

    # -- events from outside the agent loop (feedback) ------------------------------

    async def record_event(self, info: SessionInfo, event: Event) -> Event:
        """Append an event the server makes itself (``feedback``) to the session's stream and
        return it as stored: through the live session when there is one (it takes the next
        ``seq`` and reaches the session's watchers), else straight to the log after its last
        ``seq`` (no workspace needed: an RL rollout can be rated). Stamped with the session's
        current turn."""
        live = self.live.get(info.id)
        if live is None:
            async with self._loading.setdefault(info.id, asyncio.Lock()):  # get_live waits for this one
                live = self.live.get(info.id)
                if live is None:
                    now_ = await asyncio.to_thread(self.log.get_session, info.id) or info
                    stored = await self.writer.append(event.model_copy(update={
                        "seq": now_.last_seq + 1, "session_id": info.id, "turn": now_.turns}))
                    return stored.event
        return await live.session.emit(event)

    async def revert_file(self, info: SessionInfo, path: str,
                          record: Callable[[FileEdit], Event]) -> tuple[FileEdit, Event]:
        """Put ``path`` back as it was when the session started (``Workspace.revert``), tell the
        search index, and append ``record(edit)`` to the stream; returns both. 409 while a turn
        runs or when the file is not changed, 410 when the workspace is gone. A message sent
        while the revert writes waits for it (the revert holds the session's turn slot)."""
        live = await self._idle_live(info, "a turn is running in this session; revert once it has ended "
                                           "(or interrupt it)")

        async def work() -> tuple[FileEdit, Event]:
            try:
                edit = await asyncio.to_thread(live.workspace.revert, path)
            except WorkspaceError as exc:
                raise HubError(409, str(exc)) from None
            if live.session.ctx.search_index is not None:
                live.session.ctx.search_index.notify_edits([edit.path])
            return edit, await live.session.emit(record(edit))

        task = asyncio.create_task(work(), name=f"hub-revert:{info.id}")
        live.turn_task, live.turn_ended = task, True  # send() waits for an ended turn's task, then starts
        try:
            return await task
        finally:
            await self._evict_if_unused(live)

    async def interrupt(self, info: SessionInfo) -> bool:
        """Interrupt the session's turn and wait for it to end; False when no turn runs (one
        whose ``turn_end`` is out has ended: there is nothing left to interrupt)."""
        live = self.live.get(info.id)
        if live is None or not live.busy:
            return False
        await self._stop(live, "interrupted")
        return True

    @staticmethod
    async def _stop(live: LiveSession, reason: Literal["interrupted", "shutdown"]) -> None:
        """Interrupt the session's turn and wait for it to end. The hub's turn task may
        not have started the session's turn yet (it records the status first): an
        interrupt then finds nothing to stop, so it is repeated until it lands. A turn
        waiting for an approval would otherwise wait for ever. A turn whose ``turn_end``
        is out is only waited for (an interrupt must not cut its teardown short)."""
        task = live.turn_task
        while task is not None and not task.done():
            if not live.turn_ended:
                live.session.interrupt(reason=reason)
            await asyncio.wait([task], timeout=0.02)

    async def cancel(self, info: SessionInfo) -> None:
        live = self.live.get(info.id)
        if live is not None:
            live.cancelled = True
            await self.interrupt(info)
        await asyncio.to_thread(self.log.set_status, info.id, "cancelled")

    # -- streaming -------------------------------------------------------------

    async def stream(self, info: SessionInfo, after: int) -> AsyncIterator[Event]:
        """:meth:`stream_stored`, as events."""
        async with contextlib.aclosing(self.stream_stored(info, after)) as stored:
            async for s in stored:
                yield s.event

    async def stream_stored(self, info: SessionInfo, after: int) -> AsyncIterator[StoredEvent]:
        """Every event with ``seq > after`` as the log stores it (its JSON line): the
        backlog from the log, then live ones, without gaps or duplicates. Ends when
        the subscriber is dropped (raises :class:`SlowClient`) or the hub shuts down."""
        live = await self.get_live(info)
        sub = Subscriber(self.client_queue_events)
        live.subscribers.add(sub)
        try:
            last = after
            while True:  # backlog, in pages
                page = await asyncio.to_thread(self.log.events_stored, info.id, after=last, limit=1000)
                for e in page:
                    yield e
                    last = e.seq
                if len(page) < 1000:
                    break
            while True:
                event = await sub.queue.get()
                if sub.dropped:
                    raise SlowClient(last)
                if event is None:
                    return
                if event.seq <= last:
                    continue
                yield event
                last = event.seq
        finally:
            live.subscribers.discard(sub)
            await self._evict_if_unused(live)

    @staticmethod
    def _release_index(session: Session) -> None:
        """Close a branch's replay index when its session leaves memory (the log rebuilds
        the session with the pooled index)."""
        index = session.ctx.search_index
        if isinstance(index, LazySearchIndex):
            index.close()


class SlowClient(Exception):
    def __init__(self, last_seq: int):
        super().__init__(f"client fell too far behind; reconnect with after={last_seq}")
        self.last_seq = last_seq
