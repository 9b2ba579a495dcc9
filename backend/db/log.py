"""The session log: sessions, append-only events, snapshots, tokens (:mod:`backend.db.tokens`).

All methods are synchronous and thread-safe (one connection per call). The
server calls them from worker threads; event appends go through
:class:`backend.db.writer.EventWriter`, one thread that commits whatever is
queued in a single transaction (group commit) and only then reports each
event as durable.

Events are stored as their JSON line (:func:`agent.events.event_to_json`, the
row's ``body``), encoded once: :class:`~backend.db.stored_event.StoredEvent`
carries that line to every reader -- the WebSocket sends it as it is, live or from the backlog, so all
subscribers get the same text the log holds. Appends and the hot reads use
SQLAlchemy Core (one ``executemany`` per table and batch), not ORM objects.

A bad event -- one that cannot be serialised (only possible for an event built
with ``model_construct``; see ``agent.events``) -- is stored as its
:func:`stand_in`, an ``error`` event with the same ``seq``, ``session_id``,
``turn`` and ``ts``; a row the database refuses raises, and the writer
isolates it (``backend.db.writer``).

Not guaranteed: an OS crash (not a killed process) with SQLite
``synchronous=NORMAL`` may lose the last transactions; that is SQLite's
documented trade-off for WAL mode.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine, String, bindparam, case, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session as DbSession

from agent.events import Event
from agent.text_safety import json_safe_value
from backend.db.models import EventRow, SessionRow, SnapshotRow, policy_label
from backend.db.stored_event import StoredEvent, serialised, stand_in
from backend.db.tokens import ROLES, Principal, TokenError, TokenLog, hash_token
from tools.snapshots import Snapshot

__all__ = ["ROLES", "TURN_STATUS", "Principal", "SessionInfo", "SessionLog", "StoredEvent", "TokenError",
           "hash_token", "now", "stand_in"]

_EVENTS = EventRow.__table__
_SESSIONS = SessionRow.__table__
_INSERT_EVENT = insert(_EVENTS)
# One row per session of a batch (executemany); bind names differ from the column names.
# ``new_status`` NULL keeps the status; a cancelled session stays cancelled.
_ADVANCE_SESSION = (
    update(_SESSIONS).where(_SESSIONS.c.id == bindparam("sid"))
    .values(last_seq=bindparam("upto"), turns=bindparam("turn_no"),
            output_tokens=_SESSIONS.c.output_tokens + bindparam("tokens"), updated_at=bindparam("at"),
            status=case((_SESSIONS.c.status == "cancelled", _SESSIONS.c.status),
                        else_=func.coalesce(bindparam("new_status", type_=String), _SESSIONS.c.status)))
)
TURN_STATUS = {"user_message": "running", "turn_started": "running", "turn_end": "idle"}
"""The session status an event sets, committed with it (a cancelled session stays cancelled)."""


def now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


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
    def of(cls, row: Any) -> SessionInfo:
        """From a ``SessionRow`` or a Core row of the ``sessions`` table."""
        return cls(**{f: getattr(row, f) for f in cls.__dataclass_fields__})

    def public(self) -> dict[str, Any]:
        """The session as a JSON value, made UTF-8-safe like events (``agent.text_safety``):
        a lone surrogate in the policy (e.g. recorded outputs) must not fail the response."""
        d = {f: getattr(self, f) for f in self.__dataclass_fields__}
        d["created_at"] = self.created_at.isoformat() + "Z"
        d["updated_at"] = self.updated_at.isoformat() + "Z"
        return json_safe_value(d)  # type: ignore[no-any-return]


class SessionLog(TokenLog):
    """The log: tokens (:class:`backend.db.tokens.TokenLog`), snapshots, sessions, events."""

    def __init__(self, engine: Engine):
        self.engine = engine

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
        with self.engine.connect() as conn:
            row = conn.execute(select(_SESSIONS).where(_SESSIONS.c.id == session_id)).first()
        return SessionInfo.of(row) if row is not None else None

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
        with self.engine.begin() as conn:
            conn.execute(update(_SESSIONS).where(_SESSIONS.c.id == session_id).values(status=status, updated_at=now()))

    def merge_source(self, session_id: str, values: dict[str, Any]) -> SessionInfo:
        """Set ``values``' keys in a session's ``source`` (its other keys are kept), in one
        transaction; returns the session. ``KeyError`` when there is no such session. For what
        a driver keeps with a session as it goes (``flywheel acp``: the editor's mode, the
        specs of tools connected later); not for ``kind``, ``path`` or ``approval_mode``."""
        with DbSession(self.engine) as db, db.begin():
            row = db.get(SessionRow, session_id, with_for_update=True)
            if row is None:
                raise KeyError(f"no session {session_id!r} in the log")
            row.source = {**(row.source or {}), **values}
            row.updated_at = now()
            db.flush()
            return SessionInfo.of(row)

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
        and nothing is committed: :class:`backend.db.writer.EventStore` isolates
        such rows. Each session's row advances in the same transaction: last
        ``seq``, turns, output tokens, and the status of :data:`TURN_STATUS`
        (a turn's first event sets running, ``turn_end`` idle; a cancelled
        session stays cancelled).
        """
        return [s.event for s in self.append_stored(events)]

    def append_stored(self, events: Sequence[Event]) -> list[StoredEvent]:
        """:meth:`append`, returning each stored event with its JSON line (the row's body)."""
        if not events:
            return []
        stored = [serialised(e) for e in events]
        rows = []
        latest: dict[str, tuple[int, int, int, str | None]] = {}
        for s in stored:
            e = s.event
            rows.append({"session_id": e.session_id, "seq": e.seq, "type": e.type, "turn": e.turn, "ts": e.ts,
                         "body": s.json})
            seq, turn, tokens, status = latest.get(e.session_id, (0, 0, 0, None))
            tokens += getattr(e, "output_tokens", 0) if e.type == "assistant_message" else 0
            if e.seq >= seq:
                status = TURN_STATUS.get(e.type, status)
            latest[e.session_id] = (max(seq, e.seq), max(turn, e.turn), tokens, status)
        at = now()
        with self.engine.begin() as conn:
            conn.execute(_INSERT_EVENT, rows)
            conn.execute(_ADVANCE_SESSION, [
                {"sid": sid, "upto": seq, "turn_no": turn, "tokens": tokens, "at": at, "new_status": status}
                for sid, (seq, turn, tokens, status) in latest.items()])
        return stored

    def events(self, session_id: str, *, after: int = 0, limit: int = 1000) -> list[Event]:
        return [s.event for s in self.events_stored(session_id, after=after, limit=limit)]

    def events_stored(self, session_id: str, *, after: int = 0, limit: int = 1000) -> list[StoredEvent]:
        """Events with ``seq > after``, in order, as stored (the JSON line; parsed only when
        ``.event`` is read)."""
        q = (select(_EVENTS.c.seq, _EVENTS.c.body).where(_EVENTS.c.session_id == session_id, _EVENTS.c.seq > after)
             .order_by(_EVENTS.c.seq).limit(limit))
        with self.engine.connect() as conn:
            return [StoredEvent(seq, body) for seq, body in conn.execute(q)]

    def all_events(self, session_id: str) -> list[Event]:
        out: list[Event] = []
        while True:
            page = self.events(session_id, after=out[-1].seq if out else 0, limit=5000)
            out += page
            if len(page) < 5000:
                return out
