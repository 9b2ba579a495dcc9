"""Overlay mounts for copy-on-write workspaces: mount, unmount, probe, and cleanup at exit.

A copy-on-write workspace is an overlayfs mount: read-only *lower* layers (a
source directory used in place, or a directory the store owns) under a
private *upper* directory that receives every write. Deleting a file of a
lower layer leaves a *whiteout* (a 0/0 character device) in the upper; a
directory that replaces a lower one is marked *opaque* (the
``trusted.overlay.opaque`` xattr). Nothing is ever written to a lower layer.

Mounts are made with ``mount(2)`` through ctypes (a millisecond, no process
spawned), which needs ``CAP_SYS_ADMIN`` (root): :func:`overlay_unavailable`
says why not where it cannot. Options, whatever the kernel's defaults:
``redirect_dir=on`` (a directory of a lower layer can be renamed: the upper
records where it came from), ``metacopy=off`` (a copied-up file holds all its
data) and ``index=off``. An upper directory copied verbatim (``cp -a`` as root
keeps whiteouts and ``trusted.overlay.*`` xattrs) serves as a lower layer of
another mount, above the same layers, with the same meaning. Lower layers are
passed as ``/proc/self/fd/N`` paths, so a deep stack fits the kernel's
one-page option limit.

Every mount this process makes is recorded and unmounted when the process
exits: by an ``atexit`` hook, and, for a process that dies without running it
(SIGKILL, ``os._exit``: a Ray worker being stopped), by a *reaper*, a small
helper process started with the first mount, in its own session, that learns
of each mount and unmount through a pipe and detaches (``MNT_DETACH``) what is
left when the pipe closes. A mount still in use is detached lazily.

Not guaranteed:

* Changing a lower layer while it is mounted is, for the kernel, undefined:
  in practice a change to a file the workspace has not written shows through
  and one it has written does not.
* A rename whose recorded origin path would exceed the kernel's
  ``redirect_max`` (256 bytes by default) fails with ``EXDEV``, which ``mv``
  and ``shutil.move`` handle by copying.
* The reaper runs when every process holding the pipe has exited (children
  forked without ``exec`` hold it too), so a directory removed right after
  the kill may still hold mounts: :func:`detach_under` unmounts them at once
  (``tools.workspace.remove_store`` and the server's start call it); if the
  reaper itself is killed, a SIGKILLed process leaves its mounts
  (``WorkspaceStore.open`` reuses them). A reaper that runs late may detach a
  mount made since at the same place if the kernel gave it the same mount id.
* Writing a large lower file copies all of it into the upper first.
"""

from __future__ import annotations

import atexit
import ctypes
import errno
import os
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tools.treewalk import O_PATH, remove_path

__all__ = [
    "MOUNT_OPTIONS", "OPAQUE_XATTR", "OverlayError", "detach_under", "is_mountpoint", "is_opaque", "is_whiteout",
    "mount_overlay", "mounted_here", "mounts_under", "overlay_unavailable", "unmount", "upper_dir",
]

MOUNT_OPTIONS = "redirect_dir=on,metacopy=off,index=off"
OPAQUE_XATTR = "trusted.overlay.opaque"
_MNT_DETACH = 2
_MAX_OPTIONS_BYTES = 4095  # the legacy mount(2) data is one page

_lock = threading.Lock()


@dataclass(frozen=True, slots=True)
class _Mount:
    pid: int  # the process that mounted it
    mnt_id: int  # the kernel's mount id (mountinfo's first field)
    upper: str  # the upperdir option as given: with the id, names the mount even after a rename


_ours: dict[str, _Mount] = {}  # mountpoint as mounted -> the mount
_probed: dict[int, str | None] = {}  # st_dev of the store -> why overlay does not work there
_libc: ctypes.CDLL | None = None


class OverlayError(OSError):
    """A mount or unmount failed (the message names the path and the reason)."""


def _c() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        lib = ctypes.CDLL(None, use_errno=True)
        lib.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
        lib.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
        _libc = lib
    return _libc


