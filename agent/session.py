"""The one agent loop. The server, RL rollouts and replay all drive this class.

A turn: render the conversation → the policy streams → the parser turns the
stream into text and calls → each call is validated and dispatched to the
executor the moment it is complete → results go back to the model in call
order → next model call; until the model answers without a tool call or a
limit (steps, output tokens, wall time) is hit.

Every step is an event on one ordered stream (``agent.events``); ``seq`` is
assigned here, under a lock, so sinks see events strictly in order. A sink
that awaits (the server persists before it sends) applies backpressure to
the loop; that is deliberate.

Around each tool call the session reports what the call is doing: held for
the user's approval (``approval_requested`` / ``approval_resolved``, per the
session's approval mode: :mod:`agent.approval`), waiting for earlier calls
(``tool_call_queued``, then ``tool_call_running``), and what it prints while
it runs (``tool_output_delta``, coalesced to one event per call every
``Limits.output_delta_interval_s`` and capped at ``Limits.max_live_output_bytes``
per call). A call's deltas all precede its ``tool_result``.

Not guaranteed: token counts for policies that report neither token ids nor
usage are estimates (4 characters per token); how live output is split into
deltas (it follows the command's writes and the coalescing clock).
"""

from __future__ import annotations

import asyncio
import logging
import math
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from agent.approval import (
    ApprovalDecision,
    ApprovalMode,
    ApprovalRequest,
    Approver,
    approval_kind,
    declined_result,
    parse_approval_mode,
)
from agent.calls import CallRejected, ToolCall, render_results, validate_call
from agent.events import (
    ApprovalRequested,
    ApprovalResolved,
    AssistantDelta,
    AssistantMessage,
    ErrorEvent,
    Event,
    EventSink,
    FileEditEvent,
    ListSink,
    ToolCallDelta,
    ToolCallQueued,
    ToolCallRunning,
    ToolCallStarted,
    ToolOutputDelta,
    ToolResultEvent,
    TurnEnd,
    TurnStarted,
    UserMessage,
)
from agent.executor import CallOutcome, Executor
from agent.parser import CallOpened, MalformedCall, ParamDelta, ParsedCall, ParseEvent, StreamParser, TextDelta
from agent.policy import Policy, PolicyChunk, PolicyError
from agent.prompt import DEFAULT_PROFILE, Message, PromptProfile, render_prompt
from tools.base import Resources, Tool, ToolContext, ToolResult, cut_text

if TYPE_CHECKING:
    from tools.protocols import Sandbox, SearchIndex, Workspace

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Limits:
    max_steps: int = 30  # model calls per turn
    max_output_tokens: int = 200_000  # per turn
    max_wall_s: float = 1800.0  # per turn
    max_calls_per_step: int = 64
    output_delta_interval_s: float = 0.1  # at most one tool_output_delta per call this often
    max_live_output_bytes: int = 128 << 10  # live output per call; the result still has head and tail


@dataclass(frozen=True, slots=True)
class TurnOutcome:
    reason: str
    steps: int
    output_tokens: int
    final_text: str


@dataclass(slots=True)
class _StepState:
    """Everything one model call has produced so far. The session records its
    ``assistant_message`` from this object, once, whatever ends the step."""

    step: int
    executor: Executor
    parts: list[str] = field(default_factory=list)  # raw model text, as streamed
    visible: list[str] = field(default_factory=list)  # text outside tool calls
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    reported: int | None = None  # server-reported output tokens, if any
    chars: int = 0
    finish: str | None = None
    open_names: dict[int, str] = field(default_factory=dict)
    recorded: bool = False
    held: set[int] = field(default_factory=set)  # calls that were queued or awaited approval
    live: dict[int, _LiveOutput] = field(default_factory=dict)  # open live output, by call index

    def add(self, chunk: PolicyChunk) -> None:
        self.parts.append(chunk.text)
        self.chars += len(chunk.text)
        self.token_ids += chunk.token_ids
        self.logprobs += chunk.logprobs
        if chunk.output_tokens is not None:
            self.reported = chunk.output_tokens
        self.finish = chunk.finish_reason or self.finish

    @property
    def text(self) -> str:
        return "".join(self.parts)

    @property
    def tokens(self) -> int:
        return _count(self.chars, self.token_ids, self.reported)


