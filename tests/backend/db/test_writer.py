"""The group-commit writer: a bad event never costs another; a database failure is reported as one;
events are committed in order, before their waiters (and so any client) see them."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, event

from agent.events import AssistantDelta, ErrorEvent, Event, ToolResultEvent
from backend.db.log import SessionLog
from backend.db.writer import EventRejected, EventWriter, LogUnavailable
from tests.backend.db.test_log import BAD_SEQ, N, _assert_all_stored_with_stand_in, _events, _make_session, \
    _unserialisable

ROOT = Path(__file__).resolve().parents[3]


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




def _sessions(log: SessionLog, n: int) -> list[str]:
    _make_session(log)
    return ["sess1"] + [log.create_session(id=f"sess{i}", owner="u", source={}, workspace_id="w", base_snapshot="s0",
                                           policy={}).id for i in range(2, n + 1)]


async def test_group_commit_keeps_each_sessions_order_and_commits_before_the_waiter_sees_it(engine: Engine) -> None:
    log = SessionLog(engine)
    sids = _sessions(log, 3)
    writer = EventWriter(log)
    seen: dict[str, list[int]] = {sid: [] for sid in sids}

    async def session(sid: str) -> None:  # like agent.Session: the next event only after the last is durable
        for seq in range(1, 201):
            stored = await writer.append(AssistantDelta(seq=seq, session_id=sid, turn=1, step=1, text=f"{sid} {seq}"))
            # what a client would be sent is already committed, byte for byte
            assert [r.json for r in log.events_stored(sid, after=seq - 1, limit=1)] == [stored.json]
            seen[sid].append(stored.seq)

    try:
        await asyncio.wait_for(asyncio.gather(*(session(s) for s in sids)), 60)
    finally:
        writer.close()
    for sid in sids:
        assert seen[sid] == list(range(1, 201))
        assert [s.seq for s in log.events_stored(sid, limit=1000)] == list(range(1, 201))
        assert log.get_session(sid).last_seq == 200
    assert writer.commits < 3 * 200  # grouped: the three sessions shared transactions


async def test_one_loop_iterations_appends_are_one_batch_in_order(engine: Engine) -> None:
    log = SessionLog(engine)
    sid = _make_session(log)
    writer = EventWriter(log)
    try:
        stored = await asyncio.wait_for(asyncio.gather(*(
            writer.append(AssistantDelta(seq=i, session_id=sid, turn=1, step=1, text=str(i))) for i in range(1, 51))), 30)
    finally:
        writer.close()
    assert (writer.batches, writer.commits) == (1, 1)  # one hand-over to the thread, one transaction
    assert [s.seq for s in stored] == [s.seq for s in log.events_stored(sid)] == list(range(1, 51))


CRASHER = """
import asyncio, sys
from agent.events import AssistantDelta
from backend.db.engine import make_engine
from backend.db.log import SessionLog
from backend.db.writer import EventWriter

log = SessionLog(make_engine(sys.argv[1]))
writer = EventWriter(log)

async def session(sid):
    seq = 0
    while True:
        seq += 1
        stored = await writer.append(AssistantDelta(seq=seq, session_id=sid, turn=1, step=1, text="x" * 200))
        print(sid, stored.seq, flush=True)  # what a client would see: sent only once committed

async def main():
    await asyncio.gather(*(session(sid) for sid in sys.argv[2:]))

asyncio.run(main())
"""


def test_a_killed_writer_loses_no_event_a_client_saw(engine: Engine, tmp_path: Path) -> None:
    log = SessionLog(engine)
    sids = _sessions(log, 4)
    proc = subprocess.Popen([sys.executable, "-c", CRASHER, str(engine.url), *sids], stdout=subprocess.PIPE,
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout is not None
    seen: dict[str, int] = {}
    try:
        for line in proc.stdout:  # until a few thousand events went out, then kill -9 mid-stream
            sid, seq = line.decode().split()
            seen[sid] = int(seq)
            if sum(seen.values()) >= 3000:
                break
    finally:
        proc.kill()
        proc.wait(timeout=30)
        proc.stdout.close()
    assert sum(seen.values()) >= 3000, "the writer process ended early"
    for sid in sids:
        stored = [s.seq for s in log.events_stored(sid, limit=100_000)]
        assert stored == list(range(1, len(stored) + 1))  # a prefix: in order, no gap
        assert len(stored) >= seen.get(sid, 0)  # everything its client saw (and maybe a last batch more)
