"""Snapshots of a workspace tree: manifests, a content-addressed blob store, exact restore.

A snapshot records, per relative path, a regular file (sha256 of its bytes
and the executable bit), a symlink (its target, verbatim) or a directory
(so empty directories survive). Its id is the sha256 of the canonical JSON
manifest, so equal trees get equal ids. File bytes live once in a shared
:class:`BlobStore` (``blobs/ab/cdef...``).

Limits (snapshots are exact or they fail; nothing is silently omitted):

* A regular file larger than ``max_file_bytes`` (default
  :data:`MAX_SNAPSHOT_FILE_BYTES`, apparent size, holes included) makes
  :func:`build_manifest` raise :class:`FileTooLargeError` before a byte of it
  is read, so a ``truncate -s 8G`` file can neither exhaust memory nor fill
  the store. Replay and RL forks rely on exact restores, and a snapshot that
  left such a file out could not give one: a workspace holding such a file
  cannot be created (``WorkspaceStore.from_dir`` says which file).
* Files are hashed and stored streamed (1 MiB at a time) and sparse-aware:
  holes are found with ``SEEK_DATA``/``SEEK_HOLE``, hashed as zeros without
  being read, and stored as holes, so a blob takes the disk space of the
  file's data, not of its apparent size.
* Entries deeper than :data:`~tools.treewalk.MAX_TREE_DEPTH` levels or with
  paths longer than :data:`~tools.treewalk.MAX_PATH_BYTES` bytes are refused
  (:class:`TreeTooDeepError`); walks are iterative (no ``RecursionError``).

Restore verifies every blob it is about to write against its sha256 *before*
it changes the tree; a missing or corrupt blob fails with the file's path and
the blob's id and leaves the tree untouched. A blob that changes on disk
during the restore itself is still detected (each copy is hashed as it is
written) but then the tree is left partly restored, and the error says so.

Ignored paths (``.gitignore``, see :mod:`tools.gitignore`) are not part of a
snapshot when the caller passes ``ignore``: :func:`build_manifest` never reads
them (a 3 GB ``.venv`` costs nothing), and :func:`restore_tree` leaves them as
they are. A snapshot's ``origin`` says where they came from (a workspace
opened in place over a host directory), so a workspace made from the
snapshot can show them again.

Not captured (so not restored): special files (FIFOs, sockets, devices, which
are skipped), ownership, timestamps, xattrs/ACLs, directory permissions, the
permission bits other than "executable" (files come back 0644 or 0755), and
hard links (each link becomes its own file). Not guaranteed: a consistent
snapshot of a tree that a running command is changing.
"""

from __future__ import annotations

import enum
import hashlib
import json
import os
import posixpath
import re
import secrets
import stat
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from tools.blobs import BlobStore, SnapshotError
from tools.diffs import MODE_EXEC, MODE_FILE, MODE_LINK
from tools.gitignore import IgnoreRules
from tools.delayed_progress import DelayedProgress
from tools.paths import O_PATH, display_path, makedirs_beneath, open_beneath
from tools.treewalk import (
    OnLimit,
    TreeItem,
    TreeLimitError,
    hash_fd,
    open_item,
    remove_tree,
    scan_tree,
    short_path,
)

__all__ = [
    "BlobStore", "EntryKind", "FileTooLargeError", "ManifestEntry", "Snapshot", "SnapshotError",
    "TreeTooDeepError", "build_manifest", "canonical_json", "file_entry", "restore_tree",
]

MANIFEST_VERSION = 1
MAX_SNAPSHOT_FILE_BYTES = 1 << 30
"""Largest regular file (apparent size) a snapshot holds by default."""
SMALL_FILE_BYTES = 1 << 20
"""Files up to this size are read in one piece; larger ones are streamed."""
_SHA_RE = re.compile(r"[0-9a-f]{64}")


class FileTooLargeError(SnapshotError):
    """A regular file is larger than the snapshot limit."""

    def __init__(self, path: str, size: int, limit: int) -> None:
        super().__init__(
            f"file {display_path(short_path(path))!r} is {_human(size)} ({size} bytes); snapshots hold files "
            f"up to {_human(limit)}: remove or shrink it (or keep it out of the workspace)"
        )
        self.path, self.size, self.limit = path, size, limit


class TreeTooDeepError(SnapshotError):
    """An entry is too deep or its path too long for a snapshot."""


def _human(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} bytes"


class EntryKind(enum.StrEnum):
    FILE = "file"
    DIR = "dir"
    SYMLINK = "symlink"