class _StopStream(Exception):
    """Stop reading the model's output (too many calls in one response)."""


class _LimitHit(Exception):
    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason


class Session:
    """A stateful conversation with a workspace. One turn at a time.

    Drivers build sessions with :func:`agent.runtime.build_session` (which
    picks the tool set and prompt profile from the parts); constructing one
    directly is for tests of the loop itself. ``policy`` and ``limits`` are the
    session's defaults; a turn may use others (``run_turn(policy=, limits=)``),
    and neither can be reassigned.
    """

    def __init__(
        self,
        *,
        workspace: Workspace,
        policy: Policy,
        tools: Sequence[Tool],
        sink: EventSink | None = None,
        sandbox: Sandbox | None = None,
        limits: Limits = Limits(),
        session_id: str | None = None,
        profile: PromptProfile | None = DEFAULT_PROFILE,
        conversation: Sequence[Message] = (),
        next_seq: int = 1,
        turns_done: int = 0,
        search_index: SearchIndex | None = None,
        approval_mode: ApprovalMode = "auto",
        approver: Approver | None = None,
        recorded_approvals: Mapping[str, ApprovalDecision | None] | None = None,
    ):
        self._approval_mode = parse_approval_mode(approval_mode)
        if self._approval_mode != "auto" and approver is None:
            raise ValueError(f"approval mode {approval_mode!r} needs an approver to ask")
        self._approver = approver
        self._recorded_approvals = dict(recorded_approvals or {})
        self.session_id = session_id or uuid.uuid4().hex
        self.workspace = workspace
        self._policy = policy
        self._turn_policy: Policy | None = None
        self.tools = {t.spec.name: t for t in tools}
        self.specs = [t.spec for t in tools]
        self.sink: EventSink = sink if sink is not None else ListSink()
        self.ctx = ToolContext(workspace=workspace, sandbox=sandbox, search_index=search_index)
        self._limits = limits
        self._turn_limits: Limits | None = None
        # None: the default policy's own, which it learns at first use (its resolve_prompt_profile(),
        # awaited before the first prompt is rendered: an OpenAI-compatible server's published profile).
        self.profile: PromptProfile | None = profile
        self.conversation: list[Message] = list(conversation)
        self._seq = next_seq - 1
        self._turn = turns_done
        self._emit_lock = asyncio.Lock()
        self._task: asyncio.Task[TurnOutcome] | None = None
        self._interrupted = False

    # -- driving -------------------------------------------------------------

    async def run_turn(
        self, text: str | None, *, policy: Policy | None = None, limits: Limits | None = None
    ) -> TurnOutcome:
        """Run one user turn to its end. Raises only if the sink fails, or
        CancelledError if the *caller* is cancelled (the turn is then still
        closed with a ``turn_end`` event first).

        ``text=None`` continues from the conversation as it is (a branch taken
        after a step's tool results) without a new user message. ``policy`` and
        ``limits`` apply to this turn only (None: the session's defaults); the
        session does not close a per-turn policy, its caller does.
        """
        if self._task is not None:
            raise RuntimeError("a turn is already running in this session")
        self._turn_policy, self._turn_limits = policy, limits
        self._turn += 1
        self._interrupted = False
        self._stop_reason = "interrupted"
        self._started = False
        self._task = asyncio.create_task(self._run_turn(text), name=f"turn:{self.session_id}:{self._turn}")
        try:
            return await self._task
        except asyncio.CancelledError:
            if not self._task.done():
                self._task.cancel()
                await asyncio.wait([self._task])
            raise
        finally:
            self._task = None
            self._turn_policy = self._turn_limits = None

    @property
    def policy(self) -> Policy:
        """The running turn's policy, else the session's default (read-only)."""
        return self._turn_policy if self._turn_policy is not None else self._policy

    @property
    def limits(self) -> Limits:
        """The running turn's limits, else the session's default (read-only)."""
        return self._turn_limits if self._turn_limits is not None else self._limits

    def interrupt(self, *, reason: Literal["interrupted", "shutdown"] = "interrupted") -> bool:
        """Stop the running turn: tools are cancelled, the turn ends with ``reason``
        (``interrupted``: the user asked; ``shutdown``: the server is stopping).

        Idempotent: a second interrupt while the first is being handled does
        nothing (it must not cancel the clean-up).
        """
        if self._task is None or self._task.done():
            return False
        if not self._interrupted:
            self._interrupted = True
            self._stop_reason = reason
            if self._started:
                self._task.cancel()
        return True

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    @property
    def approval_mode(self) -> ApprovalMode:
        """What this session asks the user before running (read-only; :mod:`agent.approval`)."""
        return self._approval_mode

    @property
    def approver(self) -> Approver | None:
        return self._approver

    # -- events --------------------------------------------------------------

    async def emit(self, event: Event) -> Event:
        """Stamp ``event`` with the next ``seq``, this session and its current turn, hand it to
        the sink, and return it as stamped. Drivers may emit events of their own (the server's
        ``feedback``) between or during turns: they take the next ``seq`` like any other."""
        async with self._emit_lock:
            self._seq += 1
            stamped = event.model_copy(update={"seq": self._seq, "session_id": self.session_id, "turn": self._turn})
            await self.sink.emit(stamped)
            return stamped

    @property
    def last_seq(self) -> int:
        return self._seq

    # -- the loop ------------------------------------------------------------

    async def _run_turn(self, text: str | None) -> TurnOutcome:
        if text is not None:
            self.conversation.append(Message("user", text))
            await self.emit(UserMessage(text=text))
        await self.emit(TurnStarted())
        self._steps = 0
        self._tokens = 0
        self._final = ""
        self._current: _StepState | None = None
        reason, detail, why = "completed", "", ""
        error: ErrorEvent | None = None
        external_cancel = False
        self._started = True  # from here on, interrupt() cancels this task
        try:
            if self._interrupted:
                raise asyncio.CancelledError
            async with asyncio.timeout(self.limits.max_wall_s):
                while True:
                    if self._steps >= self.limits.max_steps:
                        raise _LimitHit("max_steps", f"stopped after {self._steps} model calls")
                    self._steps += 1
                    if not await self._step(self._steps):
                        break
        except _LimitHit as hit:
            reason, detail = hit.reason, str(hit)
        except TimeoutError:
            reason, detail = "timeout", f"the turn ran longer than {self.limits.max_wall_s:g} s"
            why = "the turn hit its time limit"
        except PolicyError as exc:
            reason, detail, why = "error", str(exc), "the model failed"
            error = ErrorEvent(message=str(exc), source="policy")
        except asyncio.CancelledError:
            external_cancel = not self._interrupted
            if self._interrupted and self._stop_reason == "shutdown":
                reason, detail = "shutdown", "the server stopped during this turn"
                why = "the server stopped"
            else:
                reason = "interrupted"
                detail = why = "the user interrupted the turn" if self._interrupted else "the turn was cancelled"
        except Exception as exc:  # a bug must not leave the turn open or tools running
            log.exception("session %s: turn failed", self.session_id)
            reason, detail, why = "error", f"internal error: {type(exc).__name__}: {exc}", "an internal error"
            error = ErrorEvent(message=detail, source="session")
        await self._abort_tools(why or "the turn ended")
        if error is not None:
            await self.emit(error)
        await self.emit(TurnEnd(reason=reason, steps=self._steps, output_tokens=self._tokens, detail=detail))  # type: ignore[arg-type]
        if external_cancel:
            raise asyncio.CancelledError
        return TurnOutcome(reason, self._steps, self._tokens, self._final)

    async def _step(self, step: int) -> bool:
        """One model call and its tools. Returns True when the model must continue.

        The step's ``assistant_message`` is recorded in one place, in
        ``finally``: a step cut off by the wall-clock limit, an interrupt or a
        policy error is recorded from the same state as one that ended
        normally (raw text, token ids and logprobs streamed so far), only its
        ``finish_reason`` differs (``aborted`` or ``error``).
        """
        if self.profile is None:  # raises PolicyError when the policy cannot learn it: the turn ends in error
            self.profile = await self._policy.resolve_prompt_profile()  # type: ignore[attr-defined]
        prompt = render_prompt(self.conversation, self.specs, profile=self.profile)
        parser = StreamParser()
        hooks = _CallHooks(self)
        state = _StepState(step, Executor(self.tools, self.ctx, on_result=lambda o: self._on_result(step, o),
                                          hooks=hooks))
        hooks.state = state
        self._current = state
        limit: _LimitHit | None = None
        finish_override: str | None = "aborted"
        try:
            stream = self.policy.stream(prompt)
            stopped = False
            try:
                async for chunk in stream:
                    state.add(chunk)
                    for ev in parser.feed(chunk.text):
                        await self._on_parse(state, ev)
                    if self._tokens + state.tokens > self.limits.max_output_tokens:
                        limit = _LimitHit("max_tokens", f"the turn exceeded {self.limits.max_output_tokens} output tokens")
                        break
            except _StopStream:
                stopped = True
            finally:
                await _aclose(stream)
            if not stopped:
                try:
                    for ev in parser.finish():
                        await self._on_parse(state, ev)
                except _StopStream:
                    pass
            finish_override = None
        except PolicyError:
            finish_override = "error"
            raise
        finally:
            # Shielded: a second cancellation (an interrupt during a timeout's
            # clean-up) must not lose the message; the emit lock keeps order.
            await asyncio.shield(self._record_message(state, finish_override))
        outcomes = await state.executor.results()
        self._current = None
        if outcomes:
            self.conversation.append(Message("tool", render_results([(o.name, o.call.index, o.result) for o in outcomes])))
        if limit is not None:
            raise limit
        if not outcomes:
            self._final = "".join(state.visible)
            if state.finish == "length":
                raise _LimitHit("max_tokens", "the model stopped at its output-token limit")
        return bool(outcomes)

    async def _record_message(self, state: _StepState, finish_override: str | None) -> None:
        """Record the step's model output: the conversation and the event, once."""
        if state.recorded:
            return
        state.recorded = True
        used = state.tokens
        self._tokens += used
        self.conversation.append(Message("assistant", state.text))
        await self.emit(
            AssistantMessage(
                step=state.step, text=state.text, token_ids=list(state.token_ids), logprobs=list(state.logprobs),
                output_tokens=used, finish_reason=finish_override or state.finish,
            )
        )

    async def _on_parse(self, state: _StepState, ev: ParseEvent) -> None:
        step, executor = state.step, state.executor
        if isinstance(ev, TextDelta):
            state.visible.append(ev.text)
            await self.emit(AssistantDelta(step=step, text=ev.text))
        elif isinstance(ev, CallOpened):
            state.open_names[ev.index] = ev.name
        elif isinstance(ev, ParamDelta):
            name = state.open_names.get(ev.index, "")
            await self.emit(ToolCallDelta(step=step, index=ev.index, name=name, param=ev.param, text=ev.text))
        elif isinstance(ev, ParsedCall | MalformedCall):
            call_id = f"t{self._turn}s{step}c{ev.index}"
            overflow = len(executor) >= self.limits.max_calls_per_step
            if overflow:
                call: ToolCall | CallRejected = CallRejected(
                    ev.index, call_id, ev.name,
                    f"too many tool calls in one response (at most {self.limits.max_calls_per_step}); "
                    "the rest of the response was discarded. Wait for these results, then continue",
                )
            else:
                call = validate_call(ev, {s.name: s for s in self.specs}, call_id)
            args = call.args if isinstance(call, ToolCall) else {}
            await self.emit(
                ToolCallStarted(
                    step=step, index=call.index, call_id=call_id, name=call.name, args=args,
                    valid=isinstance(call, ToolCall),
                )
            )
            executor.submit(call)
            await asyncio.sleep(0)  # let the tool start now, even if the policy never yields
            if overflow:
                raise _StopStream

    async def _on_result(self, step: int, outcome: CallOutcome) -> None:
        call, result = outcome.call, outcome.result
        await self.emit(
            ToolResultEvent(
                step=step, index=call.index, call_id=call.call_id, name=call.name, ok=result.ok,
                output=result.output, data=result.data, duration_ms=round(outcome.duration_ms, 3),
            )
        )
        for edit in result.edits:
            await self.emit(
                FileEditEvent(
                    call_id=call.call_id, path=edit.path, diff=edit.diff, created=edit.created, deleted=edit.deleted
                )
            )

    async def _approve(self, state: _StepState, call: ToolCall, resources: Resources) -> ToolResult | None:
        """Ask before ``call`` runs, if the mode says so (or re-apply a recorded
        answer); None means run it, a result is its refusal."""
        if call.call_id in self._recorded_approvals:
            recorded = self._recorded_approvals.pop(call.call_id)
            if recorded is None:
                return None  # it ran unasked in the recording: so it does again
        else:
            recorded = None
        kind = approval_kind("ask-edits" if recorded is not None else self._approval_mode, resources)
        if kind is None:
            return None
        state.held.add(call.index)
        request = ApprovalRequest(call.call_id, call.name, dict(call.args), kind, state.step, call.index)
        await self.emit(ApprovalRequested(step=state.step, index=call.index, call_id=call.call_id, name=call.name,
                                          args=dict(call.args), kind=kind))
        if recorded is not None:
            decision, by = recorded, "recording"
        else:
            assert self._approver is not None  # checked in __init__
            by = "user"
            try:
                decision = await self._approver.decide(request)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a broken prompt refuses; it must not run the call unasked
                log.exception("session %s: approver failed", self.session_id)
                decision = ApprovalDecision(False, f"(no answer: asking for approval failed: {type(exc).__name__})")
        await self.emit(ApprovalResolved(step=state.step, index=call.index, call_id=call.call_id,
                                         approved=decision.approved, reason=decision.reason, by=by))  # type: ignore[arg-type]
        return None if decision.approved else declined_result(request, decision)

    async def _abort_tools(self, why: str) -> None:
        """Cancel the running step's tools and record (as events too) a
        cancelled result for each call that had not finished -- with how long
        it ran and the output it had printed -- so the log rebuilds exactly
        this conversation. The step's own message was already recorded by
        :meth:`_step`."""
        state = self._current
        self._current = None
        if state is None:
            return
        await state.executor.cancel()
        settled = state.executor.settled(f"cancelled: {why}")
        for done in settled:
            call, result = done.call, done.result
            if not done.finished:
                live = state.live.pop(call.index, None)
                if live is not None:
                    await live.close()  # what it printed is shown before its result
                await self.emit(ToolResultEvent(step=state.step, index=call.index, call_id=call.call_id,
                                                name=call.name, ok=False, output=result.output, data=result.data,
                                                duration_ms=done.duration_ms))
        for live in list(state.live.values()):
            await live.close()
        state.live.clear()
        if settled:
            self.conversation.append(
                Message("tool", render_results([(d.call.name, d.call.index, d.result) for d in settled]))
            )


