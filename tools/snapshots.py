"""Snapshots of a workspace tree: manifests, a content-addressed blob store, a safe walk.

A snapshot records, per relative path, a regular file (sha256 of its bytes
and the executable bit), a symlink (its target, verbatim) or a directory
(so empty directories survive). Its id is the sha256 of the canonical JSON
manifest, so equal trees get equal ids. File bytes live once in a shared
:class:`BlobStore` (``blobs/ab/cdef...``).

Not captured (so not restored): special files (FIFOs, sockets, devices, which
are skipped), ownership, timestamps, xattrs/ACLs, directory permissions, the
permission bits other than "executable" (files come back 0644 or 0755), and
hard links (each link becomes its own file).
"""

from __future__ import annotations

import enum
import hashlib
import json
import os
import posixpath
import re
import secrets
import shutil
import stat
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from tools.diffs import MODE_EXEC, MODE_FILE, MODE_LINK
from tools.paths import O_PATH, open_beneath, write_bytes_beneath

MANIFEST_VERSION = 1
_SHA_RE = re.compile(r"[0-9a-f]{64}")


class SnapshotError(Exception):
    """A snapshot or blob is missing or corrupt."""


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
    """An exact, immutable description of a tree. Equal and hashed by ``id``."""

    id: str
    manifest: Mapping[str, ManifestEntry] = field(compare=False, hash=False, repr=False)

    @classmethod
    def from_manifest(cls, manifest: Mapping[str, ManifestEntry]) -> Snapshot:
        frozen = MappingProxyType(dict(sorted(manifest.items())))
        return cls(id=hashlib.sha256(canonical_json(frozen)).hexdigest(), manifest=frozen)

    @classmethod
    def from_json(cls, raw: bytes, expected_id: str | None = None) -> Snapshot:
        obj = json.loads(raw)
        if obj.get("version") != MANIFEST_VERSION:
            raise SnapshotError(f"unsupported manifest version {obj.get('version')!r}")
        snap = cls.from_manifest({p: ManifestEntry.from_json(e) for p, e in obj["entries"].items()})
        if expected_id is not None and snap.id != expected_id:
            raise SnapshotError(f"snapshot {expected_id} is corrupt (content hashes to {snap.id})")
        return snap

    def to_json(self) -> bytes:
        return canonical_json(self.manifest)


def canonical_json(manifest: Mapping[str, ManifestEntry]) -> bytes:
    """Canonical bytes of a manifest: sorted keys, no spaces, ASCII (non-UTF-8 names escape)."""
    body = {"version": MANIFEST_VERSION, "entries": {p: e.to_json() for p, e in manifest.items()}}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


class BlobStore:
    """Content-addressed file bytes under ``root/ab/cdef...``; writes are atomic and idempotent."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, sha: str) -> Path:
        if not _SHA_RE.fullmatch(sha):
            raise SnapshotError(f"not a sha256: {sha!r}")
        return self.root / sha[:2] / sha[2:]

    def has(self, sha: str) -> bool:
        return self.path(sha).exists()

    def put(self, data: bytes, sha: str | None = None) -> str:
        sha = sha or hashlib.sha256(data).hexdigest()
        dest = self.path(sha)
        if dest.exists():
            return sha
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.parent / f".tmp-{secrets.token_hex(8)}"
        tmp.write_bytes(data)
        os.chmod(tmp, 0o444)
        os.replace(tmp, dest)  # concurrent writers of one sha write equal bytes
        return sha

    def get(self, sha: str) -> bytes:
        try:
            return self.path(sha).read_bytes()
        except FileNotFoundError:
            raise SnapshotError(f"blob {sha} is missing from the store {self.root}") from None


@dataclass(frozen=True, slots=True)
class TreeItem:
    """One entry met by :func:`scan_tree`; ``dir_fd`` is valid only during the yield."""

    path: str
    st: os.stat_result
    dir_fd: int
    name: str


def scan_tree(root: str | os.PathLike[str]) -> Iterator[TreeItem]:
    """Walk ``root`` by directory fds without following any symlink (parents first, sorted)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield from _scan_dir(fd, "")
    finally:
        os.close(fd)


def _scan_dir(fd: int, prefix: str) -> Iterator[TreeItem]:
    with os.scandir(fd) as it:
        names = sorted(e.name for e in it)
    for name in names:
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        rel = prefix + name
        yield TreeItem(rel, st, fd, name)
        if stat.S_ISDIR(st.st_mode):
            try:
                child = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                                dir_fd=fd)
            except (FileNotFoundError, NotADirectoryError, OSError):
                continue
            try:
                yield from _scan_dir(child, rel + "/")
            finally:
                os.close(child)


def read_item(item: TreeItem) -> bytes:
    """Bytes of a regular file met by :func:`scan_tree` (refusing a swapped-in link)."""
    fd = os.open(item.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                 dir_fd=item.dir_fd)
    try:
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read()
    finally:
        os.close(fd)


def build_manifest(
    root: str | os.PathLike[str], blobs: BlobStore | None
) -> dict[str, ManifestEntry]:
    """Describe the tree at ``root``; with ``blobs``, also store every file's bytes."""
    manifest: dict[str, ManifestEntry] = {}
    for item in scan_tree(root):
        mode = item.st.st_mode
        if stat.S_ISDIR(mode):
            manifest[item.path] = ManifestEntry(EntryKind.DIR)
        elif stat.S_ISLNK(mode):
            target = os.readlink(item.name, dir_fd=item.dir_fd)
            manifest[item.path] = ManifestEntry(EntryKind.SYMLINK, target=target)
        elif stat.S_ISREG(mode):
            data = read_item(item)
            sha = hashlib.sha256(data).hexdigest()
            if blobs is not None:
                blobs.put(data, sha)
            manifest[item.path] = ManifestEntry(
                EntryKind.FILE, sha256=sha, executable=bool(mode & 0o100), size=len(data)
            )
    return manifest


def restore_tree(root: str | os.PathLike[str], snapshot: Snapshot, blobs: BlobStore) -> None:
    """Make the tree at ``root`` exactly equal to ``snapshot``.

    Extras and wrong-kind entries are removed first (``unlink``/fd-based
    ``rmtree`` relative to their parent's fd, so a symlink is removed, never
    followed); then directories, symlinks and files are created or rewritten
    in path order, each relative to a parent resolved with no symlinks allowed.
    Unchanged files (same size and hash) are left alone.
    """
    want = snapshot.manifest
    for sha in {e.sha256 for e in want.values() if e.sha256}:
        if not blobs.has(sha):
            raise SnapshotError(f"cannot restore {snapshot.id}: blob {sha} is missing")
    have: dict[str, ManifestEntry] = {}
    for item in scan_tree(root):  # a removed directory is not descended into
        cur = _entry_of(item)
        target = want.get(item.path)
        if target is None or cur is None or cur.kind is not target.kind:
            if stat.S_ISDIR(item.st.st_mode):
                shutil.rmtree(item.name, dir_fd=item.dir_fd)
            else:
                os.unlink(item.name, dir_fd=item.dir_fd)
            continue
        if cur.kind is EntryKind.FILE and cur.size == target.size:
            data = read_item(item)
            cur = ManifestEntry(EntryKind.FILE, sha256=hashlib.sha256(data).hexdigest(),
                                executable=cur.executable, size=len(data))
        have[item.path] = cur
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
            write_bytes_beneath(root, path, blobs.get(entry.sha256), mode=mode,
                                follow_symlink=False, make_parents=False, durable=False)


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