@dataclass(frozen=True, slots=True)
class ManifestEntry:
    """One path's recorded state. Only the fields of its ``kind`` are meaningful."""

    kind: EntryKind
    sha256: str | None = None
    executable: bool = False
    size: int = 0
    target: str | None = None

    @property
    def hashed(self) -> bool:
        """False for a file :func:`build_manifest` measured but did not hash (over the limit)."""
        return self.kind is not EntryKind.FILE or self.sha256 is not None

    @property
    def git_mode(self) -> int:
        if self.kind is EntryKind.SYMLINK:
            return MODE_LINK
        return MODE_EXEC if self.executable else MODE_FILE

    def to_json(self) -> dict[str, Any]:
        if self.kind is EntryKind.FILE:
            return {"type": "file", "sha256": self.sha256, "exec": self.executable, "size": self.size}
        if self.kind is EntryKind.SYMLINK:
            return {"type": "symlink", "target": self.target}
        return {"type": "dir"}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> ManifestEntry:
        kind = EntryKind(obj["type"])
        if kind is EntryKind.FILE:
            sha = str(obj["sha256"])
            if not _SHA_RE.fullmatch(sha):
                raise SnapshotError(f"bad sha256 in manifest: {sha!r}")
            return cls(kind, sha256=sha, executable=bool(obj["exec"]), size=int(obj["size"]))
        if kind is EntryKind.SYMLINK:
            return cls(kind, target=str(obj["target"]))
        return cls(kind)


@dataclass(frozen=True)
class Snapshot:
    """An exact, immutable description of a tree. Equal and hashed by ``id``.

    ``origin`` (part of the id when set) is the host directory a workspace was
    opened from in place: the snapshot's *ignored* paths (never in the
    manifest) are that directory's, as it is when the snapshot is used.
    """

    id: str
    manifest: Mapping[str, ManifestEntry] = field(compare=False, hash=False, repr=False)
    origin: str | None = field(default=None, compare=False, hash=False)

    @classmethod
    def from_manifest(cls, manifest: Mapping[str, ManifestEntry], origin: str | None = None) -> Snapshot:
        frozen = MappingProxyType(dict(sorted(manifest.items())))
        return cls(id=hashlib.sha256(canonical_json(frozen, origin)).hexdigest(), manifest=frozen, origin=origin)

    @classmethod
    def from_json(cls, raw: bytes, expected_id: str | None = None) -> Snapshot:
        obj = json.loads(raw)
        if obj.get("version") != MANIFEST_VERSION:
            raise SnapshotError(f"unsupported manifest version {obj.get('version')!r}")
        origin = obj.get("origin")
        if origin is not None and not (isinstance(origin, str) and origin.startswith("/")):
            raise SnapshotError(f"bad origin in manifest: {origin!r}")
        snap = cls.from_manifest({p: ManifestEntry.from_json(e) for p, e in obj["entries"].items()}, origin)
        if expected_id is not None and snap.id != expected_id:
            raise SnapshotError(f"snapshot {expected_id} is corrupt (content hashes to {snap.id})")
        return snap

    def to_json(self) -> bytes:
        return canonical_json(self.manifest, self.origin)


def canonical_json(manifest: Mapping[str, ManifestEntry], origin: str | None = None) -> bytes:
    """Canonical bytes of a manifest: sorted keys, no spaces, ASCII (non-UTF-8 names escape).

    Without ``origin`` the bytes (so the ids) are those of every earlier version.
    """
    body: dict[str, Any] = {"version": MANIFEST_VERSION, "entries": {p: e.to_json() for p, e in manifest.items()}}
    if origin is not None:
        body["origin"] = origin
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def file_entry(item: TreeItem, blobs: BlobStore | None, max_file_bytes: int | None, *,
               strict: bool = False) -> ManifestEntry:
    """The manifest entry of a regular file, hashed streamed; with ``blobs``, also stored.

    Over ``max_file_bytes`` (``None``: no limit): with ``blobs`` or
    ``strict``, raises :class:`FileTooLargeError`; otherwise returns an
    unhashed entry (size only).
    """
    size, executable = item.st.st_size, bool(item.st.st_mode & 0o100)
    if max_file_bytes is not None and size > max_file_bytes:
        if blobs is not None or strict:
            raise FileTooLargeError(item.path, size, max_file_bytes)
        return ManifestEntry(EntryKind.FILE, sha256=None, executable=executable, size=size)
    fd = open_item(item)
    try:
        size = os.fstat(fd).st_size
        if size <= SMALL_FILE_BYTES:
            with os.fdopen(fd, "rb", closefd=False) as f:
                data = f.read(SMALL_FILE_BYTES + 1)
            if len(data) <= SMALL_FILE_BYTES:
                sha = hashlib.sha256(data).hexdigest()
                if blobs is not None:
                    blobs.put(data, sha)
                return ManifestEntry(EntryKind.FILE, sha256=sha, executable=executable, size=len(data))
            size = os.fstat(fd).st_size  # it grew: stream it
            if max_file_bytes is not None and size > max_file_bytes:
                raise FileTooLargeError(item.path, size, max_file_bytes)
        hasher = hashlib.sha256()
        if hash_fd(fd, size, hasher) != size:
            raise SnapshotError(f"file {display_path(item.path)!r} changed while it was read; try again")
        sha = hasher.hexdigest()
        if blobs is not None:
            blobs.put_fd(fd, size, sha, item.path)
        return ManifestEntry(EntryKind.FILE, sha256=sha, executable=executable, size=size)
    finally:
        os.close(fd)


