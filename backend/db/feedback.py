"""Feedback rows (migration 0003): one per (session, turn or file, author), and the session's counts.

:func:`record` inserts or replaces a person's feedback on one turn (a rating)
or one changed file (a verdict) and recounts the session's
``feedback_up``/``feedback_down``/``files_kept``/``files_reverted`` in the
same transaction, so the counts the session browser filters on always match
the rows. The event that recorded it (``feedback``, see ``agent.events``)
names its ``seq``; the event stream keeps every change of mind, the table
only the latest.

Not guaranteed: a row and its event are written in two steps (the event
first); if the database fails in between, the event stands without its row.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Engine, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session as DbSession

from backend.db.log import now
from backend.db.models import FeedbackRow, SessionRow


@dataclass(frozen=True, slots=True)
class Feedback:
    id: int
    session_id: str
    target: str  # "turn" | "file"
    turn: int | None
    path: str | None
    rating: str | None
    verdict: str | None
    comment: str
    author: str
    seq: int
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, row: FeedbackRow) -> Feedback:
        return cls(**{f: getattr(row, f) for f in cls.__dataclass_fields__})


def key_of(turn: int | None, path: str | None) -> str:
    """What the feedback is about, as the row's key: ``turn:N`` or ``file:`` + the path's SHA-256."""
    if path is not None:
        return "file:" + hashlib.sha256(path.encode("utf-8", "surrogatepass")).hexdigest()
    return f"turn:{turn}"


def record(engine: Engine, *, session_id: str, author: str, seq: int, turn: int | None = None,
           path: str | None = None, rating: str | None = None, verdict: str | None = None,
           comment: str = "") -> Feedback:
    """Insert or replace ``author``'s feedback on ``turn`` (with ``rating``) or ``path`` (with ``verdict``)."""
    key = key_of(turn, path)
    for attempt in range(2):  # two first ratings at once: the loser of the insert updates
        try:
            with DbSession(engine) as db, db.begin():
                row = db.scalar(select(FeedbackRow).where(FeedbackRow.session_id == session_id,
                                                          FeedbackRow.key == key, FeedbackRow.author == author))
                t = now()
                if row is None:
                    row = FeedbackRow(session_id=session_id, key=key, target="file" if path is not None else "turn",
                                      turn=turn, path=path, author=author, created_at=t)
                    db.add(row)
                row.rating, row.verdict, row.comment, row.seq, row.updated_at = rating, verdict, comment, seq, t
                db.flush()
                _recount(db, session_id)
                return Feedback.of(row)
        except IntegrityError:
            if attempt:
                raise
    raise AssertionError("unreachable")


def _recount(db: DbSession, session_id: str) -> None:
    counts = {(r, v): n for r, v, n in db.execute(
        select(FeedbackRow.rating, FeedbackRow.verdict, func.count()).where(FeedbackRow.session_id == session_id)
        .group_by(FeedbackRow.rating, FeedbackRow.verdict))}

    def n(rating: str | None = None, verdict: str | None = None) -> int:
        return sum(c for (r, v), c in counts.items() if (rating is None or r == rating)
                   and (verdict is None or v == verdict))

    db.execute(update(SessionRow).where(SessionRow.id == session_id).values(
        feedback_up=n(rating="up"), feedback_down=n(rating="down"), files_kept=n(verdict="keep"),
        files_reverted=n(verdict="revert")))


def of_session(engine: Engine, session_id: str) -> list[Feedback]:
    """A session's feedback, oldest first."""
    q = select(FeedbackRow).where(FeedbackRow.session_id == session_id).order_by(FeedbackRow.id)
    with DbSession(engine) as db:
        return [Feedback.of(r) for r in db.scalars(q)]


def all_feedback(engine: Engine, *, after: int = 0, limit: int = 500,
                 since: datetime | None = None) -> list[tuple[Feedback, str, str, str]]:
    """Everyone's feedback in ``id`` order after ``after`` (keyset), with each session's owner, kind and
    policy name: what later training turns into data."""
    q = (select(FeedbackRow, SessionRow.owner, SessionRow.kind, SessionRow.policy_name)
         .join(SessionRow, SessionRow.id == FeedbackRow.session_id)
         .where(FeedbackRow.id > after).order_by(FeedbackRow.id).limit(limit))
    if since is not None:
        q = q.where(FeedbackRow.updated_at >= since)
    with DbSession(engine) as db:
        return [(Feedback.of(r), owner, kind, policy) for r, owner, kind, policy in db.execute(q)]
