"""Isolated, stateful copies of a source tree: create, fork, snapshot, restore, diff.

A :class:`WorkspaceStore` is a directory::

    root/ws/<id>/tree          one workspace's files (what tools and commands see)
    root/ws/<id>/meta.json     its starting snapshot id
    root/blobs/ab/cdef...      file bytes, content-addressed, shared by every workspace
    root/snapshots/<id>.json   snapshot manifests (see tools.snapshots)

File access for tools goes through :mod:`tools.paths`, so a model-supplied
path never leaves the tree. The store's own operations (fork, snapshot,
restore) walk by directory fds and never follow symlinks.

Not guaranteed: ``fork`` is ``cp -a --reflink=auto``, a real copy on
file systems without reflinks (ext4), so its cost grows with the tree;
snapshots do not capture special files, ownership, timestamps, xattrs or
hard links (see :mod:`tools.snapshots`); a workspace is not safe against a
concurrent writer (a running command) during ``restore`` or ``snapshot``;
``diff`` skips everything under a ``.git`` directory and empty-directory changes.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from tools.base import FileEdit
from tools.diffs import MODE_EXEC, MODE_FILE, ChangeEntry, ChangeKind, unified_diff
from tools.paths import (
    PathNotFoundError,
    PathTypeError,
    normalize,
    open_beneath,
    read_bytes_beneath,
    resolve_beneath,
    stat_beneath,
    write_bytes_beneath,
)
from tools.snapshots import (
    BlobStore,
    EntryKind,
    ManifestEntry,
    Snapshot,
    SnapshotError,
    build_manifest,
    restore_tree,
)

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
    """Where workspaces, blobs and snapshot manifests live (one directory)."""

    def __init__(self, root: Path) -> None:
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
            base = Workspace(ws_id, tree, self, None).snapshot()
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
        probe = _git(repo, "rev-parse", "--git-dir")
        if probe.returncode != 0:
            raise WorkspaceError(f"not a git repository: {repo} ({probe.stderr.strip()})")
        rev = _git(repo, "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}")
        if rev.returncode != 0:
            raise WorkspaceError(f"unknown commit {commit!r} in {repo}")
        sha = rev.stdout.strip()
        ws_id, tree = self._new_dir()
        tree.mkdir()
        with tempfile.TemporaryFile() as err, subprocess.Popen(
            ["git", "-C", os.fspath(repo), "archive", "--format=tar", sha],
            stdout=subprocess.PIPE, stderr=err,
        ) as archive:
            untar = subprocess.run(["tar", "-x", "-f", "-", "-C", os.fspath(tree)],
                                   stdin=archive.stdout, capture_output=True)
            if archive.stdout is not None:
                archive.stdout.close()
            ok = archive.wait() == 0 and untar.returncode == 0
            err.seek(0)
            message = (err.read() or untar.stderr).decode(errors="replace").strip()
        if not ok:
            shutil.rmtree(tree.parent, ignore_errors=True)
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
        """Remove this workspace's directory (idempotent). Blobs and snapshots stay."""
        shutil.rmtree(self.root.parent, ignore_errors=True)

    close = delete

    # -- whole-tree operations
    def fork(self) -> Workspace:
        """An independent copy of the current state; it shares this workspace's base."""
        ws_id, tree = self.store._new_dir()
        _copy_tree(self.root, tree)
        return self.store._finish(ws_id, tree, self._base)

    def snapshot(self) -> Snapshot:
        """Record the exact current state; blobs go into the shared store (deduplicated)."""
        snap = Snapshot.from_manifest(build_manifest(self.root, self.store.blobs))
        self.store.save_snapshot(snap)
        return snap

    def restore(self, snapshot: Snapshot) -> None:
        """Make the tree exactly equal to ``snapshot`` (never following a link while deleting)."""
        restore_tree(self.root, snapshot, self.store.blobs)

    def changed_paths(self, base: Snapshot | None = None) -> list[ChangeEntry]:
        """Files and symlinks that differ from ``base`` (default: the starting snapshot)."""
        return [ChangeEntry(p, k) for p, k, _, _ in self._changes(base)]

    def diff(self, base: Snapshot | None = None) -> str:
        """A git-style unified diff of the tree versus ``base`` (default: the starting snapshot)."""
        parts: list[str] = []
        for path, _kind, old, new in self._changes(base):
            if old is not None and new is not None and old.kind is not new.kind:
                parts.append(unified_diff(path, self._old_bytes(old), None, old_mode=old.git_mode))
                parts.append(unified_diff(path, None, self._new_bytes(path, new), new_mode=new.git_mode))
                continue
            parts.append(unified_diff(
                path,
                self._old_bytes(old) if old else None,
                self._new_bytes(path, new) if new else None,
                old_mode=old.git_mode if old else MODE_FILE,
                new_mode=new.git_mode if new else MODE_FILE,
            ))
        return "".join(parts)

    def _changes(
        self, base: Snapshot | None
    ) -> list[tuple[str, ChangeKind, ManifestEntry | None, ManifestEntry | None]]:
        old_m = (base or self.base).manifest
        new_m = build_manifest(self.root, None)
        out = []
        for path in sorted(set(old_m) | set(new_m)):
            if ".git" in path.split("/"):
                continue
            old, new = old_m.get(path), new_m.get(path)
            old = old if old and old.kind is not EntryKind.DIR else None
            new = new if new and new.kind is not EntryKind.DIR else None
            if old == new:
                continue
            kind = ChangeKind.ADDED if old is None else ChangeKind.DELETED if new is None else ChangeKind.MODIFIED
            out.append((path, kind, old, new))
        return out

    def _old_bytes(self, entry: ManifestEntry) -> bytes:
        if entry.kind is EntryKind.SYMLINK:
            return os.fsencode(entry.target or "")
        assert entry.sha256 is not None
        return self.store.blobs.get(entry.sha256)

    def _new_bytes(self, path: str, entry: ManifestEntry) -> bytes:
        if entry.kind is EntryKind.SYMLINK:
            return os.fsencode(entry.target or "")
        fd = open_beneath(self.root, path, os.O_RDONLY | os.O_NONBLOCK, no_symlinks=True)
        with os.fdopen(fd, "rb") as f:
            return f.read()

    # -- file access for tools (model-supplied paths)
    def resolve(self, rel: str) -> str:
        """Normalised relative path; raises PathError if invalid or if it leads outside."""
        norm = normalize(rel)
        try:
            os.close(open_beneath(self.root, norm))
        except (PathNotFoundError, PathTypeError):
            pass
        return norm

    def real_path(self, rel: str) -> str:
        """Relative path of an existing ``rel`` after following in-workspace symlinks."""
        return resolve_beneath(self.root, rel)

    def exists(self, rel: str) -> bool:
        """Whether ``rel`` exists (through in-workspace links); PathError if it leads outside."""
        try:
            os.close(open_beneath(self.root, rel))
            return True
        except (PathNotFoundError, PathTypeError):
            return False

    def is_dir(self, rel: str) -> bool:
        try:
            return stat.S_ISDIR(stat_beneath(self.root, rel).st_mode)
        except (PathNotFoundError, PathTypeError):
            return False

    def read_bytes(self, rel: str, *, limit: int | None = None) -> bytes:
        return read_bytes_beneath(self.root, rel, limit=limit)

    def write_bytes(self, rel: str, data: bytes) -> FileEdit:
        """Create or atomically replace a file; the FileEdit names the file really written."""
        old: bytes | None = None
        old_mode = MODE_FILE
        try:
            old = read_bytes_beneath(self.root, rel)
            old_mode = MODE_EXEC if stat_beneath(self.root, rel).st_mode & 0o100 else MODE_FILE
        except (PathNotFoundError, PathTypeError):
            pass
        outcome = write_bytes_beneath(self.root, rel, data)
        new_mode = old_mode if not outcome.created else MODE_FILE
        diff = unified_diff(outcome.path, None if outcome.created else old, data,
                            old_mode=old_mode, new_mode=new_mode)
        return FileEdit(path=outcome.path, diff=diff, created=outcome.created)

    def listdir(self, rel: str = ".") -> list[DirEntryInfo]:
        """Entries of a directory (following in-workspace links to it), sorted by name."""
        fd = open_beneath(self.root, rel, os.O_RDONLY | os.O_DIRECTORY)
        try:
            out = []
            with os.scandir(fd) as it:
                for e in it:
                    st = e.stat(follow_symlinks=False)
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
                          capture_output=True, text=True)
    if proc.returncode != 0:
        shutil.rmtree(dst.parent, ignore_errors=True)
        raise WorkspaceError(f"copying {src} failed: {proc.stderr.strip()}")


def _git(repo: str | os.PathLike[str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", os.fspath(repo), *args], capture_output=True, text=True)
