"""Full copies of a tree: ``cp -a`` with reflinks where the file system has them,
and a progress bar on stderr for a copy that takes more than a second.

This is what a workspace costs where overlays cannot be mounted (see
:mod:`tools.overlay`), and what ``from_dir`` does when the source may not be
used in place. :func:`reflink_works` tells a reflink copy (btrfs, XFS: metadata
only, data shared until written) from a real one (ext4, tmpfs).

Progress is measured, not estimated: the bar's total is the allocated size of
the source (scanned while the copy runs), its position the bytes ``cp`` has
written (``/proc/PID/io``). Not guaranteed: the bar's figures for a reflink
copy (it writes almost nothing) or a tree of hard links; ``cp`` fails on trees
deeper than ``PATH_MAX`` allows, and the caller says so.
"""

from __future__ import annotations

import enum
import errno
import fcntl
import os
import stat
import subprocess
import tempfile
import threading
from pathlib import Path

from tools.delayed_progress import DelayedProgress

__all__ = ["CopyError", "CopyMethod", "copy_tree", "reflink_works"]

_FICLONE = 0x40049409
_reflink_cache: dict[tuple[int, int], bool] = {}


class CopyMethod(enum.StrEnum):
    REFLINK = "reflink"
    COPY = "copy"


class CopyError(OSError):
    """``cp`` failed; the message is its stderr."""


def _first_file(root: Path, limit: int = 2000) -> Path | None:
    """Some regular file beneath ``root`` (breadth-first, at most ``limit`` entries looked at)."""
    queue, seen = [root], 0
    while queue and seen < limit:
        try:
            with os.scandir(queue.pop(0)) as it:
                for e in it:
                    seen += 1
                    if e.is_file(follow_symlinks=False):
                        return Path(e.path)
                    if e.is_dir(follow_symlinks=False):
                        queue.append(Path(e.path))
        except OSError:
            continue
    return None


def reflink_works(src: Path, dst_dir: Path) -> bool:
    """Whether files of ``src`` can be reflinked into ``dst_dir`` (probed once per pair of file systems)."""
    try:
        key = (os.stat(src).st_dev, os.stat(dst_dir).st_dev)
    except OSError:
        return False
    if key in _reflink_cache:
        return _reflink_cache[key]
    ok = False
    sample = _first_file(src)
    if sample is not None:
        try:
            sfd = os.open(sample, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            sfd = -1
        if sfd >= 0:
            try:
                with tempfile.TemporaryFile(dir=dst_dir) as probe:
                    fcntl.ioctl(probe.fileno(), _FICLONE, sfd)
                    ok = True
            except OSError:  # EOPNOTSUPP, EXDEV, EINVAL...: no reflinks between these file systems
                ok = False
            finally:
                os.close(sfd)
    _reflink_cache[key] = ok
    return ok


def _allocated(root: Path, stop: threading.Event) -> int:
    total, stack = 0, [os.fspath(root)]
    while stack and not stop.is_set():
        try:
            with os.scandir(stack.pop()) as it:
                for e in it:
                    try:
                        st = e.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if stat.S_ISDIR(st.st_mode):
                        stack.append(e.path)
                    elif stat.S_ISREG(st.st_mode):
                        total += st.st_blocks * 512
        except OSError:
            continue
    return total


def _written(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/io") as f:
            for line in f:
                if line.startswith("write_bytes:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def copy_tree(src: Path, dst: Path, *, what: str, progress: bool = True) -> CopyMethod:
    """Copy ``src`` to the new path ``dst`` (``cp -a --reflink=auto``: modes, times, links, xattrs kept).

    With ``progress``, a bar named ``what`` appears on stderr once the copy
    has run for :data:`tools.progress.PROGRESS_AFTER_S`. Raises :class:`CopyError`.
    """
    method = CopyMethod.REFLINK if reflink_works(src, dst.parent) else CopyMethod.COPY
    proc = subprocess.Popen(["cp", "-a", "--reflink=auto", "-T", "--", os.fspath(src), os.fspath(dst)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    stop = threading.Event()
    bar = DelayedProgress(f"{what} ({method})", unit="B", unit_scale=True, poll=lambda: _written(proc.pid),
                          enabled=progress)

    def scan() -> None:  # the bar's total: the source's allocated size
        total = _allocated(src, stop)
        if not stop.is_set():
            bar.total = total

    scanner = threading.Thread(target=scan, daemon=True)
    if progress:
        scanner.start()
    try:
        _, err = proc.communicate()
    finally:
        stop.set()
        bar.close()
        if progress:
            scanner.join(timeout=5)
    if proc.returncode != 0:
        raise CopyError(errno.EIO, err.decode(errors="replace").strip() or f"cp exited with {proc.returncode}")
    return method
