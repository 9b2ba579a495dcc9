"""A session's changes, brought back to the user's project: a change set, a patch, a safe apply.

A :class:`ChangeSet` is what a session changed in its workspace relative to
its starting snapshot: per file or symlink, the state at the start (``old``)
and now (``new``), with contents. It is built from a local workspace
(:meth:`ChangeSet.from_workspace`, through the workspace's public API: its
base snapshot, ``changed_paths`` and the blob store), or from the JSON the
server sends (:meth:`ChangeSet.from_json`, see ``backend/api/routes/changes.py``).

* :meth:`ChangeSet.patch` is a git patch that ``git apply`` accepts: full
  ``index`` lines, ``GIT binary patch`` literals for binary and large files,
  symlinks as mode 120000, names quoted the way git quotes them.
* :func:`apply_changes` writes the changes into the original directory, and
  refuses -- changing nothing -- if any path it would touch is not what the
  session started from (edited, created or deleted there since). A path that
  already holds the session's new state is left alone (applying twice is a
  no-op). Created files get their parent directories; files and symlinks are
  replaced atomically (a temporary name, then ``rename``); a deleted file's
  directories that the session removed are removed when empty.

Never applied (listed in :attr:`ChangeSet.skipped`): anything inside a
``.git`` directory -- a hook or config planted there would run on the host.

Not guaranteed: the check and the writes are not one atomic step (a file
edited in the tiny window between them is overwritten); an apply that fails
half-way (disk full, permissions) leaves the files written so far; the
owner, timestamps, xattrs and permission bits other than "executable" of the
session's files are not carried over (an existing file keeps its own bits,
with the executable bits set or cleared); empty directories the session
created are not created; a change set holds contents in memory, so at most
:data:`MAX_CHANGE_BYTES`.
"""

from __future__ import annotations

import base64
import difflib
import errno
import hashlib
import os
import secrets
import stat
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from tools.diffs import MAX_DIFF_FILE_BYTES, MODE_EXEC, MODE_FILE, MODE_LINK, is_binary, split_lines
from tools.paths import display_path, unescape_path
from tools.snapshots import EntryKind, ManifestEntry, Snapshot, SnapshotError

if TYPE_CHECKING:
    from tools.workspace import Workspace

MAX_CHANGE_BYTES = 256 << 20
"""Largest total content (old and new sides) a change set holds."""
_NULL_SHA1 = "0" * 40
_O_PATH: int = getattr(os, "O_PATH", 0o10000000)


class ApplyError(Exception):
    """The changes cannot be collected or applied; the message is one line for the user."""


class ApplyConflict(ApplyError):
    """Files the apply would touch changed in the original directory; nothing was written."""

    def __init__(self, target: Path, conflicts: list[tuple[str, str]]):
        self.target = target
        self.conflicts = conflicts  # (display path, why)
        shown = "; ".join(f"{p}: {why}" for p, why in conflicts[:5])
        more = f"; and {len(conflicts) - 5} more" if len(conflicts) > 5 else ""
        super().__init__(f"not applied: {len(conflicts)} file(s) changed in {target} since the session started "
                         f"({shown}{more}); nothing was written")


@dataclass(frozen=True, slots=True)
class FileState:
    """A regular file (its bytes) or a symlink (its target's bytes) at one point in time."""

    kind: Literal["file", "symlink"]
    data: bytes
    executable: bool = False

    @property
    def mode(self) -> int:
        if self.kind == "symlink":
            return MODE_LINK
        return MODE_EXEC if self.executable else MODE_FILE

    @property
    def git_sha1(self) -> str:
        """The id git gives this content as a blob (what ``index`` lines name)."""
        return hashlib.sha1(b"blob %d\0" % len(self.data) + self.data).hexdigest()

    def same_as(self, other: FileState | None) -> bool:
        return other is not None and (self.kind, self.data, self.executable) == (
            other.kind, other.data, other.executable)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "executable": self.executable, "data_b64": base64.b64encode(self.data).decode()}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> FileState:
        kind = obj.get("kind")
        if kind not in ("file", "symlink"):
            raise ApplyError(f"the server sent a change of unknown kind {kind!r}")
        return cls(kind, base64.b64decode(str(obj.get("data_b64", "")), validate=True), bool(obj.get("executable")))


