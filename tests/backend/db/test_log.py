"""The session log: appends store a stand-in for a bad event and keep the rest; reads give the stored JSON lines."""

from __future__ import annotations

from sqlalchemy import Engine

from agent.events import AssistantDelta, AssistantMessage, ErrorEvent, Event, TurnEnd, TurnStarted, UserMessage, \
    event_to_json
from backend.db.log import SessionLog, stand_in

N = 300
BAD_SEQ = 150


def _make_session(log: SessionLog) -> str:
    with log.engine.begin() as conn:  # a snapshot row the session can point at
        conn.exec_driver_sql("INSERT INTO snapshots (id, manifest, created_at) VALUES ('s0', '{}', '2026-01-01')")
    return log.create_session(id="sess1", owner="u", source={}, workspace_id="w", base_snapshot="s0",
                              policy={}).id


def _events(sid: str, bad: Event | None = None) -> list[Event]:
    out: list[Event] = [AssistantDelta(seq=i, session_id=sid, turn=1, step=1, text=f"word {i}") for i in range(1, N + 1)]
    if bad is not None:
        out[BAD_SEQ - 1] = bad
    return out


def _unserialisable(sid: str) -> Event:
    # model_construct skips the validator that makes events JSON-safe: the one way left to build one.
    return AssistantDelta.model_construct(seq=BAD_SEQ, session_id=sid, turn=1, ts=1.0, step=1, text="bad \ud800")


def _assert_all_stored_with_stand_in(log: SessionLog, sid: str, bad_type: str = "assistant_delta") -> None:
    stored = log.all_events(sid)
    assert [e.seq for e in stored] == list(range(1, N + 1))
    assert all(e.text == f"word {e.seq}" for e in stored if e.seq != BAD_SEQ)
    err = stored[BAD_SEQ - 1]
    assert isinstance(err, ErrorEvent) and err.turn == 1
    assert f"event seq {BAD_SEQ} ({bad_type}) could not be stored" in err.message
    assert log.get_session(sid).last_seq == N


def test_append_replaces_an_unserialisable_event_and_keeps_the_rest(engine: Engine) -> None:
    log = SessionLog(engine)
    sid = _make_session(log)
    stored = log.append(_events(sid, _unserialisable(sid)))
    assert len(stored) == N and isinstance(stored[BAD_SEQ - 1], ErrorEvent)
    _assert_all_stored_with_stand_in(log, sid)


def test_stand_in_keeps_seq_session_turn_and_time() -> None:
    e = AssistantDelta(seq=9, session_id="s", turn=3, ts=12.5, step=1, text="x")
    s = stand_in(e, "why")
    assert (s.seq, s.session_id, s.turn, s.ts, s.type) == (9, "s", 3, 12.5, "error") and "why" in s.message


def test_append_stored_gives_the_line_the_log_holds_and_advances_each_session(engine: Engine) -> None:
    log = SessionLog(engine)
    a = _make_session(log)
    b = log.create_session(id="sess2", owner="u", source={}, workspace_id="w", base_snapshot="s0", policy={}).id
    batch: list[Event] = [
        AssistantDelta(seq=1, session_id=a, turn=1, step=1, text="a1"),
        AssistantDelta(seq=1, session_id=b, turn=2, step=1, text="b1"),
        AssistantMessage(seq=2, session_id=a, turn=1, step=1, text="a1", output_tokens=7),
        AssistantMessage(seq=2, session_id=b, turn=2, step=1, text="b1", output_tokens=5),
    ]
    stored = log.append_stored(batch)
    assert [s.event for s in stored] == batch
    assert [s.json for s in stored] == [event_to_json(e) for e in batch]
    log.append_stored([AssistantMessage(seq=3, session_id=a, turn=2, step=1, text="x", output_tokens=3)])
    for sid, want in ((a, (3, 2, 10)), (b, (2, 2, 5))):
        info = log.get_session(sid)
        assert (info.last_seq, info.turns, info.output_tokens) == want
    # read back: the same lines, byte for byte, parsed only on demand
    back = log.events_stored(a, after=0)
    assert [s.seq for s in back] == [1, 2, 3]
    assert [s.json for s in back[:2]] == [stored[0].json, stored[2].json]
    assert back[0]._event is None and back[0].event == batch[0]
    assert [s.seq for s in log.events_stored(a, after=1, limit=1)] == [2]


def test_a_turn_sets_the_status_in_the_commits_of_its_first_and_last_events(engine: Engine) -> None:
    log = SessionLog(engine)
    sid = _make_session(log)
    log.append([UserMessage(seq=1, session_id=sid, turn=1, text="go")])
    assert log.get_session(sid).status == "running"  # committed with the turn's first event
    log.append([AssistantDelta(seq=2, session_id=sid, turn=1, step=1, text="x")])
    assert log.get_session(sid).status == "running"
    log.append([TurnEnd(seq=3, session_id=sid, turn=1, reason="completed", steps=1, output_tokens=1),
                UserMessage(seq=4, session_id=sid, turn=2, text="again")])
    assert log.get_session(sid).status == "running"  # the later event of the batch wins
    log.append([TurnEnd(seq=5, session_id=sid, turn=2, reason="completed", steps=1, output_tokens=1)])
    assert log.get_session(sid).status == "idle"
    log.set_status(sid, "cancelled")
    log.append([TurnStarted(seq=6, session_id=sid, turn=3)])
    assert log.get_session(sid).status == "cancelled"  # events never undo a cancel


def test_merge_source_sets_keys_and_keeps_the_others(engine: Engine) -> None:
    import pytest

    log = SessionLog(engine)
    with log.engine.begin() as conn:
        conn.exec_driver_sql("INSERT INTO snapshots (id, manifest, created_at) VALUES ('s0', '{}', '2026-01-01')")
    sid = log.create_session(id="sess2", owner="u", source={"kind": "dir", "acp_mode": "ask"}, workspace_id="w",
                             base_snapshot="s0", policy={}).id
    info = log.merge_source(sid, {"acp_mode": "auto", "external_tools": [{"name": "t"}]})
    assert info.source == {"kind": "dir", "acp_mode": "auto", "external_tools": [{"name": "t"}]}
    assert log.get_session(sid).source == info.source
    with pytest.raises(KeyError, match="no session"):
        log.merge_source("nope", {"a": 1})
