"""Rebuild a session's conversation from its event log.

The server uses this to resume a session after a restart; replay uses it to
recover the recorded model outputs. The rebuilt conversation equals the one
the live ``Session`` held, because the session records every message it adds
(including partial output and cancelled calls of an interrupted step) as
events.

Not guaranteed: a step cut off by a crash before its ``assistant_message``
was recorded is left out (the model's partial output is lost with it).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from agent.calls import render_results
from agent.events import AssistantMessage, Event, ToolResultEvent, UserMessage
from agent.prompt import Message
from tools.base import ToolResult


@dataclass(slots=True)
class History:
    conversation: list[Message] = field(default_factory=list)
    last_seq: int = 0
    turns: int = 0
    # model outputs per turn, in order: [(turn, step, text)]
    outputs: list[tuple[int, int, str]] = field(default_factory=list)


def history_from_events(events: Iterable[Event]) -> History:
    h = History()
    pending: dict[tuple[int, int], dict[int, ToolResultEvent]] = {}
    order: list[tuple[int, int]] = []  # steps with an assistant message, in order

    for e in events:
        h.last_seq = max(h.last_seq, e.seq)
        h.turns = max(h.turns, e.turn)
        if isinstance(e, UserMessage):
            order.append((e.turn, -1))
            pending[(e.turn, -1)] = {}
            h.conversation.append(Message("user", e.text))  # placeholder position kept by order
        elif isinstance(e, AssistantMessage):
            order.append((e.turn, e.step))
            pending.setdefault((e.turn, e.step), {})
            h.outputs.append((e.turn, e.step, e.text))
        elif isinstance(e, ToolResultEvent):
            pending.setdefault((e.turn, e.step), {})[e.index] = e

    conversation: list[Message] = []
    users = iter(m for m in h.conversation)
    texts = iter(h.outputs)
    for key in order:
        if key[1] == -1:
            conversation.append(next(users))
            continue
        _, _, text = next(texts)
        conversation.append(Message("assistant", text))
        results = pending.get(key) or {}
        if results:
            rendered = [(r.name, i, ToolResult(r.ok, r.output)) for i, r in sorted(results.items())]
            conversation.append(Message("tool", render_results(rendered)))
    h.conversation = conversation
    return h
