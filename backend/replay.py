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

Not guaranteed: results of calls that were cancelled in the recording (an
interrupt, a crash) are compared against the cancellation message, so they
show as differing; network-dependent or time-dependent commands differ.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from agent.events import AssistantMessage, Event, ListSink, ToolResultEvent, UserMessage
from agent.policies.scripted import ScriptedPolicy
from agent.runtime import SessionParts, build_session
from agent.session import Limits, Session


@dataclass(frozen=True, slots=True)
class RecordedTurn:
    user_text: str | None  # None: a continuation without a user message
    outputs: list[str]


def recorded_turns(events: list[Event]) -> list[RecordedTurn]:
    """The user messages and model outputs of each turn, in order."""
    turns: dict[int, RecordedTurn] = {}
    for e in events:
        if isinstance(e, UserMessage):
            turns[e.turn] = RecordedTurn(e.text, [])
        elif isinstance(e, AssistantMessage):
            turns.setdefault(e.turn, RecordedTurn(None, [])).outputs.append(e.text)
    return [turns[t] for t in sorted(turns)]


def truncate_at_step(turns: list[RecordedTurn], step: int) -> list[RecordedTurn]:
    """The first ``step`` model outputs (counted across turns), as turns."""
    out: list[RecordedTurn] = []
    left = step
    for t in turns:
        if left <= 0:
            break
        out.append(RecordedTurn(t.user_text, t.outputs[:left]))
        left -= len(t.outputs)
    return out


@dataclass(slots=True)
class CallComparison:
    call_id: str
    name: str | None
    status: str  # same | differs | missing | extra
    recorded_ok: bool | None = None
    replayed_ok: bool | None = None
    recorded_output: str | None = None
    replayed_output: str | None = None


@dataclass(slots=True)
class ReexecuteReport:
    session_id: str
    calls: list[CallComparison] = field(default_factory=list)

    @property
    def counts(self) -> dict[str, int]:
        out = {"same": 0, "differs": 0, "missing": 0, "extra": 0}
        for c in self.calls:
            out[c.status] += 1
        return out

    def to_json(self) -> dict[str, Any]:
        return {"session_id": self.session_id, "counts": self.counts, "calls": [asdict(c) for c in self.calls]}


async def run_recording(turns: list[RecordedTurn], session: Session) -> Session:
    """Drive ``session`` through recorded turns: each turn gets its own scripted
    policy and a step limit of its length, as ``run_turn`` arguments, so the
    session's own policy and limits are untouched (a branch continues with them)."""
    for turn in turns:
        await session.run_turn(turn.user_text, policy=ScriptedPolicy(turn.outputs, chunk_chars=256),
                               limits=Limits(max_steps=max(1, len(turn.outputs))))
    return session


def compare(session_id: str, recorded: list[Event], replayed: list[Event]) -> ReexecuteReport:
    def results(events: list[Event]) -> dict[str, ToolResultEvent]:
        return {e.call_id: e for e in events if isinstance(e, ToolResultEvent)}

    old, new = results(recorded), results(replayed)
    report = ReexecuteReport(session_id)
    for call_id in sorted(old.keys() | new.keys(), key=_call_order):
        a, b = old.get(call_id), new.get(call_id)
        if a is None:
            assert b is not None
            report.calls.append(CallComparison(call_id, b.name, "extra", None, b.ok, None, b.output))
        elif b is None:
            report.calls.append(CallComparison(call_id, a.name, "missing", a.ok, None, a.output, None))
        else:
            same = (a.ok, a.output) == (b.ok, b.output)
            report.calls.append(CallComparison(
                call_id, a.name, "same" if same else "differs", a.ok, b.ok,
                None if same else a.output, None if same else b.output,
            ))
    return report


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
    session = build_session(parts, policy=ScriptedPolicy([]), sink=sink)  # each turn brings its own policy
    await run_recording(recorded_turns(events), session)
    return compare(session_id, events, sink.events)


def timeline(events: list[Event]) -> list[dict[str, Any]]:
    """Events in order with their offset from the first one (seconds)."""
    if not events:
        return []
    t0 = events[0].ts
    return [{"t": round(e.ts - t0, 6), **e.model_dump(mode="json")} for e in events]
