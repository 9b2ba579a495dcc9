"""The session browser's queries: filtered keyset pages, full-text search, facets, branches.

Pages are ordered by ``(created_at, id)`` (newest first by default) and
continue from an opaque cursor that names the last row shown, so a page costs
the same however deep it is and rows created meanwhile never shift a page
(unlike ``OFFSET``). Every filter is a column of ``sessions`` (indexed where
it is selective: owner, kind, RL run, policy, parent); a search (``q``, see
:mod:`backend.db.search`) keeps only sessions with a matching message and
adds each one's first match with a snippet.

Not guaranteed: a cursor is tied to its order (``newest``/``oldest``), not to
its filters (changing filters with an old cursor continues from that row
under the new filters); search results are ordered by time like every page,
not by relevance.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from sqlalchemy import Engine, and_, or_, select
from sqlalchemy.orm import Session as DbSession

from backend.db.log import SessionInfo
from backend.db.models import SessionRow
from backend.db.search import Match, Term, first_matches, search_page

Order = Literal["newest", "oldest"]
FeedbackFilter = Literal["any", "none", "up", "down", "kept", "reverted"]
MAX_FACET_VALUES = 500


@dataclass(frozen=True, slots=True)
class BrowseFilters:
    """What the session browser filters by; None means "any"."""

    owner: str | None = None
    status: str | None = None
    kind: str | None = None
    since: datetime | None = None  # created at or after (naive UTC)
    until: datetime | None = None  # created before
    policy: str | None = None  # policy_name, exactly
    run: str | None = None
    iteration: int | None = None
    task: str | None = None
    min_reward: float | None = None
    max_reward: float | None = None
    feedback: FeedbackFilter | None = None
    terms: tuple[Term, ...] = ()


@dataclass(frozen=True, slots=True)
class Page:
    sessions: list[SessionInfo]
    next_cursor: str | None
    matches: dict[str, Match]


class CursorError(ValueError):
    """A cursor this server did not make (or made for the other order)."""


def encode_cursor(info: SessionInfo, order: Order) -> str:
    raw = json.dumps([order[0], info.created_at.isoformat(), info.id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str, order: Order) -> tuple[datetime, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        tag, created, sid = json.loads(raw)
        if tag != order[0] or not isinstance(sid, str):
            raise ValueError
        return datetime.fromisoformat(created), sid
    except (ValueError, TypeError, binascii.Error, json.JSONDecodeError):
        raise CursorError(f"not a cursor of this listing (order={order}); start again without one") from None


def _feedback_clause(which: FeedbackFilter) -> object:
    s = SessionRow
    return {
        "any": or_(s.feedback_up > 0, s.feedback_down > 0, s.files_kept > 0, s.files_reverted > 0),
        "none": and_(s.feedback_up == 0, s.feedback_down == 0, s.files_kept == 0, s.files_reverted == 0),
        "up": s.feedback_up > 0, "down": s.feedback_down > 0, "kept": s.files_kept > 0,
        "reverted": s.files_reverted > 0,
    }[which]


def _where(engine: Engine, f: BrowseFilters) -> list[object]:
    s = SessionRow
    pairs = [(f.owner, s.owner), (f.status, s.status), (f.kind, s.kind), (f.policy, s.policy_name),
             (f.run, s.rl_run), (f.iteration, s.rl_iteration), (f.task, s.rl_task)]
    out: list[object] = [col == value for value, col in pairs if value is not None]
    if f.since is not None:
        out.append(s.created_at >= f.since)
    if f.until is not None:
        out.append(s.created_at < f.until)
    if f.min_reward is not None:
        out.append(s.rl_reward >= f.min_reward)
    if f.max_reward is not None:
        out.append(s.rl_reward <= f.max_reward)
    if f.feedback is not None:
        out.append(_feedback_clause(f.feedback))
    return out  # the search terms are the page's plan (search.search_page)


def browse_sessions(engine: Engine, filters: BrowseFilters, *, limit: int = 50, cursor: str | None = None,
                    order: Order = "newest") -> Page:
    """One page of sessions matching ``filters``, after ``cursor`` (:class:`CursorError` if it is not one)."""
    s = SessionRow
    where = _where(engine, filters)
    after = decode_cursor(cursor, order) if cursor is not None else None
    newest = order == "newest"
    if after is not None:
        t, sid = after
        where.append(or_(s.created_at < t, and_(s.created_at == t, s.id < sid)) if newest
                     else or_(s.created_at > t, and_(s.created_at == t, s.id > sid)))
    with DbSession(engine) as db:
        if filters.terms:
            found = search_page(db, filters.terms, where, limit=limit + 1, newest=newest)
        else:
            q = select(s).where(*where).order_by(  # type: ignore[arg-type]
                *((s.created_at.desc(), s.id.desc()) if newest else (s.created_at, s.id)))
            found = list(db.scalars(q.limit(limit + 1)))
        rows = [SessionInfo.of(r) for r in found]
    page, more = rows[:limit], len(rows) > limit
    matches = first_matches(engine, [r.id for r in page], filters.terms) if filters.terms else {}
    return Page(page, encode_cursor(page[-1], order) if more else None, matches)


@dataclass(frozen=True, slots=True)
class Facets:
    owners: list[str]
    policies: list[str]
    runs: list[str]


def facets(engine: Engine, owner: str | None = None) -> Facets:
    """The values the browser's filters can take (at most :data:`MAX_FACET_VALUES` each, sorted):
    owners, policy names and RL runs, among ``owner``'s sessions if given."""
    s = SessionRow

    def values(col: object) -> list[str]:
        q = select(col).distinct().where(col.isnot(None))  # type: ignore[call-overload,attr-defined]
        if owner is not None:
            q = q.where(s.owner == owner)
        with DbSession(engine) as db:
            return sorted(v for v in db.scalars(q.order_by(col).limit(MAX_FACET_VALUES)) if v)  # type: ignore[arg-type]

    return Facets(owners=values(s.owner), policies=values(s.policy_name), runs=values(s.rl_run))


def branches_of(engine: Engine, session_id: str) -> Sequence[SessionInfo]:
    """The sessions branched from ``session_id``, newest first."""
    q = (select(SessionRow).where(SessionRow.parent_id == session_id)
         .order_by(SessionRow.created_at.desc(), SessionRow.id.desc()))
    with DbSession(engine) as db:
        return [SessionInfo.of(r) for r in db.scalars(q)]