class _CallHooks:
    """The session's side of :class:`agent.executor.CallHooks` for one step."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.state: _StepState | None = None

    def _state(self) -> _StepState:
        assert self.state is not None
        return self.state

    async def approve(self, call: ToolCall, resources: Resources) -> ToolResult | None:
        return await self.session._approve(self._state(), call, resources)

    async def queued(self, call: ToolCall, waiting_for: list[str]) -> None:
        state = self._state()
        state.held.add(call.index)
        await self.session.emit(ToolCallQueued(step=state.step, index=call.index, call_id=call.call_id,
                                               waiting_for=waiting_for))

    async def running(self, call: ToolCall) -> None:
        state = self._state()
        if call.index in state.held:
            await self.session.emit(ToolCallRunning(step=state.step, index=call.index, call_id=call.call_id))

    def output(self, call: ToolCall, text: str) -> None:
        state = self._state()
        live = state.live.get(call.index)
        if live is None:
            live = state.live[call.index] = _LiveOutput(self.session, state, call)
        live.feed(text)

    async def finished(self, call: ToolCall) -> None:
        live = self._state().live.pop(call.index, None)
        if live is not None:
            await live.close()


class _LiveOutput:
    """One call's live output: coalesced into ``tool_output_delta`` events no
    more often than the limit's interval, host paths scrubbed as results are,
    capped at ``max_live_output_bytes``. :meth:`close` flushes the rest."""

    def __init__(self, session: Session, state: _StepState, call: ToolCall) -> None:
        self.session, self.state, self.call = session, state, call
        limits = session.limits
        self.interval = limits.output_delta_interval_s
        self.cap = limits.max_live_output_bytes
        self._chunks: list[str] = []
        self._chars = 0
        self._sent = 0  # bytes emitted
        self._done = False  # the cap was reached, or closed
        self._last = -math.inf
        self._wake = asyncio.Event()
        self._closing = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def feed(self, text: str) -> None:
        if self._done or self._closing.is_set():
            return
        if self._chars <= self.cap - self._sent + 4096:  # past that, the cap drops it anyway
            self._chunks.append(text)
            self._chars += len(text)
        if self._task is None:
            self._task = asyncio.create_task(self._pump(), name=f"live-output:{self.call.call_id}")
        self._wake.set()

    async def _pump(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self._closing.is_set():
                return
            delay = self._last + self.interval - loop.time()
            if delay > 0:
                try:
                    await asyncio.wait_for(self._closing.wait(), delay)
                    return  # close() flushes what is left
                except TimeoutError:
                    pass
            await self._flush(final=False)
            if self._done:
                return

    async def close(self) -> None:
        """Flush what is pending and stop. Raises what the sink raised, if it failed."""
        self._closing.set()
        self._wake.set()
        if self._task is not None:
            await asyncio.wait([self._task])
            if not self._task.cancelled() and self._task.exception() is not None:
                raise self._task.exception()  # type: ignore[misc]
        if not self._done:
            await self._flush(final=True)
        self._done = True

    async def _flush(self, *, final: bool) -> None:
        raw = "".join(self._chunks)
        shown, held = self.state.executor.scrub_stream(raw, final=final)
        self._chunks, self._chars = ([held], len(held)) if held else ([], 0)
        if not shown:
            return
        size = len(shown.encode("utf-8", "surrogatepass"))
        cut = self._sent + size > self.cap
        if cut:
            shown = cut_text(shown, max(0, self.cap - self._sent)) or ""
            size = len(shown.encode("utf-8", "surrogatepass"))
            self._done = True
            self._chunks, self._chars = [], 0
        self._sent += size
        self._last = asyncio.get_running_loop().time()
        state, call = self.state, self.call
        await self.session.emit(ToolOutputDelta(step=state.step, index=call.index, call_id=call.call_id,
                                                text=shown, cut=cut))


def _count(chars: int, token_ids: list[int], reported: int | None) -> int:
    if reported is not None:
        return reported
    if token_ids:
        return len(token_ids)
    return math.ceil(chars / 4)


async def _aclose(stream: Any) -> None:
    close = getattr(stream, "aclose", None)
    if close is not None:
        await close()
