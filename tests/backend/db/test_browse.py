"""backend/db/browse.py and backend/db/search.py on a real database (SQLite and PostgreSQL)."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
from sqlalchemy import Engine, update
from sqlalchemy.orm import Session as DbSession

from agent.events import AssistantMessage, ToolResultEvent, TurnStarted, UserMessage
from backend.db.browse import BrowseFilters, CursorError, browse_sessions, decode_cursor, encode_cursor, facets
from backend.db.engine import make_engine, migrate
from backend.db.log import SessionInfo, SessionLog
from backend.db.models import SessionRow
from backend.db.search import parse_query
from tools.snapshots import Snapshot


@pytest.fixture
def log(db_url: str) -> Iterator[SessionLog]:
    engine = make_engine(db_url)
    migrate(engine)
    yield SessionLog(engine)
    engine.dispose()


def new_session(log: SessionLog, owner: str = "alice", *, user_text: str = "", model_text: str = "",
                **fields: object) -> SessionInfo:
    snap = Snapshot.from_manifest({})
    log.save_snapshot(snap)
    info = log.create_session(id=uuid.uuid4().hex, owner=owner, title="", source={}, workspace_id="w",
                              base_snapshot=snap.id, **{"policy": {"kind": "scripted"}, **fields})
    events = []
    if user_text:
        events += [UserMessage(seq=1, session_id=info.id, turn=1, text=user_text),
                   TurnStarted(seq=2, session_id=info.id, turn=1)]
    if model_text:
        events.append(AssistantMessage(seq=3, session_id=info.id, turn=1, step=1, text=model_text))
        events.append(ToolResultEvent(seq=4, session_id=info.id, turn=1, step=1, index=0, call_id="t1s1c0",
                                      name="x", ok=True, output="needle in a tool output"))
    log.append(events)
    return info


def ids(page: object) -> list[str]:
    return [s.id for s in page.sessions]  # type: ignore[attr-defined]


def all_pages(engine: Engine, filters: BrowseFilters, limit: int, order: str = "newest") -> list[str]:
    out, cursor = [], None
    while True:
        page = browse_sessions(engine, filters, limit=limit, cursor=cursor, order=order)  # type: ignore[arg-type]
        out += ids(page)
        cursor = page.next_cursor
        if cursor is None:
            return out


def test_keyset_pages_cover_every_session_once_in_order(log: SessionLog) -> None:
    made = [new_session(log, owner="alice" if i % 3 else "bob") for i in range(11)]
    with DbSession(log.engine) as db, db.begin():  # two sessions created in the same microsecond: ties break by id
        db.execute(update(SessionRow).where(SessionRow.id.in_([made[4].id, made[5].id]))
                   .values(created_at=made[4].created_at))
    newest = sorted(log.list_sessions(limit=100), key=lambda s: (s.created_at, s.id), reverse=True)
    assert all_pages(log.engine, BrowseFilters(), limit=3) == [s.id for s in newest]
    assert all_pages(log.engine, BrowseFilters(), limit=4, order="oldest") == [s.id for s in reversed(newest)]
    alice = all_pages(log.engine, BrowseFilters(owner="alice"), limit=2)
    assert alice == [s.id for s in newest if s.owner == "alice"] and len(alice) == 7
    last = browse_sessions(log.engine, BrowseFilters(), limit=11)
    assert len(last.sessions) == 11 and last.next_cursor is None
    page = browse_sessions(log.engine, BrowseFilters(), limit=5)
    new_session(log)  # a session created meanwhile does not shift the next page
    assert ids(browse_sessions(log.engine, BrowseFilters(), limit=5, cursor=page.next_cursor)) == \
        [s.id for s in newest[5:10]]


def test_a_cursor_is_checked(log: SessionLog) -> None:
    new_session(log)
    new_session(log)
    cursor = browse_sessions(log.engine, BrowseFilters(), limit=1).next_cursor
    assert cursor is not None and decode_cursor(cursor, "newest")[1]
    for bad in ("nonsense", "", "eyJ4IjoxfQ", cursor + "x"):
        with pytest.raises(CursorError):
            browse_sessions(log.engine, BrowseFilters(), cursor=bad)
    with pytest.raises(CursorError, match="order=oldest"):
        browse_sessions(log.engine, BrowseFilters(), cursor=cursor, order="oldest")
    ghost = dataclasses.replace(log.list_sessions()[0], id="f" * 32)  # a well-formed cursor naming no session
    page = browse_sessions(log.engine, BrowseFilters(terms=tuple(parse_query("x"))), cursor=encode_cursor(ghost, "newest"))
    assert page.sessions == []


def test_every_filter(log: SessionLog) -> None:
    a = new_session(log, policy={"kind": "openai", "model": "qwen"})
    b = new_session(log, "bob")
    rl = [new_session(log, "rl", kind="rl", rl_run="run1", rl_iteration=it, rl_task=task, rl_sample=0,
                      policy={"kind": "rl"}) for it, task in ((0, "t1"), (1, "t1"), (1, "t2"))]
    log.set_rl_outcome(rl[0].id, reward=0.0, status="finished")
    log.set_rl_outcome(rl[1].id, reward=1.0, status="finished")
    log.set_status(b.id, "cancelled")
    with DbSession(log.engine) as db, db.begin():
        db.execute(update(SessionRow).where(SessionRow.id == a.id).values(feedback_down=1))
        db.execute(update(SessionRow).where(SessionRow.id == b.id).values(files_reverted=2))

    def got(**kw: object) -> set[str]:
        return set(ids(browse_sessions(log.engine, BrowseFilters(**kw), limit=50)))  # type: ignore[arg-type]

    assert got(kind="rl") == {r.id for r in rl} and got(kind="user") == {a.id, b.id}
    assert got(status="cancelled") == {b.id} and got(owner="bob") == {b.id}
    assert got(policy="openai:qwen") == {a.id} and got(policy="rl") == {r.id for r in rl}
    assert got(run="run1", iteration=1) == {rl[1].id, rl[2].id} and got(task="t2") == {rl[2].id}
    assert got(min_reward=0.5) == {rl[1].id} and got(max_reward=0.5) == {rl[0].id}
    assert got(feedback="down") == {a.id} and got(feedback="reverted") == {b.id}
    assert got(feedback="any") == {a.id, b.id} and got(feedback="none") == {r.id for r in rl}
    assert got(feedback="up") == set()
    assert got(since=rl[0].created_at) == {r.id for r in rl}
    assert got(until=rl[0].created_at) == {a.id, b.id}
    assert got(since=a.created_at, until=a.created_at + timedelta(microseconds=1)) == {a.id}
    f = facets(log.engine)
    assert f.owners == ["alice", "bob", "rl"] and f.runs == ["run1"]
    assert f.policies == ["openai:qwen", "rl", "scripted"]
    assert facets(log.engine, owner="bob").owners == ["bob"] and facets(log.engine, owner="bob").runs == []


def test_search_finds_messages_not_tool_output_and_snippets_mark_the_hits(log: SessionLog) -> None:
    a = new_session(log, user_text="The tests fail. Fix stats.py please", model_text="I'll call read_file first")
    b = new_session(log, "bob", user_text="Añadir tests para el módulo", model_text="ok")
    new_session(log, user_text="something else entirely", model_text="unrelated")

    def found(q: str, **kw: object) -> set[str]:
        page = browse_sessions(log.engine, BrowseFilters(terms=tuple(parse_query(q)), **kw), limit=50)  # type: ignore[arg-type]
        return set(ids(page))

    assert found("stats") == {a.id} and found("STATS.PY") == {a.id} and found("stats.py fix") == {a.id}
    assert found("read_file") == {a.id} and found('"call read"') == {a.id}
    assert found('"read call"') == set()  # a phrase keeps its order
    assert found("tests") == {a.id, b.id} and found("tests", owner="bob") == {b.id}
    assert found("stat*") == {a.id} and found("stat") == set()
    assert found("needle") == set()  # tool output is not a message
    assert found("tests módulo") == {b.id} and found("AÑADIR") == {b.id}  # written as in the text: both databases
    page = browse_sessions(log.engine, BrowseFilters(terms=tuple(parse_query("stats fix"))), limit=5)
    match = page.matches[a.id]
    assert match.seq == 1 and match.type == "user_message"
    marked = [s.text for s in match.snippet if s.match]
    assert marked == ["Fix", "stats"] and "".join(s.text for s in match.snippet) == "The tests fail. Fix stats.py please"


@pytest.mark.parametrize("second", [False, True], ids=["first-plan", "second-plan"])
def test_search_pages_cover_every_match_once_with_either_plan(log: SessionLog, second: bool,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import backend.db.search as search

    if second:
        monkeypatch.setattr(search, "WALK", 1)  # collect the matches from the index after one probe
    made = [new_session(log, owner="alice" if i % 2 else "bob", user_text=f"common word{i % 3}",
                        model_text="other" if i % 4 else "common too") for i in range(13)]
    for q in ("common", "comm*"):  # a prefix has its own probe on SQLite
        for order in ("newest", "oldest"):
            got = all_pages(log.engine, BrowseFilters(terms=tuple(parse_query(q))), limit=2, order=order)
            want = [s.id for s in (reversed(made) if order == "newest" else made)]
            assert got == want, (q, order)
    got = all_pages(log.engine, BrowseFilters(terms=tuple(parse_query("word1")), owner="alice"), limit=1)
    assert got == [s.id for s in reversed(made) if s.owner == "alice" and made.index(s) % 3 == 1]
    page = browse_sessions(log.engine, BrowseFilters(terms=tuple(parse_query("too"))), limit=50)
    assert set(page.matches) == {s.id for i, s in enumerate(made) if i % 4 == 0}
    assert all(m.seq == 3 and m.type == "assistant_message" for m in page.matches.values())


def test_hostile_queries_are_words_not_syntax(log: SessionLog) -> None:
    a = new_session(log, user_text="select the NEAR column or not", model_text="x")
    for q in ('NEAR(" a', "col:umn", "a AND OR NOT", "'; DROP TABLE sessions; --", "(((", "x & y | !z <-> w:*",
              '"unterminated', "*", "ü" * 200):
        try:
            terms = parse_query(q)
        except ValueError:
            continue
        browse_sessions(log.engine, BrowseFilters(terms=tuple(terms)))  # no syntax error on either database
    assert ids(browse_sessions(log.engine, BrowseFilters(terms=tuple(parse_query("near or not"))))) == [a.id]
    assert log.get_session(a.id) is not None