def _escape(path: Path) -> str:
    """A path as overlayfs parses it in an option value (``\\``, ``,`` and ``:`` escaped)."""
    return os.fspath(path).replace("\\", "\\\\").replace(",", "\\,").replace(":", "\\:")


def mount_overlay(target: Path, lowers: Sequence[Path], upper: Path, work: Path) -> None:
    """Mount an overlay of ``lowers`` (top first) with ``upper`` at ``target``; record it as ours."""
    if not lowers:
        raise ValueError("an overlay needs at least one lower layer")
    fds: list[int] = []
    try:
        for p in lowers:
            fds.append(os.open(p, O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))
        opts = (f"lowerdir={':'.join(f'/proc/self/fd/{fd}' for fd in fds)},upperdir={_escape(upper)},"
                f"workdir={_escape(work)},{MOUNT_OPTIONS}").encode("utf-8", "surrogateescape")
        if len(opts) > _MAX_OPTIONS_BYTES:
            raise OverlayError(errno.E2BIG, f"overlay options for {target} are {len(opts)} bytes (the kernel "
                               f"takes {_MAX_OPTIONS_BYTES}): the upper path is too long")
        dest = os.fsencode(target)
        if _c().mount(b"overlay", dest, b"overlay", 0, opts) != 0:
            err = ctypes.get_errno()
            raise OverlayError(err, f"mounting an overlay at {target} failed: {os.strerror(err)}")
    finally:
        for fd in fds:
            os.close(fd)
    mount = _Mount(os.getpid(), _mount_id(target), _escape(upper))
    with _lock:
        _ours[os.fspath(target)] = mount
    _register_exit_hook()
    _tell_reaper(f"+{mount.mnt_id} {mount.upper.encode('utf-8', 'surrogateescape').hex()}\n".encode())


