"""Walk, hash, copy and remove workspace trees by directory fds, iteratively, in bounded memory.

* :func:`scan_tree` walks a tree without recursion and without following any
  symlink, and enforces :data:`MAX_TREE_DEPTH` and :data:`MAX_PATH_BYTES`.
* :func:`hash_fd` / :func:`copy_fd` stream a file in :data:`CHUNK_BYTES`
  pieces and skip a sparse file's holes (``SEEK_DATA``/``SEEK_HOLE``): holes
  are hashed from a constant zero buffer and are never read, and a copy keeps
  them as holes.
* :func:`remove_tree` deletes a tree of any depth with two fds open at a time
  and no recursion (a 3.11 ``shutil.rmtree`` recurses once per level and hits
  ``RecursionError`` near 1,000 levels). A directory that cannot be renamed
  (``EXDEV``: a lower-layer directory of an overlay mounted without
  ``redirect_dir``) is removed depth-first in place instead, one fd per level.

Not guaranteed: a concurrent writer can change the tree during a walk (a
file that changes while it is hashed or copied is reported by the caller
comparing two hashes, not prevented); ``remove_tree`` renames entries into
the directory being removed, so an interrupted removal leaves a flatter,
partly removed tree, never anything outside it.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

MAX_TREE_DEPTH = 256
"""Directory levels a walk descends (``a/b`` is depth 2); deeper entries are refused or skipped."""
MAX_PATH_BYTES = 4096
"""Longest relative path (in bytes) a walk accepts, the same as a tool path's limit."""
CHUNK_BYTES = 1 << 20
_ZEROS = bytes(CHUNK_BYTES)
_SEEK_DATA = getattr(os, "SEEK_DATA", 3)
_SEEK_HOLE = getattr(os, "SEEK_HOLE", 4)
O_PATH: int = getattr(os, "O_PATH", 0o10000000)


