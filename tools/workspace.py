"""Isolated, stateful copies of a source tree: create, fork, snapshot, restore, diff.

A :class:`WorkspaceStore` is a directory::

    root/ws/<id>/tree          one workspace's files (what tools and commands see)
    root/ws/<id>/meta.json     its starting snapshot id
    root/blobs/ab/cdef...      file bytes, content-addressed, shared by every workspace
    root/snapshots/<id>.json   snapshot manifests (see tools.snapshots)

File access for tools goes through :mod:`tools.paths`, so a model-supplied
path never leaves the tree. The store's own operations (fork, snapshot,
restore) walk by directory fds and never follow symlinks.

Limits (each fails with a clear error or a note, never by exhausting memory):
a workspace is created only if it can be snapshotted exactly, so a file over
``max_file_bytes`` (default 1 GiB, apparent size) or a tree deeper than
:data:`~tools.treewalk.MAX_TREE_DEPTH` levels makes creation fail with a
:class:`WorkspaceError` naming the file. Later (after a model made such a
file or tree), ``diff`` shows files over
:data:`~tools.diffs.MAX_DIFF_FILE_BYTES` as "large file, not shown" (and does
not hash files over ``max_file_bytes``), notes directories too deep to walk,
``restore`` removes them, ``snapshot`` refuses them, and ``delete`` removes
trees of any depth. Changes under ``.git`` are shown like any others.
Before a workspace is handed to the host's git, call :meth:`Workspace.neutralise_git`
(see :mod:`tools.gitsafe`).

Not guaranteed: ``fork`` is ``cp -a --reflink=auto``, a real copy on
file systems without reflinks (ext4), so its cost grows with the tree;
snapshots do not capture special files, ownership, timestamps, xattrs or
hard links (see :mod:`tools.snapshots`); a workspace is not safe against a
concurrent writer (a running command) during ``restore`` or ``snapshot``;
``diff`` does not show empty-directory changes.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

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
from tools.gitsafe import GitNeutralised, host_env, host_git, neutralise_git
from tools.paths import (
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
from tools.snapshots import (
    MAX_SNAPSHOT_FILE_BYTES,
    BlobStore,
    EntryKind,
    ManifestEntry,
    Snapshot,
    SnapshotError,
    build_manifest,
    restore_tree,
)
from tools.treewalk import TreeItem, TreeLimitError, remove_path, scan_tree, short_path

__all__ = [
    "ChangeEntry", "ChangeKind", "DirEntryInfo", "Snapshot", "Workspace", "WorkspaceError",
    "WorkspaceStore", "unified_diff",
]

_ID_RE = re.compile(r"[0-9a-f]{16}")
_HEX64_RE = re.compile(r"[0-9a-f]{64}")


class WorkspaceError(Exception):
    """A workspace could not be created, found or changed (not the model's fault)."""


@dataclass(frozen=True, slots=True)
class DirEntryInfo:
    """One directory entry as tools show it. ``target`` is set for symlinks only."""

    name: str
    kind: str  # "file" | "dir" | "symlink" | "other"
    size: int = 0
    target: str | None = None


class WorkspaceStore:
    """Where workspaces, blobs and snapshot manifests live (one directory).

    ``max_file_bytes`` is the largest file a snapshot (so a workspace) may hold.
    """

    def __init__(self, root: Path, *, max_file_bytes: int = MAX_SNAPSHOT_FILE_BYTES) -> None:
        self.max_file_bytes = max_file_bytes
        self.root = Path(root)
        for sub in ("ws", "blobs", "snapshots"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self.root = self.root.resolve()
        self.blobs = BlobStore(self.root / "blobs")

    # -- creating workspaces
    def _new_dir(self) -> tuple[str, Path]:
        while True:
            ws_id = secrets.token_hex(8)
            try:
                (self.root / "ws" / ws_id).mkdir()
                return ws_id, self.root / "ws" / ws_id / "tree"
            except FileExistsError:
                continue

    def _finish(self, ws_id: str, tree: Path, base: Snapshot | None) -> Workspace:
        if base is None:
            try:
                base = Workspace(ws_id, tree, self, None).snapshot()
            except SnapshotError as exc:
                remove_path(tree.parent)
                raise WorkspaceError(f"cannot create the workspace: {exc}") from None
        (tree.parent / "meta.json").write_text(json.dumps({"base": base.id}))
        return Workspace(ws_id, tree, self, base)

    def from_dir(self, src: str | os.PathLike[str]) -> Workspace:
        """Copy a local directory (symlinks copied as links) into a new workspace."""
        if not os.path.isdir(src):
            raise WorkspaceError(f"not a directory: {src}")
        ws_id, tree = self._new_dir()
        _copy_tree(Path(src), tree)
        return self._finish(ws_id, tree, None)

    def from_git(self, repo: str | os.PathLike[str], commit: str) -> Workspace:
        """A new workspace holding ``git archive`` of ``commit`` (no ``.git``, no submodules)."""
        if not commit or commit.startswith("-"):
            raise WorkspaceError(f"invalid commit name {commit!r}")
        probe = host_git(repo, "rev-parse", "--git-dir")
        if probe.returncode != 0:
            raise WorkspaceError(f"not a git repository: {repo} ({probe.stderr.strip()})")
        rev = host_git(repo, "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}")
        if rev.returncode != 0:
            raise WorkspaceError(f"unknown commit {commit!r} in {repo}")
        sha = rev.stdout.strip()
        ws_id, tree = self._new_dir()
        tree.mkdir()
        with tempfile.TemporaryFile() as err, subprocess.Popen(
            ["git", "-C", os.fspath(repo), "-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false",
             "archive", "--format=tar", sha],
            stdout=subprocess.PIPE, stderr=err, env=host_env(), stdin=subprocess.DEVNULL,
        ) as archive:
            untar = subprocess.run(["tar", "-x", "-f", "-", "-C", os.fspath(tree)],
                                   stdin=archive.stdout, capture_output=True)
            if archive.stdout is not None:
                archive.stdout.close()
            ok = archive.wait() == 0 and untar.returncode == 0
            err.seek(0)
            message = (err.read() or untar.stderr).decode(errors="replace").strip()
        if not ok:
            remove_path(tree.parent)
            raise WorkspaceError(f"git archive {sha} failed: {message}")
        return self._finish(ws_id, tree, None)

    def from_snapshot(self, snapshot: Snapshot) -> Workspace:
        """A new workspace at exactly ``snapshot``'s state (its base is that snapshot)."""
        ws_id, tree = self._new_dir()
        tree.mkdir()
        ws = Workspace(ws_id, tree, self, snapshot)
        ws.restore(snapshot)
        return self._finish(ws_id, tree, snapshot)

    def open(self, ws_id: str) -> Workspace:
        """Reattach to an existing workspace by id."""
        meta = self.root / "ws" / ws_id / "meta.json" if _ID_RE.fullmatch(ws_id) else None
        if meta is None or not meta.exists():
            raise WorkspaceError(f"no workspace {ws_id!r} in {self.root}")
        base = self.load_snapshot(json.loads(meta.read_text())["base"])
        return Workspace(ws_id, meta.parent / "tree", self, base)

    # -- snapshots
    def save_snapshot(self, snapshot: Snapshot) -> None:
        dest = self.root / "snapshots" / f"{snapshot.id}.json"
        if not dest.exists():
            tmp = dest.with_name(f".tmp-{secrets.token_hex(8)}")
            tmp.write_bytes(snapshot.to_json())
            os.replace(tmp, dest)

    def load_snapshot(self, snapshot_id: str) -> Snapshot:
        if not _HEX64_RE.fullmatch(snapshot_id):
            raise SnapshotError(f"not a snapshot id: {snapshot_id!r}")
        try:
            raw = (self.root / "snapshots" / f"{snapshot_id}.json").read_bytes()
        except FileNotFoundError:
            raise SnapshotError(f"no snapshot {snapshot_id} in {self.root}") from None
        return Snapshot.from_json(raw, expected_id=snapshot_id)


class Workspace:
    """One isolated tree. Tools reach its files only through the methods below."""

    def __init__(self, ws_id: str, root: Path, store: WorkspaceStore, base: Snapshot | None) -> None:
        self.id = ws_id
        self.root = Path(os.path.realpath(root))
        self.store = store
        self._base = base

    @property
    def base(self) -> Snapshot:
        """The starting snapshot; ``diff()`` compares against it by default."""
        if self._base is None:
            raise WorkspaceError("workspace has no base snapshot yet")
        return self._base

    def __repr__(self) -> str:
        return f"Workspace(id={self.id!r}, root={str(self.root)!r})"

    def __enter__(self) -> Workspace:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.delete()

    def delete(self) -> None:
        """Remove this workspace's directory, at any depth (idempotent). Blobs and snapshots stay."""
        remove_path(self.root.parent)

    close = delete

    # -- whole-tree operations
    def fork(self) -> Workspace:
        """An independent copy of the current state; it shares this workspace's base."""
        ws_id, tree = self.store._new_dir()
        _copy_tree(self.root, tree)
        return self.store._finish(ws_id, tree, self._base)

    def snapshot(self) -> Snapshot:
        """Record the exact current state; blobs go into the shared store (deduplicated)."""
        snap = Snapshot.from_manifest(build_manifest(self.root, self.store.blobs,
                                                     max_file_bytes=self.store.max_file_bytes))
        self.store.save_snapshot(snap)
        return snap

    def restore(self, snapshot: Snapshot) -> None:
        """Make the tree exactly equal to ``snapshot`` (never following a link while deleting)."""
        restore_tree(self.root, snapshot, self.store.blobs)

    def neutralise_git(self) -> GitNeutralised:
        """Disable hooks and program-running config in every git directory of the tree.

        Call before the host's git may touch this tree (a kept or exported
        workspace); see :mod:`tools.gitsafe` for what is changed and what is not guaranteed.
        """
        return neutralise_git(self.root)

    def changed_paths(self, base: Snapshot | None = None) -> list[ChangeEntry]:
        """Files and symlinks that differ from ``base`` (default: the starting snapshot).

        A directory too deep to walk is listed as modified (its content unknown).
        """
        changes, too_deep = self._changes(base)
        return [ChangeEntry(display_path(p), k) for p, k, _, _ in changes] + [
            ChangeEntry(display_path(p), ChangeKind.MODIFIED) for p in too_deep]

    def diff(self, base: Snapshot | None = None) -> str:
        """A git-style unified diff of the tree versus ``base`` (default: the starting snapshot).

        Files over :data:`~tools.diffs.MAX_DIFF_FILE_BYTES` get a "large file,
        not shown" note; directories too deep to walk get a trailing note.
        """
        parts: list[str] = []
        changes, too_deep = self._changes(base)
        for path, _kind, old, new in changes:
            if old is not None and new is not None and old.kind is not new.kind:
                parts.append(self._file_diff(path, old, None))
                parts.append(self._file_diff(path, None, new))
            else:
                parts.append(self._file_diff(path, old, new))
        parts += [f"# not shown: {display_path(short_path(p))!r} {why}\n" for p, why in too_deep.items()]
        return "".join(parts)

    def _file_diff(self, path: str, old: ManifestEntry | None, new: ManifestEntry | None) -> str:
        old_mode = old.git_mode if old else MODE_FILE
        new_mode = new.git_mode if new else MODE_FILE
        if any(e is not None and e.kind is EntryKind.FILE and (e.size > MAX_DIFF_FILE_BYTES or not e.hashed)
               for e in (old, new)):
            return large_file_diff(path, old.size if old else None, new.size if new else None,
                                   old_mode=old_mode, new_mode=new_mode)
        return unified_diff(path, self._old_bytes(path, old) if old else None,
                            self._new_bytes(path, new) if new else None, old_mode=old_mode, new_mode=new_mode)

    def _changes(
        self, base: Snapshot | None
    ) -> tuple[list[tuple[str, ChangeKind, ManifestEntry | None, ManifestEntry | None]], dict[str, str]]:
        old_m = (base or self.base).manifest
        too_deep: dict[str, str] = {}

        def skip(item: TreeItem, exc: TreeLimitError) -> None:
            too_deep[item.path] = exc.reason

        new_m = build_manifest(self.root, None, max_file_bytes=self.store.max_file_bytes, on_limit=skip)
        out = []
        for path in sorted(set(old_m) | set(new_m)):
            old, new = old_m.get(path), new_m.get(path)
            old = old if old and old.kind is not EntryKind.DIR else None
            new = new if new and new.kind is not EntryKind.DIR else None
            if old == new:
                continue
            kind = ChangeKind.ADDED if old is None else ChangeKind.DELETED if new is None else ChangeKind.MODIFIED
            out.append((path, kind, old, new))
        return out, too_deep

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


def _copy_tree(src: Path, dst: Path) -> None:
    proc = subprocess.run(["cp", "-a", "--reflink=auto", "-T", "--", os.fspath(src), os.fspath(dst)],
                          capture_output=True, text=True, errors="replace")
    if proc.returncode != 0:
        remove_path(dst.parent)
        try:  # the likely reason cp fails on a readable tree: one too deep for full paths
            for _ in scan_tree(src):
                pass
        except TreeLimitError as exc:
            raise WorkspaceError(f"cannot copy {src}: {exc}; workspaces hold trees up to that depth") from None
        raise WorkspaceError(f"copying {src} failed: {short_path(proc.stderr.strip(), 1000)}")
