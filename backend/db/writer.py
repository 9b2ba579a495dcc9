"""Group commit: the one thread that makes events durable before anyone sees them.

:class:`EventWriter` takes every event the server emits, commits whatever is
queued in one transaction (:meth:`backend.db.log.SessionLog.append_stored`:
one ``executemany`` per table) and only then hands each waiter its
:class:`~backend.db.log.StoredEvent` -- so "committed before any client sees
it" holds for every event, and the JSON line the log holds is the one clients
are sent. Events queued while a commit is in flight go into the next
transaction together, so throughput grows with load instead of collapsing;
a batch is stored in the order its events were queued.

Two kinds of append failure are kept apart:

* **a bad event** -- one that cannot be serialised or that the database
  refuses as a row (an integrity or data error). It never costs another
  event: it is stored as an ``error`` event with the same ``seq``
  (:func:`backend.db.log.stand_in`), found by splitting the failed batch in
  halves (a few extra transactions per bad event, none for good batches).
  Only if that stand-in is refused too (e.g. its session does not exist)
  does its waiter get :class:`EventRejected`.
* **a database failure** -- ``OperationalError``/``InterfaceError`` or a
  lost connection (disk full, database locked past the busy timeout, server
  gone). The batch is retried :data:`DB_RETRIES` times with a short backoff;
  if it still fails, nothing of the batch is committed and every waiter gets
  :class:`LogUnavailable` (the server decides: the session's turn ends in
  error). The ``seq`` numbers of those events stay unused, so the stored
  stream has a gap there.

Not guaranteed: a waiter whose event loop has closed is not told (its result
is dropped), nor is one that appended after :meth:`EventWriter.close`; the
batch size (about ``max_batch``: one loop iteration's appends are never split)
and so the commit boundaries depend on timing.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Sequence

from sqlalchemy.exc import DBAPIError, DisconnectionError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from agent.events import Event
from backend.db.log import SessionLog, StoredEvent, stand_in

DB_RETRIES = 2
"""How often a batch is retried after a database failure (backoff 0.05 s, then 0.25 s)."""
_BACKOFF_S = (0.05, 0.25)


class EventRejected(Exception):
    """Neither the event nor an ``error`` event in its place could be stored
    (e.g. its session is not in the log). No other event is affected."""


class LogUnavailable(Exception):
    """The database failed (disk full, connection lost, locked too long); the
    events of that batch were not stored. The message names the cause."""


def _why(exc: BaseException) -> str:
    # SQLAlchemy's own message repeats the SQL and every parameter (the event
    # bodies): name the driver's error only.
    orig = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
    return f"{type(orig).__name__}: {str(orig)[:500]}"


def is_database_failure(exc: BaseException) -> bool:
    """True for a failure of the database itself rather than of one row."""
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    return isinstance(exc, (OperationalError, InterfaceError, DisconnectionError, PoolTimeoutError))


_Result = StoredEvent | BaseException


class EventStore:
    """The synchronous core of :class:`EventWriter`: commit a batch with retries on a
    database failure and bisection around bad events (stored as stand-ins).

    :meth:`store` runs on the caller's thread (e.g. ``backend.rl_log``, which
    persists a finished rollout's events in one call); :class:`EventWriter`
    calls the same code from its thread.
    """

    def __init__(self, log: SessionLog) -> None:
        self.log = log
        self.commits = 0
        self.replaced = 0  # bad events stored as error events

    def store(self, events: Sequence[Event]) -> list[Event]:
        """Commit ``events``; return what was stored (stand-ins in place of bad events).

        Raises the first :class:`LogUnavailable` or :class:`EventRejected`; the
        events not affected by it are committed all the same.
        """
        results = self._store(list(events))
        for r in results:
            if isinstance(r, BaseException):
                raise r
        return [r.event for r in results]  # type: ignore[union-attr]

    def _store(self, events: list[Event]) -> list[_Result]:
        """Commit ``events``; isolate the bad ones by bisection. One result per event, in order."""
        try:
            stored = self._append_retrying(events)
        except LogUnavailable as exc:
            return [exc] * len(events)
        except Exception as exc:  # one or more rows refused
            if len(events) > 1:
                mid = len(events) // 2
                first = self._store(events[:mid])
                if any(isinstance(r, LogUnavailable) for r in first):  # the database went away meanwhile
                    return first + [next(r for r in first if isinstance(r, LogUnavailable))] * (len(events) - mid)
                return first + self._store(events[mid:])
            return [self._store_stand_in(events[0], exc)]
        return list(stored)

    def _store_stand_in(self, event: Event, cause: Exception) -> _Result:
        replacement = stand_in(event, f"the database refused it: {_why(cause)}")
        try:
            stored = self._append_retrying([replacement])
        except LogUnavailable as exc:
            return exc
        except Exception as exc:
            return EventRejected(f"event seq {event.seq} ({event.type}) of session {event.session_id!r} could not "
                                 f"be stored, nor an error event in its place: {_why(exc)}")
        self.replaced += 1
        return stored[0]

    def _append_retrying(self, events: list[Event]) -> list[StoredEvent]:
        for attempt in range(DB_RETRIES + 1):
            try:
                stored = self.log.append_stored(events)
            except Exception as exc:
                if not is_database_failure(exc):
                    raise
                if attempt == DB_RETRIES:
                    raise LogUnavailable(f"the session log is unavailable ({_why(exc)}); "
                                         f"{len(events)} event(s) were not stored") from exc
                time.sleep(_BACKOFF_S[min(attempt, len(_BACKOFF_S) - 1)])
            else:
                self.commits += 1
                self.replaced += sum(a is not b.event for a, b in zip(events, stored, strict=True))
                return stored
        raise AssertionError("unreachable")


_Waiter = tuple[Event, "asyncio.Future[StoredEvent]", asyncio.AbstractEventLoop]


class EventWriter(EventStore):
    """One thread that appends events with group commit (see the module docstring).

    ``await writer.append(event)`` returns the :class:`StoredEvent` once it is
    committed: ``event`` itself and its JSON line, or its stand-in if ``event``
    was bad. The events one event loop appends during one of its iterations
    reach the thread as one item (one cross-thread wake-up, not one per
    event), and the waiters of a batch are woken with one callback per loop.

    Raises :class:`LogUnavailable` (database failure, after retries) or
    :class:`EventRejected` (this event and its stand-in both refused).
    """

    def __init__(self, log: SessionLog, *, max_batch: int = 512):
        super().__init__(log)
        self.max_batch = max_batch
        self.batches = 0
        self._q: queue.SimpleQueue[list[_Waiter] | None] = queue.SimpleQueue()
        self._pending: dict[asyncio.AbstractEventLoop, list[_Waiter]] = {}  # this iteration's appends, per loop
        self._thread = threading.Thread(target=self._loop, name="flywheel-event-writer", daemon=True)
        self._thread.start()

    async def append(self, event: Event) -> StoredEvent:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[StoredEvent] = loop.create_future()
        pending = self._pending.get(loop)
        if pending is None:
            pending = self._pending[loop] = []
            loop.call_soon(self._hand_over, loop)
        pending.append((event, fut, loop))
        return await fut

    def _hand_over(self, loop: asyncio.AbstractEventLoop) -> None:
        """Give the writer thread what ``loop`` appended since the last hand-over, in order."""
        self._q.put(self._pending.pop(loop))

    def close(self) -> None:
        self._q.put(None)
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            batch = list(item)
            stop = False
            while len(batch) < self.max_batch:  # a hand-over is never split, so a batch may exceed it
                try:
                    nxt = self._q.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                batch += nxt
            try:
                results = self._store([e for e, _, _ in batch])
            except BaseException as exc:  # a bug here must not leave a waiter hanging
                results = [exc] * len(batch)
            self.batches += 1
            by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[StoredEvent], _Result]]] = {}
            for (_, fut, loop), result in zip(batch, results, strict=True):
                by_loop.setdefault(loop, []).append((fut, result))
            for loop, settled in by_loop.items():
                try:
                    loop.call_soon_threadsafe(_settle, settled)
                except RuntimeError:  # that loop is closed: nobody waits any more
                    pass
            if stop:
                return


def _settle(settled: list[tuple[asyncio.Future[StoredEvent], _Result]]) -> None:
    for fut, result in settled:
        if fut.done():
            continue
        if isinstance(result, BaseException):
            fut.set_exception(result)
        else:
            fut.set_result(result)
