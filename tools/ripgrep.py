"""Running ripgrep for the ``glob`` and ``grep`` tools: flags, streaming, timeouts.

Every run uses the same base flags so serving, RL and replay agree:
``.gitignore``/``.ignore`` files inside the workspace are respected even
without a ``.git`` directory, but ignore files *above* the workspace, the
user's global gitignore and any ripgrep config file are not; hidden files are
searched (``.git`` itself is skipped); symlinks are never followed.

Bounds on every run: arguments are checked first (:func:`tools.argv.check_arg`:
no NUL bytes, at most 128 KiB each, refused with a clear message); at most
:data:`MAX_CONCURRENT` ripgrep processes run at once per event loop (more
wait their turn; they are started without forking the server,
:mod:`tools.spawn`); each has :data:`RG_TIMEOUT_S` of wall time and an address
space of :data:`RG_MEMORY_BYTES` (plus ripgrep's own regex size limits); the
workspace's host path is replaced by ``.`` in what ripgrep prints on stderr.
Directory walks skip FIFOs, sockets and devices (ripgrep searches only
regular files it finds); a FIFO named explicitly would block its open, so the
``grep`` tool refuses non-regular files before running ripgrep.

Not guaranteed: ripgrep's ``--glob`` *overrides* ignore rules (an ignored file
matching the glob is listed), so callers that take a glob intersect with an
unfiltered listing (:func:`list_files`); output lines longer than
:data:`MAX_MESSAGE_BYTES` are dropped and counted, not shown. The memory
limit is set with ``prlimit`` just after ripgrep starts: its first
allocations happen before it. Time spent waiting for a free slot does not
count against the timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import shutil
import weakref
from collections.abc import Callable
from dataclasses import dataclass

from tools.argv import ArgvError, check_arg
from tools.base import ToolError
from tools.spawn import spawn_piped

RG_TIMEOUT_S = 30.0
RG_MEMORY_BYTES = 2 << 30
MAX_CONCURRENT = 4
MAX_MESSAGE_BYTES = 4 << 20
MAX_STDERR_BYTES = 16 << 10

BASE_FLAGS = (
    "--no-config",
    "--no-require-git",
    "--no-ignore-parent",
    "--no-ignore-global",
    "--hidden",
    "--glob=!.git",
    "--no-follow",
    "--color=never",
    "--no-mmap",  # plain reads: the address-space limit then bounds memory, not file size
)

_slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()


def _slot() -> asyncio.Semaphore:
    """The per-event-loop semaphore bounding concurrent ripgrep processes."""
    loop = asyncio.get_running_loop()
    sem = _slots.get(loop)
    if sem is None:
        sem = _slots[loop] = asyncio.Semaphore(MAX_CONCURRENT)
    return sem


def scrub(text: str, root: str | os.PathLike[str]) -> str:
    """``text`` with the absolute workspace path replaced by ``.`` (relative paths)."""
    for r in {os.fspath(root), os.path.realpath(root)}:
        text = text.replace(r.rstrip("/") + "/", "./").replace(r, ".")
    return text


_FOUND: dict[str, str] = {}  # PATH -> where rg was found on it


def rg_binary() -> str:
    """Path of the ``rg`` executable; a ToolError saying how to install it if missing.

    Remembered per ``PATH`` once found (the search stats every ``PATH`` entry, and
    a server runs ripgrep for every ``grep``); a miss is never remembered."""
    key = os.environ.get("PATH", "")
    path = _FOUND.get(key) or shutil.which("rg")
    if path is None:
        raise ToolError(_RG_MISSING)
    _FOUND[key] = path
    return path


_RG_MISSING = "ripgrep (rg) is not installed: apt-get install ripgrep"


@dataclass(frozen=True, slots=True)
class RgExit:
    returncode: int
    stderr: str
    dropped_lines: int


async def run_rg(
    args: list[str],
    cwd: str | os.PathLike[str],
    on_line: Callable[[bytes], None],
    *,
    timeout: float | None = None,
) -> RgExit:
    """Run ``rg BASE_FLAGS args`` in ``cwd``, feeding each stdout line (no ``\\n``) to ``on_line``.

    Kills rg on timeout (ToolError) or cancellation. Exit codes are returned,
    not interpreted: 0 found, 1 nothing found, 2 error. ``timeout`` defaults
    to :data:`RG_TIMEOUT_S` (read at call time). An argument that cannot be
    passed to a program (NUL byte, over 128 KiB) is a ToolError.
    """
    for arg in args:
        try:
            check_arg("argument", arg)
        except ArgvError as exc:
            raise ToolError(str(exc)) from None
    async with _slot():
        return await _run_rg(args, cwd, on_line, RG_TIMEOUT_S if timeout is None else timeout)


async def _run_rg(
    args: list[str], cwd: str | os.PathLike[str], on_line: Callable[[bytes], None], timeout: float
) -> RgExit:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RIPGREP_")}
    binary = rg_binary()
    try:
        proc = await spawn_piped([binary, *BASE_FLAGS, *args], cwd=os.fspath(cwd), env=env)
    except FileNotFoundError:
        if not os.path.exists(binary):  # removed since it was found
            _FOUND.clear()
            raise ToolError(_RG_MISSING) from None
        raise
    with contextlib.suppress(OSError):  # it may already have exited
        resource.prlimit(proc.pid, resource.RLIMIT_AS, (RG_MEMORY_BYTES, RG_MEMORY_BYTES))
    stdout, stderr = proc.stdout, proc.stderr
    dropped = 0

    async def pump_stdout() -> None:
        nonlocal dropped
        buf = bytearray()
        skipping = False
        while chunk := await stdout.read(1 << 16):
            start = 0
            while (nl := chunk.find(b"\n", start)) >= 0:
                if not skipping:
                    buf += chunk[start:nl]
                    on_line(bytes(buf))
                buf.clear()
                skipping = False
                start = nl + 1
            if not skipping:
                buf += chunk[start:]
                if len(buf) > MAX_MESSAGE_BYTES:
                    buf.clear()
                    skipping = True
                    dropped += 1
        if buf and not skipping:
            on_line(bytes(buf))

    async def pump_stderr() -> bytes:
        kept = bytearray()
        while chunk := await stderr.read(1 << 14):
            kept += chunk[: max(0, MAX_STDERR_BYTES - len(kept))]
        return bytes(kept)

    try:
        async with asyncio.timeout(timeout):
            _, err = await asyncio.gather(pump_stdout(), pump_stderr())
            rc = await proc.wait()
    except TimeoutError:
        raise ToolError(
            f"ripgrep timed out after {timeout:g} s and was stopped: narrow the path, glob or pattern"
        ) from None
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        proc.close()
    return RgExit(rc, scrub(err.decode("utf-8", "replace").strip(), cwd), dropped)


async def list_files(cwd: str | os.PathLike[str], path: str, glob: str | None = None) -> list[str]:
    """Files beneath ``path`` (relative to ``cwd``) that ripgrep would search, sorted.

    With ``glob``, only files matching it *and* not ignored (see module doc).
    """
    where = [] if path == "." else ["--", path]

    async def listing(extra: list[str]) -> set[str]:
        out: set[str] = set()
        res = await run_rg(["--files", *extra, *where], cwd,
                           lambda line: out.add(line.decode("utf-8", "replace")))
        if res.returncode not in (0, 1):
            raise ToolError(f"ripgrep failed: {res.stderr or f'exit code {res.returncode}'}")
        return out

    if glob is None:
        return sorted(await listing([]))
    matching, unignored = await asyncio.gather(listing(["--glob", glob]), listing([]))
    return sorted(matching & unignored)
