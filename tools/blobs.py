"""The content-addressed blob store that snapshots keep file bytes in (``root/ab/cdef...``).

Blobs are written atomically (temporary file, rename), streamed and
sparse-aware for large files (holes stay holes), and every read checks the
bytes against their sha256. Not guaranteed: garbage collection (blobs are
never deleted), or protection against a writer that modifies a blob in place
between a check and a use (a restore hashes each copy as it writes it).
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
from pathlib import Path

from tools.paths import display_path
from tools.treewalk import copy_fd, hash_fd

_SHA_RE = re.compile(r"[0-9a-f]{64}")


class SnapshotError(Exception):
    """A snapshot or blob is missing or corrupt, or a tree cannot be snapshotted exactly."""


class BlobStore:
    """Content-addressed file bytes under ``root/ab/cdef...``; writes are atomic and idempotent.

    Every read (:meth:`get`, :meth:`verify`, :meth:`copy_to`) checks the bytes
    against their sha256 and raises :class:`SnapshotError` on a mismatch.
    """

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

    def put_fd(self, fd: int, size: int, sha: str, what: str) -> None:
        """Store ``size`` bytes of ``fd`` (streamed, holes kept) as blob ``sha``, checking the hash."""
        dest = self.path(sha)
        if dest.exists():
            return
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.parent / f".tmp-{secrets.token_hex(8)}"
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o444)
        try:
            hasher = hashlib.sha256()
            copied = copy_fd(fd, out, size, hasher)
        finally:
            os.close(out)
        if copied != size or hasher.hexdigest() != sha:
            tmp.unlink()
            raise SnapshotError(f"file {display_path(what)!r} changed while it was snapshotted; try again")
        os.replace(tmp, dest)

    def _open(self, sha: str, what: str) -> int:
        try:
            return os.open(self.path(sha), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise SnapshotError(f"blob {sha} (for {display_path(what)!r}) is missing from the blob store") from None

    def get(self, sha: str, what: str = "?") -> bytes:
        """The blob's bytes (for small blobs: the diff reads at most its size limit)."""
        fd = self._open(sha, what)
        try:
            with os.fdopen(fd, "rb", closefd=False) as f:
                data = f.read()
        finally:
            os.close(fd)
        if hashlib.sha256(data).hexdigest() != sha:
            raise self._corrupt(sha, what)
        return data

    def verify(self, sha: str, size: int, what: str) -> None:
        """Check a blob's size and hash (streamed); raise naming ``what`` (the file it is for)."""
        fd = self._open(sha, what)
        try:
            hasher = hashlib.sha256()
            ok = os.fstat(fd).st_size == size and hash_fd(fd, size, hasher) == size
        finally:
            os.close(fd)
        if not ok or hasher.hexdigest() != sha:
            raise self._corrupt(sha, what)

    def copy_to(self, sha: str, size: int, dst: int, what: str) -> None:
        """Copy a blob into the empty file ``dst`` (holes kept), checking the hash as it goes."""
        fd = self._open(sha, what)
        try:
            hasher = hashlib.sha256()
            copied = copy_fd(fd, dst, size, hasher)
        finally:
            os.close(fd)
        if copied != size or hasher.hexdigest() != sha:
            raise self._corrupt(sha, what)

    @staticmethod
    def _corrupt(sha: str, what: str) -> SnapshotError:
        return SnapshotError(f"blob {sha} (for {display_path(what)!r}) is corrupt: its bytes do not "
                             "match its sha256")
