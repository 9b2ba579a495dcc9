"""Start a child process from the event loop without forking the server.

``asyncio.create_subprocess_exec`` on uvloop (the loop uvicorn picks when it
is installed, as in ``flywheel serve``) starts the child with libuv, which
``fork()``s the whole server with the GIL held: in a ~300 MB process that cost
about 1.8 ms of CPU and 5 ms with every thread stopped, per spawn, measured
here -- the largest single cost of a ``grep`` call under load.
:func:`spawn_piped` starts the child with :class:`subprocess.Popen` (vfork or
``posix_spawn``: 0.3 ms) on any loop and then reads its pipes and notices its
exit through the loop (a pidfd, :class:`tools.supervisor.ExitWatch`).

The pipes are read with ``loop.add_reader`` and ``os.read`` on descriptors
this module owns and closes once -- not ``loop.connect_read_pipe``: uvloop's
pipe transport closes the descriptor twice (libuv, then the file object; seen
with strace), and in a threaded server the second ``close`` can hit a
descriptor another thread has just been given (SQLite answered "disk I/O
error").

Not guaranteed: the child is not killed when the :class:`PipedProcess` is
garbage collected -- callers kill and :meth:`PipedProcess.close` it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
from collections.abc import Mapping, Sequence
from typing import IO

from tools.supervisor import ExitWatch

_CHUNK = 1 << 16


class _PipeReader:
    """Feeds one non-blocking pipe into a :class:`asyncio.StreamReader` from the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, pipe: IO[bytes]) -> None:
        self.loop, self.pipe = loop, pipe
        self.fd = pipe.fileno()
        self.stream = asyncio.StreamReader(loop=loop)
        os.set_blocking(self.fd, False)
        loop.add_reader(self.fd, self._readable)
        self._watching = True

    def _readable(self) -> None:
        try:
            data = os.read(self.fd, _CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            self.stream.feed_data(data)
        else:
            self._unwatch()
            self.stream.feed_eof()

    def _unwatch(self) -> None:
        if self._watching:
            self._watching = False
            self.loop.remove_reader(self.fd)

    def close(self) -> None:
        self._unwatch()
        self.pipe.close()


class PipedProcess:
    """A running child: ``stdout``/``stderr`` as stream readers, :meth:`wait`, :meth:`kill`."""

    def __init__(self, proc: subprocess.Popen[bytes], pipes: list[_PipeReader], exit_watch: ExitWatch) -> None:
        self._proc = proc
        self._pipes = pipes
        self.stdout = pipes[0].stream
        self.stderr = pipes[1].stream
        self._exit = exit_watch

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        """The exit status once :meth:`wait` has returned, else None."""
        return self._proc.returncode

    async def wait(self) -> int:
        """Wait for the child to exit and reap it; its exit status."""
        await asyncio.shield(self._exit.future)
        return self._proc.wait()  # it has exited: reaping does not block

    def kill(self) -> None:
        """SIGKILL the child unless it was already reaped."""
        if self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()

    def close(self) -> None:
        """Close the pipes and the exit watch (after :meth:`wait`, or after :meth:`kill`)."""
        for p in self._pipes:
            p.close()
        self._exit.close()


async def spawn_piped(argv: Sequence[str], *, cwd: str | os.PathLike[str], env: Mapping[str, str]) -> PipedProcess:
    """Start ``argv`` in ``cwd`` with stdin from /dev/null and stdout/stderr piped to the loop.

    ``Popen`` runs on a worker thread: it returns once the child has exec'd, which on
    a busy machine can take milliseconds the loop should not spend blocked (the GIL
    is free meanwhile). Cancelled while it starts, the child is killed and reaped as
    soon as it exists. Raises what ``Popen`` raises (``OSError`` for a missing
    program or ``cwd``)."""
    loop = asyncio.get_running_loop()
    start = asyncio.ensure_future(asyncio.to_thread(
        subprocess.Popen, list(argv), cwd=cwd, env=dict(env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, close_fds=True))
    try:
        proc = await asyncio.shield(start)
    except asyncio.CancelledError:
        start.add_done_callback(_discard_started)
        raise
    assert proc.stdout is not None and proc.stderr is not None
    return PipedProcess(proc, [_PipeReader(loop, proc.stdout), _PipeReader(loop, proc.stderr)], ExitWatch(loop, proc))


def _discard_started(start: asyncio.Future[subprocess.Popen[bytes]]) -> None:
    """Kill and reap a child whose caller was cancelled while it started."""
    if start.cancelled() or start.exception() is not None:
        return
    proc = start.result()
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    proc.wait()  # SIGKILLed: returns at once
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()
