"""The session log: sessions, append-only events, snapshots, tokens.

All methods are synchronous and thread-safe (one SQLAlchemy session per
call). The server calls them from worker threads; event appends go through
:class:`EventWriter`, one thread that commits whatever is queued in a single
transaction (group commit) and only then reports each event as durable.

Two kinds of append failure are kept apart:

* **a bad event** -- one that cannot be serialised (only possible for an
  event built with ``model_construct``; see ``agent.events``) or that the
  database refuses as a row (an integrity or data error). It never costs
  another event: it is stored as an ``error`` event with the same ``seq``,
  ``session_id``, ``turn`` and ``ts`` (its ``message`` says which event was
  replaced and why), and every other event of the batch is committed. Only if
  that stand-in is refused too (e.g. its session does not exist) does its
  waiter get :class:`EventRejected`.
* **a database failure** -- ``OperationalError``/``InterfaceError`` or a
  lost connection (disk full, database locked past the busy timeout, server
  gone). The writer retries the batch :data:`DB_RETRIES` times with a short
  backoff; if it still fails, nothing of the batch is committed and every
  waiter gets :class:`LogUnavailable` (the server decides: the session's
  turn ends in error). The ``seq`` numbers of those events stay unused, so
  the stored stream has a gap there.

Not guaranteed: an OS crash (not a killed process) with SQLite
``synchronous=NORMAL`` may lose the last transactions; that is SQLite's
documented trade-off for WAL mode.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import queue
import secrets
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine, func, select, update
from sqlalchemy.exc import DBAPIError, DisconnectionError, IntegrityError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.orm import Session as DbSession

from agent.events import ErrorEvent, Event, event_from_json, event_to_json
from agent.text_safety import json_safe_value
from backend.db.models import EventRow, SessionRow, SnapshotRow, TokenRow, policy_label
from tools.snapshots import Snapshot

ROLES = ("user", "staff")
DB_RETRIES = 2
"""How often :class:`EventWriter` retries a batch after a database failure (backoff 0.05 s, then 0.25 s)."""
_BACKOFF_S = (0.05, 0.25)


def now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: a token's name (the user) and role."""

    name: str
    role: str

    @property
    def is_staff(self) -> bool:
        return self.role == "staff"


@dataclass(frozen=True, slots=True)
class SessionInfo:
    id: str
    owner: str
    status: str
    title: str
    source: dict[str, Any]
    workspace_id: str
    base_snapshot: str
    policy: dict[str, Any]
    created_at: datetime
    updated_at: datetime
    last_seq: int
    turns: int
    output_tokens: int
    parent_id: str | None
    branch_step: int | None
    kind: str = "user"  # "user" | "rl" (an RL rollout, tagged below; see backend/rl_log.py)
    rl_run: str | None = None
    rl_iteration: int | None = None
    rl_task: str | None = None
    rl_sample: int | None = None
    rl_reward: float | None = None
    rl_status: str | None = None
    policy_name: str = ""  # models.policy_label(policy): what the session browser filters by
    feedback_up: int = 0  # turns rated up / down, files kept / reverted (backend/db/feedback.py)
    feedback_down: int = 0
    files_kept: int = 0
    files_reverted: int = 0

    @classmethod
    def of(cls, row: SessionRow) -> SessionInfo:
        return cls(**{f: getattr(row, f) for f in cls.__dataclass_fields__})

    def public(self) -> dict[str, Any]:
        """The session as a JSON value, made UTF-8-safe like events (``agent.text_safety``):
        a lone surrogate in the policy (e.g. recorded outputs) must not fail the response."""
        d = {f: getattr(self, f) for f in self.__dataclass_fields__}
        d["created_at"] = self.created_at.isoformat() + "Z"
        d["updated_at"] = self.updated_at.isoformat() + "Z"
        return json_safe_value(d)  # type: ignore[no-any-return]


class TokenError(ValueError):
    pass


