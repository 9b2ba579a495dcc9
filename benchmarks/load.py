"""Server load: many concurrent WebSocket sessions against a real server.

Starts ``flywheel serve`` as a subprocess (SQLite in a temporary data dir),
creates ``--sessions`` sessions (default 100) on a small workspace, each with
a scripted policy, connects one WebSocket client per session and runs
``--turns`` turns (default 10) in every session at once. Each turn is two model
outputs: one with three parallel tool calls (read_file / grep / list_dir),
then a final answer.

Reports wall time, sessions/s and turns/s, event latency p50/p99 from the
event's ``ts`` (set on the server when the event is created, just before it
is committed: the figure includes the commit and the fan-out) to the moment
the client receives it (same machine, same clock), the server's CPU time per
event (its user + system CPU while the turns ran, divided by the events the
clients received), errors (must be 0) and the server's peak RSS. Clients and
server share this machine's cores, so the latency also includes client-side
event-loop delay.

``--profile`` samples the server with py-spy while the turns run and adds
``profile``: the share of its Python time per part (commit, tools, WebSocket
send, agent loop, ...), the top functions by own time, and the CPU of its
event-loop thread and of its other threads (``benchmarks/_pyspy.py``). The
sampler pauses the server and competes for its cores, so a profiled run is
written to ``load_profile.json``, not ``load.json``.

Errors: a turn_end other than ``completed``, a ``request_error``, a
disconnect or timeout, a missing or duplicate ``seq``, or a session whose log
(``GET /events``) does not end at the last ``seq`` its client received.

Usage: python benchmarks/load.py [--sessions 100] [--turns 10] [--quick] [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from websockets.asyncio.client import connect

from _common import median, percentile, write_result
from _pyspy import Profiler, find_pyspy
from _server import Server, acreate_session, afetch_events, final_step, make_workspace, tool_step


class Stats:
    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.errors: collections.Counter[str] = collections.Counter()
        self.samples: list[str] = []
        self.events = 0
        self.turns_completed = 0
        self.last_seq: dict[str, int] = {}
        self.settled = 0  # clients connected, or failed to
        self.busy_retries = 0

    def error(self, kind: str, detail: str) -> None:
        self.errors[kind] += 1
        if len(self.samples) < 20:
            self.samples.append(f"{kind}: {detail}"[:300])


class RssPoller(threading.Thread):
    """Polls the server's VmRSS (and VmHWM) from /proc every ``period`` s."""

    def __init__(self, server: Server, period: float = 0.2):
        super().__init__(daemon=True)
        self.server, self.period = server, period
        self.max_rss_kb = 0
        self.hwm_kb = 0
        self._stop_evt = threading.Event()

    def run(self) -> None:
        while not self._stop_evt.is_set():
            self.sample()
            self._stop_evt.wait(self.period)

    def sample(self) -> None:
        st = self.server.status_kb()
        self.max_rss_kb = max(self.max_rss_kb, st.get("VmRSS", 0))
        self.hwm_kb = max(self.hwm_kb, st.get("VmHWM", 0))

    def stop(self) -> None:
        self._stop_evt.set()
        self.join(timeout=5)
        self.sample()


def script(turns: int) -> list[str]:
    outputs: list[str] = []
    for t in range(turns):
        outputs += [tool_step(t), final_step(t)]
    return outputs


