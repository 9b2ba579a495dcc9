"""Workspace indexes built off the request path, for servers with many sessions.

:class:`IndexPool` hands out one :class:`BackgroundIndex` per workspace root
and keeps the ``max_indexes`` most recently used in memory (a session evicted
between turns keeps its index; one forgotten is reloaded from its on-disk
manifest, so only files changed since are re-read).
Building (``WorkspaceIndex.refresh``) runs on the pool's single worker thread,
so several sessions' builds queue instead of fighting over the CPU, and
content already embedded for any workspace (same data dir) is reused, so a
fork of an indexed workspace costs a walk, chunking and BM25, no embedding.

:meth:`BackgroundIndex.search` starts the build when none has started (the
server builds lazily: a session that never searches costs nothing), waits a
short while for it and then
raises :class:`IndexNotReady` with the progress, which the ``semantic_search``
tool turns into an error result telling the model to use grep meanwhile.
Edits reported while the build runs (``notify_edits``) are applied before
the first search.

Not guaranteed: fairness between sessions beyond first-come first-served;
an index's on-disk manifest outliving its workspace (nothing deletes it).
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from embeddings.embedder import Embedder
from embeddings.index import WorkspaceIndex
from embeddings.types import SearchHit

log = logging.getLogger(__name__)


class IndexNotReady(RuntimeError):
    """The index is still being built (or its build failed); the message says how far it got."""


class _Cancelled(Exception):
    """Raised inside a build when its pool is closed, to stop between batches of files."""


class BackgroundIndex:
    """A :class:`WorkspaceIndex` whose first build runs on an :class:`IndexPool` worker."""

    def __init__(self, root: Path, pool: IndexPool) -> None:
        self.root = root
        self._pool = pool
        self._index: WorkspaceIndex | None = None
        self._future: Future[object] | None = None
        self._lock = threading.Lock()
        self._pending: set[str] = set()
        self._tree_changed = False
        self.progress = (0, 0)  # files done, files to (re)index
        self.error: str | None = None

    @property
    def state(self) -> str:
        """``idle`` (never started), ``building``, ``ready`` or ``failed``."""
        if self._future is None:
            return "idle"
        if not self._future.done():
            return "building"
        return "failed" if self.error else "ready"

    def start(self) -> Future[object]:
        """Queue the build (idempotent); returns its future."""
        with self._lock:
            if self._future is None:
                self._future = self._pool.submit(self._build)
            return self._future

    def _build(self) -> None:
        try:
            index = WorkspaceIndex(self.root, embedder=self._pool.embedder, data_dir=self._pool.data_dir)
            stats = index.refresh(on_progress=self._on_progress)
            index.prepare()  # a large index's HNSW graph, here rather than in the first search
            with self._lock:
                self._index = index
                if self._pending or self._tree_changed:
                    index.notify_edits(sorted(self._pending), tree_changed=self._tree_changed)
                self._pending.clear()
            log.info("indexed %s: %d files, %d chunks (%d embedded) in %.1fs",
                     self.root, stats.files, stats.chunks, stats.embedded, stats.seconds)
        except _Cancelled:
            self.error = "the server is shutting down"
        except Exception as exc:  # reported to the model by search(); the server keeps going
            self.error = f"{type(exc).__name__}: {exc}"
            log.exception("indexing %s failed", self.root)

    def _on_progress(self, done: int, total: int) -> None:
        self.progress = (done, total)
        if self._pool.closed:
            raise _Cancelled

    def notify_edits(self, paths: Iterable[str], *, tree_changed: bool = False) -> None:
        with self._lock:
            if self._index is not None:
                self._index.notify_edits(paths, tree_changed=tree_changed)
                return
            self._pending.update(paths)
            self._tree_changed |= tree_changed

    def search(self, query: str, k: int = 10, path_glob: str | None = None) -> list[SearchHit]:
        """Hybrid search once built; starts the build if needed and waits up to the pool's ``wait_s``."""
        future = self.start()
        try:
            future.result(timeout=self._pool.wait_s)
        except TimeoutError:
            pass
        if self.error:
            raise IndexNotReady(f"the search index could not be built ({self.error}); use grep")
        index = self._index
        if index is None:
            done, total = self.progress
            where = f" ({done:,} of {total:,} files)" if total else ""
            raise IndexNotReady(f"the search index for this workspace is still being built{where}; "
                                "use grep now, or semantic_search again in a little while")
        return index.search(query, k, path_glob)


class IndexPool:
    """One :class:`BackgroundIndex` per workspace root, sharing an embedder, a data dir and one build thread."""

    def __init__(self, data_dir: str | os.PathLike[str], *, embedder: Embedder | None = None,
                 wait_s: float = 2.0, max_indexes: int = 64) -> None:  # fmt: skip
        self.data_dir = Path(data_dir)
        self._embedder = embedder
        self.wait_s = wait_s
        self.max_indexes = max_indexes
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="flywheel-index")
        self._indexes: OrderedDict[Path, BackgroundIndex] = OrderedDict()  # least recently used first
        self._lock = threading.Lock()
        self.closed = False

    @property
    def embedder(self) -> Embedder:
        if self._embedder is None:  # loaded on the worker, at the first build
            from embeddings.embedder import SentenceTransformerEmbedder

            self._embedder = SentenceTransformerEmbedder()
        return self._embedder

    def submit(self, fn: Callable[[], object]) -> Future[object]:
        """Run ``fn`` on the pool's one indexing thread, after the builds queued before it."""
        return self._executor.submit(fn)

    def get(self, root: str | os.PathLike[str]) -> BackgroundIndex:
        key = Path(os.path.realpath(root))
        with self._lock:
            index = self._indexes.get(key)
            if index is None:
                index = self._indexes[key] = BackgroundIndex(key, self)
                self._trim()
            self._indexes.move_to_end(key)
            return index

    def _trim(self) -> None:
        """Forget least recently used indexes beyond ``max_indexes`` (never one still building)."""
        excess = len(self._indexes) - self.max_indexes
        for key in [k for k, ix in self._indexes.items() if ix.state != "building"][:max(0, excess)]:
            del self._indexes[key]

    def build_now(self, root: str | os.PathLike[str]) -> WorkspaceIndex:
        """A complete index of ``root`` built in the calling thread (for replays, which must not see
        "still being built"). Shares the embedder and the embedding cache; not kept by the pool."""
        index = WorkspaceIndex(Path(os.path.realpath(root)), embedder=self.embedder, data_dir=self.data_dir)
        index.refresh(save=False)
        return index

    def release(self, root: str | os.PathLike[str]) -> None:
        """Forget a workspace's in-memory index now (its manifest stays on disk, so a later
        :meth:`get` rebuilds it from there cheaply)."""
        with self._lock:
            self._indexes.pop(Path(os.path.realpath(root)), None)

    def __len__(self) -> int:
        return len(self._indexes)

    def close(self) -> None:
        """Drop queued builds and stop a running one at its next batch of files (so a server
        can exit without waiting for a large tree to finish indexing)."""
        self.closed = True
        self._executor.shutdown(wait=False, cancel_futures=True)
