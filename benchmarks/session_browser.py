"""Session browser latency at 100,000 sessions: the list and search routes' p50/p95 (target p95 < 200 ms).

Seeds a database with N sessions (default 100,000; ``--quick``: 10,000) the
way the log holds them -- 60% users' sessions (200 owners, four policies),
40% RL rollouts (10 runs x 50 iterations x 1,000 tasks, rewards), a few
percent with feedback, creation times over 180 days -- each with a user
message and a model output of Zipf-distributed words (4 events, 2 of them
indexed for search). Rows go in with bulk inserts, so the search index is
filled by the same trigger the server's writes fire.

Then it times ``GET /v1/browse/sessions`` through the real app (FastAPI,
in-process HTTP client, the same code ``flywheel serve`` runs), each request
timed alone:

* list: staff first pages with no filter and with each filter (owner, kind +
  run + iteration, status, policy, feedback, a date range, a reward range),
  a user's own sessions, and pages 2..20 reached by following the cursor;
* search: a common word, a mid-frequency word, a rare word, two words, a
  phrase, a prefix, the same as a user (their own sessions), and with filters.

Each case's requests come in turn on one connection, with the database warm
(after a few untimed requests). Besides wall time (``p50_ms``/``p95_ms``),
each case reports this process's CPU time per request (``cpu_*``: the app,
and on SQLite the queries, run here; PostgreSQL's own work is in its server
process and shows only in wall time). The load average at start and end is
recorded: on a shared machine waiting for a CPU inflates the wall times. Runs on SQLite, and on PostgreSQL at 127.0.0.1:5432 (database ``test``, a
temporary schema) when it is reachable. Reports p50/p95/max per category
and over all list / all search requests, plus seeding time.

Usage: python benchmarks/session_browser.py [--sessions N] [--requests R] [--quick] [--no-postgres]
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from _common import median, percentile, write_result

from agent.events import AssistantMessage, TurnEnd, TurnStarted, UserMessage, event_to_json
from backend.db.engine import make_engine, migrate, server_reachable
from backend.db.log import SessionLog
from backend.db.models import EventRow, SessionRow, SnapshotRow
from tools.snapshots import Snapshot

PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
TARGET_P95_MS = 200.0
COMMON = ("the fix test file error function return value parser stats mean list call read edit run "
          "python module import class method bug line change output failing passes works check").split()
VOCAB = COMMON + [f"tok{i}" for i in range(4000)]
WEIGHTS = [1.0 / (rank + 1) ** 1.05 for rank in range(len(VOCAB))]
POLICIES = ["openai:qwen2.5-coder", "openai:llama-3.1", "scripted", "openai:mini"]
START = datetime(2026, 6, 1)


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choices(VOCAB, WEIGHTS, k=n))


def seed(engine: Any, n: int, rng: random.Random) -> dict[str, float]:
    """Bulk-insert ``n`` sessions with their events; returns timings."""
    snap = Snapshot.from_manifest({})
    t0 = time.perf_counter()
    with engine.begin() as conn:
        conn.execute(SnapshotRow.__table__.insert(), [{"id": snap.id, "manifest": snap.to_json().decode(),
                                                       "created_at": START}])
    step = timedelta(days=180) / n
    chunk = 5000
    for lo in range(0, n, chunk):
        sessions, events = [], []
        for i in range(lo, min(n, lo + chunk)):
            sid = uuid.UUID(int=rng.getrandbits(128)).hex
            created = START + step * i
            rl = rng.random() < 0.4
            row: dict[str, Any] = {
                "id": sid, "owner": "rl" if rl else f"user{min(199, int(rng.paretovariate(1.2)) - 1)}",
                "status": "cancelled" if rng.random() < 0.08 else "idle", "title": "",  # none running: the
                # server would close their turns at start (Hub.recover)
                "source": {"kind": "rl" if rl else "dir"}, "workspace_id": "w", "base_snapshot": snap.id,
                "policy": {"kind": "rl"} if rl else {"kind": "x"}, "created_at": created, "updated_at": created,
                "last_seq": 4, "turns": 1, "output_tokens": 50, "parent_id": None, "branch_step": None,
                "kind": "rl" if rl else "user", "rl_run": None, "rl_iteration": None, "rl_task": None,
                "rl_sample": None, "rl_reward": None, "rl_status": None,
                "policy_name": "rl" if rl else rng.choice(POLICIES),
                "feedback_up": int(rng.random() < 0.03), "feedback_down": int(rng.random() < 0.02),
                "files_kept": int(rng.random() < 0.02), "files_reverted": int(rng.random() < 0.01),
            }
            if rl:
                row |= {"rl_run": f"run-{rng.randrange(10)}", "rl_iteration": rng.randrange(50),
                        "rl_task": f"task-{rng.randrange(1000)}", "rl_sample": rng.randrange(8),
                        "rl_reward": round(rng.random(), 3), "rl_status": "finished", "feedback_up": 0,
                        "feedback_down": 0, "files_kept": 0, "files_reverted": 0}
            sessions.append(row)
            ts = created.timestamp()
            for e in (UserMessage(seq=1, session_id=sid, turn=1, ts=ts, text=words(rng, 12)),
                      TurnStarted(seq=2, session_id=sid, turn=1, ts=ts),
                      AssistantMessage(seq=3, session_id=sid, turn=1, step=1, ts=ts + 1, text=words(rng, 40),
                                       output_tokens=50),
                      TurnEnd(seq=4, session_id=sid, turn=1, ts=ts + 2, reason="completed", steps=1, output_tokens=50)):
                events.append({"session_id": sid, "seq": e.seq, "type": e.type, "turn": 1, "ts": e.ts,
                               "body": event_to_json(e)})
        with engine.begin() as conn:
            conn.execute(SessionRow.__table__.insert(), sessions)
            conn.execute(EventRow.__table__.insert(), events)
    seeded = time.perf_counter() - t0
    if engine.dialect.name == "postgresql":
        with engine.begin() as conn:
            conn.exec_driver_sql("ANALYZE")
    else:
        with engine.begin() as conn:
            conn.exec_driver_sql("ANALYZE")
            conn.exec_driver_sql("INSERT INTO message_fts(message_fts) VALUES ('optimize')")
    return {"seed_s": round(seeded, 1), "analyze_s": round(time.perf_counter() - t0 - seeded, 1)}


def cases(rng: random.Random, requests: int) -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """Requests per category: (who, query parameters)."""
    day = lambda d: (START + timedelta(days=d)).isoformat()  # noqa: E731
    list_filters: list[dict[str, Any]] = [
        {}, {"owner": "user3"}, {"kind": "user"}, {"kind": "rl", "run": "run-4", "iteration": 17},
        {"status": "cancelled"}, {"policy": "openai:llama-3.1"}, {"feedback": "down"}, {"feedback": "reverted"},
        {"since": day(30), "until": day(32)}, {"kind": "rl", "min_reward": 0.95}, {"kind": "rl", "task": "task-42"},
        {"order": "oldest"}, {"feedback": "any", "kind": "user", "status": "idle"},
    ]
    mid = VOCAB[60:400]
    rare = VOCAB[2000:]
    search: dict[str, Callable[[], str]] = {
        "search_common": lambda: rng.choice(COMMON[:5]),
        "search_mid": lambda: rng.choice(mid),
        "search_rare": lambda: rng.choice(rare),
        "search_two_words": lambda: f"{rng.choice(COMMON)} {rng.choice(mid)}",
        "search_phrase": lambda: f'"{rng.choice(COMMON[:10])} {rng.choice(COMMON[:10])}"',
        "search_prefix": lambda: rng.choice([f"tok{rng.randrange(10, 99)}*", f"{rng.choice(COMMON[:12])[:3]}*"]),
    }
    per = max(3, requests // 12)
    out: dict[str, list[tuple[str, dict[str, Any]]]] = {
        "list_first_page": [("staff", rng.choice(list_filters)) for _ in range(per * 2)],
        "list_user_own": [("user", {}) for _ in range(per)],
    }
    for name, q in search.items():
        out[name] = [("staff", {"q": q()}) for _ in range(per)]
    out["search_user_own"] = [("user", {"q": search["search_mid"]()}) for _ in range(per)]
    out["search_filtered"] = [("staff", {"q": search["search_common"](), **rng.choice(list_filters[1:11])})
                              for _ in range(per)]
    return out


CPU: list[float] = []  # per timed request: CPU time of this process (the app and SQLite run in it)


def timed(client: Any, headers: dict[str, str], params: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    c0, t0 = time.process_time(), time.perf_counter()
    r = client.get("/v1/browse/sessions", params=params, headers=headers)
    ms = (time.perf_counter() - t0) * 1000
    CPU.append((time.process_time() - c0) * 1000)
    if r.status_code != 200:
        raise RuntimeError(f"{params}: {r.status_code} {r.text[:300]}")
    return ms, r.json()


def stats(ms: list[float], cpu: list[float] | None = None) -> dict[str, float]:
    out = {"n": len(ms), "p50_ms": round(median(ms), 2), "p95_ms": round(percentile(ms, 95), 2),
           "max_ms": round(max(ms), 2)}
    if cpu:
        out |= {"cpu_p50_ms": round(median(cpu), 2), "cpu_p95_ms": round(percentile(cpu, 95), 2)}
    return out


def measure(db_url: str, n: int, requests: int, seed_value: int = 0) -> dict[str, Any]:
    from fastapi.testclient import TestClient

    from backend.app import create_app
    from backend.settings import Settings

    rng = random.Random(seed_value)
    engine = make_engine(db_url)
    migrate(engine)
    seeding = seed(engine, n, rng)
    log = SessionLog(engine)
    tokens = {"staff": log.create_token("sue", "staff"), "user": log.create_token("user3", "user")}
    engine.dispose()
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(data_dir=Path(tmp), db_url=db_url, port=0, semantic_search=False)
        with TestClient(create_app(settings)) as client:
            h = {who: {"Authorization": f"Bearer {t}"} for who, t in tokens.items()}
            for _ in range(5):  # warm the connection pool and the page cache
                timed(client, h["staff"], {"q": "fix"})
                timed(client, h["staff"], {})
            results: dict[str, list[float]] = {}
            cpu: dict[str, list[float]] = {}
            hits: dict[str, list[int]] = {}
            for name, reqs in cases(rng, requests).items():
                for who, params in reqs:
                    ms, body = timed(client, h[who], params)
                    results.setdefault(name, []).append(ms)
                    cpu.setdefault(name, []).append(CPU[-1])
                    hits.setdefault(name, []).append(len(body["sessions"]))
            deep: list[float] = []
            cursor = None
            for _ in range(max(5, requests // 12)):  # pages 2.. of the whole log, by cursor
                ms, body = timed(client, h["staff"], {"limit": 50, **({"cursor": cursor} if cursor else {})})
                if cursor:
                    deep.append(ms)
                    cpu.setdefault("list_next_pages", []).append(CPU[-1])
                    hits.setdefault("list_next_pages", []).append(len(body["sessions"]))
                cursor = body["next_cursor"]
            results["list_next_pages"] = deep
    def pooled(prefix: str, d: dict[str, list[float]]) -> list[float]:
        return [ms for k, v in d.items() if k.startswith(prefix) for ms in v]

    listing, search = pooled("list", results), pooled("search", results)
    return {
        "database": db_url.split("://")[0], "sessions": n, **seeding,
        "list": stats(listing, pooled("list", cpu)), "search": stats(search, pooled("search", cpu)),
        "by_case": {k: {**stats(v, cpu.get(k)), "mean_hits": round(sum(hits[k]) / max(1, len(hits[k])), 1)}
                    for k, v in results.items()},
        "list_p95_under_target": percentile(listing, 95) < TARGET_P95_MS,
        "search_p95_under_target": percentile(search, 95) < TARGET_P95_MS,
    }


@contextmanager
def pg_schema() -> Iterator[str]:
    schema = f"fwbench_{uuid.uuid4().hex[:10]}"
    admin = make_engine(PG_URL)
    with admin.begin() as conn:
        conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    try:
        yield f"{PG_URL}?options=-csearch_path%3D{schema}"
    finally:
        with admin.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')
        admin.dispose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=None, help="sessions to seed (default 100000; --quick 10000)")
    ap.add_argument("--requests", type=int, default=None, help="timed requests per database (default 600; quick 120)")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 10,000 sessions")
    ap.add_argument("--no-postgres", action="store_true", help="SQLite only")
    args = ap.parse_args()
    n = args.sessions or (10_000 if args.quick else 100_000)
    requests = args.requests or (120 if args.quick else 600)
    out: dict[str, Any] = {"sessions": n, "target_p95_ms": TARGET_P95_MS, "quick": args.quick,
                           "load_average_at_start": [round(x, 2) for x in os.getloadavg()]}
    with tempfile.TemporaryDirectory() as tmp:
        out["sqlite"] = measure(f"sqlite:///{Path(tmp) / 'browse.db'}", n, requests)
        out["sqlite"]["db_mb"] = round((Path(tmp) / "browse.db").stat().st_size / 2**20, 1)
    if args.no_postgres:
        out["postgresql"] = "skipped (--no-postgres)"
    elif not server_reachable(PG_URL):
        out["postgresql"] = "skipped: not reachable at 127.0.0.1:5432"
    else:
        with pg_schema() as url:
            out["postgresql"] = measure(url, n, requests)
    out["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]  # the machine is shared: how noisy it was
    write_result("session_browser", out)


if __name__ == "__main__":
    main()
