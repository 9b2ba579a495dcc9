"""Where a server process spends its CPU: py-spy samples plus per-thread CPU from /proc.

:class:`Profiler` attaches ``py-spy record`` to a running process (its GIL
holder only, ``--gil``: Python-level CPU; C code that releases the GIL, such
as SQLite executing a statement, shows up in the thread CPU figures instead)
for a stretch of a benchmark, and :func:`summarise` turns the raw samples
into shares per named part of the server (:data:`PARTS`) and the top
functions by own time.

Needs ``py-spy`` (in the ``test`` extra) and the right to ptrace the process
(root, or ``kernel.yama.ptrace_scope=0``). Not guaranteed: sampling at
``rate`` Hz is statistical (a share under ~1% is noise), and a frame py-spy
cannot read is counted under "other".
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PARTS: list[tuple[str, tuple[str, ...]]] = [
    # (name, frames that mark it), first match wins, most specific first
    ("commit: the event writer thread (group commit, SQLAlchemy Core)", ("EventWriter._loop",)),
    ("thread pool: to_thread work (status updates, session reads, file reads)", ("_WorkItem.run",)),
    ("tools: starting ripgrep", ("spawn_piped", "create_subprocess_exec")),
    ("tools: running calls (read_file, grep, list_dir)", ("Executor._invoke",)),
    ("websocket: sending events", ("_serve.<locals>.send",)),
    ("websocket: event stream (hub queue -> socket)", ("pump_events", "stream_stored")),
    ("websocket: reading client messages", ("read_commands",)),
    ("agent: persist-then-broadcast emit (stamp, queue, wait)", ("Session.emit",)),
    ("agent: parsing model output", ("StreamParser.",)),
    ("agent: rendering the prompt", ("render_prompt",)),
    ("agent: policy stream", ("ScriptedPolicy.stream",)),
    ("agent: rest of the turn loop", ("Session._run_turn", "Session._step")),
    ("HTTP requests", ("RequestResponseCycle", "HttpToolsProtocol")),
    ("event loop and other", ("",)),
]


def thread_cpu_s(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) of each thread of ``pid`` (Linux /proc)."""
    out: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        out[int(task.name)] = (int(fields[11]) + int(fields[12])) / tick
    return out


def find_pyspy() -> str:
    """The py-spy executable (next to this Python first, then on PATH); SystemExit saying how to get it."""
    here = Path(sys.executable).parent / "py-spy"
    exe = str(here) if here.exists() else shutil.which("py-spy")
    if exe is None:
        raise SystemExit("--profile needs py-spy: pip install py-spy (it is in the 'test' extra)")
    return exe


class Profiler:
    """``py-spy record`` on ``pid`` between :meth:`start` and :meth:`stop`."""

    def __init__(self, pid: int, *, rate: int = 100) -> None:
        self.pid, self.rate, self.exe = pid, rate, find_pyspy()
        self._dir = tempfile.TemporaryDirectory(prefix="flywheel-pyspy-")
        self.raw = Path(self._dir.name) / "samples.txt"
        self._proc: subprocess.Popen[bytes] | None = None
        self._threads0: dict[int, float] = {}
        self.threads: dict[int, float] = {}
        self.wall_s = 0.0

    def start(self, timeout: float = 30.0) -> None:
        log = Path(self._dir.name) / "py-spy.log"
        self._log = log.open("wb")
        self._proc = subprocess.Popen(
            [self.exe, "record", "--pid", str(self.pid), "--rate", str(self.rate), "--gil",
             "--format", "raw", "--output", str(self.raw)], stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while b"Sampling process" not in log.read_bytes():  # attached
            if self._proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"py-spy could not attach to pid {self.pid}:\n{log.read_text(errors='replace')}")
            time.sleep(0.02)
        self._threads0 = thread_cpu_s(self.pid)
        self._t0 = time.perf_counter()

    def stop(self) -> None:
        self.wall_s = time.perf_counter() - self._t0
        t1 = thread_cpu_s(self.pid)
        self.threads = {tid: t1[tid] - self._threads0.get(tid, 0.0) for tid in t1}
        assert self._proc is not None
        self._proc.send_signal(signal.SIGINT)  # py-spy writes its samples and exits
        self._proc.wait(timeout=60)
        self._log.close()

    def summary(self, events: int) -> dict[str, Any]:
        main = self.threads.get(self.pid, 0.0)
        rest = sum(v for k, v in self.threads.items() if k != self.pid)
        out = summarise(self.raw.read_text() if self.raw.exists() else "")
        out["thread_cpu_s"] = {
            "event_loop_thread": round(main, 2), "other_threads": round(rest, 2), "wall_s": round(self.wall_s, 2),
            "event_loop_ms_per_event": round(main / events * 1e3, 4) if events else None,
            "other_threads_ms_per_event": round(rest / events * 1e3, 4) if events else None,
            "note": "from /proc/PID/task/*/stat over the sampled stretch; the other threads are the event "
                    "writer (its SQLite work runs without the GIL, so py-spy's --gil samples miss it) and the "
                    "to_thread pool",
        }
        out["sampler"] = f"py-spy record --gil --rate {self.rate} (Python time of the GIL holder)"
        self._dir.cleanup()
        return out


_FRAME = re.compile(r"^(.*) \((.*):(\d+)\)$")


def _short(frame: str) -> str:
    m = _FRAME.match(frame)
    if not m:
        return frame
    func, path, _ = m.groups()
    for marker in ("site-packages/", "python3.11/", "python3.12/", "python3.13/"):
        if marker in path:
            path = path.split(marker, 1)[1]
    return f"{func} ({path})"


def summarise(raw: str, *, top: int = 15) -> dict[str, Any]:
    """Shares of ``PARTS`` and the top functions by own time, from py-spy ``--format raw`` text
    (one ``frame;frame;... count`` line per distinct stack, outermost frame first)."""
    parts: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        count = int(n)
        frames = stack.split(";")
        total += count
        own[_short(frames[-1])] += count
        for name, marks in PARTS:
            if any(m in f for f in frames for m in marks):
                parts[name] += count
                break
    share = (lambda c: round(100 * c / total, 1)) if total else (lambda c: 0.0)
    return {
        "samples": total,
        "parts_percent": {name: share(parts[name]) for name, _ in PARTS if parts[name]},
        "top_own_time_percent": {f: share(c) for f, c in own.most_common(top)},
    }
