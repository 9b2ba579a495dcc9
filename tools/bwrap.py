"""The bubblewrap command line: what a sandboxed command can see, and where.

The sandbox's filesystem is an *allow-list* built on an empty root:

* :data:`DEFAULT_VISIBLE` (``/usr``, ``/bin``, ``/sbin``, ``/lib*``, ``/etc``)
  bound read-only at their own paths; a top-level symlink (``/bin -> usr/bin``
  on merged-/usr systems) is recreated as the same symlink. Nothing else of
  the host exists inside: no ``/root``, ``/home``, ``/var``, ``/srv``,
  ``/opt``, ``/mnt``, ``/run``, ``/work`` or host ``/tmp``, so no workspace
  store, data directory, session log or token file either.
* Inside ``/etc`` (and any ``hide`` path beneath a visible directory) every
  entry the host keeps from other users (a file without the ``o+r`` bit, a
  directory without ``o+rx``: ``shadow``, ``gshadow``, ``ssl/private``, SSH
  host keys, database configs) is covered by an empty, mode-000 file or
  directory, so opening it fails with "Permission denied".
* ``extra_ro`` host directories (a toolchain such as a Python with pytest) are
  bound read-only at their own paths, for operators who need them.
* The workspace is bound read-write at :data:`WORKSPACE_PATH` (``/workspace``)
  whatever its host path, and commands start there, so ``pwd``, tracebacks and
  ``git status`` are the same for every copy of a workspace.
* A fresh ``/dev``, a read-only ``/proc``, a private ``/tmp`` (tmpfs), the
  hostname ``flywheel``.

Not guaranteed:

* ``/proc/self/mountinfo`` (and tools that read it, e.g. ``findmnt``) shows
  the host path of every bind mount's source, the workspace's included: the
  path can be learnt, though nothing beneath it other than the workspace can
  be opened.
* Timestamps, inode numbers, free disk space and the contents of ``/etc`` and
  ``/usr`` are the host's, so they differ between hosts.
* ``/etc`` is scanned for unreadable entries once, when the sandbox is built:
  a secret added to ``/etc`` later is visible until the sandbox is rebuilt.
  Directories in ``extra_ro`` are not scanned at all.
* A workspace whose host path lies beneath a visible directory is also
  visible (read-only) at that path.
"""

from __future__ import annotations

import atexit
import os
import shutil
import stat
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

WORKSPACE_PATH = Path("/workspace")
HOSTNAME = "flywheel"
DEFAULT_VISIBLE: tuple[Path, ...] = tuple(
    Path(p) for p in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
)
"""Host paths a command can read (at the same path), unless the caller says otherwise."""
SCANNED: tuple[Path, ...] = (Path("/etc"),)
"""Visible directories searched for entries that are not world-readable."""

_cover_dir: Path | None = None


def _world_readable(st: os.stat_result) -> bool:
    if stat.S_ISDIR(st.st_mode):
        return st.st_mode & 0o005 == 0o005
    return bool(st.st_mode & 0o004)


def unreadable_entries(root: Path) -> list[Path]:
    """Entries beneath ``root`` that other users may not read (not following links).

    A directory that is itself unreadable is listed and not descended into.
    """
    found: list[Path] = []
    stack = [root]
    while stack:
        d = stack.pop()
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        for e in entries:
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISLNK(st.st_mode):
                continue
            if not _world_readable(st):
                found.append(Path(e.path))
            elif stat.S_ISDIR(st.st_mode):
                stack.append(Path(e.path))
    return sorted(found)


def _cover_sources() -> Path:
    """A private host directory holding an empty mode-000 ``file`` and ``dir``.

    They are bind sources that cover hidden paths: inside the sandbox (no
    capabilities) opening them fails. Made on first use, removed at exit,
    remade if something cleaned it away.
    """
    global _cover_dir
    if _cover_dir is None or not (_cover_dir / "file").exists() or not (_cover_dir / "dir").exists():
        d = Path(tempfile.mkdtemp(prefix="flywheel-cover-"))
        (d / "file").touch()
        (d / "dir").mkdir()
        os.chmod(d / "file", 0)
        os.chmod(d / "dir", 0)
        atexit.register(shutil.rmtree, d, True)
        _cover_dir = d
    return _cover_dir


def cover(host: Path, inside: Path) -> list[str]:
    """Flags that make ``inside`` an empty, unopenable stand-in for ``host``."""
    kind = "dir" if host.is_dir() and not host.is_symlink() else "file"
    return ["--ro-bind", str(_cover_sources() / kind), str(inside)]


def root_args(visible: Sequence[Path]) -> list[str]:
    """Flags that make each ``visible`` host path appear read-only at its own path."""
    args: list[str] = []
    for p in visible:
        if p.is_symlink():
            args += ["--symlink", os.readlink(p), str(p)]
        elif p.exists():
            args += ["--ro-bind", str(p), str(p)]
    return args


def isolation_args(bwrap: str, visible: Sequence[Path]) -> list[str]:
    """The flags every sandbox gets, before any workspace-specific mount."""
    # The private /tmp first: a visible path beneath /tmp (a toolchain in a checkout under
    # /tmp, say) is bound on top of it, not hidden by it.
    args = [bwrap, "--tmpfs", "/tmp", *root_args(visible), "--dev", "/dev", "--proc", "/proc"]
    args += ["--remount-ro", "/proc"]
    args += ["--unshare-all", "--hostname", HOSTNAME, "--die-with-parent", "--new-session"]
    if os.geteuid() == 0:  # as root, bwrap would keep every capability
        args += ["--cap-drop", "ALL"]
    return args


def _beneath(path: Path, roots: Sequence[Path]) -> bool:
    return any(path.is_relative_to(r) for r in roots)


def command_argv(
    *,
    bwrap: str,
    workspace: Path,
    visible: Sequence[Path],
    covered: Sequence[Path],
    env: Mapping[str, str],
    argv: Sequence[str],
) -> list[str]:
    """The full bwrap argv running ``argv`` in ``workspace`` (a real host path).

    ``covered``: host paths to hide. Those beneath a visible directory are
    covered at their own path; those beneath the workspace at their place
    under :data:`WORKSPACE_PATH`; the rest do not exist inside anyway.
    """
    if workspace == Path("/"):
        raise ValueError("refusing to make the whole filesystem writable (workspace is /)")
    real_visible = [Path(os.path.realpath(v)) for v in visible if v.exists()]
    args = isolation_args(bwrap, visible)
    inside_ws: list[Path] = []
    for h in covered:
        if h == workspace or not os.path.lexists(h):
            continue
        if h.is_relative_to(workspace):
            inside_ws.append(h)
        elif _beneath(h, real_visible):
            args += cover(h, h)
    args += ["--bind", str(workspace), str(WORKSPACE_PATH)]
    for h in inside_ws:
        args += cover(h, WORKSPACE_PATH / h.relative_to(workspace))
    args += ["--chdir", str(WORKSPACE_PATH), "--clearenv"]
    for key, value in env.items():
        args += ["--setenv", key, value]
    return [*args, "--", *argv]
