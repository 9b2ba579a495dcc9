"""Resolve model-supplied paths beneath a workspace root, and never out of it.

Two layers:

* :func:`normalize` checks the *string* (not absolute, no NUL, no escaping
  ``..``, length limits) and normalises it lexically (``posixpath.normpath``;
  ``"."`` is the root). ``a/link/../b`` becomes ``a/b`` lexically, before any
  symlink is looked at.
* Resolution is done by the kernel: ``openat2(2)`` with ``RESOLVE_BENEATH |
  RESOLVE_NO_MAGICLINKS`` relative to an ``O_PATH`` descriptor of the root. A
  symlink that stays inside the root is followed; one that leaves it (absolute
  targets, ``..`` chains, ``/proc`` magic links) is refused. Where openat2 is
  missing (``ENOSYS``), a component-by-component walk with ``O_NOFOLLOW`` and
  manual symlink expansion gives the same answer. Neither is a prefix check.

Writes are atomic (temporary file in the target directory, ``fsync``,
``rename``) and follow an in-workspace symlink to its target rather than
replacing the link.

Not guaranteed: protection against a *concurrent* process that swaps
directories while a write walks the tree is the kernel's (each step is
relative to a held descriptor, so it cannot escape, but a write may land in
the swapped-in directory); hard links inside the workspace that point at files
elsewhere cannot be detected (a replace breaks the link, it never writes
through it); absolute symlinks are refused even when they point back inside
the workspace; special files (FIFOs, devices) are refused for reading.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import posixpath
import re
import secrets
import stat
from dataclasses import dataclass

from tools.base import ToolError

MAX_COMPONENT_BYTES = 255
MAX_PATH_BYTES = 4096
MAX_SYMLINKS = 40

O_PATH: int = getattr(os, "O_PATH", 0o10000000)
RESOLVE_NO_XDEV = 0x01
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
_SYS_OPENAT2 = {"x86_64": 437, "aarch64": 437, "arm64": 437}


class PathError(ToolError):
    """A path the model gave cannot be used; the message says why and what to do."""


class PathEscapeError(PathError):
    """The path (or a symlink along it) leads outside the workspace."""


class PathNotFoundError(PathError):
    """Nothing exists at the path (inside the workspace)."""


class PathTypeError(PathError):
    """The path exists but is the wrong kind (a directory where a file is needed, ...)."""


def normalize(rel: str) -> str:
    """Validate a model-supplied relative path and normalise it lexically.

    Returns a ``/``-separated path without ``.``/``..`` components, or ``"."``
    for the root. Backslashes, ``~`` and URL-like strings are ordinary name
    characters here. Does not touch the file system.
    """
    if not isinstance(rel, str):
        raise PathError(f"path must be a string, got {type(rel).__name__}")
    if rel == "":
        raise PathError("empty path: use '.' for the workspace root")
    if "\x00" in rel:
        raise PathError("path contains a NUL byte")
    try:
        raw = os.fsencode(rel)
    except UnicodeEncodeError:
        raise PathError(f"path {rel!r} contains characters that cannot be encoded") from None
    if len(raw) > MAX_PATH_BYTES:
        raise PathError(f"path is too long ({len(raw)} bytes; the limit is {MAX_PATH_BYTES})")
    for comp in raw.split(b"/"):
        if len(comp) > MAX_COMPONENT_BYTES:
            raise PathError(
                f"path component {comp[:40].decode('utf-8', 'replace')!r}... is too long "
                f"({len(comp)} bytes; the limit is {MAX_COMPONENT_BYTES})"
            )
    if rel.startswith("/"):
        raise PathError(
            f"absolute paths are not allowed ({rel!r}): use a path relative to the workspace root"
        )
    norm = posixpath.normpath(rel)
    if norm == ".." or norm.startswith("../"):
        raise PathEscapeError(f"path {rel!r} escapes the workspace (too many '..' components)")
    return norm


_ESCAPED_BYTE_RE = re.compile(r"\\x([89a-fA-F][0-9a-fA-F])")


def display_path(path: str) -> str:
    """``path`` as valid UTF-8 text for the model and for events.

    A file name that is not valid UTF-8 reaches Python with each bad byte as a
    surrogate escape (``os.fsdecode``); each becomes the four characters
    ``\\xHH`` here, which :func:`unescape_path` maps back. Valid names are
    returned unchanged.
    """
    if not any("\udc80" <= c <= "\udcff" for c in path):
        return path
    return "".join(f"\\x{ord(c) - 0xDC00:02x}" if "\udc80" <= c <= "\udcff" else c for c in path)


def unescape_path(path: str) -> str:
    """The inverse of :func:`display_path`: ``\\x80``-``\\xff`` escapes become raw bytes."""
    return _ESCAPED_BYTE_RE.sub(lambda m: chr(0xDC00 + int(m.group(1), 16)), path)


def fs_path(root: str | os.PathLike[str], rel: str) -> str:
    """The file-system name for a model-supplied ``rel`` that may hold ``\\xHH`` escapes.

    The literal name wins when it exists (backslashes are ordinary name
    characters); otherwise the escapes name raw bytes, so a name shown by
    :func:`display_path` can be passed back as shown. Not guaranteed: with
    both a literal ``a\\xff`` and a raw-byte ``a<ff>`` present, the raw one
    cannot be reached by this spelling.
    """
    raw = unescape_path(rel) if "\\x" in rel else rel
    if raw == rel:
        return rel
    try:
        os.close(open_beneath(root, rel, follow_final=False))
        return rel
    except PathError:
        return raw


def resource_key(rel: str) -> str:
    """The executor's lock key for a path: normalised, or the raw string if invalid."""
    try:
        return normalize(rel)
    except PathError:
        return rel


