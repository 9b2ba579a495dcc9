"""Run one process tree with a wall-clock deadline and a bounded output buffer.

This is the process plumbing shared by every :mod:`tools.sandbox` runner: spawn
(no ``preexec_fn``: the launcher argv itself joins cgroups), read the merged
stdout+stderr incrementally, notice exit through a pidfd, and on timeout,
output overflow, cancellation or normal exit kill everything that is left.

Not guaranteed:

* Without a cgroup the "tree" is the launcher's process group; a child that
  calls ``setsid()`` escapes it (inside bubblewrap the PID namespace still
  takes it down; in the unsandboxed runner nothing does).
* The SIGTERM grace period is honoured only for processes we can address
  individually (a cgroup); without one, the first signal ends bwrap and with
  it the whole namespace at once.
* Teardown after cancellation waits synchronously (bounded, normally
  milliseconds) for SIGKILLed processes to go, briefly blocking the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tools.cgroups import CgroupGroup

log = logging.getLogger(__name__)

_READ_CHUNK = 1 << 20
_DRAIN_AFTER_EXIT_S = 2.0
_REAP_DEADLINE_S = 5.0


class OutputBuffer:
    """Keeps the first and last ``cap // 2`` bytes of a stream and counts the rest.

    Memory stays O(cap) however much is fed. The split point may cut a
    multi-byte character; decoding replaces the broken halves.
    """

    def __init__(self, cap: int) -> None:
        self.cap = max(0, cap)
        self._head_cap = self.cap - self.cap // 2
        self._tail_cap = self.cap // 2
        self._head = bytearray()
        self._tail = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self._head_cap - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        if data and self._tail_cap:
            self._tail += data[-self._tail_cap :]
            excess = len(self._tail) - self._tail_cap
            if excess > 0:
                del self._tail[:excess]

    @property
    def truncated(self) -> bool:
        return self.total > len(self._head) + len(self._tail)

    def text(self) -> str:
        head = self._head.decode("utf-8", errors="replace")
        tail = self._tail.decode("utf-8", errors="replace")
        if not self.truncated:
            return head + tail
        dropped = self.total - len(self._head) - len(self._tail)
        return f"{head}\n[... {dropped} bytes truncated ...]\n{tail}"


@dataclass(slots=True)
class Supervised:
    """What happened to the launcher: raw facts for the sandbox's result."""

    returncode: int | None
    duration_s: float
    timed_out: bool
    output_limit_hit: bool
    output: OutputBuffer


