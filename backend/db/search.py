"""Full-text search over sessions' messages (user and assistant text), by dialect.

The index is kept by a trigger on ``events`` (migration 0003): an FTS5 table
``message_fts`` on SQLite, a ``tsvector`` table ``message_search`` with a GIN
index on PostgreSQL. Both see a message as its words: runs of letters and
digits, case-folded (``read_file`` is ``read`` ``file``; ``stats.py`` is
``stats`` ``py``).

The search syntax (:func:`parse_query`) is deliberately small and the same on
both databases: words are ANDed; ``"quoted words"`` must appear in that
order, adjacent; a word ending in ``*`` matches as a prefix (at least
:data:`MIN_PREFIX_CHARS` characters before the ``*``). A word written
with punctuation (``read_file``, ``stats.py``) is a phrase of its parts.
Anything else is not syntax: the query is rebuilt from its words, so no input
can be an FTS5 or ``tsquery`` syntax error. At most :data:`MAX_TERMS` terms of
at most :data:`MAX_TOKEN_CHARS` characters are kept.

A page is found in one of two ways (:func:`search_page`): a common word by
walking the newest sessions in order and probing each one's messages (the
page fills at once), a rare one by collecting its few matching sessions from
the index first; ``benchmarks/session_browser.py`` measures both at 100,000
sessions.

Not guaranteed: PostgreSQL's ``simple`` configuration neither stems nor
removes accents, and FTS5 folds accents (``remove_diacritics 2``), so a query
with accents may match differently on the two; only the first 100,000
characters of a message are indexed; a message PostgreSQL could not index (a
NUL character) is not found.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, column, func, literal, literal_column, select, table, text, true
from sqlalchemy.orm import Session as DbSession

from agent.events import event_from_json
from backend.db.models import EventRow, SessionRow

MAX_TERMS = 16
MIN_PREFIX_CHARS = 3  # shorter prefixes match most of the index (SQLite keeps a 3-character prefix index)
MAX_TOKEN_CHARS = 64
SNIPPET_WORDS = 24
_WORD = re.compile(r"[^\W_]+")  # letters and digits: what both indexes call a word
_TERM = re.compile(r'"([^"]*)"?|(\S+)')


@dataclass(frozen=True, slots=True)
class Term:
    """Words that must appear adjacent and in order; ``prefix``: the last one is a prefix."""

    words: tuple[str, ...]
    prefix: bool = False


class QueryError(ValueError):
    """A search with no words in it, or a prefix too short to be useful."""


def parse_query(q: str) -> list[Term]:
    """The terms of a search (see the module docstring); :class:`QueryError` if there are none."""
    terms: list[Term] = []
    for m in _TERM.finditer(q):
        raw = m.group(1) if m.group(1) is not None else m.group(2)
        words = tuple(w.casefold()[:MAX_TOKEN_CHARS] for w in _WORD.findall(raw))
        prefix = m.group(2) is not None and raw.endswith("*")
        if words and prefix and len(words[-1]) < MIN_PREFIX_CHARS:
            raise QueryError(f"a prefix ({raw}) needs at least {MIN_PREFIX_CHARS} letters or digits before the *")
        if words:
            terms.append(Term(words, prefix=prefix))
        if len(terms) == MAX_TERMS:
            break
    if not terms:
        raise QueryError("the search has no words (letters or digits) in it")
    return terms


def fts5_query(terms: Sequence[Term]) -> str:
    """An FTS5 MATCH expression: each term a quoted phrase (``"a b"``, ``"pre" *``), all ANDed."""
    return " ".join(f'"{" ".join(t.words)}"' + (" *" if t.prefix else "") for t in terms)


def tsquery(terms: Sequence[Term]) -> str:
    """A ``to_tsquery('simple', ...)`` expression: phrases with ``<->``, prefixes with ``:*``, ANDed."""
    parts = []
    for t in terms:
        words = [*t.words[:-1], t.words[-1] + (":*" if t.prefix else "")]
        parts.append("(" + " <-> ".join(words) + ")")
    return " & ".join(parts)


MESSAGE_SEARCH = table("message_search", column("session_id"), column("seq"), column("tsv"))
# SQLite: the FTS rowid of a message is num << 32 | seq (migration 0003), num the session's number in
# message_fts_sessions, so one session's messages are one rowid range of the index.
SESSION_NUMS = table("message_fts_sessions", column("num"), column("session_id"))
WALK = 1000
"""How many of the newest sessions that pass the filters (after the cursor) a search probes one by one
before it collects the matching sessions from the index instead."""


def search_page(db: DbSession, terms: Sequence[Term], where: Sequence[object], *, limit: int,
                newest: bool) -> list[Any]:
    """One page of sessions matching ``terms`` and ``where`` (filters and the cursor's keyset),
    ordered by ``(created_at, id)`` like every listing.

    1. *Walk*: the newest :data:`WALK` sessions that pass ``where`` (the plain listing's query,
       on its indexes) are probed in order, each by its own messages -- a scalar subquery with
       ``LIMIT 1``, which neither planner turns into a join over every match. A common word
       fills the page within a few dozen sessions; a selective filter ends the walk early.
       (SQLite with a prefix term: membership in the matching sessions' numbers, collected
       once, since FTS5 would expand the prefix again at every probe.)
    2. *Collect*, only if the walk neither filled the page nor ran out of sessions: the
       sessions matching the query are taken from the index (a rare word: few), filtered and
       sorted.
    """
    s = SessionRow
    sqlite = db.get_bind().dialect.name == "sqlite"
    order = (s.created_at.desc(), s.id.desc()) if newest else (s.created_at, s.id)
    recent = select(s).where(*where).order_by(*order).limit(WALK).subquery("recent")  # type: ignore[arg-type]
    walk_order = (recent.c.created_at.desc(), recent.c.id.desc()) if newest else (recent.c.created_at, recent.c.id)
    rows = list(db.execute(select(recent).where(_probe(sqlite, terms, recent.c.id)).order_by(*walk_order)
                           .limit(limit)))
    if len(rows) >= limit or (db.scalar(select(func.count()).select_from(recent)) or 0) < WALK:
        return rows
    if sqlite:
        nums = text("SELECT session_id FROM message_fts_sessions WHERE num IN "
                    "(SELECT rowid >> 32 FROM message_fts WHERE message_fts MATCH :q)").bindparams(q=fts5_query(terms))
        return list(db.scalars(select(s).where(s.id.in_(nums), *where).order_by(*order).limit(limit)))  # type: ignore[arg-type]
    found = (select(MESSAGE_SEARCH.c.session_id).distinct()
             .where(text("message_search.tsv @@ to_tsquery('simple', :q)").bindparams(q=tsquery(terms)))
             .cte("found").prefix_with("MATERIALIZED"))
    # each found session looked up by id (OFFSET 0 keeps the planner from hashing the whole table)
    one = select(s).where(s.id == found.c.session_id, *where).offset(0).lateral("one")  # type: ignore[arg-type]
    lat_order = (one.c.created_at.desc(), one.c.id.desc()) if newest else (one.c.created_at, one.c.id)
    return list(db.execute(select(one).select_from(found).join(one, true()).order_by(*lat_order).limit(limit)))


def _probe(sqlite: bool, terms: Sequence[Term], session_id: Any) -> Any:
    """Whether the session ``session_id`` (a column of the walk) has a message matching ``terms``."""
    if not sqlite:
        m = MESSAGE_SEARCH.alias("m")
        return (select(literal(1)).select_from(m).where(
            m.c.session_id == session_id, text("m.tsv @@ to_tsquery('simple', :q)").bindparams(q=tsquery(terms)))
            .limit(1).scalar_subquery()).isnot(None)
    num = (select(SESSION_NUMS.c.num).where(SESSION_NUMS.c.session_id == session_id)
           .correlate_except(SESSION_NUMS).scalar_subquery())  # the walked session, two levels out
    if any(t.prefix for t in terms):  # FTS5 expands a prefix at every probe: match the set, built once, instead
        return num.in_(text("SELECT rowid >> 32 FROM message_fts WHERE message_fts MATCH :q")
                       .bindparams(q=fts5_query(terms)))
    first = num.op("<<")(literal_column("32"))
    fts = table("message_fts", column("rowid"))
    return (select(literal(1)).select_from(fts).where(
        text("message_fts MATCH :q").bindparams(q=fts5_query(terms)),
        fts.c.rowid.between(first, first.op("|")(literal_column("4294967295")))).limit(1).scalar_subquery()).isnot(None)


@dataclass(frozen=True, slots=True)
class Segment:
    text: str
    match: bool


@dataclass(frozen=True, slots=True)
class Match:
    """A session's first matching message (by ``seq``) and a snippet of it around the first hit."""

    seq: int
    type: str
    snippet: list[Segment]


def first_matches(engine: Engine, session_ids: Sequence[str], terms: Sequence[Term]) -> dict[str, Match]:
    """For each of ``session_ids`` with a matching message: its first one, with a snippet."""
    if not session_ids:
        return {}
    ids = list(session_ids)
    with DbSession(engine) as db:
        if engine.dialect.name == "sqlite":  # one pass over the page's rowid range (a prefix expands once)
            sid_of = {num: sid for sid, num in db.execute(select(SESSION_NUMS.c.session_id, SESSION_NUMS.c.num)
                                                          .where(SESSION_NUMS.c.session_id.in_(ids)))}
            if not sid_of:
                return {}
            hits = db.execute(text("SELECT rowid >> 32, rowid & 4294967295 FROM message_fts WHERE message_fts "
                                   "MATCH :q AND rowid BETWEEN (:lo << 32) AND (:hi << 32) | 4294967295"),
                              {"q": fts5_query(terms), "lo": min(sid_of), "hi": max(sid_of)})
            firsts: dict[str, int] = {}
            for num, seq in hits:
                sid = sid_of.get(num)
                if sid is not None and (sid not in firsts or seq < firsts[sid]):
                    firsts[sid] = int(seq)
        else:
            ms = MESSAGE_SEARCH
            q = (select(ms.c.session_id, func.min(ms.c.seq)).where(
                text("tsv @@ to_tsquery('simple', :q)").bindparams(q=tsquery(terms)), ms.c.session_id.in_(ids))
                .group_by(ms.c.session_id))
            firsts = {sid: seq for sid, seq in db.execute(q)}
        if not firsts:
            return {}
        bodies = db.execute(select(EventRow.session_id, EventRow.seq, EventRow.body).where(
            EventRow.session_id.in_(list(firsts)), EventRow.seq.in_(list(set(firsts.values())))))
        out: dict[str, Match] = {}
        for sid, seq, body in bodies:
            if firsts.get(sid) != seq:
                continue
            event = event_from_json(body)
            out[sid] = Match(seq=seq, type=event.type, snippet=snippet(getattr(event, "text", ""), terms))
        return out


def snippet(text_: str, terms: Sequence[Term], words: int = SNIPPET_WORDS) -> list[Segment]:
    """About ``words`` words of ``text_`` around its first hit, split into plain and matching segments
    (a client renders each as text: nothing here is markup)."""
    exact = {w for t in terms for w in (t.words if not t.prefix else t.words[:-1])}
    prefixes = tuple(t.words[-1] for t in terms if t.prefix)
    spans = [(m.start(), m.end(), m.group().casefold()) for m in _WORD.finditer(text_)]
    hits = {i for i, (_, _, w) in enumerate(spans) if w in exact or (prefixes and w.startswith(prefixes))}
    if not spans:
        return [Segment(text_[:200], False)] if text_ else []
    first = min(hits) if hits else 0
    lo = max(0, first - words // 3)
    hi = min(len(spans), lo + words)
    start = 0 if lo == 0 else spans[lo][0]  # the whole text's ends when they are in the window
    end = len(text_) if hi == len(spans) else spans[hi - 1][1]
    out: list[Segment] = []
    if lo > 0:
        out.append(Segment("…", False))
    pos = start
    for i in range(lo, hi):
        s, e, _ = spans[i]
        if i in hits:
            if s > pos:
                out.append(Segment(text_[pos:s], False))
            out.append(Segment(text_[s:e], True))
            pos = e
    if end > pos:
        out.append(Segment(text_[pos:end], False))
    if hi < len(spans):
        out.append(Segment("…", False))
    return out
