"""A workspace's search index: chunks keyed by content hash, embeddings, BM25,
hybrid search, and incremental updates.

On-disk layout (``data_dir``, given by the caller: this package knows no default; the
drivers pass ``backend.settings.LocalSettings.search_index_dir``, so ``flywheel index``,
``flywheel run --semantic-search`` and ``flywheel serve`` share one cache)::

    embeddings.sqlite                    shared cache: (model, chunk content_hash) -> float32 vector
    indexes/<sha256(root)[:16]>/manifest.json
        {"version", "root", "model", "root_hash",
         "files": {path: {"hash", "size", "mtime_ns", "chunks": [[start, end, kind, symbol, language, text], ...]}},
         "dirs": {dir: merkle hash},
         "ann": {"file": "hnsw-<id>.faiss", "rows": [[path, chunk index] or null, ...]}}   (large indexes)
    indexes/<sha256(root)[:16]>/hnsw-<id>.faiss    the HNSW graph, rows as listed in "ann"

Vectors are not stored per index: loading a manifest fetches them from the
shared cache by content hash, so an unchanged chunk is embedded once per model,
whatever workspace or refresh it appears in. Above the ANN threshold the HNSW
graph is saved too (``refresh`` builds it before saving), so a reload does not
rebuild it; a graph that cannot be read is rebuilt at the next search.

Freshness: :meth:`notify_edits` (called by the executor for every FileEdit,
and with ``tree_changed=True`` after a call that may write anywhere, such as
``run_command``) only marks work; :meth:`search` first applies it
(:meth:`sync`): dirty files are re-chunked and only new chunk hashes are
embedded; after a tree change, a stat scan (size, mtime_ns) finds what else
changed. Not guaranteed: changes made behind the runtime's back (another
process) are seen only after a tree change is signalled or :meth:`refresh`.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from embeddings.bm25 import BM25Index
from embeddings.cache import EmbeddingCache
from embeddings.embedder import Embedder, SentenceTransformerEmbedder
from embeddings.fusion import LINK_DEPTH, POOL, bm25_weight_for, fuse, is_code_query
from embeddings.merkle import dir_hashes, file_hash
from embeddings.symbols import SymbolTable
from embeddings.types import Chunk, SearchHit
from embeddings.vectors import ANN_THRESHOLD, VectorIndex

Mode = Literal["hybrid", "vector", "bm25"]
MANIFEST_VERSION = 1


@dataclass(slots=True)
class UpdateStats:
    """What an update did: chunks now indexed, and how their vectors were obtained."""

    files: int = 0
    chunks: int = 0
    embedded: int = 0  # newly embedded (new content hashes)
    reused: int = 0  # taken from the cache or the index
    removed_files: int = 0
    seconds: float = 0.0

    def add(self, other: UpdateStats) -> None:
        self.files += other.files
        self.chunks += other.chunks
        self.embedded += other.embedded
        self.reused += other.reused
        self.removed_files += other.removed_files


@dataclass(slots=True)
class _File:
    hash: str
    size: int
    mtime_ns: int
    ids: list[int] = field(default_factory=list)


def _chunker() -> Callable[..., list[Chunk]]:
    try:
        from embeddings.chunking import chunk_file
    except ImportError:  # chunking not available yet: plain line windows
        return _window_chunks
    return chunk_file


def _window_chunks(path: str, data: bytes, *, max_tokens: int = 256, count_tokens: object = None,
                   lines_per_chunk: int = 40) -> list[Chunk]:
    text = data.decode("utf-8", "replace")
    lines = text.splitlines()
    out = []
    for i in range(0, len(lines), lines_per_chunk):
        body = "\n".join(lines[i:i + lines_per_chunk])
        if body.strip():
            out.append(Chunk(path, i + 1, min(len(lines), i + lines_per_chunk), "window", "", "text", body))
    return out


def _iter_files(root: Path, progress: bool) -> Iterator[str]:
    try:
        from embeddings.walk import iter_files
    except ImportError:
        yield from _walk_fallback(root)
        return
    yield from iter_files(root, progress=progress)


def _walk_fallback(root: Path) -> Iterator[str]:
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if not x.startswith(".") and x not in ("node_modules", "__pycache__"))
        for f in sorted(files):
            full = os.path.join(d, f)
            if f.startswith(".") or os.path.islink(full) or os.path.getsize(full) > 1_000_000:
                continue
            with open(full, "rb") as fh:
                if b"\0" in fh.read(8192):
                    continue
            yield os.path.relpath(full, root).replace(os.sep, "/")


class WorkspaceIndex:
    """Index of one directory tree. Thread-safe (one lock); ``search`` syncs first."""

    def __init__(self, root: str | os.PathLike[str], *, data_dir: str | os.PathLike[str],
                 embedder: Embedder | None = None, ann_threshold: int = ANN_THRESHOLD,
                 max_tokens: int = 256, load: bool = True) -> None:
        self.root = Path(os.path.realpath(root))
        self.embedder: Embedder = embedder or SentenceTransformerEmbedder()
        self.data_dir = Path(data_dir)
        self.max_tokens = max_tokens
        self.cache = EmbeddingCache(self.data_dir / "embeddings.sqlite", self.embedder.name)
        self.manifest_path = (self.data_dir / "indexes" / hashlib.sha256(str(self.root).encode()).hexdigest()[:16]
                              / "manifest.json")
        self._lock = threading.RLock()
        self._pending_lock = threading.Lock()  # guards _dirty/_rescan only
        self._chunk_file = _chunker()
        self._ann_threshold = ann_threshold
        self._vectors: VectorIndex | None = None
        self._bm25 = BM25Index()
        self._symbols = SymbolTable()
        self._files: dict[str, _File] = {}
        self._chunks: dict[int, Chunk] = {}
        self._next_id = 0
        self._dirty: set[str] = set()
        self._rescan = False
        self.totals = UpdateStats()  # cumulative since construction
        self._query_cache: dict[str, np.ndarray] = {}
        if load and self.manifest_path.exists():
            self._load()

    # -- state ---------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._chunks)

    @property
    def files(self) -> list[str]:
        return sorted(self._files)

    def chunk(self, cid: int) -> Chunk:
        """The chunk with this id (ids as :meth:`linked` returns them; valid until it changes)."""
        with self._lock:
            return self._chunks[cid]

    def chunks(self, path: str | None = None) -> list[Chunk]:
        with self._lock:
            if path is None:
                return [self._chunks[i] for f in self._files.values() for i in f.ids]
            f = self._files.get(path)
            return [self._chunks[i] for i in f.ids] if f else []

    def merkle(self) -> dict[str, str]:
        """Directory → Merkle hash ("" is the root) over the indexed files."""
        with self._lock:
            return dir_hashes({p: f.hash for p, f in self._files.items()})

    @property
    def root_hash(self) -> str:
        return self.merkle()[""]

    def _vecs(self, dim: int) -> VectorIndex:
        if self._vectors is None:  # dim from the vectors: a fully cached index never loads the model
            self._vectors = VectorIndex(dim, ann_threshold=self._ann_threshold)
        return self._vectors

    def prepare(self) -> None:
        """Build the approximate-search graph now (above the ANN threshold) rather than in the
        first search after a build or reload; servers call it on their indexing thread."""
        with self._lock:
            if self._vectors is not None:
                self._vectors.build()

    # -- updating -------------------------------------------------------------
    def refresh(self, *, progress: bool = False, save: bool = True,
                on_progress: Callable[[int, int], None] | None = None) -> UpdateStats:  # fmt: skip
        """Bring the index up to date with the tree: new, changed (by size/mtime,
        then content hash) and deleted files. Unchanged files cost one stat.
        ``progress`` draws a bar on stderr; ``on_progress(done, total)`` is
        called after each batch of files (for servers)."""
        t0 = time.perf_counter()
        stats = UpdateStats()
        seen: set[str] = set()
        changed: list[str] = []
        with self._lock:
            for rel in _iter_files(self.root, progress):
                seen.add(rel)
                try:
                    st = os.stat(self.root / rel, follow_symlinks=False)
                except OSError:
                    continue
                f = self._files.get(rel)
                if f is None or f.size != st.st_size or f.mtime_ns != st.st_mtime_ns:
                    changed.append(rel)
            gone = [p for p in self._files if p not in seen]
            bar = None
            if progress and changed:
                from tqdm import tqdm

                bar = tqdm(total=len(changed), desc="indexing", unit="file")
            batch: list[tuple[str, bytes | None]] = []
            done = 0
            if on_progress is not None:
                on_progress(0, len(changed))
            for rel in changed:  # batches: one embedding call covers several small files
                batch.append((rel, self._read(rel)))
                if len(batch) >= 16 or sum(len(d or b"") for _, d in batch) > 256_000:
                    stats.add(self._update_many(batch))
                    done += len(batch)
                    if on_progress is not None:
                        on_progress(done, len(changed))
                    if bar is not None:
                        bar.update(len(batch))
                        bar.set_postfix(chunks=len(self._chunks), embedded=stats.embedded, refresh=False)
                    batch = []
            stats.add(self._update_many(batch + [(p, None) for p in gone]))
            if on_progress is not None:
                on_progress(len(changed), len(changed))
            if bar is not None:
                bar.update(len(batch))
                bar.close()
            stats.files = len(self._files)
            stats.chunks = len(self._chunks)
            if save:
                self.prepare()  # a large index saves its HNSW graph too
                self.save()
        stats.seconds = time.perf_counter() - t0
        return stats

    def _read(self, rel: str) -> bytes | None:
        try:
            with open(self.root / rel, "rb") as fh:
                return fh.read()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    def update_file(self, path: str, data: bytes | None) -> UpdateStats:
        """Re-index one file from ``data`` (None: it was deleted). Only chunks whose
        content hash is new to the cache are embedded."""
        with self._lock:
            return self._update_many([(path, data)])

    def _update_many(self, items: list[tuple[str, bytes | None]]) -> UpdateStats:
        t0 = time.perf_counter()
        stats = UpdateStats()
        new_chunks: list[tuple[str, list[Chunk], str, os.stat_result | None]] = []
        for path, data in items:
            old = self._files.get(path)
            if data is None:
                if old is not None:
                    self._drop(path)
                    stats.removed_files += 1
                continue
            h = file_hash(data)
            try:
                st: os.stat_result | None = os.stat(self.root / path, follow_symlinks=False)
            except OSError:
                st = None
            if old is not None and old.hash == h:
                if st is not None:
                    old.size, old.mtime_ns = st.st_size, st.st_mtime_ns
                continue
            chunks = self._chunk_file(path, data, max_tokens=self.max_tokens, count_tokens=self.embedder.count_tokens)
            new_chunks.append((path, chunks, h, st))
        if not new_chunks:
            stats.seconds = time.perf_counter() - t0
            return stats
        hashes = [c.content_hash for _, cs, _, _ in new_chunks for c in cs]
        have = self.cache.get_many(hashes)
        missing: dict[str, str] = {}
        for _, cs, _, _ in new_chunks:
            for c in cs:
                if c.content_hash not in have:
                    missing.setdefault(c.content_hash, c.text)
        if missing:
            vecs = self.embedder.embed(list(missing.values()))
            fresh = dict(zip(missing.keys(), vecs))
            self.cache.put_many(fresh)
            have.update(fresh)
        stats.embedded += len(missing)
        stats.reused += len(hashes) - len(missing)
        for path, chunks, h, st in new_chunks:
            if path in self._files:
                self._drop(path)
            ids = list(range(self._next_id, self._next_id + len(chunks)))
            self._next_id += len(chunks)
            self._files[path] = _File(h, st.st_size if st else -1, st.st_mtime_ns if st else -1, ids)
            for cid, c in zip(ids, chunks):
                self._add_chunk(cid, c)
            if ids:
                rows = np.stack([have[c.content_hash] for c in chunks])
                self._vecs(rows.shape[1]).add(ids, rows)
        stats.chunks = sum(len(cs) for _, cs, _, _ in new_chunks)
        self.totals.add(stats)
        stats.seconds = time.perf_counter() - t0
        return stats

    def _add_chunk(self, cid: int, c: Chunk) -> None:
        self._chunks[cid] = c
        self._bm25.add(cid, bm25_text(c))
        self._symbols.add(cid, c)

    def _drop(self, path: str) -> None:
        f = self._files.pop(path)
        for cid in f.ids:
            self._symbols.remove(cid, self._chunks.pop(cid))
            self._bm25.remove(cid)
        if self._vectors is not None:
            self._vectors.remove(f.ids)

    def load_chunks(self, chunks: list[Chunk], vectors: np.ndarray) -> None:
        """Add chunks with precomputed vectors (synthetic benchmarks, imported indexes).
        Their files are not read, hashed or persisted by content; a refresh replaces them."""
        with self._lock:
            by_path: dict[str, list[int]] = {}
            for c, row in zip(chunks, range(len(chunks))):
                by_path.setdefault(c.path, []).append(row)
            for path, rows in by_path.items():
                if path in self._files:
                    self._drop(path)
                ids = list(range(self._next_id, self._next_id + len(rows)))
                self._next_id += len(rows)
                self._files[path] = _File("", -1, -1, ids)
                for cid, r in zip(ids, rows):
                    self._add_chunk(cid, chunks[r])
                self._vecs(vectors.shape[1]).add(ids, vectors[rows])

    # -- freshness hooks --------------------------------------------------------
    def notify_edits(self, paths: Iterable[str], *, tree_changed: bool = False) -> None:
        """Cheap and never blocked by a running search (own lock): remember what
        changed; the next search applies it."""
        with self._pending_lock:
            self._dirty.update(paths)
            self._rescan = self._rescan or tree_changed

    def sync(self) -> UpdateStats:
        """Apply pending edits (and a stat rescan if the tree may have changed)."""
        with self._lock:
            with self._pending_lock:
                dirty, rescan = sorted(self._dirty), self._rescan
                self._dirty, self._rescan = set(), False
            if rescan:
                return self.refresh(save=False)
            return self._update_many([(p, self._read(p)) for p in dirty]) if dirty else UpdateStats()

    # -- searching ---------------------------------------------------------------
    def search(self, query: str, k: int = 10, path_glob: str | None = None,
               mode: Mode = "hybrid") -> list[SearchHit]:
        if mode not in ("hybrid", "vector", "bm25"):
            raise ValueError(f"unknown search mode {mode!r}")
        with self._lock:
            self.sync()
            if not query.strip() or not self._chunks or k <= 0:
                return []
            allowed = None
            if path_glob:
                allowed = {cid for p, f in self._files.items() if _glob_match(p, path_glob) for cid in f.ids}
                if not allowed:
                    return []
            pool = max(POOL, 5 * k) if mode == "hybrid" else k
            vec = self._vector_search(query, pool, allowed) if mode != "bm25" else []
            lex = self._bm25.search(query, pool, allowed) if mode != "vector" else []
            if mode == "vector":
                ranked = vec
            elif mode == "bm25":
                ranked = lex
            else:
                ranked = fuse(vec, lex, bm25_weight_for(query), linked=self.linked(query, allowed))
            return [SearchHit(self._chunks[cid], score, mode) for cid, score in ranked[:k]]

    def linked(self, query: str, allowed: set[int] | None = None, *, depth: int = LINK_DEPTH) -> dict[int, float]:
        """For a code query (:func:`embeddings.fusion.is_code_query`): the definitions linked from
        the chunks it names (:meth:`embeddings.symbols.SymbolTable.neighbours`), within
        ``allowed``; empty for prose queries."""
        if not is_code_query(query):
            return {}
        with self._lock:
            out = self._symbols.neighbours(query, lambda cid: self._chunks[cid].text, depth=depth)
        return out if allowed is None else {c: s for c, s in out.items() if c in allowed}

    def embed_query(self, query: str) -> np.ndarray:
        q = self._query_cache.get(query)
        if q is None:
            q = self.embedder.embed([query])[0]
            if len(self._query_cache) > 256:
                self._query_cache.clear()
            self._query_cache[query] = q
        return q

    def _vector_search(self, query: str, k: int, allowed: set[int] | None) -> list[tuple[int, float]]:
        if self._vectors is None or not len(self._vectors):
            return []
        arr = np.fromiter(allowed, dtype=np.int64) if allowed is not None else None
        return self._vectors.search(self.embed_query(query), k, arr)

    # -- persistence -------------------------------------------------------------
    def save(self) -> None:
        """Write the manifest (and the HNSW graph, when there is one) atomically: a graph file
        is written under a fresh name first, then the manifest that names it replaces the old."""
        with self._lock:
            files = {p: {"hash": f.hash, "size": f.size, "mtime_ns": f.mtime_ns,
                         "chunks": [[c.start_line, c.end_line, c.kind, c.symbol, c.language, c.text]
                                    for c in (self._chunks[i] for i in f.ids)]}
                     for p, f in sorted(self._files.items())}
            dirs = dir_hashes({p: f.hash for p, f in self._files.items()})
            doc: dict = {"version": MANIFEST_VERSION, "root": str(self.root), "model": self.embedder.name,
                         "root_hash": dirs[""], "files": files, "dirs": dirs}
            folder = self.manifest_path.parent
            folder.mkdir(parents=True, exist_ok=True)
            state = self._vectors.ann_state() if self._vectors is not None else None
            if state is not None:
                import faiss

                graph, row_ids = state
                where = {cid: [p, i] for p, f in self._files.items() for i, cid in enumerate(f.ids)}
                name = f"hnsw-{uuid.uuid4().hex[:12]}.faiss"
                faiss.write_index(graph, str(folder / name))
                doc["ann"] = {"file": name, "rows": [where.get(cid) if cid is not None else None for cid in row_ids]}
            tmp = self.manifest_path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps(doc, ensure_ascii=False))
            os.replace(tmp, self.manifest_path)
            for old in folder.glob("hnsw-*.faiss"):  # graphs no manifest names any more
                if old.name != doc.get("ann", {}).get("file"):
                    old.unlink(missing_ok=True)

    def _load(self) -> None:
        doc = json.loads(self.manifest_path.read_text())
        if doc.get("version") != MANIFEST_VERSION or doc.get("model") != self.embedder.name:
            return  # another model or format: start afresh (the vectors cache still helps)
        vectors: dict[int, np.ndarray] = {}
        for path, f in doc["files"].items():
            chunks = [Chunk(path, s, e, kind, sym, lang, text) for s, e, kind, sym, lang, text in f["chunks"]]
            have = self.cache.get_many(c.content_hash for c in chunks)
            if any(c.content_hash not in have for c in chunks):
                continue  # cache lost a vector: the next refresh re-indexes this file
            ids = list(range(self._next_id, self._next_id + len(chunks)))
            self._next_id += len(chunks)
            self._files[path] = _File(f["hash"], f["size"], f["mtime_ns"], ids)
            for cid, c in zip(ids, chunks):
                self._add_chunk(cid, c)
                vectors[cid] = have[c.content_hash]
        if not vectors:
            return
        dim = len(next(iter(vectors.values())))
        placed = self._restore_graph(doc.get("ann"), vectors, dim)
        rest = [cid for cid in vectors if cid not in placed]
        if rest:
            self._vecs(dim).add(rest, np.stack([vectors[c] for c in rest]))

    def _restore_graph(self, ann: dict | None, vectors: dict[int, np.ndarray], dim: int) -> set[int]:
        """Re-attach a saved HNSW graph (no rebuild); returns the ids placed in its rows."""
        if not ann:
            return set()
        path = self.manifest_path.parent / ann["file"]
        try:
            import faiss

            graph = faiss.read_index(str(path))
            cid_at = {(p, i): cid for p, f in self._files.items() for i, cid in enumerate(f.ids)}
            row_ids = [cid_at.get((loc[0], loc[1])) if loc else None for loc in ann["rows"]]
            zero = np.zeros(dim, dtype=np.float32)
            rows = np.stack([vectors[c] if c is not None else zero for c in row_ids]) if row_ids else \
                np.zeros((0, dim), dtype=np.float32)
            self._vectors = VectorIndex.restore(dim, graph, row_ids, rows, ann_threshold=self._ann_threshold)
        except (ImportError, OSError, RuntimeError, ValueError, KeyError, IndexError, TypeError):
            self._vectors = None  # unreadable or mismatched: vectors are re-added, the graph rebuilt when needed
            return set()
        return {c for c in row_ids if c is not None}

    def close(self) -> None:
        self.cache.close()


def bm25_text(chunk: Chunk) -> str:
    """What BM25 indexes for a chunk: its path, then its text. The path's words count as
    terms (``toolz/itertoolz.py`` → toolz, itertoolz): queries often name a module, and a
    failing test's file names the module it tests. The embeddings see the text only."""
    return f"{chunk.path}\n{chunk.text}"


def _glob_match(path: str, pattern: str) -> bool:
    """fnmatch semantics (``*`` crosses ``/``); a pattern without ``/`` also matches basenames;
    a bare directory name matches everything under it."""
    pattern = pattern.strip()
    pattern = pattern[2:] if pattern.startswith("./") else pattern
    if fnmatch.fnmatchcase(path, pattern) or fnmatch.fnmatchcase(path, pattern.replace("**/", "")):
        return True
    if "/" not in pattern and fnmatch.fnmatchcase(path.rpartition("/")[2], pattern):
        return True
    return path.startswith(pattern.rstrip("/") + "/")
