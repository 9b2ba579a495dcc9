"""The content-addressed blob store that snapshots keep file bytes in (``root/ab/cdef...``).

Blobs are written atomically (temporary file, rename), streamed and
sparse-aware for large files (holes stay holes), and every read checks the
bytes against their sha256.

:meth:`BlobStore.put_later` stores the blobs of a tree's files from a
background thread (a workspace opened in place returns as soon as its files
are hashed); every read of a blob still pending waits for it.

Not guaranteed: garbage collection (blobs are never deleted), or protection
against a writer that modifies a blob in place between a check and a use (a
restore hashes each copy as it writes it). A file that changes before
``put_later`` reads it does not match its hash and is not stored (a warning
is logged; reading that blob later fails as "missing"); a process killed
before the thread finishes leaves the rest unstored too.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import secrets
import threading
from collections.abc import Iterable
from pathlib import Path

from tools.paths import display_path, open_beneath
from tools.treewalk import copy_fd, hash_fd

log = logging.getLogger(__name__)
_SHA_RE = re.compile(r"[0-9a-f]{64}")
SMALL_BLOB_BYTES = 1 << 20


class SnapshotError(Exception):
    """A snapshot or blob is missing or corrupt, or a tree cannot be snapshotted exactly."""


class BlobStore:
    """Content-addressed file bytes under ``root/ab/cdef...``; writes are atomic and idempotent.

    Every read (:meth:`get`, :meth:`verify`, :meth:`copy_to`) checks the bytes
    against their sha256 and raises :class:`SnapshotError` on a mismatch.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self._dirs: set[str] = set()  # fan-out directories known to exist
        self._lock = threading.Lock()
        self._pending: dict[str, threading.Event] = {}  # sha -> set once put_later has dealt with it

    def path(self, sha: str) -> Path:
        if not _SHA_RE.fullmatch(sha):
            raise SnapshotError(f"not a sha256: {sha!r}")
        return self.root / sha[:2] / sha[2:]

    def _wait(self, sha: str) -> None:
        event = self._pending.get(sha)
        if event is not None:
            event.wait()

    def wait(self) -> None:
        """Return once every blob :meth:`put_later` was given has been stored (or given up on)."""
        for event in list(self._pending.values()):
            event.wait()

    def has(self, sha: str) -> bool:
        self._wait(sha)
        return self.path(sha).exists()

    def _fanout(self, sha: str) -> Path:
        sub = sha[:2]
        if sub not in self._dirs:
            (self.root / sub).mkdir(parents=True, exist_ok=True)
            self._dirs.add(sub)
        return self.root / sub

    def put(self, data: bytes, sha: str | None = None) -> str:
        sha = sha or hashlib.sha256(data).hexdigest()
        dest = self.path(sha)
        if dest.exists():
            return sha
        tmp = self._fanout(sha) / f".tmp-{secrets.token_hex(8)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o444)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.replace(tmp, dest)  # concurrent writers of one sha write equal bytes
        return sha

    def put_later(self, root: Path, files: Iterable[tuple[str, str, int]]) -> threading.Thread:
        """Store ``(path, sha256, size)`` files of the tree at ``root`` in a background thread.

        Each file is read beneath ``root`` (no symlinks followed) and checked
        against its hash as it is stored. The thread is not a daemon: the
        interpreter waits for it at exit.
        """
        todo = [(p, sha, size) for p, sha, size in files]
        events: dict[str, threading.Event] = {}
        with self._lock:
            for _, sha, _ in todo:
                if sha not in self._pending:
                    events[sha] = self._pending[sha] = threading.Event()

        def run() -> None:
            try:
                for path, sha, size in todo:
                    event = events.get(sha)
                    if event is None or event.is_set():
                        continue
                    try:
                        if not self.path(sha).exists():
                            self._put_file(root, path, sha, size)
                    except Exception as exc:  # gone, changed, unreadable: a warning, never a crash
                        log.warning("blob %s of %r not stored: %s", sha, display_path(path), exc)
                    finally:
                        self._done(sha, event)
            finally:
                for sha, event in events.items():
                    self._done(sha, event)

        thread = threading.Thread(target=run, name="flywheel-blobs", daemon=False)
        thread.start()
        return thread

    def _done(self, sha: str, event: threading.Event) -> None:
        with self._lock:
            if self._pending.get(sha) is event:
                del self._pending[sha]
        event.set()

    def _put_file(self, root: Path, path: str, sha: str, size: int) -> None:
        fd = open_beneath(root, path, os.O_RDONLY | os.O_NONBLOCK, no_symlinks=True)
        try:
            if size <= SMALL_BLOB_BYTES:
                with os.fdopen(fd, "rb", closefd=False) as f:
                    data = f.read(size + 1)
                if hashlib.sha256(data).hexdigest() != sha:
                    raise SnapshotError("it changed since it was hashed")
                self.put(data, sha)
            else:
                self.put_fd(fd, size, sha, path)
        finally:
            os.close(fd)

    def put_fd(self, fd: int, size: int, sha: str, what: str) -> None:
        """Store ``size`` bytes of ``fd`` (streamed, holes kept) as blob ``sha``, checking the hash."""
        dest = self.path(sha)
        if dest.exists():
            return
        tmp = self._fanout(sha) / f".tmp-{secrets.token_hex(8)}"
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
        self._wait(sha)
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