# ---------------------------------------------------------------- resolution


class _OpenHowStruct(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_libc: ctypes.CDLL | None = None
_openat2_state: bool | None = None  # None: unknown yet; False: ENOSYS seen


def _syscall_openat2(dirfd: int, path: bytes, flags: int, resolve: int) -> int:
    """Raw openat2; returns an fd or raises OSError (ENOSYS where unsupported)."""
    global _libc
    nr = _SYS_OPENAT2.get(platform.machine())
    if nr is None:
        raise OSError(errno.ENOSYS, "openat2 syscall number unknown for this machine")
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    how = _OpenHowStruct(flags | os.O_CLOEXEC, 0, resolve)
    fd = _libc.syscall(
        ctypes.c_long(nr), ctypes.c_int(dirfd), ctypes.c_char_p(path),
        ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how)),
    )
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), os.fsdecode(path))
    return int(fd)


def openat2_available() -> bool:
    """Whether the kernel resolver is used (False: the manual walk is used)."""
    global _openat2_state
    if _openat2_state is None:
        try:
            os.close(_syscall_openat2(-100, b"/", O_PATH | os.O_DIRECTORY, 0))  # AT_FDCWD
            _openat2_state = True
        except OSError:  # ENOSYS, or EPERM from a seccomp filter that does not know it
            _openat2_state = False
    return _openat2_state


def _walk(root_fd: int, rel: str, flags: int, follow_final: bool, no_symlinks: bool) -> int:
    """Fallback resolver: open each component ``O_NOFOLLOW`` and expand links by hand.

    ``..`` pops back to the directory the walk came from (physical semantics,
    as the kernel does), and may never pop past the root.
    """
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    stack = [os.dup(root_fd)]
    links = 0
    try:
        while parts:
            comp = parts.pop(0)
            if comp == "..":
                if len(stack) == 1:
                    raise OSError(errno.EXDEV, "escapes root", rel)
                os.close(stack.pop())
                continue
            last = not parts
            fd = os.open(comp, O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=stack[-1])
            mode = os.fstat(fd).st_mode
            if stat.S_ISLNK(mode) and (not last or follow_final):
                os.close(fd)
                links += 1
                if no_symlinks or links > MAX_SYMLINKS:
                    raise OSError(errno.ELOOP, "symlink refused or loop", rel)
                target = os.readlink(comp, dir_fd=stack[-1])
                if target.startswith("/"):
                    raise OSError(errno.EXDEV, "absolute symlink", rel)
                parts[:0] = [p for p in target.split("/") if p not in ("", ".")]
                continue
            if last:
                os.close(fd)  # reopen with the real flags; O_NOFOLLOW closes the swap race
                return os.open(comp, flags | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=stack[-1])
            if not stat.S_ISDIR(mode):
                os.close(fd)
                raise OSError(errno.ENOTDIR, "not a directory", rel)
            stack.append(fd)
        return os.open(".", flags | os.O_CLOEXEC, dir_fd=stack[-1])
    finally:
        for fd in stack:
            os.close(fd)


