"""The one typed event stream (see ``docs/protocol.md``).

Every step of a session is an event: the server persists and streams them,
RL records them as trajectories, replay reads them back. Events are pydantic
models forming one union discriminated by ``type``; ``seq`` is per session,
starts at 1 and increases by one per event.

Clients must ignore event types they do not know. Field additions are
backwards compatible; renames and removals are not.

Every event is JSON-serialisable by construction: a validator on the base
class passes every field value -- strings, and recursively the contents of
``args``/``data`` -- through :func:`agent.text_safety.json_safe_value`, so a
lone surrogate (a file name with byte ``\\xff``, decoded with
``surrogateescape``) is stored as the visible text ``\\xff`` and any other lone
surrogate as U+FFFD (see ``docs/protocol.md``). ``model_copy(update=...)``
cleans its updates the same way.

Not guaranteed: ``model_construct`` skips validation, so an event built that
way may still hold unserialisable text; the server's writer
(``backend.db.log``) replaces such an event by an ``error`` event with its
``seq`` rather than losing the events around it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal, Protocol, Self, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

from agent.text_safety import escape_json_text, json_safe_value


class _Event(BaseModel):
    # Unknown fields are ignored so that a newer writer's additions do not
    # break an older reader (the documented compatibility rule).
    model_config = ConfigDict(extra="ignore", frozen=True)

    seq: int = 0
    session_id: str = ""
    ts: float = Field(default_factory=time.time)
    turn: int = 0

    @model_validator(mode="before")
    @classmethod
    def _json_safe(cls, data: Any) -> Any:
        # On the base class, so a field added to any event later is covered too.
        if isinstance(data, Mapping):
            return {k: json_safe_value(v) for k, v in data.items()}
        return data

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy with ``update`` applied; updates are made JSON-safe like constructor input
        (pydantic does not validate them)."""
        safe = None if update is None else {k: json_safe_value(v) for k, v in update.items()}
        return super().model_copy(update=safe, deep=deep)


class UserMessage(_Event):
    type: Literal["user_message"] = "user_message"
    text: str


class TurnStarted(_Event):
    type: Literal["turn_started"] = "turn_started"


class AssistantDelta(_Event):
    """Assistant text outside tool calls, as it streams."""

    type: Literal["assistant_delta"] = "assistant_delta"
    step: int
    text: str


class ToolCallDelta(_Event):
    """Part of a parameter of a call that is still streaming (for live previews)."""

    type: Literal["tool_call_delta"] = "tool_call_delta"
    step: int
    index: int
    name: str
    param: str
    text: str


class ToolCallStarted(_Event):
    """A complete call was parsed and dispatched (valid or not)."""

    type: Literal["tool_call_started"] = "tool_call_started"
    step: int
    index: int
    call_id: str
    name: str | None
    args: dict[str, Any]
    valid: bool = True


class ToolCallQueued(_Event):
    """A dispatched call waits for earlier calls it conflicts with (``waiting_for``:
    their call ids); it has not started. ``tool_call_running`` follows when it does."""

    type: Literal["tool_call_queued"] = "tool_call_queued"
    step: int
    index: int
    call_id: str
    waiting_for: list[str] = Field(default_factory=list)


class ToolCallRunning(_Event):
    """A call that was queued or waited for approval has started. A call with
    neither is running from its ``tool_call_started``; no event says so again."""

    type: Literal["tool_call_running"] = "tool_call_running"
    step: int
    index: int
    call_id: str


class ToolOutputDelta(_Event):
    """Output a running call printed (a command's merged stdout and stderr), as it comes.

    Coalesced: at most one per call every ``Limits.output_delta_interval_s``.
    Capped: at most ``Limits.max_live_output_bytes`` of text per call; the
    delta that reaches the cap has ``cut: true`` and none follow. The call's
    ``tool_result`` (which comes after its last delta) holds what the model
    reads; the deltas are for watching. How text is split between deltas is
    not guaranteed.
    """

    type: Literal["tool_output_delta"] = "tool_output_delta"
    step: int
    index: int
    call_id: str
    text: str
    cut: bool = False


class ApprovalRequested(_Event):
    """The session asks the user before it runs a call (approval modes,
    ``agent.approval``). ``kind`` is ``command`` (run_command) or ``edit``
    (a file tool that writes). Settled by ``approval_resolved`` or, if the turn
    ends first, by the call's cancelled ``tool_result``."""

    type: Literal["approval_requested"] = "approval_requested"
    step: int
    index: int
    call_id: str
    name: str | None
    args: dict[str, Any] = Field(default_factory=dict)
    kind: Literal["command", "edit"] = "command"


class ApprovalResolved(_Event):
    """The answer to an ``approval_requested``: ``approved`` or not, the user's
    ``reason`` (may be empty) and who answered: ``user``, or ``recording``
    (replay and branches re-apply a recorded answer)."""

    type: Literal["approval_resolved"] = "approval_resolved"
    step: int
    index: int
    call_id: str
    approved: bool
    reason: str = ""
    by: Literal["user", "recording"] = "user"