class TreeLimitError(Exception):
    """An entry is deeper than :data:`MAX_TREE_DEPTH` or its path is longer than :data:`MAX_PATH_BYTES`."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{short_path(path)!r} {reason}")
        self.path = path
        self.reason = reason


def short_path(path: str, limit: int = 120) -> str:
    """``path`` cut to ``limit`` characters (keeping its start and end) for an error message."""
    return path if len(path) <= limit else f"{path[:limit // 2]}…{path[-limit // 2:]}"


@dataclass(frozen=True, slots=True)
class TreeItem:
    """One entry met by :func:`scan_tree`; ``dir_fd`` is valid only during the yield."""

    path: str
    st: os.stat_result
    dir_fd: int
    name: str


OnLimit = Callable[[TreeItem, TreeLimitError], None]


def scan_tree(root: str | os.PathLike[str], *, on_limit: OnLimit | None = None,
              descend: Callable[[TreeItem], bool] | None = None,
              include: Callable[[TreeItem], bool] | None = None,
              max_depth: int = MAX_TREE_DEPTH) -> Iterator[TreeItem]:
    """Walk ``root`` by directory fds without following any symlink (parents first, sorted).

    ``include`` is asked about every entry first (in walk order); an entry it
    refuses is neither yielded nor descended into, nor checked against the
    limits (an ignored ``.venv`` may be as deep as it likes).
    An entry deeper than ``max_depth`` levels or with a path longer than
    :data:`MAX_PATH_BYTES` raises :class:`TreeLimitError`, or, with
    ``on_limit``, is passed to it (and neither yielded nor descended into).
    ``descend`` is called with every item right after it is yielded; False
    prunes a directory (its entries are not walked). A directory that is
    removed while it is yielded is not descended into.
    At most ``max_depth`` + 1 fds are open at once.
    """
    top = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    stack: list[tuple[int, str, Iterator[str]]] = [(top, "", iter(_sorted_names(top)))]
    try:
        while stack:
            fd, prefix, names = stack[-1]
            name = next(names, None)
            if name is None:
                os.close(fd)
                stack.pop()
                continue
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            item = TreeItem(prefix + name, st, fd, name)
            if include is not None and not include(item):
                continue
            problem = _limit_problem(item.path, len(stack), max_depth)
            if problem is not None:
                if on_limit is None:
                    raise problem
                on_limit(item, problem)
                continue
            yield item
            if descend is not None and not descend(item) or not stat.S_ISDIR(st.st_mode):
                continue
            try:
                child = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                                dir_fd=fd)
            except OSError:  # removed or replaced by the caller, or unreadable
                continue
            try:
                stack.append((child, item.path + "/", iter(_sorted_names(child))))
            except BaseException:
                os.close(child)
                raise
    finally:
        for fd, _, _ in stack:
            os.close(fd)


def _sorted_names(fd: int) -> list[str]:
    with os.scandir(fd) as it:
        return sorted(e.name for e in it)


def _limit_problem(path: str, depth: int, max_depth: int) -> TreeLimitError | None:
    if depth > max_depth:
        return TreeLimitError(path, f"is deeper than {max_depth} directory levels")
    if len(os.fsencode(path)) > MAX_PATH_BYTES:
        return TreeLimitError(path, f"has a path longer than {MAX_PATH_BYTES} bytes")
    return None


def open_item(item: TreeItem) -> int:
    """An ``O_RDONLY`` fd of a regular file met by :func:`scan_tree` (refusing a swapped-in link)."""
    fd = os.open(item.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=item.dir_fd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file any more", item.path)
    return fd


# ---------------------------------------------------------------- streaming, sparse-aware


class Hasher(Protocol):
    def update(self, data: bytes | memoryview, /) -> None: ...


def _segments(fd: int, size: int) -> Iterator[tuple[int, int, bool]]:
    """``(offset, length, is_data)`` covering ``[0, size)``; holes found with SEEK_DATA/SEEK_HOLE."""
    pos = 0
    while pos < size:
        try:
            data = os.lseek(fd, pos, _SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # only a hole is left
                yield pos, size - pos, False
                return
            yield pos, size - pos, True  # no SEEK_DATA here: treat everything as data
            return
        if data > pos:
            yield pos, min(data, size) - pos, False
        if data >= size:
            return
        hole = min(os.lseek(fd, data, _SEEK_HOLE), size)
        yield data, hole - data, True
        pos = hole


def _read_range(fd: int, offset: int, length: int) -> Iterator[bytes]:
    end = offset + length
    while offset < end:
        chunk = os.pread(fd, min(CHUNK_BYTES, end - offset), offset)
        if not chunk:
            return
        yield chunk
        offset += len(chunk)


def hash_fd(fd: int, size: int, hasher: Hasher) -> int:
    """Feed the first ``size`` bytes of ``fd`` to ``hasher``; return the bytes fed.

    Holes are fed from a constant zero buffer (never read); memory stays
    under two :data:`CHUNK_BYTES`. Fewer bytes than ``size`` means the file shrank.
    """
    fed = 0
    for offset, length, is_data in _segments(fd, size):
        if is_data:
            for chunk in _read_range(fd, offset, length):
                hasher.update(chunk)
                fed += len(chunk)
            if fed < offset + length:
                return fed
        else:
            _feed_zeros(hasher, length)
            fed += length
    return fed


def _feed_zeros(hasher: Hasher, length: int) -> None:
    zeros = memoryview(_ZEROS)
    while length:
        n = min(length, CHUNK_BYTES)
        hasher.update(zeros[:n])
        length -= n


def copy_fd(src: int, dst: int, size: int, hasher: Hasher | None = None) -> int:
    """Copy ``size`` bytes of ``src`` to the empty file ``dst``, keeping holes as holes.

    Also feeds ``hasher`` (holes as zeros) so the caller can check what it
    copied. Returns the bytes copied (fewer than ``size``: the source shrank).
    """
    copied = 0
    for offset, length, is_data in _segments(src, size):
        if not is_data:
            if hasher is not None:
                _feed_zeros(hasher, length)
            copied += length
            continue
        end = offset + length
        for chunk in _read_range(src, offset, length):
            view = memoryview(chunk)
            at = offset
            while view:
                n = os.pwrite(dst, view, at)
                view, at = view[n:], at + n
            if hasher is not None:
                hasher.update(chunk)
            offset += len(chunk)
            copied += len(chunk)
        if offset < end:  # the source shrank while it was read
            break
    os.ftruncate(dst, copied)  # a trailing hole
    return copied


# ---------------------------------------------------------------- removal


def remove_tree(dir_fd: int, name: str) -> None:
    """Remove ``name`` (relative to ``dir_fd``) and everything under it; never follows a link.

    Iterative and depth-independent: a subdirectory's files are unlinked and
    its subdirectories renamed up into the directory being removed, then the
    emptied subdirectory is removed, so every directory moves at most once and
    two fds are open at a time. A subdirectory that refuses to move (``EXDEV``,
    an overlay's lower directory) is removed in place, depth-first.
    Directories without search permission are given it first. A missing
    ``name`` is not an error.
    """
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=dir_fd)
        return
    top = _open_dir(dir_fd, name)
    try:
        while names := _sorted_names(top):
            for entry in names:
                try:
                    est = os.stat(entry, dir_fd=top, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if not stat.S_ISDIR(est.st_mode):
                    os.unlink(entry, dir_fd=top)
                    continue
                sub = _open_dir(top, entry)
                try:
                    for child in _unlink_files(sub):
                        try:  # moved up: removed by a later pass, with no recursion
                            os.rename(child, f".fw-rm-{secrets.token_hex(8)}", src_dir_fd=sub, dst_dir_fd=top)
                        except OSError as exc:
                            if exc.errno != errno.EXDEV:
                                raise
                            _remove_in_place(sub, child)  # an overlay's lower directory cannot move
                finally:
                    os.close(sub)
                os.rmdir(entry, dir_fd=top)
    finally:
        os.close(top)
    os.rmdir(name, dir_fd=dir_fd)


def _remove_in_place(dir_fd: int, name: str) -> None:
    """Remove the directory ``name`` depth-first, without renaming anything (one fd per level).

    For directories ``rename`` refuses with ``EXDEV``: on an overlay mounted
    without ``redirect_dir``, a directory of a lower layer cannot be moved.
    """
    stack: list[tuple[int, str, int, Iterator[str]]] = []

    def enter(parent: int, entry: str) -> None:
        fd = _open_dir(parent, entry)
        try:
            subdirs = _unlink_files(fd)
        except BaseException:
            os.close(fd)
            raise
        stack.append((parent, entry, fd, iter(sorted(subdirs))))

    enter(dir_fd, name)
    try:
        while stack:
            parent, entry, fd, subdirs = stack[-1]
            child = next(subdirs, None)
            if child is not None:
                enter(fd, child)
                continue
            os.close(fd)
            stack.pop()
            os.rmdir(entry, dir_fd=parent)
    finally:
        for _, _, fd, _ in stack:
            os.close(fd)


def _unlink_files(fd: int) -> list[str]:
    """Unlink every entry of the directory ``fd`` that is not a directory (a link is
    unlinked, never followed); return the names of its subdirectories, in scan order."""
    with os.scandir(fd) as it:
        children = [(c.name, c.is_dir(follow_symlinks=False)) for c in it]
    subdirs: list[str] = []
    for child, is_dir in children:
        if is_dir:
            subdirs.append(child)
        else:
            os.unlink(child, dir_fd=fd)
    return subdirs


def _open_dir(dir_fd: int, name: str) -> int:
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except PermissionError:  # a directory without read/search permission (not for root)
        pfd = os.open(name, O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        try:
            if stat.S_ISDIR(os.fstat(pfd).st_mode):
                os.chmod(f"/proc/self/fd/{pfd}", 0o700)  # the inode itself, never a link
        finally:
            os.close(pfd)
        return os.open(name, flags, dir_fd=dir_fd)


def remove_path(path: str | os.PathLike[str]) -> None:
    """:func:`remove_tree` for an absolute (host-chosen, trusted) path; missing is fine."""
    parent, name = os.path.split(os.path.abspath(path))
    try:
        fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        remove_tree(fd, name)
    finally:
        os.close(fd)
