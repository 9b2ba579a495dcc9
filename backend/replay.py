"""Replay for support staff: view, re-execute, branch.

Re-execution restores the session's starting workspace and feeds the recorded
model outputs, turn by turn, through the same ``Session``, parser, executor
and tools (the scripted policy), then compares every tool result with the
recording, call by call (calls are matched by their deterministic
``call_id``). Deterministic tools give identical results; what differs is
what the report is for (a changed tool, an environment difference, a
nondeterministic command).

Sessions are built by :func:`agent.runtime.build_session` from the same
parts as the original (sandbox, search index), so the model sees the same
tool set; each recorded turn runs with its own scripted policy and a step
limit of its recorded length, passed to ``run_turn`` (the session's own
policy and limits are what a branch continues with).

External tools (an MCP server's, recorded in the session's ``source`` as
``external_tools``) are not called again: their calls are answered from the
recording (:mod:`agent.recorded_tools`) and reported as ``recorded``, so a
replay needs no server up and repeats no side effect outside the workspace.

Not guaranteed: results of calls that were cancelled in the recording (an
interrupt, a crash) are compared against the cancellation message, so they
show as differing; network-dependent or time-dependent commands differ.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
from typing import Any

from agent.events import (
    AssistantMessage,
    Event,
    FeedbackEvent,
    FileEditEvent,
    ListSink,
    ToolCallStarted,
    ToolResultEvent,
    UserMessage,
)
from agent.policies.scripted import ScriptedPolicy
from agent.policy import Policy, PolicyChunk
from agent.prompt import RenderedPrompt
from agent.runtime import SessionParts, build_session
from agent.session import Limits, Session
from tools.workspace import WorkspaceError


@dataclass(frozen=True, slots=True)
class RecordedTurn:
    user_text: str | None  # None: a continuation without a user message
    outputs: list[str]
    reverts: list[FeedbackEvent] = field(default_factory=list)  # files the user reverted after this turn


def recorded_turns(events: list[Event]) -> list[RecordedTurn]:
    """The user messages and model outputs of each turn, in order, and the reverts after each."""
    turns: dict[int, RecordedTurn] = {}
    for e in events:
        if isinstance(e, UserMessage):
            turns[e.turn] = RecordedTurn(e.text, [])
        elif isinstance(e, AssistantMessage):
            turns.setdefault(e.turn, RecordedTurn(None, [])).outputs.append(e.text)
        elif isinstance(e, FeedbackEvent) and e.verdict == "revert" and e.turn in turns:
            turns[e.turn].reverts.append(e)  # a revert waits for the turn to end: it comes after it
    return [turns[t] for t in sorted(turns)]


class RecordedThen:
    """A turn's policy for a branch cut inside a turn: the recorded outputs first (one per
    model call, as :class:`ScriptedPolicy` streams them), then ``then`` — so the recorded
    steps and the continuation are one turn, started by the turn's own user message."""

    def __init__(self, recorded: list[str], then: Policy):
        self.recorded = ScriptedPolicy(recorded, chunk_chars=256)
        self.then = then
        self.name = then.name

    def stream(self, prompt: RenderedPrompt) -> AsyncIterator[PolicyChunk]:
        if self.recorded.remaining:
            return self.recorded.stream(prompt)
        return self.then.stream(prompt)

    async def aclose(self) -> None:
        """The continuation's policy is the session's own: the session closes it."""


@dataclass(frozen=True, slots=True)
class Continuation:
    """The turn a branch starts after its re-executed steps: ``user_text`` (the recorded
    turn's message, or None for a turn the recording had without one) and the outputs of
    a cut turn's recorded steps, replayed at its start."""

    user_text: str | None
    recorded: list[str]
    only_if_tool_results: bool = False  # at the recording's end: continue only if the model owes an answer

    def policy(self, branch_policy: Policy) -> Policy:
        """The policy for the continued turn."""
        return RecordedThen(self.recorded, branch_policy) if self.recorded else branch_policy


@dataclass(frozen=True, slots=True)
class BranchPlan:
    """How a branch at ``step`` runs: ``recorded`` turns re-executed before the branch exists
    for clients, then ``continuation`` (None: the branch waits for a message)."""

    recorded: list[RecordedTurn]
    continuation: Continuation | None