async def run_session(sid: str, server: Server, turns: int, stats: Stats, recv_timeout: float,
                      start: asyncio.Event, strict: bool) -> None:
    url = f"{server.ws_base}/v1/sessions/{sid}/ws"
    last = 0
    connected = False
    try:
        async with connect(url, additional_headers=server.headers, max_size=None, ping_interval=None,
                           open_timeout=60, close_timeout=5) as ws:
            stats.settled += 1
            connected = True
            await start.wait()
            for t in range(1, turns + 1):
                message = json.dumps({"type": "user_message", "text": f"Turn {t}: check the stats helpers."})
                await ws.send(message)
                started = False  # has this turn's first event arrived?
                while True:
                    try:
                        raw = await asyncio.wait_for(ws.recv(), timeout=recv_timeout)
                    except TimeoutError:
                        stats.error("timeout", f"{sid} turn {t}: no event for {recv_timeout}s after seq {last}")
                        return
                    received = time.time()
                    ev = json.loads(raw)
                    if ev.get("type") == "request_error":
                        if ev.get("status") == 409 and t > 1 and not started and not strict:
                            # A message sent right after turn_end must be accepted (the hub waits for the
                            # finished turn's teardown, backend.hub); a 409 here is that race coming back.
                            # --no-strict retries and counts it ("busy_retries"); --strict, an error.
                            stats.busy_retries += 1
                            await asyncio.sleep(0.005)
                            await ws.send(message)
                            continue
                        stats.error("request_error", f"{sid} turn {t}: {ev}")
                        return
                    started = True
                    seq = ev.get("seq")
                    if seq != last + 1:
                        kind = "duplicate_seq" if isinstance(seq, int) and seq <= last else "missing_seq"
                        stats.error(kind, f"{sid}: got seq {seq} after {last}")
                        if kind == "duplicate_seq":
                            continue
                    last = seq
                    stats.events += 1
                    stats.latencies.append(received - ev["ts"])
                    if ev["type"] == "turn_end":
                        if ev.get("reason") != "completed":
                            stats.error(f"turn_end:{ev.get('reason')}", f"{sid} turn {t}: {ev.get('detail')}")
                            return
                        stats.turns_completed += 1
                        break
    except Exception as exc:  # a refused or dropped connection
        stats.error("disconnect", f"{sid} after seq {last}: {exc!r}")
    finally:
        stats.last_seq[sid] = last
        if not connected:
            stats.settled += 1


