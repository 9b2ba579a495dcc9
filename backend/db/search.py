"""Full-text search over sessions' messages (user and assistant text), by dialect.

The index is kept by a trigger on ``events`` (migration 0003): an FTS5 table
``message_fts`` on SQLite, a ``tsvector`` table ``message_search`` with a GIN
index on PostgreSQL. Both see a message as its words: runs of letters and
digits, case-folded (``read_file`` is ``read`` ``file``; ``stats.py`` is
``stats`` ``py``).

The search syntax (:func:`parse_query`) is deliberately small and the same on
both databases: words are ANDed; ``"quoted words"`` must appear in that
order, adjacent; a word ending in ``*`` matches as a prefix. A word written
with punctuation (``read_file``, ``stats.py``) is a phrase of its parts.
Anything else is not syntax: the query is rebuilt from its words, so no input
can be an FTS5 or ``tsquery`` syntax error. At most :data:`MAX_TERMS` terms of
at most :data:`MAX_TOKEN_CHARS` characters are kept.

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

from sqlalchemy import ColumnElement, Engine, bindparam, column, func, select, table, text
from sqlalchemy.orm import Session as DbSession

from agent.events import event_from_json
from backend.db.models import EventRow

MAX_TERMS = 16
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
    """A search with no words in it."""


def parse_query(q: str) -> list[Term]:
    """The terms of a search (see the module docstring); :class:`QueryError` if there are none."""
    terms: list[Term] = []
    for m in _TERM.finditer(q):
        raw = m.group(1) if m.group(1) is not None else m.group(2)
        words = tuple(w.casefold()[:MAX_TOKEN_CHARS] for w in _WORD.findall(raw))
        if words:
            terms.append(Term(words, prefix=m.group(2) is not None and raw.endswith("*")))
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


def matching_sessions(dialect: str, terms: Sequence[Term]) -> ColumnElement[bool]:
    """A subquery of the ids of sessions with a message matching ``terms`` (for ``id IN (...)``)."""
    if dialect == "sqlite":
        return text("SELECT session_id FROM message_fts WHERE message_fts MATCH :fts_q").bindparams(
            fts_q=fts5_query(terms))  # type: ignore[return-value]
    return text("SELECT session_id FROM message_search WHERE tsv @@ to_tsquery('simple', :ts_q)").bindparams(
        ts_q=tsquery(terms))  # type: ignore[return-value]


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
    if engine.dialect.name == "sqlite":
        q = text("SELECT session_id, min(seq) FROM message_fts WHERE message_fts MATCH :q AND session_id IN :ids "
                 "GROUP BY session_id").bindparams(bindparam("ids", expanding=True), q=fts5_query(terms), ids=ids)
    else:
        ms = table("message_search", column("session_id"), column("seq"), column("tsv"))
        q = (select(ms.c.session_id, func.min(ms.c.seq)).where(
            text("tsv @@ to_tsquery('simple', :q)").bindparams(q=tsquery(terms)), ms.c.session_id.in_(ids))
            .group_by(ms.c.session_id))
    with DbSession(engine) as db:
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