def plan_branch(turns: list[RecordedTurn], step: int, *, auto_continue: bool = True) -> BranchPlan:
    """Split a recording for a branch after its first ``step`` model outputs.

    * ``step`` at a turn boundary (0 included): the turns before it are re-executed and,
      with ``auto_continue``, the next recorded turn starts over with its user message and
      the branch's policy (a branch from step 0 re-asks the first request).
    * ``step`` inside a turn: the turns before it are re-executed; with ``auto_continue``
      the cut turn then runs as one turn — its user message, its first recorded steps, then
      the branch's policy (:class:`RecordedThen`); without, the cut turn is re-executed up
      to ``step`` and stops there (``max_steps``).
    """
    if step < 0:
        raise ValueError("step must be >= 0")
    done: list[RecordedTurn] = []
    left = step
    for t in turns:
        if left == 0:  # a boundary before this turn
            return BranchPlan(done, Continuation(t.user_text, []) if auto_continue else None)
        if left < len(t.outputs):  # inside this turn
            if not auto_continue:
                return BranchPlan([*done, RecordedTurn(t.user_text, t.outputs[:left])], None)
            return BranchPlan(done, Continuation(t.user_text, t.outputs[:left]))
        done.append(t)
        left -= len(t.outputs)
    if left > 0:
        raise ValueError(f"step {step} is past the recording's {step - left} model outputs")
    # the recording's end: continue only where the model owes an answer (its last step called tools)
    return BranchPlan(done, Continuation(None, [], only_if_tool_results=True) if auto_continue else None)


def branch_consumed(policy: dict[str, Any], turns: list[RecordedTurn], step: int) -> int:
    """Outputs a branch's scripted policy has already "used": ``step`` when its outputs begin
    with the recording's first ``step`` outputs (the session's own script, e.g. the demo:
    the branch continues the script instead of restarting it), else 0. What a restarted
    server computes too (``consumed`` = the outputs in the log)."""
    if policy.get("kind") != "scripted":
        return 0
    recorded = [o for t in turns for o in t.outputs][:step]
    outputs = policy.get("outputs") or []
    return step if step and list(outputs[:step]) == recorded else 0


@dataclass(slots=True)
class CallComparison:
    """One call, recorded vs replayed. Outputs and edits are given only where they differ (or one side is
    missing); ``differs_in`` names what differs: ``ok``, ``output``, ``edits``."""

    call_id: str
    name: str | None
    status: str  # same | differs | missing | extra | recorded (an external tool's, not run again)
    recorded_ok: bool | None = None
    replayed_ok: bool | None = None
    recorded_output: str | None = None
    replayed_output: str | None = None
    turn: int | None = None
    step: int | None = None
    index: int | None = None
    args: dict[str, Any] | None = None
    recorded_duration_ms: float | None = None
    replayed_duration_ms: float | None = None
    differs_in: list[str] = field(default_factory=list)
    recorded_edits: list[str] | None = None  # the call's file_edit diffs
    replayed_edits: list[str] | None = None


@dataclass(slots=True)
class ReexecuteReport:
    session_id: str
    calls: list[CallComparison] = field(default_factory=list)
    reverts: list[ReplayedRevert] = field(default_factory=list)

    @property
    def counts(self) -> dict[str, int]:
        out = {"same": 0, "differs": 0, "missing": 0, "extra": 0}
        for c in self.calls:
            out[c.status] = out.get(c.status, 0) + 1  # "recorded" only appears when there are some
        return out

    def to_json(self) -> dict[str, Any]:
        return {"session_id": self.session_id, "counts": self.counts, "calls": [asdict(c) for c in self.calls],
                "reverts": [asdict(r) for r in self.reverts]}


@dataclass(slots=True)
class ReplayedRevert:
    """A recorded revert, re-applied after its turn: ``ok`` False when the replayed workspace did not
    have that change (``detail`` says why), so the replay's later turns may differ from the recording."""

    turn: int
    path: str
    ok: bool
    detail: str = ""


async def run_recording(turns: list[RecordedTurn], session: Session) -> list[ReplayedRevert]:
    """Drive ``session`` through recorded turns: each turn gets its own scripted
    policy and a step limit of its length, as ``run_turn`` arguments, so the
    session's own policy and limits are untouched (a branch continues with them).
    After each turn, the files the user reverted then are reverted again (each recorded
    as a ``feedback`` event, as in the recording); returns how each went."""
    done: list[ReplayedRevert] = []
    for turn in turns:
        await session.run_turn(turn.user_text, policy=ScriptedPolicy(turn.outputs, chunk_chars=256),
                               limits=Limits(max_steps=max(1, len(turn.outputs))))
        for fb in turn.reverts:
            done.append(await _revert_again(session, fb))
    return done


