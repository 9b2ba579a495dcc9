"""The session log: sessions, append-only events, snapshots, tokens.

All methods are synchronous and thread-safe (one SQLAlchemy session per
call). The server calls them from worker threads; event appends go through
:class:`EventWriter`, one thread that commits whatever is queued in a single
transaction (group commit) and only then reports each event as durable.

Not guaranteed: an OS crash (not a killed process) with SQLite
``synchronous=NORMAL`` may lose the last transactions; that is SQLite's
documented trade-off for WAL mode.
"""

from __future__ import annotations

import asyncio
import hashlib
import queue
import secrets
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session as DbSession

from agent.events import Event, event_from_json, event_to_json
from backend.db.models import EventRow, SessionRow, SnapshotRow, TokenRow
from tools.snapshots import Snapshot

ROLES = ("user", "staff")


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

    @classmethod
    def of(cls, row: SessionRow) -> SessionInfo:
        return cls(**{f: getattr(row, f) for f in cls.__dataclass_fields__})

    def public(self) -> dict[str, Any]:
        d = {f: getattr(self, f) for f in self.__dataclass_fields__}
        d["created_at"] = self.created_at.isoformat() + "Z"
        d["updated_at"] = self.updated_at.isoformat() + "Z"
        return d


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
        until: datetime | None = None, limit: int = 50, offset: int = 0,
    ) -> list[SessionInfo]:
        q = select(SessionRow).order_by(SessionRow.created_at.desc(), SessionRow.id).limit(limit).offset(offset)
        if owner is not None:
            q = q.where(SessionRow.owner == owner)
        if status is not None:
            q = q.where(SessionRow.status == status)
        if since is not None:
            q = q.where(SessionRow.created_at >= since)
        if until is not None:
            q = q.where(SessionRow.created_at < until)
        with DbSession(self.engine) as db:
            return [SessionInfo.of(r) for r in db.scalars(q)]

    def set_status(self, session_id: str, status: str) -> None:
        with DbSession(self.engine) as db, db.begin():
            db.execute(update(SessionRow).where(SessionRow.id == session_id).values(status=status, updated_at=now()))

    def sessions_with_status(self, status: str) -> list[SessionInfo]:
        with DbSession(self.engine) as db:
            return [SessionInfo.of(r) for r in db.scalars(select(SessionRow).where(SessionRow.status == status))]

    # -- events ----------------------------------------------------------------

    def append(self, events: Sequence[Event]) -> None:
        """Append events (any sessions) in one transaction."""
        if not events:
            return
        latest: dict[str, tuple[int, int, int]] = {}
        with DbSession(self.engine) as db, db.begin():
            for e in events:
                db.add(EventRow(session_id=e.session_id, seq=e.seq, type=e.type, turn=e.turn, ts=e.ts,
                                body=event_to_json(e)))
                seq, turn, tokens = latest.get(e.session_id, (0, 0, 0))
                tokens += getattr(e, "output_tokens", 0) if e.type == "assistant_message" else 0
                latest[e.session_id] = (max(seq, e.seq), max(turn, e.turn), tokens)
            for sid, (seq, turn, tokens) in latest.items():
                db.execute(
                    update(SessionRow).where(SessionRow.id == sid).values(
                        last_seq=seq, turns=turn, output_tokens=SessionRow.output_tokens + tokens, updated_at=now()
                    )
                )

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


class EventWriter:
    """One thread that appends events with group commit.

    ``await writer.append(event)`` returns once the event is committed. Events
    queued while a commit is in flight go into the next transaction together,
    so throughput grows with load instead of collapsing.
    """

    def __init__(self, log: SessionLog, *, max_batch: int = 512):
        self.log = log
        self.max_batch = max_batch
        self._q: queue.SimpleQueue[tuple[Event, asyncio.Future[None], asyncio.AbstractEventLoop] | None] = (
            queue.SimpleQueue()
        )
        self._thread = threading.Thread(target=self._loop, name="flywheel-event-writer", daemon=True)
        self._thread.start()
        self.commits = 0

    async def append(self, event: Event) -> None:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._q.put((event, fut, loop))
        await fut

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
            error: BaseException | None = None
            try:
                self.log.append([e for e, _, _ in batch])
                self.commits += 1
            except BaseException as exc:  # report to every waiter; the server decides
                error = exc
            for _, fut, loop in batch:
                loop.call_soon_threadsafe(_settle, fut, error)
            if stop:
                return


def _settle(fut: asyncio.Future[None], error: BaseException | None) -> None:
    if fut.done():
        return
    if error is None:
        fut.set_result(None)
    else:
        fut.set_exception(error)
