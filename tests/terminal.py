"""A command run on a real pseudo-terminal, for tests of what the CLI asks on a terminal."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


class Terminal:
    """The terminal side of a process whose stdin, stdout and stderr are one pty."""

    def __init__(self, proc: subprocess.Popen[bytes], master: int):
        self.proc, self.master = proc, master
        self.seen = b""
        self._pos = 0  # the end of the last match

    @property
    def text(self) -> str:
        return self.seen.decode(errors="replace").replace("\r\n", "\n")

    def until(self, token: str, timeout: float = 60) -> str:
        """Read until ``token`` appears (after what was already matched); what was read."""
        want = token.encode()
        start = self._pos
        deadline = time.monotonic() + timeout
        while want not in self.seen[start:] and time.monotonic() < deadline:
            if select.select([self.master], [], [], 0.2)[0]:
                try:
                    chunk = os.read(self.master, 65536)
                except OSError:  # the child closed the terminal
                    break
                if not chunk:
                    break
                self.seen += chunk
        assert want in self.seen[start:], f"no {token!r} in:\n{self.text[-3000:]}"
        self._pos = self.seen.index(want, start) + len(want)
        return self.seen[start:self._pos].decode(errors="replace")

    def send(self, line: str) -> None:
        os.write(self.master, line.encode() + b"\n")

    def wait(self, timeout: float = 60) -> int:
        """The exit status, reading the rest of the output meanwhile."""
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            if select.select([self.master], [], [], 0.2)[0]:
                try:
                    self.seen += os.read(self.master, 65536)
                except OSError:
                    break
        return self.proc.wait(timeout=max(0.1, deadline - time.monotonic()))


@contextmanager
def on_terminal(cmd: list[str], env: dict[str, str], cwd: Path = REPO) -> Iterator[Terminal]:
    """Run ``cmd`` on a new pty; the process is killed when the block ends."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(cmd, stdin=slave, stdout=slave, stderr=slave, close_fds=True, cwd=cwd, env=env)
    os.close(slave)
    try:
        yield Terminal(proc, master)
    finally:
        proc.kill()
        proc.wait()
        os.close(master)