class ToolResultEvent(_Event):
    """A call ended. ``duration_ms`` is how long the tool ran (not the time it
    was queued or awaited approval); a call cancelled while running keeps the
    time it ran and its output so far (``data.cancelled``, ``data.partial_output``)."""

    type: Literal["tool_result"] = "tool_result"
    step: int
    index: int
    call_id: str
    name: str | None
    ok: bool
    output: str
    data: dict[str, Any] = Field(default_factory=dict)
    duration_ms: float = 0.0


class FileEditEvent(_Event):
    type: Literal["file_edit"] = "file_edit"
    call_id: str
    path: str
    diff: str
    created: bool = False
    deleted: bool = False


class AssistantMessage(_Event):
    """The complete raw model output of one step (what replay feeds back).

    ``token_ids``/``logprobs`` are filled by local policies (token-in/token-out
    for RL) and empty for remote ones.
    """

    type: Literal["assistant_message"] = "assistant_message"
    step: int
    text: str
    token_ids: list[int] = Field(default_factory=list)
    logprobs: list[float] = Field(default_factory=list)
    output_tokens: int = 0
    finish_reason: str | None = None


class TurnEnd(_Event):
    type: Literal["turn_end"] = "turn_end"
    reason: Literal["completed", "max_steps", "max_tokens", "timeout", "interrupted", "shutdown", "error"]
    steps: int
    output_tokens: int
    detail: str = ""


class ErrorEvent(_Event):
    type: Literal["error"] = "error"
    message: str
    source: Literal["policy", "tool", "session"] = "session"


class FeedbackEvent(_Event):
    """A person's feedback on the session, recorded by the server (not by the agent loop)
    between or during turns: a rating of turn ``of_turn`` (``target`` turn, ``rating`` up or
    down) or a verdict on a file the session changed (``target`` file, ``path``, ``verdict``
    keep or revert), with an optional ``comment``, given by ``by``. A revert put the file back
    as it was when the session started: ``diff`` is what it changed in the workspace (empty
    otherwise). The model is not told of feedback (replay re-applies recorded reverts)."""

    type: Literal["feedback"] = "feedback"
    target: Literal["turn", "file"]
    of_turn: int | None = None
    path: str | None = None
    rating: Literal["up", "down"] | None = None
    verdict: Literal["keep", "revert"] | None = None
    comment: str = ""
    by: str = ""
    diff: str = ""


Event = Annotated[
    UserMessage
    | TurnStarted
    | AssistantDelta
    | ToolCallDelta
    | ToolCallStarted
    | ToolCallQueued
    | ToolCallRunning
    | ToolOutputDelta
    | ApprovalRequested
    | ApprovalResolved
    | ToolResultEvent
    | FileEditEvent
    | AssistantMessage
    | TurnEnd
    | ErrorEvent
    | FeedbackEvent,
    Field(discriminator="type"),
]

EVENT_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)


KNOWN_TYPES = frozenset(
    cls.model_fields["type"].default
    for cls in (UserMessage, TurnStarted, AssistantDelta, ToolCallDelta, ToolCallStarted, ToolCallQueued,
                ToolCallRunning, ToolOutputDelta, ApprovalRequested, ApprovalResolved, ToolResultEvent,
                FileEditEvent, AssistantMessage, TurnEnd, ErrorEvent, FeedbackEvent)
)


def event_from_json(data: str | bytes) -> Event:
    """Parse one event; raises ``pydantic.ValidationError`` on a malformed or
    unknown one (see :func:`event_from_json_or_none` for readers that skip)."""
    return EVENT_ADAPTER.validate_json(data)


def event_from_json_or_none(data: str | bytes) -> Event | None:
    """Parse an event, or return None for a type this version does not know."""
    import json

    if json.loads(data).get("type") not in KNOWN_TYPES:
        return None
    return EVENT_ADAPTER.validate_json(data)


def event_to_json(event: Event) -> str:
    """The event as one line of JSON (the log's body, ``--json``, the WebSocket).

    Exact: parsing it gives the same event. Characters JSON would leave raw
    but a terminal acts on (DEL, C1 and bidi controls) are written as
    ``\\uXXXX`` escapes, so the line is inert when printed. Raises
    ``pydantic_core.PydanticSerializationError`` only for an event that
    bypassed validation (``model_construct``).
    """
    return escape_json_text(event.model_dump_json())


@runtime_checkable
class EventSink(Protocol):
    """Receives every event in ``seq`` order. ``emit`` returning means "accepted":
    a persisting sink returns only once the event is durable."""

    async def emit(self, event: Event) -> None: ...


class ListSink:
    """Collects events in memory (tests, RL trajectories)."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    async def emit(self, event: Event) -> None:
        self.events.append(event)

    def of_type(self, cls: type[_Event]) -> list[Any]:
        return [e for e in self.events if isinstance(e, cls)]


class CallbackSink:
    """Calls a plain function per event (the terminal transcript, JSON lines)."""

    def __init__(self, fn: Callable[[Event], None]) -> None:
        self._fn = fn

    async def emit(self, event: Event) -> None:
        self._fn(event)


class FanoutSink:
    """Sends each event to several sinks in order (persist first, then notify)."""

    def __init__(self, *sinks: EventSink) -> None:
        self.sinks = list(sinks)

    async def emit(self, event: Event) -> None:
        for sink in self.sinks:
            await sink.emit(event)
