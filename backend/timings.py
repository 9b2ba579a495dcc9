"""When each model call and tool call of a recorded session ran: the bars of the replay view.

:func:`call_timings` reads a session's events once (no I/O) and returns, per
tool call, when it was dispatched (``tool_call_started``), when it really
started running (``tool_call_running`` after a queue or an approval, else the
dispatch), when it ended (``tool_result``), its arguments, result and file
edits; and per model call (step) when the model was asked (the time of the
event before the step's first one: the turn's start or the previous step's
last result) and when its ``assistant_message`` came. Times are seconds since the session's first event
(``t0``), as ``GET /v1/sessions/{id}/timeline`` gives them, so the two views
line up.

Not guaranteed: times are the events' ``ts`` (when the server created the
event), so a bar starts when the call was parsed and dispatched, not when the
sandboxed process was spawned; ``duration_ms`` (the tool's own measure) can be
a little shorter than ``ended_t - running_t``. A call of a turn the log left
open (a crash not yet recovered) has ``ended_t`` None.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, Field

from agent.events import (
    ApprovalRequested,
    ApprovalResolved,
    AssistantMessage,
    Event,
    FileEditEvent,
    ToolCallQueued,
    ToolCallRunning,
    ToolCallStarted,
    ToolOutputDelta,
    ToolResultEvent,
)


class Approval(BaseModel):
    requested_t: float
    kind: str = Field(description="command or edit")
    resolved_t: float | None = Field(None, description="None: never answered (the turn ended first)")
    approved: bool | None = None
    reason: str = ""
    by: str | None = Field(None, description="user, or recording (replay re-applied the recorded answer)")


class Edit(BaseModel):
    seq: int
    path: str
    diff: str = Field(description="unified diff (empty when outputs=false)")
    created: bool
    deleted: bool


class CallTiming(BaseModel):
    call_id: str
    turn: int
    step: int
    index: int
    name: str | None
    args: dict[str, Any]
    valid: bool = Field(description="false: the call was rejected before it ran (its error is the output)")
    started_seq: int = Field(description="seq of its tool_call_started")
    started_t: float = Field(description="dispatched (parsed complete), seconds since t0")
    running_t: float | None = Field(None, description="started running: = started_t unless it was queued or "
                                    "awaited approval; None if it never ran")
    ended_t: float | None = Field(None, description="its tool_result; None while it runs")
    result_seq: int | None = None
    ok: bool | None = None
    output: str | None = Field(None, description="what the model read (None when outputs=false or still running)")
    data: dict[str, Any] = Field(default_factory=dict)
    duration_ms: float | None = Field(None, description="how long the tool ran (its own measure)")
    queued_for: list[str] = Field(default_factory=list, description="call ids it waited for")
    approval: Approval | None = None
    output_deltas: int = Field(0, description="tool_output_delta events it streamed")
    edits: list[Edit] = Field(default_factory=list)


class StepTiming(BaseModel):
    turn: int
    step: int
    started_t: float = Field(description="when the model was asked (the event before the step's first one)")
    ended_t: float | None = Field(None, description="its assistant_message; None if the step never finished")
    output_tokens: int = 0
    finish_reason: str | None = None
    calls: list[str] = Field(default_factory=list, description="its call ids, in dispatch order")


class Timings(BaseModel):
    t0: float = Field(description="Unix time of the session's first event; every *_t is seconds after it")
    calls: list[CallTiming]
    steps: list[StepTiming]


def call_timings(events: Sequence[Event], *, outputs: bool = True) -> Timings:
    """The call and step bars of ``events`` (one session's, in ``seq`` order); ``outputs=False``
    leaves results' ``output`` and edits' ``diff`` out (a lighter answer for drawing)."""
    t0 = events[0].ts if events else 0.0
    calls: dict[str, CallTiming] = {}
    steps: dict[tuple[int, int], StepTiming] = {}

    def t(e: Event) -> float:
        return round(e.ts - t0, 6)

    prev = 0.0
    for e in events:
        step = getattr(e, "step", None)
        if isinstance(step, int) and (e.turn, step) not in steps:
            steps[(e.turn, step)] = StepTiming(turn=e.turn, step=step, started_t=prev)  # the model was asked after the event before
        prev = t(e)
        if isinstance(e, ToolCallStarted):
            calls[e.call_id] = CallTiming(call_id=e.call_id, turn=e.turn, step=e.step, index=e.index, name=e.name,
                                          args=dict(e.args), valid=e.valid, started_seq=e.seq, started_t=t(e),
                                          running_t=t(e))
            steps[(e.turn, e.step)].calls.append(e.call_id)
            continue
        call = calls.get(getattr(e, "call_id", ""))
        if isinstance(e, AssistantMessage):
            s = steps[(e.turn, e.step)]
            s.ended_t, s.output_tokens, s.finish_reason = t(e), e.output_tokens, e.finish_reason
        elif call is None:
            continue
        elif isinstance(e, ToolCallQueued):
            call.running_t, call.queued_for = None, list(e.waiting_for)
        elif isinstance(e, ApprovalRequested):
            call.running_t, call.approval = None, Approval(requested_t=t(e), kind=e.kind)
        elif isinstance(e, ApprovalResolved) and call.approval is not None:
            call.approval.resolved_t, call.approval.approved = t(e), e.approved
            call.approval.reason, call.approval.by = e.reason, e.by
        elif isinstance(e, ToolCallRunning):
            call.running_t = t(e)
        elif isinstance(e, ToolOutputDelta):
            call.output_deltas += 1
        elif isinstance(e, ToolResultEvent):
            call.ended_t, call.result_seq, call.ok, call.duration_ms = t(e), e.seq, e.ok, e.duration_ms
            call.output, call.data = (e.output if outputs else None), dict(e.data)
        elif isinstance(e, FileEditEvent):
            call.edits.append(Edit(seq=e.seq, path=e.path, diff=e.diff if outputs else "", created=e.created,
                                   deleted=e.deleted))
    return Timings(t0=t0, calls=list(calls.values()), steps=list(steps.values()))
