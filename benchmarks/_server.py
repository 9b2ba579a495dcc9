"""Shared by the server benchmarks (load, crash): a real ``flywheel serve``
subprocess, a tiny workspace, REST helpers and scripted model outputs.

The server runs as its own process (``python -m backend.cli serve``), exactly
as an operator starts it; the benchmark talks to it over HTTP/WebSocket only.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from _common import ROOT

from agent.parser import encode_call

SERVE_RE = re.compile(r"Flywheel is serving at (http://\S+)")
TOKEN_RE = re.compile(r"^token: (\S+)", re.M)


class ServerError(RuntimeError):
    pass


class Server:
    """``flywheel serve`` as a subprocess; stdout/stderr go to files in ``logs``."""

    def __init__(self, data_dir: Path, allow_root: Path, logs: Path, *, port: int = 0, name: str = "server"):
        self.data_dir = data_dir
        self.allow_root = allow_root
        self.logs = logs
        self.port = port
        self.name = name
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.token = ""
        self.peak_rss_kb = 0  # VmHWM read just before the process is stopped

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def stdout_path(self) -> Path:
        return self.logs / f"{self.name}.out"

    @property
    def stderr_path(self) -> Path:
        return self.logs / f"{self.name}.err"

    def start(self, timeout: float = 60.0) -> Server:
        self.logs.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        cmd = [sys.executable, "-m", "backend.cli", "serve", "--port", str(self.port),
               "--data-dir", str(self.data_dir), "--allow-root", str(self.allow_root), "--log-level", "warning"]
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.stdout_path.read_text(errors="replace")
            m, t = SERVE_RE.search(text), TOKEN_RE.search(text)
            if m and t:
                self.url, self.token = m.group(1), t.group(1)
                self.port = int(self.url.rsplit(":", 1)[1])
                break
            if self.proc.poll() is not None:
                raise ServerError(f"server exited with {self.proc.returncode}: {self.tail()}")
            time.sleep(0.05)
        else:
            self.stop()
            raise ServerError(f"server did not print its URL within {timeout}s: {self.tail()}")
        # The URL is printed before uvicorn's lifespan (migrations, recovery) has run: wait for /health.
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None:
                raise ServerError(f"server exited with {self.proc.returncode}: {self.tail()}")
            time.sleep(0.05)
        self.stop()
        raise ServerError(f"server did not answer /health within {timeout}s: {self.tail()}")

    def tail(self, n: int = 2000) -> str:
        err = self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""
        return err[-n:]

    def status_kb(self) -> dict[str, int]:
        """VmRSS / VmHWM (kB) from /proc; empty once the process is gone."""
        out: dict[str, int] = {}
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith(("VmRSS:", "VmHWM:")):
                    k, v = line.split(":", 1)
                    out[k] = int(v.split()[0])
        except (OSError, ValueError):
            pass
        return out

    def cpu_s(self) -> float:
        """User + system CPU seconds of the server process so far (0 once it is gone)."""
        try:
            stat = Path(f"/proc/{self.pid}/stat").read_text()
        except OSError:
            return 0.0
        fields = stat.rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def kill9(self) -> None:
        """SIGKILL: no shutdown hooks, no final commits."""
        if self.proc is not None and self.proc.poll() is None:
            self.peak_rss_kb = self.status_kb().get("VmHWM", self.peak_rss_kb)
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM (uvicorn's graceful shutdown), then SIGKILL if it lingers."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.peak_rss_kb = self.status_kb().get("VmHWM", self.peak_rss_kb)
        self.proc.terminate()
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)

    @property
    def ws_base(self) -> str:
        return self.url.replace("http://", "ws://", 1)

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


def make_workspace(root: Path) -> Path:
    """A small Python project for read_file / grep / list_dir."""
    ws = root / "workspace"
    (ws / "src" / "pkg").mkdir(parents=True, exist_ok=True)
    (ws / "tests").mkdir(exist_ok=True)
    (ws / "README.md").write_text("# Demo\n\nA tiny package used by the Flywheel server benchmarks.\n")
    (ws / "src" / "pkg" / "__init__.py").write_text('"""pkg."""\nfrom .stats import mean, median\n')
    (ws / "src" / "pkg" / "stats.py").write_text(
        '"""Tiny statistics helpers."""\n\n\n'
        "def mean(values):\n    return sum(values) / len(values)\n\n\n"
        "def median(values):\n    s = sorted(values)\n    n = len(s)\n"
        "    mid = n // 2\n    return s[mid] if n % 2 else (s[mid - 1] + s[mid]) / 2\n"
    )
    (ws / "src" / "pkg" / "text.py").write_text(
        "def words(s):\n    return s.split()\n\n\ndef count_words(s):\n    return len(words(s))\n"
    )
    (ws / "tests" / "test_stats.py").write_text(
        "from pkg import mean, median\n\n\ndef test_mean():\n    assert mean([1, 2, 3]) == 2\n\n\n"
        "def test_median():\n    assert median([3, 1, 2]) == 2\n"
    )
    return ws


CALL_SETS = [
    [("read_file", {"path": "src/pkg/stats.py"}), ("grep", {"pattern": "def "}), ("list_dir", {"path": "src/pkg"})],
    [("read_file", {"path": "tests/test_stats.py"}), ("read_file", {"path": "src/pkg/text.py"}),
     ("grep", {"pattern": "median", "path": "src"})],
    [("list_dir", {"path": "."}), ("read_file", {"path": "README.md"}), ("grep", {"pattern": "import"})],
]


def tool_step(i: int, prose: str = "") -> str:
    """One model output: a sentence, then three parallel calls."""
    calls = CALL_SETS[i % len(CALL_SETS)]
    prose = prose or f"Let me look at the code (round {i}): three things at once.\n\n"
    return prose + "\n".join(encode_call(name, args) for name, args in calls) + "\n"


def final_step(i: int) -> str:
    return f"Done with round {i}: mean() and median() look right, and the tests cover both."


async def acreate_session(client: httpx.AsyncClient, server: Server, workspace: Path, outputs: list[str], *,
                          chunk_chars: int = 24, delay_s: float = 0.0, title: str = "") -> dict[str, Any]:
    body = {"workspace": {"path": str(workspace)}, "title": title,
            "policy": {"kind": "scripted", "outputs": outputs, "chunk_chars": chunk_chars, "delay_s": delay_s}}
    r = await client.post(server.url + "/v1/sessions", json=body, headers=server.headers(), timeout=120)
    if r.status_code != 201:
        raise ServerError(f"create session: {r.status_code} {r.text[:500]}")
    return r.json()


async def afetch_events(client: httpx.AsyncClient, server: Server, session_id: str) -> list[dict[str, Any]]:
    """Every event of a session from the log, via the REST pages."""
    out: list[dict[str, Any]] = []
    after = 0
    while True:
        r = await client.get(f"{server.url}/v1/sessions/{session_id}/events",
                             params={"after": after, "limit": 5000}, headers=server.headers(), timeout=120)
        if r.status_code != 200:
            raise ServerError(f"events of {session_id}: {r.status_code} {r.text[:500]}")
        page = r.json()
        out += page["events"]
        after = page["next_after"]
        if not page["more"]:
            return out