async def supervise(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    group: CgroupGroup | None,
    timeout_s: float,
    kill_grace_s: float,
    output_bytes: int,
    kill_output_bytes: int | None,
    term_spares_launcher: bool,
    on_output: Callable[[bytes], None] | None = None,
) -> Supervised:
    """Run ``argv`` to completion or deadline; the whole tree is gone on return.

    ``term_spares_launcher``: on timeout, SIGTERM the processes in ``group``
    but not the launcher (bwrap would turn a SIGTERM into an instant kill of
    the namespace, denying the command its grace period).

    ``on_output`` receives every chunk of output as it is read (on the event
    loop, before the chunk is counted against the caps), all of it even past
    ``output_bytes``: it must be cheap and do its own capping. An exception
    from it is logged and does not stop the command.
    """
    loop = asyncio.get_running_loop()
    buf = OutputBuffer(output_bytes)
    start = time.monotonic()
    proc = subprocess.Popen(
        list(argv),
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        close_fds=True,
    )
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    with contextlib.suppress(OSError, AttributeError):
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, _READ_CHUNK)
    eof: asyncio.Future[None] = loop.create_future()
    overflow: asyncio.Future[None] = loop.create_future()

    def on_readable() -> None:
        try:
            data = os.read(fd, _READ_CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            loop.remove_reader(fd)
            if not eof.done():
                eof.set_result(None)
            return
        buf.feed(data)
        if on_output is not None:
            try:
                on_output(data)
            except Exception:  # a display problem must not kill or hang the command
                log.exception("output listener failed")
        if kill_output_bytes is not None and buf.total > kill_output_bytes:
            if not overflow.done():
                overflow.set_result(None)

    loop.add_reader(fd, on_readable)
    exit_watch = ExitWatch(loop, proc)
    timed_out = overflow_hit = False
    end: float | None = None
    try:
        await asyncio.wait(
            {exit_watch.future, overflow}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
        if not exit_watch.future.done():
            if overflow.done():
                overflow_hit = True
            else:
                timed_out = True
                _signal_tree(proc, group, signal.SIGTERM, spare_launcher=term_spares_launcher)
                await asyncio.wait({exit_watch.future}, timeout=kill_grace_s)
        if exit_watch.future.done():
            end = time.monotonic()
        # Always sweep: background jobs must not outlive the call.
        await _kill_and_reap(proc, group, exit_watch)
        end = end if end is not None else time.monotonic()
        await asyncio.wait({eof}, timeout=_DRAIN_AFTER_EXIT_S)
    finally:
        loop.remove_reader(fd)
        _teardown_sync(proc, group, exit_watch)
        proc.stdout.close()
    returncode = proc.returncode
    return Supervised(
        returncode=returncode,
        duration_s=(end or time.monotonic()) - start,
        timed_out=timed_out,
        output_limit_hit=overflow_hit,
        output=buf,
    )


class ExitWatch:
    """Resolves when the launcher exits (pidfd; polling where pidfd is missing).

    The launcher is not reaped until teardown, so its pid (and process group
    id) cannot be reused while we may still signal it.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, proc: subprocess.Popen[bytes]) -> None:
        self.future: asyncio.Future[None] = loop.create_future()
        self._loop = loop
        self._pidfd: int | None = None
        self._poller: asyncio.Task[None] | None = None
        try:
            self._pidfd = os.pidfd_open(proc.pid)
            loop.add_reader(self._pidfd, self._fire)
        except (OSError, AttributeError):
            self._pidfd = None
            self._poller = loop.create_task(self._poll(proc))

    def _fire(self) -> None:
        if not self.future.done():
            self.future.set_result(None)
        self.close()

    async def _poll(self, proc: subprocess.Popen[bytes]) -> None:
        while proc.poll() is None:
            await asyncio.sleep(0.02)
        self._fire()

    def close(self) -> None:
        if self._pidfd is not None:
            self._loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None
        if self._poller is not None and self._poller is not asyncio.current_task():
            self._poller.cancel()


def _signal_tree(
    proc: subprocess.Popen[bytes],
    group: CgroupGroup | None,
    sig: int,
    *,
    spare_launcher: bool = False,
) -> None:
    # The launcher's group first: killing bwrap takes its PID namespace down
    # with it in one kernel step. Killing the cgroup's pids one by one instead
    # lets a shell outlive its child for a moment (`sleep 30; echo > f` would
    # still write f).
    if not spare_launcher and proc.returncode is None:  # not reaped: pid and pgid are still ours
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(proc.pid, sig)
    if group is not None and group.dirs:
        group.signal_all(sig, exclude={proc.pid} if spare_launcher else ())


async def _kill_and_reap(
    proc: subprocess.Popen[bytes], group: CgroupGroup | None, exit_watch: ExitWatch
) -> None:
    deadline = time.monotonic() + _REAP_DEADLINE_S
    delay = 0.0005  # dying processes linger in cgroup.procs for a moment: back off
    while True:
        _signal_tree(proc, group, signal.SIGKILL)
        empty = group is None or not group.pids()
        if empty and exit_watch.future.done():
            return
        if time.monotonic() > deadline:
            log.error("process tree of pid %d still alive after SIGKILL", proc.pid)
            return
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.02)


def _teardown_sync(
    proc: subprocess.Popen[bytes], group: CgroupGroup | None, exit_watch: ExitWatch
) -> None:
    """Kill and reap synchronously: runs on every exit path, cancellation included."""
    deadline = time.monotonic() + _REAP_DEADLINE_S
    while True:
        _signal_tree(proc, group, signal.SIGKILL)
        if group is None or not group.pids() or time.monotonic() > deadline:
            break
        time.sleep(0.005)
    exit_watch.close()
    try:
        proc.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        log.error("launcher pid %d did not exit after SIGKILL", proc.pid)
