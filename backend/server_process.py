"""``flywheel serve`` as a child process: for end-to-end tests, benchmarks and scripts.

    with ServerProcess(data_dir=tmp_path / "data", allow_roots=[ws]) as srv:
        httpx.get(f"{srv.url}/health")
        srv.kill9()      # crash it (the whole process group)
        srv.restart()    # same port, same data dir, same token

The server's stdout and stderr go to log files under ``log_dir`` (default:
``data_dir``'s parent), not pipes, so a chatty server can never block on a
full pipe; :meth:`ServerProcess.logs` returns them for assertion messages.
Each start runs in its own process group so sandboxed commands die with it.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import httpx

REPO = Path(__file__).resolve().parents[1]
_URL = re.compile(r"Flywheel is serving at (http://\S+)")
_TOKEN = re.compile(r"^token: (\S+)", re.MULTILINE)
_READY = re.compile(r"^database: ", re.MULTILINE)  # the last line ``serve`` prints before it listens


class ServerError(RuntimeError):
    """The server did not come up; the message carries its output."""


class ServerProcess:
    def __init__(
        self, *, data_dir: Path, allow_roots: Sequence[Path] = (), port: int = 0, extra_args: Sequence[str] = (),
        env: dict[str, str] | None = None, log_dir: Path | None = None, start_timeout: float = 30.0,
    ):
        self.data_dir = Path(data_dir)
        self.allow_roots = [Path(r) for r in allow_roots]
        self.port = port
        self.extra_args = list(extra_args)
        self.env = {**os.environ, "NO_COLOR": "1", **(env or {})}
        self.log_dir = Path(log_dir) if log_dir is not None else self.data_dir.parent
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.token = ""
        self.starts = 0
        self.peak_rss_kb = 0  # VmHWM read just before the process was stopped

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> ServerProcess:
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError("the server is already running")
        self.starts += 1
        self.log_dir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "backend.cli", "serve", "--port", str(self.port), "--data-dir",
               str(self.data_dir), "--log-level", "warning", *self.extra_args]
        for root in self.allow_roots:
            cmd += ["--allow-root", str(root)]
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=REPO,
                                         env=self.env, start_new_session=True)
        try:
            self._wait_ready()
        except BaseException:
            self.kill9()
            raise
        return self

    def _wait_ready(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + self.start_timeout
        while True:
            text = self.stdout_path.read_text(errors="replace")
            url, token = _URL.search(text), _TOKEN.search(text)
            if url and _READY.search(text):
                break
            if self.proc.poll() is not None:
                raise ServerError(f"flywheel serve exited with {self.proc.returncode}\n{self.logs()}")
            if time.monotonic() > deadline:
                raise ServerError(f"flywheel serve printed no URL in {self.start_timeout} s\n{self.logs()}")
            time.sleep(0.05)
        # The "local" staff token is printed while its file exists in data_dir
        # (a data dir whose tokens were made with `flywheel token create` has none).
        self.url, self.token = url.group(1), token.group(1) if token else ""
        self.port = int(self.url.rsplit(":", 1)[1])  # a restart reuses it
        while True:
            try:
                if httpx.get(f"{self.url}/health", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise ServerError(f"flywheel serve never answered /health\n{self.logs()}")
            time.sleep(0.05)

    # -- what the process uses (Linux /proc) --------------------------------------

    def status_kb(self) -> dict[str, int]:
        """VmRSS / VmHWM (kB) of the server; empty once it is gone."""
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
        """User + system CPU seconds of the server so far (0 once it is gone)."""
        try:
            stat = Path(f"/proc/{self.pid}/stat").read_text()
        except OSError:
            return 0.0
        fields = stat.rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def ws_base(self) -> str:
        return self.url.replace("http://", "ws://", 1)

    def kill9(self) -> None:
        """SIGKILL the server and everything it started; no shutdown code runs."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.peak_rss_kb = self.status_kb().get("VmHWM", self.peak_rss_kb)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=10)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (a graceful shutdown), then SIGKILL after ``timeout``."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.peak_rss_kb = self.status_kb().get("VmHWM", self.peak_rss_kb)
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        self.kill9()  # also reaps leftovers in the group

    def restart(self) -> ServerProcess:
        """Start again on the same port and data dir (after :meth:`kill9` or :meth:`stop`)."""
        self.stop()
        return self.start()

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, typ: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    # -- helpers ---------------------------------------------------------------

    @property
    def stdout_path(self) -> Path:
        return self.log_dir / f"server-{self.starts}.out"

    @property
    def stderr_path(self) -> Path:
        return self.log_dir / f"server-{self.starts}.err"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def client(self, timeout: float = 10.0) -> httpx.Client:
        """An HTTP client for the REST API with the server's staff token."""
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=timeout)

    def logs(self, tail: int = 4000) -> str:
        """The last output of every start so far (for assertion messages)."""
        parts = []
        for n in range(1, self.starts + 1):
            for kind in ("out", "err"):
                p = self.log_dir / f"server-{n}.{kind}"
                if p.exists():
                    parts.append(f"--- {p.name} ---\n{p.read_text(errors='replace')[-tail:]}")
        return "\n".join(parts)
