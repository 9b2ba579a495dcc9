"""Rebuild a session's conversation from its event log.

The server uses this to resume a session after a restart; replay uses it to
recover the recorded model outputs. The rebuilt conversation equals the one
the live ``Session`` held, because the session records every message it adds
(including partial output and cancelled calls of an interrupted step) as
events.

A turn the log left open (the server was killed mid-turn) is closed by
:func:`closing_events`: the events the session would have written had it
stopped cleanly, rebuilt from what was persisted.

Not guaranteed: the partial ``assistant_message`` that recovery rebuilds for a
step cut off by a crash is the model's visible text and its tool calls
re-encoded canonically (``encode_call``) from the persisted deltas, not its
raw bytes; a call whose closing tag never arrived is left out (it never ran).
Its token ids and logprobs are lost with the process.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from agent.calls import render_results
from agent.events import (
    AssistantDelta,
    AssistantMessage,
    Event,
    ToolCallDelta,
    ToolCallStarted,
    ToolResultEvent,
    TurnEnd,
    UserMessage,
)
from agent.parser import encode_call
from agent.prompt import Message
from tools.base import ToolResult


@dataclass(slots=True)
class History:
    conversation: list[Message] = field(default_factory=list)
    last_seq: int = 0
    turns: int = 0
    # model outputs per turn, in order: [(turn, step, text)]
    outputs: list[tuple[int, int, str]] = field(default_factory=list)
    # per message of ``conversation``: the seq of the event it comes from (a tool message: its step's last result)
    seqs: list[int] = field(default_factory=list)


def history_from_events(events: Iterable[Event]) -> History:
    h = History()
    pending: dict[tuple[int, int], dict[int, ToolResultEvent]] = {}
    order: list[tuple[int, int]] = []  # steps with an assistant message, in order
    seq_of: dict[tuple[int, int], int] = {}  # user message (turn, -1) / assistant message (turn, step) -> seq

    for e in events:
        h.last_seq = max(h.last_seq, e.seq)
        h.turns = max(h.turns, e.turn)
        if isinstance(e, UserMessage):
            order.append((e.turn, -1))
            pending[(e.turn, -1)] = {}
            seq_of[(e.turn, -1)] = e.seq
            h.conversation.append(Message("user", e.text))  # placeholder position kept by order
        elif isinstance(e, AssistantMessage):
            order.append((e.turn, e.step))
            pending.setdefault((e.turn, e.step), {})
            seq_of[(e.turn, e.step)] = e.seq
            h.outputs.append((e.turn, e.step, e.text))
        elif isinstance(e, ToolResultEvent):
            pending.setdefault((e.turn, e.step), {})[e.index] = e

    conversation: list[Message] = []
    users = iter(m for m in h.conversation)
    texts = iter(h.outputs)
    for key in order:
        if key[1] == -1:
            conversation.append(next(users))
            h.seqs.append(seq_of[key])
            continue
        _, _, text = next(texts)
        conversation.append(Message("assistant", text))
        h.seqs.append(seq_of[key])
        results = pending.get(key) or {}
        if results:
            rendered = [(r.name, i, ToolResult(r.ok, r.output)) for i, r in sorted(results.items())]
            conversation.append(Message("tool", render_results(rendered)))
            h.seqs.append(max(r.seq for r in results.values()))
    h.conversation = conversation
    return h


CRASH_CANCELLED = (
    "cancelled: the server stopped while this call was running; it may or may not have taken effect "
    "(check the workspace before repeating it)"
)


def closing_events(events: Sequence[Event], *, detail: str = "the server stopped during this turn") -> list[Event]:
    """What closes a turn the log left open, as the session would have closed it.

    For the log's last turn, when it has no ``turn_end``: an aborted
    ``assistant_message`` for each step that streamed but has none (rebuilt
    from its deltas), a cancelled ``tool_result`` for every started call with
    no result, and a ``turn_end`` (reason ``shutdown``) with the true step
    count and output tokens. Seqs continue the log's. Empty when the last
    turn is closed.
    """
    if not events:
        return []
    last = events[-1]
    turn = [e for e in events if e.turn == last.turn]
    if any(isinstance(e, TurnEnd) for e in turn):  # closed (events a driver adds after turn_end, e.g. feedback, count)
        return []
    recorded = {e.step for e in turn if isinstance(e, AssistantMessage)}
    streamed = {e.step for e in turn if isinstance(e, AssistantDelta | ToolCallDelta | ToolCallStarted
                                                  | ToolResultEvent | AssistantMessage)}
    out: list[Event] = []
    for step in sorted(streamed - recorded):
        text = _partial_text([e for e in turn if getattr(e, "step", None) == step])
        out.append(AssistantMessage(step=step, text=text, output_tokens=math.ceil(len(text) / 4),
                                    finish_reason="aborted"))
    answered = {e.call_id for e in turn if isinstance(e, ToolResultEvent)}
    for e in turn:
        if isinstance(e, ToolCallStarted) and e.call_id not in answered:
            out.append(ToolResultEvent(step=e.step, index=e.index, call_id=e.call_id, name=e.name, ok=False,
                                       output=CRASH_CANCELLED))
    messages = [e for e in turn if isinstance(e, AssistantMessage)] + [e for e in out if isinstance(e, AssistantMessage)]
    out.append(TurnEnd(reason="shutdown", steps=max(streamed, default=0),
                       output_tokens=sum(m.output_tokens for m in messages), detail=detail))
    return [e.model_copy(update={"seq": last.seq + i, "session_id": last.session_id, "turn": last.turn})
            for i, e in enumerate(out, start=1)]


def _partial_text(step_events: Sequence[Event]) -> str:
    """A step's model output from its persisted deltas: visible text in order,
    each call re-encoded where it began; calls never closed are dropped."""
    pieces: list[str] = []
    where: dict[int, int] = {}  # call index -> its slot in pieces
    params: dict[int, dict[str, str]] = {}
    names: dict[int, str | None] = {}
    started: set[int] = set()
    for e in step_events:
        if isinstance(e, AssistantDelta):
            pieces.append(e.text)
        elif isinstance(e, ToolCallDelta | ToolCallStarted):
            if e.index not in where:
                where[e.index] = len(pieces)
                pieces.append("")
            names[e.index] = e.name or names.get(e.index)
            if isinstance(e, ToolCallDelta):
                body = params.setdefault(e.index, {})
                body[e.param] = body.get(e.param, "") + e.text
            else:
                started.add(e.index)
    for index, slot in where.items():
        if index in started:
            pieces[slot] = encode_call(names.get(index) or "", params.get(index, {}))
    return "".join(pieces)