class SessionLog:
    def __init__(self, engine: Engine):
        self.engine = engine

    # -- tokens ----------------------------------------------------------------

    def create_token(self, name: str, role: str) -> str:
        """Create a token and return it (the only time it is visible)."""
        if role not in ROLES:
            raise TokenError(f"role must be one of {', '.join(ROLES)}, not {role!r}")
        if not name or len(name) > 200:
            raise TokenError("token name must be 1-200 characters")
        token = "fw_" + secrets.token_urlsafe(32)
        with DbSession(self.engine) as db, db.begin():
            if db.scalar(select(TokenRow.id).where(TokenRow.name == name)) is not None:
                raise TokenError(f"a token named {name!r} already exists")
            db.add(TokenRow(name=name, role=role, token_hash=hash_token(token), created_at=now()))
        return token

    def verify_token(self, token: str) -> Principal | None:
        if not token or len(token) > 200:
            return None
        with DbSession(self.engine) as db:
            row = db.scalar(select(TokenRow).where(TokenRow.token_hash == hash_token(token)))
            if row is None or row.revoked:
                return None
            return Principal(row.name, row.role)

    def token_count(self) -> int:
        with DbSession(self.engine) as db:
            return int(db.scalar(select(func.count()).select_from(TokenRow).where(~TokenRow.revoked)) or 0)

    # -- snapshots -------------------------------------------------------------

    def save_snapshot(self, snapshot: Snapshot) -> None:
        """Store a manifest (idempotent: snapshots are content-addressed, so a
        concurrent insert of the same id is the same row)."""
        try:
            with DbSession(self.engine) as db, db.begin():
                if db.get(SnapshotRow, snapshot.id) is None:
                    db.add(SnapshotRow(id=snapshot.id, manifest=snapshot.to_json().decode(), created_at=now()))
        except IntegrityError:
            if not self.has_snapshot(snapshot.id):
                raise

    def has_snapshot(self, snapshot_id: str) -> bool:
        with DbSession(self.engine) as db:
            return db.get(SnapshotRow, snapshot_id) is not None

    def load_snapshot(self, snapshot_id: str) -> Snapshot:
        with DbSession(self.engine) as db:
            row = db.get(SnapshotRow, snapshot_id)
            if row is None:
                raise KeyError(f"snapshot {snapshot_id} is not in the log")
            return Snapshot.from_json(row.manifest.encode(), expected_id=snapshot_id)

    # -- sessions --------------------------------------------------------------

    def create_session(self, **fields: Any) -> SessionInfo:
        t = now()
        fields.setdefault("policy_name", policy_label(fields.get("policy") or {}))
        row = SessionRow(status="idle", created_at=t, updated_at=t, last_seq=0, turns=0, output_tokens=0, **fields)
        with DbSession(self.engine) as db, db.begin():
            db.add(row)
            db.flush()
            return SessionInfo.of(row)

    def get_session(self, session_id: str) -> SessionInfo | None:
        with DbSession(self.engine) as db:
            row = db.get(SessionRow, session_id)
            return SessionInfo.of(row) if row else None

    def list_sessions(
        self, *, owner: str | None = None, status: str | None = None, since: datetime | None = None,
        until: datetime | None = None, limit: int = 50, offset: int = 0, kind: str | None = None,
        rl_run: str | None = None,
    ) -> list[SessionInfo]:
        """Sessions, newest first. ``kind`` ("user" | "rl") and ``rl_run`` (an RL run id) filter RL rollouts."""
        q = select(SessionRow).order_by(SessionRow.created_at.desc(), SessionRow.id).limit(limit).offset(offset)
        if owner is not None:
            q = q.where(SessionRow.owner == owner)
        if status is not None:
            q = q.where(SessionRow.status == status)
        if kind is not None:
            q = q.where(SessionRow.kind == kind)
        if rl_run is not None:
            q = q.where(SessionRow.rl_run == rl_run)
        if since is not None:
            q = q.where(SessionRow.created_at >= since)
        if until is not None:
            q = q.where(SessionRow.created_at < until)
        with DbSession(self.engine) as db:
            return [SessionInfo.of(r) for r in db.scalars(q)]

    def set_status(self, session_id: str, status: str) -> None:
        with DbSession(self.engine) as db, db.begin():
            db.execute(update(SessionRow).where(SessionRow.id == session_id).values(status=status, updated_at=now()))

    def set_rl_outcome(self, session_id: str, *, reward: float | None, status: str) -> None:
        """Record an RL rollout's reward and :class:`rl.types.RolloutStatus` on its session."""
        with DbSession(self.engine) as db, db.begin():
            n = db.execute(update(SessionRow).where(SessionRow.id == session_id, SessionRow.kind == "rl")
                           .values(rl_reward=reward, rl_status=status, updated_at=now())).rowcount  # type: ignore[attr-defined]
        if n != 1:
            raise KeyError(f"no RL session {session_id!r} in the log")

    def sessions_with_status(self, status: str) -> list[SessionInfo]:
        with DbSession(self.engine) as db:
            return [SessionInfo.of(r) for r in db.scalars(select(SessionRow).where(SessionRow.status == status))]

    # -- events ----------------------------------------------------------------

    def append(self, events: Sequence[Event]) -> list[Event]:
        """Append events (any sessions) in one transaction; return what was stored.

        An event that cannot be serialised is stored as its :func:`stand_in`
        (the returned list holds the stand-in in its place); the others are
        unaffected. A row the database refuses raises (``IntegrityError`` ...)
        and nothing is committed: :class:`EventWriter` isolates such rows.
        """
        if not events:
            return []
        rows = [_serialised(e) for e in events]
        latest: dict[str, tuple[int, int, int]] = {}
        with DbSession(self.engine) as db, db.begin():
            for e, body in rows:
                db.add(EventRow(session_id=e.session_id, seq=e.seq, type=e.type, turn=e.turn, ts=e.ts, body=body))
                seq, turn, tokens = latest.get(e.session_id, (0, 0, 0))
                tokens += getattr(e, "output_tokens", 0) if e.type == "assistant_message" else 0
                latest[e.session_id] = (max(seq, e.seq), max(turn, e.turn), tokens)
            for sid, (seq, turn, tokens) in latest.items():
                db.execute(
                    update(SessionRow).where(SessionRow.id == sid).values(
                        last_seq=seq, turns=turn, output_tokens=SessionRow.output_tokens + tokens, updated_at=now()
                    )
                )
        return [e for e, _ in rows]

    def events(self, session_id: str, *, after: int = 0, limit: int = 1000) -> list[Event]:
        q = (select(EventRow.body).where(EventRow.session_id == session_id, EventRow.seq > after)
             .order_by(EventRow.seq).limit(limit))
        with DbSession(self.engine) as db:
            return [event_from_json(body) for body in db.scalars(q)]

    def all_events(self, session_id: str) -> list[Event]:
        out: list[Event] = []
        while True:
            page = self.events(session_id, after=out[-1].seq if out else 0, limit=5000)
            out += page
            if len(page) < 5000:
                return out