def _mount_id(path: Path) -> int:
    """The id of the mount whose root ``path`` now is (from ``/proc/self/fdinfo``)."""
    fd = os.open(path, O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        with open(f"/proc/self/fdinfo/{fd}") as f:
            for line in f:
                if line.startswith("mnt_id:"):
                    return int(line.split()[1])
    finally:
        os.close(fd)
    return -1


def unmount(target: Path) -> None:
    """Unmount ``target`` (detached lazily if it is busy); not mounted is not an error."""
    dest = os.fsencode(target)
    if _c().umount2(dest, 0) != 0:
        err = ctypes.get_errno()
        if err == errno.EBUSY:
            if _c().umount2(dest, _MNT_DETACH) != 0:
                err = ctypes.get_errno()
                raise OverlayError(err, f"unmounting {target} failed: {os.strerror(err)}")
        elif err not in (errno.EINVAL, errno.ENOENT):  # not a mountpoint (any more), or gone
            raise OverlayError(err, f"unmounting {target} failed: {os.strerror(err)}")
    with _lock:
        mount = _ours.pop(os.fspath(target), None)
    if mount is not None and mount.pid == os.getpid():
        _tell_reaper(f"-{mount.mnt_id}\n".encode())


def detach_under(root: Path) -> list[str]:
    """Unmount now every overlay at or beneath ``root``, whoever mounted it; return the mountpoints.

    Synchronous: when it returns, nothing is mounted there any more, so the
    directories can be removed. A busy mount (a process still has a file or
    its cwd in it) is detached lazily (``MNT_DETACH``): gone from the tree at
    once, freed by the kernel when its last user lets go. Deepest first. It
    also unmounts a *live* process's mounts: call it only for a directory
    this process owns (a store it is done with, or, at start, a data
    directory it holds the lock of) — e.g. the mounts a killed server or Ray
    worker left, before their reaper got to them.
    """
    base = os.fspath(root).rstrip("/")
    found = [m for m, fstype, _ in _mountinfo() if fstype == "overlay" and (m == base or m.startswith(base + "/"))]
    done: list[str] = []
    for path in sorted(set(found), key=len, reverse=True):
        unmount(Path(path))
        done.append(path)
    return done


def is_mountpoint(path: Path) -> bool:
    """Whether something is mounted at ``path`` (a missing path is not)."""
    try:
        return os.path.ismount(path)
    except OSError:
        return False


def mounted_here() -> list[str]:
    """Mountpoints this process mounted and has not unmounted yet (as mounted: see :func:`_unmount_ours`)."""
    with _lock:
        return sorted(p for p, m in _ours.items() if m.pid == os.getpid())


def _mountinfo() -> list[tuple[str, str, str]]:
    """``(mountpoint, fstype, raw super options)`` of every mount this process sees."""
    return [(m, t, o) for _, m, t, o in _mountinfo_ids()]


def _mountinfo_ids() -> list[tuple[int, str, str, str]]:
    """``(mount id, mountpoint, fstype, raw super options)`` of every mount this process sees."""
    out = []
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, rfields = left.split(), right.split()
            if len(fields) >= 5 and len(rfields) >= 3:
                out.append((int(fields[0]), _unescape_octal(fields[4]), rfields[0], rfields[2]))
    return out


def _upper_option(opts: str) -> str | None:
    for opt in opts.split(","):  # commas inside values are written as octal escapes
        if opt.startswith("upperdir="):
            return _unescape_octal(opt[len("upperdir="):])
    return None


def _unescape_octal(s: str) -> str:
    """The kernel writes some characters of mountinfo fields as octal escapes (``\\040``)."""
    if "\\" not in s:
        return s
    out, i = [], 0
    while i < len(s):
        if s[i] == "\\" and i + 4 <= len(s) and all(c in "01234567" for c in s[i + 1:i + 4]):
            out.append(chr(int(s[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


def _unescape_overlay(s: str) -> str:
    """Undo :func:`_escape` (overlayfs shows an option as it was given)."""
    out, i = [], 0
    while i < len(s):
        if s[i] == "\\" and i + 1 < len(s):
            i += 1
        out.append(s[i])
        i += 1
    return "".join(out)


def mounts_under(root: Path) -> list[str]:
    """Mountpoints at or beneath ``root`` (from ``/proc/self/mountinfo``)."""
    base = os.fspath(root).rstrip("/")
    return sorted(m for m, _, _ in _mountinfo() if m == base or m.startswith(base + "/"))


def upper_dir(mountpoint: Path) -> Path | None:
    """The upper directory of the overlay mounted at ``mountpoint``, or None if it is not one.

    For a disk cap that should count what commands wrote, not the lower layers.
    """
    want = os.fspath(mountpoint).rstrip("/")
    for m, fstype, opts in reversed(_mountinfo()):  # the last mount at a path is the visible one
        if m != want:
            continue
        upper = _upper_option(opts) if fstype == "overlay" else None
        return Path(_unescape_overlay(upper)) if upper is not None else None
    return None


def is_whiteout(st: os.stat_result) -> bool:
    """Whether an upper-layer entry is a whiteout (a character device 0/0)."""
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def is_opaque(fd: int) -> bool:
    """Whether the directory open at ``fd`` is an opaque overlay directory."""
    try:
        return os.getxattr(fd, OPAQUE_XATTR) == b"y"
    except OSError:
        return False


def overlay_unavailable(store_dir: Path) -> str | None:
    """None if overlays with their upper beneath ``store_dir`` work here, else why not.

    Probed once per file system (a tiny overlay is mounted, written and
    unmounted in a temporary directory under ``store_dir``).
    """
    try:
        dev = os.stat(store_dir).st_dev
    except OSError as exc:
        return f"cannot use {store_dir}: {exc.strerror}"
    with _lock:
        if dev in _probed:
            return _probed[dev]
    reason = _probe(store_dir)
    with _lock:
        _probed[dev] = reason
    return reason


def _probe(store_dir: Path) -> str | None:
    if not hasattr(os, "getxattr"):
        return "this platform has no overlayfs"
    tmp = Path(tempfile.mkdtemp(prefix=".overlay-probe-", dir=store_dir))
    try:
        for d in ("lower", "upper", "work", "merged"):
            (tmp / d).mkdir()
        (tmp / "lower" / "f").write_bytes(b"lower")
        try:
            mount_overlay(tmp / "merged", [tmp / "lower"], tmp / "upper", tmp / "work")
        except OverlayError as exc:
            hint = " (mounting needs root)" if exc.errno == errno.EPERM else ""
            return f"overlay mount failed: {os.strerror(exc.errno or errno.EIO)}{hint}"
        except (OSError, AttributeError) as exc:  # no mount(2) in this libc
            return f"overlay mount failed ({exc})"
        try:
            (tmp / "merged" / "f").write_bytes(b"upper")
            os.unlink(tmp / "merged" / "f")
            ok = (tmp / "lower" / "f").read_bytes() == b"lower" and is_whiteout(os.lstat(tmp / "upper" / "f"))
        finally:
            unmount(tmp / "merged")
        return None if ok else "overlay did not behave as expected (no whiteout in the upper layer)"
    except OSError as exc:
        return f"overlay probe failed: {exc}"
    finally:
        remove_path(tmp)


_REAPER = r"""
import ctypes, os, sys
if os.fork():  # the reaper is a grandchild: not among the descendants a supervisor kills with its parent
    os._exit(0)
left = {}
for line in sys.stdin.buffer:
    op, rest = line[:1], line[1:].split()
    if op == b"+":
        left[int(rest[0])] = bytes.fromhex(rest[1].decode()).decode("utf-8", "surrogateescape")
    else:
        left.pop(int(rest[0]), None)
if left:
    sys.path.insert(0, %r)
    from tools.overlay import detach_mounts
    detach_mounts(left)
"""
_reaper: tuple[int, int] | None = None  # (pid of the process it serves, write end of its pipe)


def detach_mounts(mounts: dict[int, str]) -> None:
    """Lazily unmount each overlay ``{mount id: upperdir option}`` that is still mounted, wherever it is now.

    A mount is matched by its id *and* its upper directory (an id may be
    reused once its mount is gone), and found at its current path (a parent
    directory may have been renamed since).
    """
    for mnt_id, path, fstype, opts in sorted(_mountinfo_ids(), key=lambda m: -len(m[1])):
        if fstype == "overlay" and mounts.get(mnt_id) == _upper_option(opts):
            _c().umount2(os.fsencode(path), _MNT_DETACH)


def _tell_reaper(line: bytes) -> None:
    """Tell this process's reaper (started on first use) about a mount (``+id upper``) or unmount (``-id``)."""
    global _reaper
    with _lock:
        if _reaper is None or _reaper[0] != os.getpid():
            _reaper = (os.getpid(), _start_reaper())
        fd = _reaper[1]
        if fd < 0:
            return
        try:
            os.write(fd, line)
        except OSError:  # the reaper is gone: atexit still unmounts
            os.close(fd)
            _reaper = (os.getpid(), -1)


def _start_reaper() -> int:
    read, write = os.pipe2(os.O_CLOEXEC)
    root = os.fspath(Path(__file__).resolve().parent.parent)
    try:
        launcher = subprocess.Popen([sys.executable, "-I", "-S", "-c", _REAPER % root], stdin=read,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                                    close_fds=True)
        threading.Thread(target=launcher.wait, daemon=True).start()  # it exits at once: no zombie
    except OSError:
        os.close(write)
        return -1
    finally:
        os.close(read)
    return write


_hooked = False


def _register_exit_hook() -> None:
    global _hooked
    with _lock:
        if _hooked:
            return
        _hooked = True
    atexit.register(_unmount_ours)


def _unmount_ours() -> None:
    """At exit: every mount this process made, found by id where it is now (see :func:`detach_mounts`)."""
    with _lock:
        mine = {m.mnt_id: m.upper for m in _ours.values() if m.pid == os.getpid()}
        _ours.clear()
    if mine:
        for mnt_id in mine:  # so the reaper, which runs next, does not act on a reused id
            _tell_reaper(f"-{mnt_id}\n".encode())
        detach_mounts(mine)