async def bench(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    workspace = make_workspace(tmp)
    server = Server(tmp / "data", workspace, tmp / "logs").start()
    poller = RssPoller(server)
    poller.start()
    stats = Stats()
    idle_rss_kb = server.status_kb().get("VmRSS", 0)
    try:
        outputs = script(args.turns)
        limits = httpx.Limits(max_connections=args.sessions, max_keepalive_connections=args.sessions)
        async with httpx.AsyncClient(limits=limits) as http:
            t0 = time.perf_counter()
            # The first session alone: concurrent creates from one source dir race to store the same
            # workspace snapshot and all but one fail with a 500 (a server bug); once the snapshot
            # exists, concurrent creates are fine.
            infos = [await acreate_session(http, server, workspace, outputs, title="load 0")]
            infos += await asyncio.gather(*(
                acreate_session(http, server, workspace, outputs, title=f"load {i}") for i in range(1, args.sessions)
            ))
            t_created = time.perf_counter()
            start = asyncio.Event()
            tasks = [asyncio.create_task(run_session(info["id"], server, args.turns, stats, args.recv_timeout, start,
                                                 args.strict))
                     for info in infos]
            # every client connects (or fails) before the turns start, so all sessions run at once
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and stats.settled < len(tasks):
                await asyncio.sleep(0.05)
            profiler = Profiler(server.pid) if args.profile else None
            if profiler is not None:
                await asyncio.to_thread(profiler.start)
            t_run = time.perf_counter()
            load_before = os.getloadavg()[0]
            cpu_server0, cpu_client0 = server.cpu_s(), time.process_time()
            start.set()
            await asyncio.gather(*tasks)
            t_end = time.perf_counter()
            cpu_server, cpu_client = server.cpu_s() - cpu_server0, time.process_time() - cpu_client0
            if profiler is not None:
                await asyncio.to_thread(profiler.stop)

            # the log must end exactly where each client's stream ended
            logs = await asyncio.gather(*(afetch_events(http, server, info["id"]) for info in infos))
            for info, events in zip(infos, logs, strict=True):
                seqs = [e["seq"] for e in events]
                if seqs != list(range(1, len(seqs) + 1)) or (seqs[-1] if seqs else 0) != stats.last_seq[info["id"]]:
                    stats.error("log_mismatch", f"{info['id']}: log has {len(seqs)} events, client saw "
                                f"{stats.last_seq[info['id']]}")
    except BaseException:
        print(f"server stderr (tail):\n{server.tail(4000)}", file=sys.stderr)
        raise
    finally:
        poller.stop()
        server.stop()
    lat_ms = [x * 1e3 for x in stats.latencies]
    turns_total = args.sessions * args.turns
    wall = t_end - t0
    run_wall = t_end - t_run
    return {
        "sessions": args.sessions,
        "turns_per_session": args.turns,
        "model_outputs_per_turn": 2,
        "tool_calls_per_turn": 3,
        "turns_completed": stats.turns_completed,
        "turns_expected": turns_total,
        "events_received": stats.events,
        "wall_s": round(wall, 3),
        "setup_s": round(t_created - t0, 3),
        "run_s": round(run_wall, 3),
        "sessions_per_s": round(args.sessions / wall, 3),
        "turns_per_s": round(stats.turns_completed / run_wall, 2),
        "events_per_s": round(stats.events / run_wall, 1),
        "latency_ms": {
            "p50": round(median(lat_ms), 2) if lat_ms else None,
            "p99": round(percentile(lat_ms, 99), 2) if lat_ms else None,
            "max": round(max(lat_ms), 2) if lat_ms else None,
            "n": len(lat_ms),
            "measured": "client receive time minus the event's ts; ts is set when the event is created on the "
                        "server, just before it is committed, so this includes the commit (group commit, SQLite "
                        "WAL), the fan-out and the WebSocket send; same machine and clock, clients share the cores",
        },
        "errors": sum(stats.errors.values()),
        "busy_retries": stats.busy_retries,
        "busy_retries_note": "409 'a turn is already running' answered to a user_message sent right after the "
                             "previous turn_end: must be 0 (the server waits for the finished turn's teardown "
                             "instead of refusing); with --no-strict retried after 5 ms and counted here, with "
                             "--strict (the default) counted as errors",
        "errors_by_kind": dict(stats.errors),
        "error_samples": stats.samples,
        "server_rss_mb": {
            "idle": round(idle_rss_kb / 1024, 1),
            "peak": round(max(poller.hwm_kb, server.peak_rss_kb) / 1024, 1),
            "peak_sampled": round(poller.max_rss_kb / 1024, 1),
            "measured": "VmHWM (peak) and VmRSS sampled every 0.2 s from /proc/PID/status",
        },
        "cpu_s_during_turns": {"server": round(cpu_server, 2), "clients": round(cpu_client, 2),
                               "cores": os.cpu_count()},
        "load_avg_1m_before_turns": round(load_before, 2),
        "load_avg_note": "the machine's 1-minute load average when the turns started: on a shared machine "
                         "the latency follows it (the server gets that much less of the cores)",
        "server_cpu_ms_per_event": round(cpu_server / stats.events * 1e3, 4) if stats.events else None,
        "server_cpu_measured": "user + system CPU of the server process (all its threads, /proc/PID/stat) while "
                               "the turns ran, divided by events_received; ripgrep's own CPU (a child) is not in it",
        "database": "sqlite (WAL) in a temporary data dir",
        "targets": _targets(cpu_server / stats.events * 1e3 if stats.events else None,
                            percentile(lat_ms, 99) if lat_ms else None),
        **({"profile": profiler.summary(stats.events)} if profiler is not None else {}),
        "pass": sum(stats.errors.values()) == 0 and stats.turns_completed == turns_total,
    }


CPU_MS_PER_EVENT_TARGET = 0.3
P99_MS_TARGET = 100.0
"""The figures issue 12 asks for at 100 sessions x 10 turns (they depend on the machine and its load)."""


def _targets(cpu_ms: float | None, p99_ms: float | None) -> dict[str, Any]:
    return {"server_cpu_ms_per_event_max": CPU_MS_PER_EVENT_TARGET, "p99_ms_max": P99_MS_TARGET,
            "met": cpu_ms is not None and p99_ms is not None and cpu_ms <= CPU_MS_PER_EVENT_TARGET
            and p99_ms <= P99_MS_TARGET}


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").strip(), formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=100)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--quick", action="store_true", help="10 sessions x 3 turns (smoke run)")
    ap.add_argument("--recv-timeout", type=float, default=60.0, help="max seconds between two events of a turn")
    ap.add_argument("--strict", action=argparse.BooleanOptionalAction, default=True,
                    help="count 409 busy answers after turn_end as errors (default; --no-strict retries them)")
    ap.add_argument("--timeout", type=float, default=600.0, help="bound for the whole run")
    ap.add_argument("--profile", action="store_true",
                    help="sample the server with py-spy while the turns run (needs py-spy and ptrace rights)")
    args = ap.parse_args()
    if args.quick:
        args.sessions, args.turns = 10, 3
    if args.profile:
        find_pyspy()  # before the server starts: a missing py-spy is a one-line error
    with tempfile.TemporaryDirectory(prefix="flywheel-load-") as d:
        result = asyncio.run(asyncio.wait_for(bench(args, Path(d)), timeout=args.timeout))
    # py-spy pauses the server 100 times a second and takes CPU from it: a profiled run's
    # latency is not the server's, so it goes to its own file
    name = "load_profile" if args.profile else "load"
    write_result(f"{name}_quick" if args.quick else name, result)
    if not result["pass"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