def stand_in(event: Event, why: str) -> ErrorEvent:
    """The ``error`` event stored in place of ``event``: same ``seq``, session, turn and
    time (the current time if ``event.ts`` is not a finite number)."""
    ts = event.ts if isinstance(event.ts, (int, float)) and math.isfinite(event.ts) else time.time()
    return ErrorEvent(
        seq=event.seq, session_id=event.session_id, turn=event.turn, ts=ts, source="session",
        message=f"event seq {event.seq} ({event.type}) could not be stored and was replaced by this error: {why}"[:2000],
    )


def _serialised(event: Event) -> tuple[Event, str]:
    try:
        return event, event_to_json(event)
    except (ValueError, TypeError) as exc:  # PydanticSerializationError is a ValueError
        replacement = stand_in(event, f"{type(exc).__name__}: {exc}")
        return replacement, event_to_json(replacement)


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
        return results  # type: ignore[return-value]

    def _store(self, events: list[Event]) -> list[Event | BaseException]:
        """Commit ``events``; isolate the bad ones by bisection. One result per event."""
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

    def _store_stand_in(self, event: Event, cause: Exception) -> Event | BaseException:
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

    def _append_retrying(self, events: list[Event]) -> list[Event]:
        for attempt in range(DB_RETRIES + 1):
            try:
                stored = self.log.append(events)
            except Exception as exc:
                if not is_database_failure(exc):
                    raise
                if attempt == DB_RETRIES:
                    raise LogUnavailable(f"the session log is unavailable ({_why(exc)}); "
                                         f"{len(events)} event(s) were not stored") from exc
                time.sleep(_BACKOFF_S[min(attempt, len(_BACKOFF_S) - 1)])
            else:
                self.commits += 1
                self.replaced += sum(a is not b for a, b in zip(events, stored, strict=True))
                return stored
        raise AssertionError("unreachable")


class EventWriter(EventStore):
    """One thread that appends events with group commit.

    ``await writer.append(event)`` returns the stored event once it is
    committed: ``event`` itself, or its :func:`stand_in` if ``event`` was bad
    (see the module docstring). Events queued while a commit is in flight go
    into the next transaction together, so throughput grows with load instead
    of collapsing. A bad event is found by splitting the failed batch in
    halves (a few extra transactions per bad event, none for good batches).

    Raises :class:`LogUnavailable` (database failure, after retries) or
    :class:`EventRejected` (this event and its stand-in both refused).
    """

    def __init__(self, log: SessionLog, *, max_batch: int = 512):
        super().__init__(log)
        self.max_batch = max_batch
        self._q: queue.SimpleQueue[tuple[Event, asyncio.Future[Event], asyncio.AbstractEventLoop] | None] = (
            queue.SimpleQueue()
        )
        self._thread = threading.Thread(target=self._loop, name="flywheel-event-writer", daemon=True)
        self._thread.start()

    async def append(self, event: Event) -> Event:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Event] = loop.create_future()
        self._q.put((event, fut, loop))
        return await fut

    def close(self) -> None:
        self._q.put(None)
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            batch = [item]
            stop = False
            while len(batch) < self.max_batch:
                try:
                    nxt = self._q.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                batch.append(nxt)
            try:
                results = self._store([e for e, _, _ in batch])
            except BaseException as exc:  # a bug here must not leave a waiter hanging
                results = [exc] * len(batch)
            for (_, fut, loop), result in zip(batch, results, strict=True):
                loop.call_soon_threadsafe(_settle, fut, result)
            if stop:
                return


def _settle(fut: asyncio.Future[Event], result: Event | BaseException) -> None:
    if fut.done():
        return
    if isinstance(result, BaseException):
        fut.set_exception(result)
    else:
        fut.set_result(result)