def _shown_by(ignore: IgnoreRules | None) -> Callable[[TreeItem], bool] | None:
    if ignore is None:
        return None
    return lambda item: ignore.shown(item.path, is_dir=stat.S_ISDIR(item.st.st_mode))


def build_manifest(
    root: str | os.PathLike[str], blobs: BlobStore | None, *,
    max_file_bytes: int | None = MAX_SNAPSHOT_FILE_BYTES, on_limit: OnLimit | None = None,
    ignore: IgnoreRules | None = None, strict: bool = False, progress: DelayedProgress | None = None,
) -> dict[str, ManifestEntry]:
    """Describe the tree at ``root``; with ``blobs``, also store every file's bytes.

    With ``ignore``, paths it does not show are left out: never read,
    hashed, stored or checked against the limits. ``progress`` counts the files hashed.
    Raises :class:`FileTooLargeError` (with ``blobs`` or ``strict``: a
    manifest whose blobs the caller stores later) and
    :class:`TreeTooDeepError` (without ``on_limit``); see the module docstring.
    """
    manifest: dict[str, ManifestEntry] = {}
    try:
        for item in scan_tree(root, on_limit=on_limit, include=_shown_by(ignore)):
            mode = item.st.st_mode
            if stat.S_ISDIR(mode):
                manifest[item.path] = ManifestEntry(EntryKind.DIR)
            elif stat.S_ISLNK(mode):
                target = os.readlink(item.name, dir_fd=item.dir_fd)
                manifest[item.path] = ManifestEntry(EntryKind.SYMLINK, target=target)
            elif stat.S_ISREG(mode):
                try:
                    manifest[item.path] = file_entry(item, blobs, max_file_bytes, strict=strict)
                except FileNotFoundError:
                    continue  # removed while walking
                if progress is not None:
                    progress.update()
    except TreeLimitError as exc:
        raise TreeTooDeepError(f"cannot snapshot the tree: {exc}; snapshots hold trees up to "
                               "that depth and path length") from None
    return manifest


def restore_tree(root: str | os.PathLike[str], snapshot: Snapshot, blobs: BlobStore, *,
                 ignore: IgnoreRules | None = None) -> None:
    """Make the tree at ``root`` exactly equal to ``snapshot``.

    With ``ignore`` (built from the *snapshot's* ignore files, keeping at least
    its paths), paths it does not show are left as they are: ignored files
    are not part of a snapshot, and restoring one keeps a project's
    virtualenv.

    Three phases: (1) scan the tree (iteratively; entries too deep for a
    snapshot are scheduled for removal) and plan what to remove and write;
    (2) verify every blob to be written against its hash, failing with the
    tree untouched; (3) remove extras and wrong-kind entries (unlink or
    :func:`~tools.treewalk.remove_tree`, relative to the parent's fd, never
    following a link), then create directories, symlinks and files in path
    order, each relative to a parent resolved with no symlinks allowed.
    Unchanged files (same size and hash) are left alone.
    """
    want = snapshot.manifest
    remove: list[str] = []
    have: dict[str, ManifestEntry] = {}

    def too_deep(item: TreeItem, _exc: TreeLimitError) -> None:
        remove.append(item.path)

    def keep(item: TreeItem) -> bool:
        cur = _entry_of(item)
        target = want.get(item.path)
        if target is None or cur is None or cur.kind is not target.kind:
            remove.append(item.path)
            return False
        if cur.kind is EntryKind.FILE and cur.size == target.size:
            try:
                cur = file_entry(item, None, None)
            except FileNotFoundError:
                return False
        have[item.path] = cur
        return True

    for _ in scan_tree(root, on_limit=too_deep, descend=keep, include=_shown_by(ignore)):
        pass
    writes = [(p, e) for p, e in want.items()
              if e.kind is EntryKind.FILE and e.sha256 is not None
              and (p not in have or have[p].sha256 != e.sha256)]
    verified: set[str] = set()
    for path, entry in writes:
        assert entry.sha256 is not None
        if entry.sha256 not in verified:
            try:
                blobs.verify(entry.sha256, entry.size, path)
            except SnapshotError as exc:
                raise SnapshotError(f"cannot restore snapshot {snapshot.id}: {exc}; the tree was not "
                                    "changed") from None
            verified.add(entry.sha256)
    for path in remove:
        _at_parent(root, path, remove_tree)
    for path, entry in want.items():  # sorted, so a directory comes before its children
        cur = have.get(path)
        if entry.kind is EntryKind.DIR and cur is None:
            _at_parent(root, path, lambda fd, name: os.mkdir(name, 0o755, dir_fd=fd))
        elif entry.kind is EntryKind.SYMLINK and (cur is None or cur.target != entry.target):
            _at_parent(root, path, lambda fd, name, t=entry.target or "": _replace_link(fd, name, t))
        elif entry.kind is EntryKind.FILE and entry.sha256 is not None:
            mode = 0o755 if entry.executable else 0o644
            if cur is not None and cur.sha256 == entry.sha256:
                if cur.executable != entry.executable:
                    _at_parent(root, path, lambda fd, name, m=mode: _chmod(fd, name, m))
                continue
            try:
                _at_parent(root, path, lambda fd, name, e=entry, m=mode, p=path: _write_blob(fd, name, blobs, e, m, p))
            except SnapshotError as exc:
                raise SnapshotError(f"restoring snapshot {snapshot.id} failed part-way: {exc}; the tree is "
                                    "partly restored: restore again once the blob store is repaired") from None