@dataclass(frozen=True, slots=True)
class FileChange:
    """One path (a file-system string: non-UTF-8 bytes as surrogate escapes) and its two states."""

    path: str
    old: FileState | None
    new: FileState | None

    @property
    def kind(self) -> Literal["added", "modified", "deleted"]:
        return "added" if self.old is None else "deleted" if self.new is None else "modified"


@dataclass(frozen=True)
class ChangeSet:
    """What a session changed, path by path (sorted), plus what it will not apply."""

    changes: tuple[FileChange, ...] = ()
    removed_dirs: tuple[str, ...] = ()  # directories the session removed (deepest first)
    skipped: tuple[str, ...] = ()  # display paths never applied (inside .git)

    def __bool__(self) -> bool:
        return bool(self.changes)

    # -- building --------------------------------------------------------------

    @classmethod
    def from_workspace(cls, workspace: Workspace, base: Snapshot | None = None, *,
                       max_bytes: int = MAX_CHANGE_BYTES) -> ChangeSet:
        """The workspace's changes against ``base`` (default: its starting snapshot).

        Which paths count as changed is the workspace's ``changed_paths`` (so
        whatever it leaves out, this leaves out). Raises :class:`ApplyError`
        for a tree too deep to compare, content over ``max_bytes`` or a
        missing blob.
        """
        base = base or workspace.base
        manifest = base.manifest
        root = str(workspace.root)
        changes: list[FileChange] = []
        skipped: list[str] = []
        removed: set[str] = set()
        total = 0
        for entry in workspace.changed_paths(base):
            path = _fs_name(entry.path, manifest, root)
            if _in_git_dir(path):
                skipped.append(display_path(path))
                continue
            old_entry = manifest.get(path)
            old = None if old_entry is None or old_entry.kind is EntryKind.DIR else _from_manifest(
                old_entry, workspace, path)
            new = _read_state(root, path)
            if new == "dir":
                if old is None:
                    raise ApplyError(f"cannot collect the changes: {display_path(path)!r} is a directory too deep "
                                     "to compare")
                new = None
            if old is None and new is None:
                continue
            total += sum(len(s.data) for s in (old, new) if isinstance(s, FileState))
            if total > max_bytes:
                raise ApplyError(f"the session's changes hold more than {max_bytes >> 20} MiB; "
                                 "copy them from the workspace by hand")
            change = FileChange(path, old, new if isinstance(new, FileState) else None)
            changes.append(change)
            if change.new is None:  # the directories it leaves that the session removed (or made a file)
                parts = path.split("/")
                for i in range(len(parts) - 1, 0, -1):
                    d = "/".join(parts[:i])
                    dentry = manifest.get(d)
                    if dentry is None or dentry.kind is not EntryKind.DIR or _read_state(root, d) == "dir":
                        break
                    removed.add(d)
        return cls(tuple(sorted(changes, key=lambda c: c.path)),
                   tuple(sorted(removed, key=lambda d: (-d.count("/"), d))), tuple(skipped))

    def to_json(self) -> dict[str, Any]:
        """A JSON value (paths in display form and, exactly, as base64 of their bytes)."""
        return {
            "changes": [{"path": display_path(c.path), "path_b64": _b64path(c.path), "kind": c.kind,
                         "old": c.old.to_json() if c.old else None, "new": c.new.to_json() if c.new else None}
                        for c in self.changes],
            "removed_dirs": [{"path": display_path(d), "path_b64": _b64path(d)} for d in self.removed_dirs],
            "skipped": list(self.skipped),
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> ChangeSet:
        """The inverse of :meth:`to_json`; raises :class:`ApplyError` on a malformed value."""
        try:
            changes = []
            for c in obj.get("changes", []):
                path = _checked_path(_unb64path(c))
                old = FileState.from_json(c["old"]) if c.get("old") else None
                new = FileState.from_json(c["new"]) if c.get("new") else None
                if old is None and new is None:
                    raise ApplyError(f"the server sent an empty change for {display_path(path)!r}")
                changes.append(FileChange(path, old, new))
            dirs = tuple(_checked_path(_unb64path(d)) for d in obj.get("removed_dirs", []))
            skipped = tuple(str(s) for s in obj.get("skipped", []))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            if isinstance(exc, ApplyError):
                raise
            raise ApplyError(f"the server sent a malformed change set ({type(exc).__name__}: {exc})") from None
        return cls(tuple(sorted(changes, key=lambda c: c.path)), dirs, skipped)

    # -- showing ---------------------------------------------------------------

    def summary(self) -> str:
        """``3 file(s): 1 added, 2 modified`` (and what is skipped)."""
        counts = {k: sum(c.kind == k for c in self.changes) for k in ("added", "modified", "deleted")}
        parts = [f"{n} {k}" for k, n in counts.items() if n]
        text = f"{len(self.changes)} file(s)" + (f": {', '.join(parts)}" if parts else "")
        if self.skipped:
            text += f"; {len(self.skipped)} change(s) inside .git are never applied"
        return text

    def patch(self) -> str:
        """A git patch of every change (``git apply`` accepts it in the original directory)."""
        out: list[str] = []
        for c in self.changes:
            if c.old is not None and c.new is not None and c.old.kind != c.new.kind:
                out.append(_file_patch(c.path, c.old, None))  # git shows a type change as delete + create
                out.append(_file_patch(c.path, None, c.new))
            else:
                out.append(_file_patch(c.path, c.old, c.new))
        return "".join(out)


# -- applying -----------------------------------------------------------------------


@dataclass(frozen=True)
class ApplyResult:
    target: Path
    written: tuple[str, ...] = ()
    deleted: tuple[str, ...] = ()
    unchanged: tuple[str, ...] = ()  # already held the session's state
    warnings: tuple[str, ...] = field(default=())

    def summary(self) -> str:
        if not self.written and not self.deleted:
            return f"nothing to apply: {self.target} already has the session's changes"
        text = f"applied to {self.target}: {len(self.written)} file(s) written, {len(self.deleted)} deleted"
        if self.unchanged:
            text += f" ({len(self.unchanged)} already up to date)"
        return text


def apply_changes(changes: ChangeSet, target: str | os.PathLike[str], *,
                  expected: Mapping[str, FileState | None] | None = None) -> ApplyResult:
    """Write ``changes`` into the directory ``target``, or raise :class:`ApplyConflict`.

    Every path is checked first against its ``old`` state (or, for a path in
    ``expected``, against that state: what an earlier apply of the same
    session wrote); if any differs, nothing is written. Paths never follow a
    symlink in ``target`` (one in the way is a conflict).
    """
    root = Path(target)
    if not root.is_dir():
        raise ApplyError(f"cannot apply: {root} is not a directory (the session's original directory is gone?)")
    expected = expected or {}
    deleting = {c.path for c in changes.changes if c.old is not None and (c.new is None or c.new.kind != c.old.kind)}
    removed_dirs = set(changes.removed_dirs)
    made_dirs = {c.path.rsplit("/", i)[0] for c in changes.changes if c.new is not None
                 for i in range(1, c.path.count("/") + 1)}
    conflicts: list[tuple[str, str]] = []
    todo: list[FileChange] = []
    unchanged: list[str] = []
    with _Tree(root) as tree:
        for c in changes.changes:
            want = expected[c.path] if c.path in expected else c.old
            now = tree.state(c.path)
            if isinstance(now, _Blocked):
                if now.by in deleting and want is None:
                    now = None  # a file the session replaced by a directory: it goes first
                else:
                    conflicts.append((display_path(c.path), f"{display_path(now.by)!r} is in the way "
                                      "(a file or symlink where the session has a directory)"))
                    continue
            if isinstance(now, _Other):
                if now.what == "a directory" and c.path in removed_dirs and want is None:
                    now = None  # a directory the session replaced by a file: emptied and removed first
                elif now.what == "a directory" and c.new is None and c.path in made_dirs:
                    unchanged.append(c.path)  # a file the session replaced by a directory, applied before
                    continue
                else:
                    conflicts.append((display_path(c.path), f"it is {now.what} there now"))
                    continue
            if c.new is not None and c.new.same_as(now) or c.new is None and now is None:
                unchanged.append(c.path)
                continue
            if want is None and now is not None:
                conflicts.append((display_path(c.path), "created there since the session started"))
            elif want is not None and now is None:
                conflicts.append((display_path(c.path), "deleted there since the session started"))
            elif want is not None and not want.same_as(now):
                conflicts.append((display_path(c.path), "edited there since the session started"))
            else:
                todo.append(c)
        if conflicts:
            raise ApplyConflict(root, conflicts)
        deleted, written, warnings = [], [], []
        try:
            for c in sorted((c for c in todo if c.path in deleting), key=lambda c: c.path, reverse=True):
                tree.remove(c.path)
                if c.new is None:
                    deleted.append(c.path)
            for d in changes.removed_dirs:
                tree.rmdir_if_empty(d)
            for c in todo:
                if c.new is None:
                    continue
                tree.write(c.path, c.new)
                written.append(c.path)
                if c.new.kind == "symlink" and _leaves_tree(c.path, os.fsdecode(c.new.data)):
                    warnings.append(f"{display_path(c.path)} is a symlink to {display_path(os.fsdecode(c.new.data))!r}, "
                                    "outside the project")
        except OSError as exc:
            done = f"{len(written)} written and {len(deleted)} deleted before it failed"
            raise ApplyError(f"applying to {root} failed: {exc.strerror or exc} ({done})") from None
    return ApplyResult(root, tuple(map(display_path, written)), tuple(map(display_path, deleted)),
                       tuple(map(display_path, unchanged)), tuple(warnings))


@dataclass(frozen=True, slots=True)
class _Blocked:
    by: str  # the prefix that is not a directory


@dataclass(frozen=True, slots=True)
class _Other:
    what: str  # "a directory" | "a special file"


class _Tree:
    """The original directory, walked component by component with ``O_NOFOLLOW``."""

    def __init__(self, root: Path):
        self.root_fd = os.open(root, _O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)

    def __enter__(self) -> _Tree:
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.root_fd)

    def _parent(self, path: str, *, create: bool = False) -> int | _Blocked | None:
        """An ``O_PATH`` fd of ``path``'s parent (caller closes it), a :class:`_Blocked`, or None if missing."""
        parts = path.split("/")
        fd = os.dup(self.root_fd)
        for i, part in enumerate(parts[:-1]):
            try:
                nfd = os.open(part, _O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    os.close(fd)
                    return None
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
                nfd = os.open(part, _O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError as exc:
                os.close(fd)
                if exc.errno in (errno.ENOTDIR, errno.ELOOP):
                    return _Blocked("/".join(parts[: i + 1]))
                raise
            os.close(fd)
            fd = nfd
        return fd

    def state(self, path: str) -> FileState | _Blocked | _Other | None:
        parent = self._parent(path)
        if not isinstance(parent, int):
            return parent
        try:
            return _state_at(parent, path.rsplit("/", 1)[-1], path)
        finally:
            os.close(parent)

    def remove(self, path: str) -> None:
        parent = self._parent(path)
        if not isinstance(parent, int):
            return
        try:
            os.unlink(path.rsplit("/", 1)[-1], dir_fd=parent)
        except FileNotFoundError:
            pass
        finally:
            os.close(parent)

    def rmdir_if_empty(self, path: str) -> None:
        parent = self._parent(path)
        if not isinstance(parent, int):
            return
        try:
            os.rmdir(path.rsplit("/", 1)[-1], dir_fd=parent)
        except OSError:
            pass  # not empty (files the session never saw), or gone already
        finally:
            os.close(parent)

    def write(self, path: str, new: FileState) -> None:
        parent = self._parent(path, create=True)
        if not isinstance(parent, int):
            raise OSError(errno.ENOTDIR, f"{display_path(path)}: a parent is not a directory")
        name = path.rsplit("/", 1)[-1]
        tmp = f".flywheel-apply-{secrets.token_hex(6)}"
        try:
            if new.kind == "symlink":
                os.symlink(new.data, tmp, dir_fd=parent)
            else:
                try:
                    st = os.stat(name, dir_fd=parent, follow_symlinks=False)
                    mode = stat.S_IMODE(st.st_mode) if stat.S_ISREG(st.st_mode) else 0o644
                except FileNotFoundError:
                    mode = 0o644
                mode = mode | ((mode & 0o444) >> 2) if new.executable else mode & ~0o111
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                             dir_fd=parent)  # an O_PATH directory fd is a valid dir_fd for openat(2)
                try:
                    view = memoryview(new.data)
                    while view:
                        view = view[os.write(fd, view):]
                    os.fchmod(fd, mode)
                    os.fsync(fd)
                finally:
                    os.close(fd)
            os.replace(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=parent)
            except OSError:
                pass
            raise
        finally:
            os.close(parent)


def _state_at(dir_fd: int, name: str, path: str) -> FileState | _Other | None:
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return FileState("symlink", os.fsencode(os.readlink(name, dir_fd=dir_fd)))
    if stat.S_ISREG(st.st_mode):
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
        with os.fdopen(fd, "rb") as f:
            return FileState("file", f.read(), bool(st.st_mode & 0o100))
    return _Other("a directory" if stat.S_ISDIR(st.st_mode) else "a special file")


def _read_state(root: str, path: str) -> FileState | Literal["dir"] | None:
    """``path`` in a workspace tree (its parents are real directories: scans never follow links)."""
    with _Tree(Path(root)) as tree:
        parent = tree._parent(path)
        if not isinstance(parent, int):
            return None
        try:
            name = path.rsplit("/", 1)[-1]
            try:
                if stat.S_ISDIR(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode):
                    return "dir"
            except FileNotFoundError:
                return None
            return _state_at(parent, name, path)
        finally:
            os.close(parent)


def _from_manifest(entry: ManifestEntry, workspace: Workspace, path: str) -> FileState:
    if entry.kind is EntryKind.SYMLINK:
        return FileState("symlink", os.fsencode(entry.target or ""))
    if entry.sha256 is None:
        raise ApplyError(f"cannot collect the changes: the starting content of {display_path(path)!r} was not recorded")
    try:
        data = workspace.store.blobs.get(entry.sha256, path)
    except SnapshotError as exc:
        raise ApplyError(f"cannot collect the changes: {exc}") from None
    return FileState("file", data, entry.executable)


def _fs_name(shown: str, manifest: Mapping[str, ManifestEntry], root: str) -> str:
    """The file-system name behind a display path (``\\xHH`` escapes, unless the literal name exists)."""
    raw = unescape_path(shown)
    if raw == shown or shown in manifest or os.path.lexists(os.path.join(root, shown)):
        return shown
    return raw


def _in_git_dir(path: str) -> bool:
    return ".git" in path.split("/")


def _leaves_tree(path: str, target: str) -> bool:
    if target.startswith("/"):
        return True
    depth = 0
    for part in (path.split("/")[:-1] + target.split("/")):
        depth = depth - 1 if part == ".." else depth if part in ("", ".") else depth + 1
        if depth < 0:
            return True
    return False


def _b64path(path: str) -> str:
    return base64.b64encode(os.fsencode(path)).decode()


def _unb64path(obj: Mapping[str, Any]) -> str:
    if "path_b64" in obj:
        return os.fsdecode(base64.b64decode(str(obj["path_b64"]), validate=True))
    return unescape_path(str(obj["path"]))


def _checked_path(path: str) -> str:
    """Refuse a path from the wire that is not a plain relative path (no ``..``, no absolute, no ``.git``)."""
    parts = path.split("/")
    if not path or path.startswith("/") or "\0" in path or any(p in ("", ".", "..") for p in parts):
        raise ApplyError(f"the server sent an unsafe path {display_path(path)!r}")
    if _in_git_dir(path):
        raise ApplyError(f"the server sent a change inside .git ({display_path(path)!r}); it is never applied")
    return path


# -- the git patch ------------------------------------------------------------------

_GIT_ESCAPES = {0x07: "\\a", 0x08: "\\b", 0x09: "\\t", 0x0A: "\\n", 0x0B: "\\v", 0x0C: "\\f", 0x0D: "\\r",
                0x22: '\\"', 0x5C: "\\\\"}


def git_quote(name: str) -> str:
    """``name`` as git writes it in a patch: verbatim, or C-quoted with octal escapes when it has
    a control character, a quote, a backslash or a non-ASCII byte (git's ``core.quotePath``)."""
    raw = os.fsencode(name)
    if all(0x20 <= b < 0x7F and b not in (0x22, 0x5C) for b in raw):
        return name
    return '"' + "".join(_GIT_ESCAPES.get(b) or (chr(b) if 0x20 <= b < 0x7F else f"\\{b:03o}") for b in raw) + '"'


def _file_patch(path: str, old: FileState | None, new: FileState | None) -> str:
    a, b = git_quote("a/" + path), git_quote("b/" + path)
    out = [f"diff --git {a} {b}\n"]
    if old is None:
        assert new is not None
        out.append(f"new file mode {new.mode:o}\n")
    elif new is None:
        out.append(f"deleted file mode {old.mode:o}\n")
    elif old.mode != new.mode:
        out.append(f"old mode {old.mode:o}\nnew mode {new.mode:o}\n")
    if old is not None and new is not None and old.data == new.data:
        return "".join(out)  # a mode change only
    same_mode = f" {old.mode:o}" if old is not None and new is not None and old.mode == new.mode else ""
    out.append(f"index {old.git_sha1 if old else _NULL_SHA1}..{new.git_sha1 if new else _NULL_SHA1}{same_mode}\n")
    if any(s is not None and (len(s.data) > MAX_DIFF_FILE_BYTES or is_binary(s.data)) for s in (old, new)):
        out.append("GIT binary patch\n")
        out.append(_literal(new.data if new else b""))
        out.append(_literal(old.data if old else b""))
        return "".join(out)
    old_lines = split_lines(old.data.decode()) if old else []
    new_lines = split_lines(new.data.decode()) if new else []
    body = list(difflib.unified_diff(old_lines, new_lines, n=3, lineterm="\n"))[2:]
    if not body:
        return "".join(out)
    out.append(f"--- {a if old else '/dev/null'}\n+++ {b if new else '/dev/null'}\n")
    for line in body:
        out.append(line)
        if not line.endswith("\n"):
            out.append("\n\\ No newline at end of file\n")
    return "".join(out)


def _literal(data: bytes) -> str:
    """One ``literal`` hunk of a git binary patch: zlib, then git's base85 in lines of 52 bytes."""
    packed = zlib.compress(data, 9)
    lines = [f"literal {len(data)}\n"]
    for i in range(0, len(packed), 52):
        chunk = packed[i:i + 52]
        n = len(chunk)
        lines.append((chr(ord("A") + n - 1) if n <= 26 else chr(ord("a") + n - 27))
                     + base64.b85encode(chunk, pad=True).decode() + "\n")
    lines.append("\n")
    return "".join(lines)


def paths_of(changes: Iterable[FileChange]) -> list[str]:
    """Display paths, for messages."""
    return [display_path(c.path) for c in changes]
