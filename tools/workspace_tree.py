"""One workspace's tree: file access for tools, snapshots, restores and diffs.

:class:`Workspace` objects are made by :class:`tools.workspace.WorkspaceStore`,
which decides how the tree is laid out (:class:`Layout`: an overlay over
read-only layers, or a plain copy) and carries out ``fork`` and ``delete``.
Everything here works on the tree as commands see it, whatever its layout.

What snapshots, diffs and change summaries show follows ``.gitignore``
(:mod:`tools.gitignore`), with the workspace's starting snapshot as the
*kept* set (a path the workspace started with is shown, like a tracked file
in git): ignored files stay in the tree, usable by commands, but are never
hashed, stored, restored or listed.

File access for tools goes through :mod:`tools.paths`, so a model-supplied
path never leaves the tree. The store's own operations (snapshot, restore)
walk by directory fds and never follow symlinks.

A tree mounted over a host directory in place shows that directory's later
changes to paths the workspace has not written; its changes (``changed_paths``,
``diff``, ``revert``) list only paths the workspace wrote
(:mod:`tools.overlay_writes`), so a user's own edit is never taken for the
session's, while snapshots record the tree as it is.

Not guaranteed: changing a workspace's ``.gitignore`` changes what later
diffs show (a newly ignored file of the starting snapshot still shows,
since it is kept; a newly ignored added file does not); a workspace is not
safe against a concurrent writer (a running command) during ``restore`` or
``snapshot``; ``diff`` does not show empty-directory changes.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from tools.base import FileEdit
from tools.diffs import (
    MAX_DIFF_FILE_BYTES,
    MODE_EXEC,
    MODE_FILE,
    ChangeEntry,
    ChangeKind,
    large_file_diff,
    unified_diff,
)
from tools.gitignore import IgnoreRules, manifest_loader, tree_loader
from tools.gitsafe import GitNeutralised, neutralise_git
from tools.overlay_writes import WrittenMarks, written_marks
from tools.paths import (
    PathError,
    PathNotFoundError,
    PathTypeError,
    display_path,
    fs_path,
    normalize,
    open_beneath,
    read_bytes_beneath,
    resolve_beneath,
    stat_beneath,
    write_bytes_beneath,
)
from tools.snapshots import EntryKind, ManifestEntry, Snapshot, build_manifest, restore_paths, restore_tree
from tools.treewalk import TreeItem, TreeLimitError, short_path
from tools.workspace_layout import Layering, Layout, WorkspaceError

if TYPE_CHECKING:
    from tools.workspace import WorkspaceStore

__all__ = ["DirEntryInfo", "Layering", "Layout", "Workspace", "WorkspaceError"]


@dataclass(frozen=True, slots=True)
class DirEntryInfo:
    """One directory entry as tools show it. ``target`` is set for symlinks only."""

    name: str
    kind: str  # "file" | "dir" | "symlink" | "other"
    size: int = 0
    target: str | None = None


_Change = tuple[str, ChangeKind, ManifestEntry | None, ManifestEntry | None]


@dataclass(slots=True)
class _Changes:
    changes: list[_Change] = field(default_factory=list)
    too_deep: dict[str, str] = field(default_factory=dict)


class Workspace:
    """One isolated tree. Tools reach its files only through the methods below."""

    def __init__(self, ws_id: str, root: Path, store: WorkspaceStore, base: Snapshot | None,
                 layout: Layout | None = None) -> None:
        self.id = ws_id
        self.root = Path(os.path.realpath(root))
        self.store = store
        self._base = base
        self.layout = layout or Layout()

    @property
    def base(self) -> Snapshot:
        """The starting snapshot; ``diff()`` compares against it by default."""
        if self._base is None:
            raise WorkspaceError("workspace has no base snapshot yet")
        return self._base

    @property
    def layering(self) -> Layering:
        """How the tree is made: an overlay (copy-on-write), a reflink copy or a full copy."""
        return self.layout.layering

    def __repr__(self) -> str:
        return f"Workspace(id={self.id!r}, root={str(self.root)!r}, layering={str(self.layering)!r})"

    def __enter__(self) -> Workspace:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.delete()

    def delete(self) -> None:
        """Unmount and remove this workspace, at any depth (idempotent). Blobs and snapshots stay."""
        self.store.delete(self)

    close = delete

    # -- whole-tree operations
    def fork(self) -> Workspace:
        """An independent copy of the current state; it shares this workspace's base.

        Copy-on-write where the store mounts overlays: this workspace's changes
        so far are frozen into a layer the fork mounts (milliseconds when there
        are none); later writes to either side are not seen by the other.
        """
        return self.store.fork(self)

    def _kept(self, *more: Snapshot) -> set[str]:
        kept = set(self._base.manifest) if self._base is not None else set()
        for snap in more:
            kept.update(snap.manifest)
        return kept

    def ignore_rules(self, kept: Collection[str] | None = None) -> IgnoreRules:
        """What a walk of this tree shows: ``.gitignore`` with the base's paths kept."""
        return IgnoreRules(tree_loader(self.root), self._kept() if kept is None else kept)

    def snapshot(self) -> Snapshot:
        """Record the exact current state of what is shown; blobs go into the shared store (deduplicated).

        Ignored paths are left out (never read); the snapshot's ``origin`` says where they come from.
        """
        manifest = build_manifest(self.root, self.store.blobs, max_file_bytes=self.store.max_file_bytes,
                                  ignore=self.ignore_rules())
        snap = Snapshot.from_manifest(manifest, self.layout.origin)
        self.store.save_snapshot(snap)
        return snap

    def restore(self, snapshot: Snapshot) -> None:
        """Make what is shown exactly equal to ``snapshot`` (never following a link while deleting).

        Paths ignored by the snapshot's own ``.gitignore`` files are left as they are.
        """
        rules = IgnoreRules(manifest_loader(snapshot.manifest, self.store.blobs), self._kept(snapshot))
        restore_tree(self.root, snapshot, self.store.blobs, ignore=rules)

    def neutralise_git(self) -> GitNeutralised:
        """Disable hooks and program-running config in every git directory of the tree.

        Call before the host's git may touch this tree (a kept or exported
        workspace); see :mod:`tools.gitsafe` for what is changed and what is not guaranteed.
        """
        return neutralise_git(self.root)

    def changed_paths(self, base: Snapshot | None = None) -> list[ChangeEntry]:
        """Shown files and symlinks that differ from ``base`` (default: the starting snapshot).

        A directory too deep to walk is listed as modified (its content unknown).
        """
        found = self._changes(base)
        return [ChangeEntry(display_path(p), k) for p, k, _, _ in found.changes] + [
            ChangeEntry(display_path(p), ChangeKind.MODIFIED) for p in found.too_deep]

    def diff(self, base: Snapshot | None = None) -> str:
        """A git-style unified diff of what is shown versus ``base`` (default: the starting snapshot).

        Files over :data:`~tools.diffs.MAX_DIFF_FILE_BYTES` get a "large file,
        not shown" note; directories too deep to walk get a trailing note.
        """
        parts: list[str] = []
        found = self._changes(base)
        for path, _kind, old, new in found.changes:
            if old is not None and new is not None and old.kind is not new.kind:
                parts.append(self._file_diff(path, old, None))
                parts.append(self._file_diff(path, None, new))
            else:
                parts.append(self._file_diff(path, old, new))
        parts += [f"# not shown: {display_path(short_path(p))!r} {why}\n" for p, why in found.too_deep.items()]
        return "".join(parts)

    def revert(self, path: str) -> FileEdit:
        """Put one changed file or symlink back as it was in the starting snapshot: rewritten,
        re-linked, or removed if it was added (``path`` as :meth:`changed_paths` shows it).

        Returns a :class:`FileEdit` whose ``diff`` is what the revert changed (the session's diff
        of that path, reversed); ``created``: the revert re-created a file the session deleted,
        ``deleted``: it removed one the session added. Raises :class:`WorkspaceError` if ``path``
        is not a changed path. Directories the session created for an added file stay (empty).
        """
        for raw, _kind, old, new in self._changes(None).changes:
            if display_path(raw) != path:
                continue
            if old is not None and new is not None and old.kind is not new.kind:
                diff = self._file_diff(raw, None, new, reverse=True) + self._file_diff(raw, old, None, reverse=True)
            else:
                diff = self._file_diff(raw, old, new, reverse=True)
            try:
                restore_paths(self.root, self.base, self.store.blobs, [raw])
            except PathError as exc:
                raise WorkspaceError(f"cannot revert {path!r}: {exc}") from None
            return FileEdit(path=path, diff=diff, created=new is None, deleted=old is None)
        raise WorkspaceError(f"{path!r} is not changed in this workspace (nothing to revert)")

    def _file_diff(self, path: str, old: ManifestEntry | None, new: ManifestEntry | None, *,
                   reverse: bool = False) -> str:
        """The diff of ``path`` from ``old`` (in the base snapshot) to ``new`` (in the tree now);
        ``reverse``: from the tree now back to the base (what a revert changes)."""
        sides = [(old, self._old_bytes), (new, self._new_bytes)]
        (a, read_a), (b, read_b) = reversed(sides) if reverse else sides
        a_mode = a.git_mode if a else MODE_FILE
        b_mode = b.git_mode if b else MODE_FILE
        if any(e is not None and e.kind is EntryKind.FILE and (e.size > MAX_DIFF_FILE_BYTES or not e.hashed)
               for e in (a, b)):
            return large_file_diff(path, a.size if a else None, b.size if b else None,
                                   old_mode=a_mode, new_mode=b_mode)
        return unified_diff(path, read_a(path, a) if a else None, read_b(path, b) if b else None,
                            old_mode=a_mode, new_mode=b_mode)

    def _changes(self, base: Snapshot | None) -> _Changes:
        old_base = base or self.base
        old_m = old_base.manifest
        found = _Changes()

        def skip(item: TreeItem, exc: TreeLimitError) -> None:
            found.too_deep[item.path] = exc.reason

        new_m = build_manifest(self.root, None, max_file_bytes=self.store.max_file_bytes, on_limit=skip,
                               ignore=self.ignore_rules(self._kept(old_base)))
        written = self._written_marks()
        for path in sorted(set(old_m) | set(new_m)):
            old, new = old_m.get(path), new_m.get(path)
            old = old if old and old.kind is not EntryKind.DIR else None
            new = new if new and new.kind is not EntryKind.DIR else None
            if old == new:
                continue
            if written is not None and not written.covers(path):
                continue  # the source's own change, showing through: not the session's
            kind = ChangeKind.ADDED if old is None else ChangeKind.DELETED if new is None else ChangeKind.MODIFIED
            found.changes.append((path, kind, old, new))
        return found

    def _written_marks(self) -> WrittenMarks | None:
        """For a tree mounted over a host directory in place: the paths this workspace wrote
        (:mod:`tools.overlay_writes`); None for every other layout (everything is the workspace's)."""
        if self.layout.layering is not Layering.OVERLAY or self.layout.source is None:
            return None
        return written_marks([self.root.parent / "upper", *(self.store.layers.path(lid) for lid in self.layout.layers)])

    def _old_bytes(self, path: str, entry: ManifestEntry) -> bytes:
        if entry.kind is EntryKind.SYMLINK:
            return os.fsencode(entry.target or "")
        assert entry.sha256 is not None
        return self.store.blobs.get(entry.sha256, path)

    def _new_bytes(self, path: str, entry: ManifestEntry) -> bytes:
        if entry.kind is EntryKind.SYMLINK:
            return os.fsencode(entry.target or "")
        fd = open_beneath(self.root, path, os.O_RDONLY | os.O_NONBLOCK, no_symlinks=True)
        with os.fdopen(fd, "rb") as f:
            return f.read(MAX_DIFF_FILE_BYTES + 1)

    # -- file access for tools (model-supplied paths)
    # Each method maps ``\xHH`` escapes back to raw bytes (tools.paths.fs_path), so a
    # non-UTF-8 name shown by display_path can be passed back as shown.
    def resolve(self, rel: str) -> str:
        """Normalised relative path; raises PathError if invalid or if it leads outside."""
        norm = normalize(fs_path(self.root, rel))
        try:
            os.close(open_beneath(self.root, norm))
        except (PathNotFoundError, PathTypeError):
            pass
        return norm

    def real_path(self, rel: str) -> str:
        """Relative path of an existing ``rel`` after following in-workspace symlinks."""
        return resolve_beneath(self.root, fs_path(self.root, rel))

    def exists(self, rel: str) -> bool:
        """Whether ``rel`` exists (through in-workspace links); PathError if it leads outside."""
        try:
            os.close(open_beneath(self.root, fs_path(self.root, rel)))
            return True
        except (PathNotFoundError, PathTypeError):
            return False

    def is_dir(self, rel: str) -> bool:
        try:
            return stat.S_ISDIR(stat_beneath(self.root, fs_path(self.root, rel)).st_mode)
        except (PathNotFoundError, PathTypeError):
            return False

    def file_size(self, rel: str) -> int:
        """Size in bytes of the regular file ``rel`` (PathTypeError for anything else)."""
        st = stat_beneath(self.root, fs_path(self.root, rel))
        if not stat.S_ISREG(st.st_mode):
            kind = "a directory, not a file (use list_dir)" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            raise PathTypeError(f"{rel!r} is {kind}")
        return st.st_size

    def read_bytes(self, rel: str, *, limit: int | None = None) -> bytes:
        return read_bytes_beneath(self.root, fs_path(self.root, rel), limit=limit)

    def write_bytes(self, rel: str, data: bytes) -> FileEdit:
        """Create or atomically replace a file; the FileEdit names the file really written.

        The old content is read for the diff only up to
        :data:`~tools.diffs.MAX_DIFF_FILE_BYTES`; a larger old or new file gets a
        "large file, not shown" diff. ``FileEdit.path`` is in display form.
        """
        rel = fs_path(self.root, rel)
        old: bytes | None = None
        old_size: int | None = None
        old_mode = MODE_FILE
        try:
            st = stat_beneath(self.root, rel)
            if stat.S_ISREG(st.st_mode):
                old_size, old_mode = st.st_size, MODE_EXEC if st.st_mode & 0o100 else MODE_FILE
                if old_size <= MAX_DIFF_FILE_BYTES:
                    old = read_bytes_beneath(self.root, rel, limit=MAX_DIFF_FILE_BYTES + 1)
        except (PathNotFoundError, PathTypeError):
            pass
        outcome = write_bytes_beneath(self.root, rel, data)
        new_mode = old_mode if not outcome.created else MODE_FILE
        if outcome.created:
            old, old_size = None, None
        if len(data) > MAX_DIFF_FILE_BYTES or (old_size or 0) > MAX_DIFF_FILE_BYTES:
            diff = large_file_diff(outcome.path, old_size, len(data), old_mode=old_mode, new_mode=new_mode)
        else:
            diff = unified_diff(outcome.path, old, data, old_mode=old_mode, new_mode=new_mode)
        return FileEdit(path=display_path(outcome.path), diff=diff, created=outcome.created)

    def listdir(self, rel: str = ".") -> list[DirEntryInfo]:
        """Entries of a directory (following in-workspace links to it), sorted by name.

        Names and link targets are file-system strings (non-UTF-8 bytes as
        surrogate escapes); show them with :func:`tools.paths.display_path`.
        """
        fd = open_beneath(self.root, fs_path(self.root, rel), os.O_RDONLY | os.O_DIRECTORY)
        try:
            out = []
            with os.scandir(fd) as it:
                for e in it:
                    try:
                        st = e.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    if stat.S_ISLNK(st.st_mode):
                        out.append(DirEntryInfo(e.name, "symlink", 0, os.readlink(e.name, dir_fd=fd)))
                    elif stat.S_ISDIR(st.st_mode):
                        out.append(DirEntryInfo(e.name, "dir"))
                    elif stat.S_ISREG(st.st_mode):
                        out.append(DirEntryInfo(e.name, "file", st.st_size))
                    else:
                        out.append(DirEntryInfo(e.name, "other"))
            return sorted(out, key=lambda d: d.name)
        finally:
            os.close(fd)