def restore_paths(root: str | os.PathLike[str], snapshot: Snapshot, blobs: BlobStore, paths: Collection[str]) -> None:
    """Make each of ``paths`` (normalised, relative, in file-system form) what it is in ``snapshot`` --
    rewritten from its blob, re-linked, made a directory, or removed when the snapshot has no such
    path -- and touch nothing else (missing parent directories are created, mode 0755).

    Every blob to be written is verified first: on a bad one nothing is changed. Raises
    :class:`~tools.paths.PathError` if a parent is not a directory (or is a symlink) any more.
    Not guaranteed: atomicity across several paths (each is replaced atomically on its own).
    """
    want = snapshot.manifest
    for path in paths:
        entry = want.get(path)
        if entry is not None and entry.kind is EntryKind.FILE and entry.sha256 is not None:
            try:
                blobs.verify(entry.sha256, entry.size, path)
            except SnapshotError as exc:
                raise SnapshotError(f"cannot restore {display_path(path)!r}: {exc}; nothing was changed") from None
    for path in sorted(paths):
        parent, name = posixpath.split(path)
        fd = makedirs_beneath(root, parent or ".", no_symlinks=True)
        try:
            _restore_one(fd, name, want.get(path), blobs, path)
        finally:
            os.close(fd)


def _restore_one(fd: int, name: str, entry: ManifestEntry | None, blobs: BlobStore, path: str) -> None:
    try:
        st: os.stat_result | None = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        st = None
    is_dir = st is not None and stat.S_ISDIR(st.st_mode)
    if entry is None or (st is not None and is_dir != (entry.kind is EntryKind.DIR)):
        remove_tree(fd, name)  # not in the snapshot, or the wrong kind: out of the way first
        st = None
    if entry is None:
        return
    if entry.kind is EntryKind.DIR:
        if st is None:
            os.mkdir(name, 0o755, dir_fd=fd)
    elif entry.kind is EntryKind.SYMLINK:
        _replace_link(fd, name, entry.target or "")
    elif entry.sha256 is not None:
        _write_blob(fd, name, blobs, entry, 0o755 if entry.executable else 0o644, path)


def _entry_of(item: TreeItem) -> ManifestEntry | None:
    mode = item.st.st_mode
    if stat.S_ISDIR(mode):
        return ManifestEntry(EntryKind.DIR)
    if stat.S_ISLNK(mode):
        return ManifestEntry(EntryKind.SYMLINK, target=os.readlink(item.name, dir_fd=item.dir_fd))
    if stat.S_ISREG(mode):
        return ManifestEntry(EntryKind.FILE, executable=bool(mode & 0o100), size=item.st.st_size)
    return None


def _at_parent(root: str | os.PathLike[str], path: str, op: Callable[[int, str], None]) -> None:
    parent, name = posixpath.split(path)
    fd = open_beneath(root, parent or ".", O_PATH | os.O_DIRECTORY, no_symlinks=True)
    try:
        op(fd, name)
    finally:
        os.close(fd)


def _write_blob(dir_fd: int, name: str, blobs: BlobStore, entry: ManifestEntry, mode: int, path: str) -> None:
    assert entry.sha256 is not None
    tmp = f".fw-tmp-{secrets.token_hex(8)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    try:
        try:
            blobs.copy_to(entry.sha256, entry.size, fd, path)
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        raise


def _replace_link(dir_fd: int, name: str, target: str) -> None:
    tmp = f".fw-link-{secrets.token_hex(8)}"
    os.symlink(target, tmp, dir_fd=dir_fd)
    os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def _chmod(dir_fd: int, name: str, mode: int) -> None:
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
