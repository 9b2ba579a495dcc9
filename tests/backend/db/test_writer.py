"""The group-commit writer: a bad event never costs another; a database failure is reported as one;
events are committed in order, before their waiters (and so any client) see them."""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy import Engine, event

from agent.events import AssistantDelta, ErrorEvent, Event, ToolResultEvent
from backend.db.log import SessionLog
from backend.db.writer import EventRejected, EventWriter, LogUnavailable
from tests.backend.db.test_log import BAD_SEQ, N, _assert_all_stored_with_stand_in, _events, _make_session, \
    _unserialisable


async def _append_all(writer: EventWriter, events: list[Event]) -> list[Any]:
    return await asyncio.wait_for(
        asyncio.gather(*(writer.append(e) for e in events), return_exceptions=True), 30)


async def test_writer_isolates_an_unserialisable_event_in_a_batch(engine: Engine) -> None:
    log = SessionLog(engine)
    sid = _make_session(log)
    writer = EventWriter(log)
    try:
        results = await _append_all(writer, _events(sid, _unserialisable(sid)))
    finally:
        writer.close()
    assert not any(isinstance(r, BaseException) for r in results), [r for r in results if isinstance(r, BaseException)]
    assert isinstance(results[BAD_SEQ - 1].event, ErrorEvent) and results[BAD_SEQ - 1].seq == BAD_SEQ
    _assert_all_stored_with_stand_in(log, sid)


async def test_writer_stores_a_stand_in_for_a_row_the_database_refuses(engine: Engine) -> None:
    # A NaN time is stored by SQLite as NULL, which the NOT NULL column refuses (an IntegrityError):
    # a bad row, not a database failure. Its stand-in takes the current time and is stored.
    log = SessionLog(engine)
    sid = _make_session(log)
    bad = ToolResultEvent(seq=BAD_SEQ, session_id=sid, turn=1, ts=float("nan"), step=1, index=0, call_id="c",
                          name="t", ok=True, output="x")
    writer = EventWriter(log, max_batch=N)
    try:
        results = await _append_all(writer, _events(sid, bad))
    finally:
        writer.close()
    assert not any(isinstance(r, BaseException) for r in results)
    assert writer.replaced == 1
    _assert_all_stored_with_stand_in(log, sid, "tool_result")
    assert "the database refused it: IntegrityError" in log.all_events(sid)[BAD_SEQ - 1].message


async def test_writer_rejects_only_the_event_whose_stand_in_is_refused_too(engine: Engine) -> None:
    log = SessionLog(engine)
    sid = _make_session(log)
    orphan = AssistantDelta(seq=BAD_SEQ, session_id="no-such-session", turn=1, step=1, text="x")  # foreign key
    writer = EventWriter(log, max_batch=N)
    try:
        results = await _append_all(writer, _events(sid, orphan))
    finally:
        writer.close()
    rejected = [i for i, r in enumerate(results) if isinstance(r, BaseException)]
    assert rejected == [BAD_SEQ - 1] and isinstance(results[BAD_SEQ - 1], EventRejected)
    assert "no-such-session" in str(results[BAD_SEQ - 1])
    assert [e.seq for e in log.all_events(sid)] == [s for s in range(1, N + 1) if s != BAD_SEQ]


async def test_disk_full_is_a_database_failure_not_a_bad_event(engine: Engine) -> None:
    log = SessionLog(engine)
    sid = _make_session(log)
    limit = {"pages": 0}

    @event.listens_for(engine, "connect")
    def _cap(dbapi_conn: Any, _record: Any) -> None:  # SQLite's own size cap: a real SQLITE_FULL
        if limit["pages"]:
            dbapi_conn.execute(f"PRAGMA max_page_count={limit['pages']}")

    with engine.connect() as conn:
        limit["pages"] = conn.exec_driver_sql("PRAGMA page_count").scalar() or 1
    engine.dispose()  # new connections get the cap
    big = [ToolResultEvent(seq=i, session_id=sid, turn=1, step=1, index=0, call_id="c", name="t", ok=True,
                           output="y" * 20_000) for i in range(1, 21)]
    writer = EventWriter(log)
    try:
        results = await _append_all(writer, big)
        assert all(isinstance(r, LogUnavailable) for r in results), results
        assert "database or disk is full" in str(results[0]) and "were not stored" in str(results[0])
        assert writer.replaced == 0  # no event was blamed
        assert log.all_events(sid) == []

        limit["pages"] = 0  # space again: the same writer thread carries on
        engine.dispose()
        again = await _append_all(writer, big[:3])
        assert not any(isinstance(r, BaseException) for r in again)
    finally:
        writer.close()
    assert [e.seq for e in log.all_events(sid)] == [1, 2, 3]