async def _revert_again(session: Session, fb: FeedbackEvent) -> ReplayedRevert:
    path = fb.path or ""
    revert = getattr(session.workspace, "revert", None)
    if revert is None:
        return ReplayedRevert(fb.turn, path, False, "this workspace cannot revert files")
    try:
        edit = await asyncio.to_thread(revert, path)
    except (WorkspaceError, OSError) as exc:
        return ReplayedRevert(fb.turn, path, False, str(exc))
    if session.ctx.search_index is not None:
        session.ctx.search_index.notify_edits([edit.path])
    await session.emit(FeedbackEvent(target="file", path=path, verdict="revert", comment=fb.comment, by=fb.by,
                                     diff=edit.diff))
    return ReplayedRevert(fb.turn, path, True)


def compare(session_id: str, recorded: list[Event], replayed: list[Event]) -> ReexecuteReport:
    """Every call of either side, matched by ``call_id``, in call order: its result (ok, output) and its
    file edits (diffs) compared."""
    old, new = _calls(recorded), _calls(replayed)
    report = ReexecuteReport(session_id)
    for call_id in sorted(old.keys() | new.keys(), key=_call_order):
        a, b = old.get(call_id), new.get(call_id)
        first = a or b
        assert first is not None
        c = CallComparison(call_id, first.result.name, "same", turn=first.result.turn, step=first.result.step,
                           index=first.result.index, args=first.args)
        if a is not None:
            c.recorded_ok, c.recorded_duration_ms = a.result.ok, a.result.duration_ms
        if b is not None:
            c.replayed_ok, c.replayed_duration_ms = b.result.ok, b.result.duration_ms
        if a is None or b is None:
            c.status = "extra" if a is None else "missing"
        else:
            c.differs_in = [what for what, x, y in (("ok", a.result.ok, b.result.ok),
                                                    ("output", a.result.output, b.result.output),
                                                    ("edits", a.edits, b.edits)) if x != y]
            # an external (MCP) tool's call is answered from the recording, not run again
            c.status = "differs" if c.differs_in else "recorded" if b.result.data.get("from_recording") else "same"
        if c.status not in ("same", "recorded"):
            c.recorded_output, c.recorded_edits = (a.result.output, a.edits) if a is not None else (None, None)
            c.replayed_output, c.replayed_edits = (b.result.output, b.edits) if b is not None else (None, None)
        report.calls.append(c)
    return report


@dataclass(slots=True)
class _Call:
    result: ToolResultEvent
    args: dict[str, Any] | None
    edits: list[str]


def _calls(events: list[Event]) -> dict[str, _Call]:
    args = {e.call_id: dict(e.args) for e in events if isinstance(e, ToolCallStarted)}
    out = {e.call_id: _Call(e, args.get(e.call_id), []) for e in events if isinstance(e, ToolResultEvent)}
    for e in events:
        if isinstance(e, FileEditEvent) and e.call_id in out:
            out[e.call_id].edits.append(e.diff)
    return out


def _call_order(call_id: str) -> tuple[int, ...]:
    # t{turn}s{step}c{index}
    try:
        t, rest = call_id[1:].split("s", 1)
        s, c = rest.split("c", 1)
        return (int(t), int(s), int(c))
    except ValueError:
        return (1 << 30,)


async def reexecute(session_id: str, events: list[Event], parts: SessionParts) -> ReexecuteReport:
    """Re-run the recorded model outputs of ``events`` on ``parts`` (a fresh copy of
    the starting workspace) and compare every tool result with the recording."""
    sink = ListSink()
    from agent.approval import recorded_decisions

    # each turn brings its own policy; recorded approval answers are re-applied (a refused call stays refused)
    session = build_session(parts, policy=ScriptedPolicy([]), sink=sink, recorded_approvals=recorded_decisions(events))
    reverts = await run_recording(recorded_turns(events), session)
    report = compare(session_id, events, sink.events)
    report.reverts = reverts
    return report


def timeline(events: list[Event]) -> list[dict[str, Any]]:
    """Events in order with their offset from the first one (seconds)."""
    if not events:
        return []
    t0 = events[0].ts
    return [{"t": round(e.ts - t0, 6), **e.model_dump(mode="json")} for e in events]
