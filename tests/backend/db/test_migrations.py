"""Migration 0002 (RL tags, rl_runs, rl_iterations): upgrade in place from 0001 and downgrade, on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from alembic import command
from sqlalchemy import Engine, inspect, text

from agent.events import UserMessage, event_to_json
from backend.db.engine import alembic_config, make_engine
from backend.db.log import SessionLog


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    eng = make_engine(db_url)
    yield eng
    eng.dispose()


def _to(engine: Engine, action: str, revision: str) -> None:
    cfg = alembic_config()
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        getattr(command, action)(cfg, revision)


def _columns(engine: Engine, table: str) -> set[str]:
    return {c["name"] for c in inspect(engine).get_columns(table)}


def _seed_0001(engine: Engine) -> None:
    """Two user sessions (one a branch of the other) with events, written as 0001 knew them."""
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO snapshots (id, manifest, created_at) VALUES ('s0', '{}', '2026-01-01')"))
        for sid, parent in (("a" * 32, None), ("b" * 32, "a" * 32)):
            conn.execute(text(
                "INSERT INTO sessions (id, owner, status, title, source, workspace_id, base_snapshot, policy, "
                "created_at, updated_at, last_seq, turns, output_tokens, parent_id) VALUES (:id, 'alice', 'idle', "
                "'t', '{}', 'w', 's0', '{}', '2026-01-01', '2026-01-01', 1, 1, 0, :parent)"), {"id": sid, "parent": parent})
            body = event_to_json(UserMessage(seq=1, session_id=sid, turn=1, ts=1.0, text="hi"))
            conn.execute(text("INSERT INTO events (session_id, seq, type, turn, ts, body) VALUES "
                              "(:id, 1, 'user_message', 1, 1.0, :body)"), {"id": sid, "body": body})


def test_a_0001_database_with_sessions_upgrades_in_place_and_downgrades(engine: Engine) -> None:
    _to(engine, "upgrade", "0001")
    _seed_0001(engine)
    _to(engine, "upgrade", "head")
    cols = _columns(engine, "sessions")
    assert {"kind", "rl_run", "rl_iteration", "rl_task", "rl_sample", "rl_reward", "rl_status"} <= cols
    assert {"rl_runs", "rl_iterations"} <= set(inspect(engine).get_table_names())
    indexes = {ix["name"] for ix in inspect(engine).get_indexes("sessions")}
    assert {"ix_sessions_kind_created", "ix_sessions_rl_rollout"} <= indexes
    log = SessionLog(engine)
    kept = log.list_sessions()
    assert sorted(s.id for s in kept) == ["a" * 32, "b" * 32]
    assert {s.kind for s in kept} == {"user"} and all(s.rl_run is None and s.rl_reward is None for s in kept)
    assert [s.id for s in log.list_sessions(kind="user")] and log.list_sessions(kind="rl") == []
    assert log.get_session("b" * 32).parent_id == "a" * 32  # type: ignore[union-attr]
    assert [(e.type, e.seq) for e in log.all_events("a" * 32)] == [("user_message", 1)]

    _to(engine, "downgrade", "0001")
    assert "kind" not in _columns(engine, "sessions")
    assert not {"rl_runs", "rl_iterations"} & set(inspect(engine).get_table_names())
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM sessions")).scalar_one() == 2
        assert conn.execute(text("SELECT count(*) FROM events")).scalar_one() == 2
    _to(engine, "upgrade", "head")  # and back up again
    assert "kind" in _columns(engine, "sessions")


def test_0003_fills_policy_names_and_the_search_index_from_existing_rows_and_downgrades(engine: Engine) -> None:
    from backend.db.browse import BrowseFilters, browse_sessions
    from backend.db.search import parse_query

    _to(engine, "upgrade", "0002")
    _seed_0001(engine)
    with engine.begin() as conn:
        conn.execute(text("""UPDATE sessions SET policy = '{"kind": "openai", "model": "m1"}' WHERE id = :id"""),
                     {"id": "a" * 32})
    _to(engine, "upgrade", "head")
    log = SessionLog(engine)
    assert log.get_session("a" * 32).policy_name == "openai:m1"  # type: ignore[union-attr]
    assert log.get_session("b" * 32).policy_name == "unknown"  # type: ignore[union-attr]  # '{}' has no kind
    found = browse_sessions(engine, BrowseFilters(terms=tuple(parse_query("hi"))))
    assert sorted(s.id for s in found.sessions) == ["a" * 32, "b" * 32]  # messages from before 0003 are indexed
    assert "feedback" in inspect(engine).get_table_names()
    indexes = {ix["name"] for ix in inspect(engine).get_indexes("sessions")}
    assert {"ix_sessions_created_id", "ix_sessions_owner_created", "ix_sessions_policy_name"} <= indexes

    _to(engine, "downgrade", "0002")
    names = set(inspect(engine).get_table_names())
    assert not {"feedback", "message_fts", "message_search"} & names
    assert not {"policy_name", "feedback_up", "files_reverted"} & _columns(engine, "sessions")
    with engine.begin() as conn:  # the trigger went with its table: events still insert
        conn.execute(text("INSERT INTO events (session_id, seq, type, turn, ts, body) VALUES "
                          "(:id, 2, 'user_message', 2, 2.0, :body)"),
                     {"id": "a" * 32, "body": event_to_json(UserMessage(seq=2, session_id="a" * 32, turn=2, text="x"))})
        assert conn.execute(text("SELECT count(*) FROM sessions")).scalar_one() == 2
    _to(engine, "upgrade", "head")
    found = browse_sessions(engine, BrowseFilters(terms=tuple(parse_query("x"))))
    assert [s.id for s in found.sessions] == ["a" * 32]