def _describe(rel: str, exc: OSError) -> PathError:
    code = exc.errno
    if code in (errno.EXDEV, errno.ELOOP):
        return PathEscapeError(
            f"path {rel!r} escapes the workspace (a symlink along it points outside, "
            "is absolute, or loops)"
        )
    if code == errno.ENOENT:
        return PathNotFoundError(f"not found: {rel!r} does not exist in the workspace")
    if code == errno.ENOTDIR:
        return PathTypeError(f"{rel!r}: a component of the path is not a directory")
    if code == errno.EISDIR:
        return PathTypeError(f"{rel!r} is a directory")
    if code == errno.ENAMETOOLONG:
        return PathError(f"path {rel!r} is too long")
    if code in (errno.EACCES, errno.EPERM):
        return PathError(f"permission denied: {rel!r}")
    return PathError(f"cannot open {rel!r}: {exc.strerror}")


def open_beneath(
    root: str | os.PathLike[str],
    rel: str,
    flags: int = O_PATH,
    *,
    follow_final: bool = True,
    no_symlinks: bool = False,
) -> int:
    """Open ``rel`` beneath ``root`` and return the fd (caller closes it).

    ``rel`` is validated with :func:`normalize` first. ``follow_final=False``
    opens a final symlink itself (only meaningful with ``O_PATH``);
    ``no_symlinks=True`` refuses every symlink on the way. Raises
    :class:`PathError` (never a bare ``OSError``) for anything the model can fix.
    """
    norm = normalize(rel)
    if not follow_final:
        flags |= os.O_NOFOLLOW
    resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS | (RESOLVE_NO_SYMLINKS if no_symlinks else 0)
    root_fd = os.open(root, O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for _ in range(8):
            try:
                if openat2_available():
                    return _syscall_openat2(root_fd, os.fsencode(norm), flags, resolve)
                return _walk(root_fd, norm, flags, follow_final, no_symlinks)
            except OSError as exc:
                if exc.errno == errno.EAGAIN:  # a concurrent rename: the kernel asks to retry
                    continue
                raise _describe(norm, exc) from None
        raise PathError(f"cannot resolve {norm!r}: the tree keeps changing")
    finally:
        os.close(root_fd)


def fd_relpath(root: str | os.PathLike[str], fd: int) -> str:
    """The workspace-relative real path of an open fd (via ``/proc/self/fd``).

    A defence-in-depth check on top of the resolver: raises
    :class:`PathEscapeError` if the fd is not beneath ``root``.
    """
    real = os.readlink(f"/proc/self/fd/{fd}")
    base = os.path.realpath(root)
    if real == base:
        return "."
    if not real.startswith(base.rstrip("/") + "/"):
        raise PathEscapeError("the path resolved to a place outside the workspace (it was moved or "
                              "swapped while it was opened)")
    return real[len(base.rstrip("/")) + 1 :]


def resolve_beneath(root: str | os.PathLike[str], rel: str) -> str:
    """The real relative path of an *existing* ``rel``, after in-workspace symlinks."""
    fd = open_beneath(root, rel)
    try:
        return fd_relpath(root, fd)
    finally:
        os.close(fd)


def stat_beneath(root: str | os.PathLike[str], rel: str, *, follow_final: bool = True) -> os.stat_result:
    fd = open_beneath(root, rel, follow_final=follow_final)
    try:
        return os.fstat(fd)
    finally:
        os.close(fd)


def read_bytes_beneath(root: str | os.PathLike[str], rel: str, *, limit: int | None = None) -> bytes:
    """Read a regular file (following in-workspace links). ``limit`` caps the bytes read."""
    probe = stat_beneath(root, rel)
    if stat.S_ISDIR(probe.st_mode):
        raise PathTypeError(f"{normalize(rel)!r} is a directory, not a file (use list_dir)")
    if not stat.S_ISREG(probe.st_mode):
        raise PathTypeError(f"{normalize(rel)!r} is not a regular file")
    fd = open_beneath(root, rel, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise PathTypeError(f"{normalize(rel)!r} is not a regular file")
        chunks: list[bytes] = []
        left = limit if limit is not None else -1
        while left != 0:
            chunk = os.read(fd, 1 << 20 if left < 0 else min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            if left > 0:
                left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


# ---------------------------------------------------------------- writing


@dataclass(frozen=True, slots=True)
class WriteOutcome:
    """Where a write landed: the real relative path, and whether it created the file."""

    path: str
    created: bool


def makedirs_beneath(root: str | os.PathLike[str], rel: str, *, no_symlinks: bool = False) -> int:
    """Ensure directory ``rel`` exists beneath ``root``; return an ``O_PATH`` fd of it.

    Each missing component is created with ``mkdir`` relative to the fd of its
    (already resolved) parent, so nothing is created outside the root.
    """
    norm = normalize(rel)
    try:
        return open_beneath(root, norm, O_PATH | os.O_DIRECTORY, no_symlinks=no_symlinks)
    except PathNotFoundError:
        pass
    parts = [] if norm == "." else norm.split("/")
    for i in range(len(parts)):
        prefix = "/".join(parts[: i + 1])
        try:
            os.close(open_beneath(root, prefix, O_PATH | os.O_DIRECTORY, no_symlinks=no_symlinks))
            continue
        except PathNotFoundError:
            pass
        parent = open_beneath(root, "/".join(parts[:i]) or ".", O_PATH | os.O_DIRECTORY,
                              no_symlinks=no_symlinks)
        try:
            os.mkdir(parts[i], 0o755, dir_fd=parent)
        except FileExistsError:
            raise PathTypeError(
                f"cannot create directory {prefix!r}: a non-directory (or dangling symlink) is in the way"
            ) from None
        finally:
            os.close(parent)
    return open_beneath(root, norm, O_PATH | os.O_DIRECTORY, no_symlinks=no_symlinks)


def write_bytes_beneath(
    root: str | os.PathLike[str],
    rel: str,
    data: bytes,
    *,
    mode: int | None = None,
    follow_symlink: bool = True,
    make_parents: bool = True,
    durable: bool = True,
    _depth: int = 0,
) -> WriteOutcome:
    """Create or atomically replace the regular file ``rel`` beneath ``root``.

    If ``rel`` is a symlink (and ``follow_symlink``), the link's resolved target
    is written instead, provided it stays in the workspace; a dangling
    relative link is followed to create its target. ``mode`` defaults to the
    existing file's permissions, or 0o644 for a new file. ``durable=False``
    skips the ``fsync`` calls (still atomic, not crash-durable). Not guaranteed: the
    file's owner, xattrs and hard links to the old inode are not preserved.
    """
    norm = normalize(rel)
    if norm == ".":
        raise PathTypeError("cannot write to '.': it is the workspace root directory")
    if _depth > MAX_SYMLINKS:
        raise PathEscapeError(f"path {rel!r} escapes the workspace (too many symlinks)")
    parent_rel, name = posixpath.split(norm)
    parent_rel = parent_rel or "."
    if make_parents:
        parent = makedirs_beneath(root, parent_rel, no_symlinks=not follow_symlink)
    else:
        parent = open_beneath(root, parent_rel, O_PATH | os.O_DIRECTORY, no_symlinks=not follow_symlink)
    try:
        try:
            st: os.stat_result | None = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is not None and stat.S_ISLNK(st.st_mode) and follow_symlink:
            real_parent = fd_relpath(root, parent)
            try:
                target_rel = resolve_beneath(root, posixpath.join(real_parent, name))
            except PathNotFoundError:
                link = os.readlink(name, dir_fd=parent)
                if link.startswith("/"):
                    raise PathEscapeError(
                        f"path {rel!r} escapes the workspace (it is a symlink to an absolute path)"
                    ) from None
                target_rel = posixpath.join(real_parent, link)
            return write_bytes_beneath(root, target_rel, data, mode=mode, durable=durable,
                                       _depth=_depth + 1)
        if st is not None and stat.S_ISDIR(st.st_mode):
            raise PathTypeError(f"{norm!r} is a directory; cannot write file content to it")
        if st is not None and not stat.S_ISREG(st.st_mode) and not stat.S_ISLNK(st.st_mode):
            raise PathTypeError(f"{norm!r} is not a regular file")
        if mode is None:
            mode = stat.S_IMODE(st.st_mode) if st is not None and stat.S_ISREG(st.st_mode) else 0o644
        _atomic_write(parent, name, data, mode, durable)
        return WriteOutcome(path=posixpath.join(fd_relpath(root, parent), name).removeprefix("./"),
                            created=st is None)
    finally:
        os.close(parent)


def _atomic_write(parent_fd: int, name: str, data: bytes, mode: int, durable: bool) -> None:
    tmp = f".fw-tmp-{secrets.token_hex(8)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600, dir_fd=parent_fd)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fchmod(fd, mode)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=parent_fd, dst_dir_fd=parent_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=parent_fd)
        except FileNotFoundError:
            pass
        raise
    if not durable:
        return
    dir_fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=parent_fd)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
