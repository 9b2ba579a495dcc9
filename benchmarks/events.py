"""Cost of serialisable-by-construction events and of isolating a bad event in the writer.

1. Per event: construct + ``event_to_json`` for a 24-character ``assistant_delta``
   and a 16 KiB ``tool_result`` (with a small ``data`` dict), p50 in µs.
   ``raw`` is the same event built with ``model_construct`` (no validation,
   the cost before the validator existed) and dumped with pydantic alone.
2. Writer throughput: N ``assistant_delta`` events through ``EventWriter``
   into SQLite (group commit), events/s: with no bad event; with one
   unserialisable event per 512 (replaced before the transaction, no extra
   commit); with one row per 512 that SQLite refuses (a NaN ``ts`` is stored
   as NULL; found by bisecting its failed batch, so extra transactions).

Usage: python benchmarks/events.py [--events N]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from _common import median, write_result

from agent.events import AssistantDelta, ErrorEvent, Event, ToolResultEvent, event_to_json
from backend.db.engine import make_engine, migrate
from backend.db.log import SessionLog
from backend.db.writer import EventWriter


def per_event_us(build, repeat: int = 2000) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(repeat):
            build()
        times.append((time.perf_counter() - t0) / repeat * 1e6)
    return round(median(times), 2)


def construction() -> dict[str, float]:
    output = ("line of command output\n" * 745)[:16384]
    data = {"exit_code": 1, "duration_s": 0.06, "truncated": False}
    common = {"seq": 1, "session_id": "s" * 32, "turn": 1, "ts": 1.0}
    return {
        "delta_us": per_event_us(lambda: event_to_json(AssistantDelta(step=1, text="x" * 24, **common))),
        "delta_raw_us": per_event_us(lambda: AssistantDelta.model_construct(
            step=1, text="x" * 24, type="assistant_delta", **common).model_dump_json()),
        "tool_result_16k_us": per_event_us(lambda: event_to_json(ToolResultEvent(
            step=1, index=0, call_id="c", name="run_command", ok=False, output=output, data=data, **common))),
        "tool_result_16k_raw_us": per_event_us(lambda: ToolResultEvent.model_construct(
            step=1, index=0, call_id="c", name="run_command", ok=False, output=output, data=data,
            duration_ms=0.0, type="tool_result", **common).model_dump_json()),
    }


async def write_all(n: int, bad_every: int | None, kind: str = "unserialisable") -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        engine = make_engine(f"sqlite:///{Path(tmp) / 'b.db'}")
        migrate(engine)
        log = SessionLog(engine)
        with engine.begin() as conn:
            conn.exec_driver_sql("INSERT INTO snapshots (id, manifest, created_at) VALUES ('s0', '{}', '2026-01-01')")
        sid = log.create_session(id="b", owner="u", source={}, workspace_id="w", base_snapshot="s0", policy={}).id
        events: list[Event] = []
        for i in range(1, n + 1):
            if bad_every and i % bad_every == 0 and kind == "refused":
                events.append(AssistantDelta(seq=i, session_id=sid, turn=1, ts=float("nan"), step=1, text="x"))
            elif bad_every and i % bad_every == 0:
                events.append(AssistantDelta.model_construct(seq=i, session_id=sid, turn=1, ts=1.0, step=1,
                                                             text="\ud800", type="assistant_delta"))
            else:
                events.append(AssistantDelta(seq=i, session_id=sid, turn=1, step=1, text=f"word {i}"))
        writer = EventWriter(log)
        t0 = time.perf_counter()
        results = await asyncio.gather(*(writer.append(e) for e in events))
        elapsed = time.perf_counter() - t0
        writer.close()
        stored = len(log.all_events(sid))
        engine.dispose()
    return {"events_per_s": round(n / elapsed), "commits": writer.commits, "stored": stored,
            "stand_ins": sum(isinstance(r.event, ErrorEvent) for r in results)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=20_000)
    args = ap.parse_args()
    result = {
        "construct_and_serialise": construction(),
        "writer_clean": asyncio.run(write_all(args.events, None)),
        "writer_one_unserialisable_per_512": asyncio.run(write_all(args.events, 512)),
        "writer_one_refused_row_per_512": asyncio.run(write_all(args.events, 512, "refused")),
        "events": args.events,
    }
    write_result("events", result)


if __name__ == "__main__":
    main()
