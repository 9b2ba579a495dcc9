"""An event as the session log stores it: its ``seq`` and its JSON line, encoded once.

:class:`StoredEvent` carries the line (:func:`agent.events.event_to_json`, the
row's ``body``) to every reader, and the event itself. :func:`serialised`
encodes an event for storing; one that cannot be encoded is stored as its
:func:`stand_in`, an ``error`` event with the same ``seq``, session, turn and time.

Not guaranteed: a line written by an older version parses with today's
defaults for fields it lacks.
"""

from __future__ import annotations

import math
import time

from agent.events import ErrorEvent, Event, event_from_json, event_to_json


class StoredEvent:
    """An event as the log holds it: its ``seq`` and JSON line (``event_to_json``, the
    row's body, what clients are sent), and the event itself -- given when it was just
    written, else parsed from the line the first time :attr:`event` is read.

    Not guaranteed: a line written by an older version parses with today's defaults
    for fields it lacks, so ``event`` may hold fields the line does not."""

    __slots__ = ("seq", "json", "_event")

    def __init__(self, seq: int, json: str, event: Event | None = None) -> None:
        self.seq = seq
        self.json = json
        self._event = event

    @property
    def event(self) -> Event:
        if self._event is None:
            self._event = event_from_json(self.json)
        return self._event

    def __repr__(self) -> str:
        return f"StoredEvent(seq={self.seq}, json={self.json[:80]!r})"


def stand_in(event: Event, why: str) -> ErrorEvent:
    """The ``error`` event stored in place of ``event``: same ``seq``, session, turn and
    time (the current time if ``event.ts`` is not a finite number)."""
    ts = event.ts if isinstance(event.ts, (int, float)) and math.isfinite(event.ts) else time.time()
    return ErrorEvent(
        seq=event.seq, session_id=event.session_id, turn=event.turn, ts=ts, source="session",
        message=f"event seq {event.seq} ({event.type}) could not be stored and was replaced by this error: {why}"[:2000],
    )


def serialised(event: Event) -> StoredEvent:
    """``event`` and its JSON line; its :func:`stand_in` (and that one's line) if it cannot be encoded."""
    try:
        return StoredEvent(event.seq, event_to_json(event), event)
    except (ValueError, TypeError) as exc:  # PydanticSerializationError is a ValueError
        replacement = stand_in(event, f"{type(exc).__name__}: {exc}")
        return StoredEvent(replacement.seq, event_to_json(replacement), replacement)
