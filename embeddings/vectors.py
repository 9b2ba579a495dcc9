"""Vector search over unit vectors: exact (numpy dot) for small indexes, faiss
HNSW above a size threshold.

Rows have integer ids and can be added and removed at any time. The HNSW graph
is built over a snapshot of rows; rows added since are searched exactly (a
small delta), removed rows are filtered out of its results (it is asked for
extra candidates), and it is rebuilt when the delta or the removed set grows
past a fraction of its size. Not guaranteed: HNSW is approximate (see
``recall_at_k``); ids must be unique.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

ANN_THRESHOLD = 50_000


class VectorIndex:
    def __init__(self, dim: int, *, ann_threshold: int = ANN_THRESHOLD, hnsw_m: int = 32,
                 ef_search: int = 512, rebuild_fraction: float = 0.1) -> None:
        self.dim = dim
        self.ann_threshold = ann_threshold
        self.hnsw_m = hnsw_m
        self.ef_search = ef_search
        self.rebuild_fraction = rebuild_fraction
        self._vecs = np.zeros((0, dim), dtype=np.float32)
        self._ids = np.zeros(0, dtype=np.int64)
        self._row: dict[int, int] = {}  # id -> row in _vecs
        self._live = np.zeros(0, dtype=bool)
        self._ann = None  # faiss index over rows [0, _ann_rows)
        self._ann_rows = 0
        self._ann_dead = 0

    def __len__(self) -> int:
        return len(self._row)

    @property
    def uses_ann(self) -> bool:
        return self._ann is not None

    def add(self, ids: Iterable[int], vecs: np.ndarray) -> None:
        ids = np.asarray(list(ids), dtype=np.int64)
        if len(ids) == 0:
            return
        vecs = np.ascontiguousarray(vecs, dtype=np.float32).reshape(len(ids), self.dim)
        start = len(self._ids)
        self._vecs = np.concatenate([self._vecs, vecs]) if start else vecs.copy()
        self._ids = np.concatenate([self._ids, ids])
        self._live = np.concatenate([self._live, np.ones(len(ids), dtype=bool)])
        for i, cid in enumerate(ids.tolist()):
            self._row[cid] = start + i

    def remove(self, ids: Iterable[int]) -> None:
        for cid in ids:
            row = self._row.pop(cid, None)
            if row is not None:
                self._live[row] = False
                if row < self._ann_rows:
                    self._ann_dead += 1
        if len(self._ids) > 2 * max(len(self._row), 1024):
            self._compact()

    def _compact(self) -> None:
        keep = np.flatnonzero(self._live)
        self._vecs, self._ids = self._vecs[keep].copy(), self._ids[keep].copy()
        self._live = np.ones(len(keep), dtype=bool)
        self._row = {cid: i for i, cid in enumerate(self._ids.tolist())}
        self._ann, self._ann_rows, self._ann_dead = None, 0, 0

    def _maybe_build_ann(self) -> None:
        n = len(self._row)
        if n < self.ann_threshold:
            self._ann = None
            return
        stale = (len(self._ids) - self._ann_rows) + self._ann_dead
        if self._ann is not None and stale <= self.rebuild_fraction * max(self._ann_rows, 1):
            return
        import faiss

        if self._ann_dead or len(self._ids) != n:
            self._compact()
        index = faiss.IndexHNSWFlat(self.dim, self.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = 64
        index.add(self._vecs)
        index.hnsw.efSearch = self.ef_search
        self._ann, self._ann_rows, self._ann_dead = index, len(self._ids), 0

    def build(self) -> None:
        """Build (or refresh) the approximate index now instead of at the next search."""
        self._maybe_build_ann()

    def ann_state(self) -> tuple[Any, list[int | None]] | None:
        """The HNSW graph and, for each of its rows, the id stored there (None: removed
        since), for persisting; None when there is no graph."""
        if self._ann is None:
            return None
        rows = range(self._ann_rows)
        return self._ann, [int(self._ids[r]) if self._live[r] else None for r in rows]

    @classmethod
    def restore(cls, dim: int, ann: Any, row_ids: list[int | None], row_vecs: np.ndarray, **kwargs: Any) -> VectorIndex:
        """An index whose first rows are a saved graph's (``row_ids``/``row_vecs`` in graph row order,
        None and any vector for rows removed since); add the rest with :meth:`add`."""
        if ann.ntotal != len(row_ids) or len(row_vecs) != len(row_ids) or ann.d != dim:
            raise ValueError(f"graph has {ann.ntotal} rows of dim {ann.d}; got {len(row_ids)} ids, "
                             f"{len(row_vecs)} vectors of dim {dim}")
        index = cls(dim, **kwargs)
        index._vecs = np.ascontiguousarray(row_vecs, dtype=np.float32).reshape(len(row_ids), dim)
        index._ids = np.asarray([-1 if i is None else i for i in row_ids], dtype=np.int64)
        index._live = np.asarray([i is not None for i in row_ids], dtype=bool)
        index._row = {cid: r for r, cid in enumerate(row_ids) if cid is not None}
        ann.hnsw.efSearch = index.ef_search
        index._ann, index._ann_rows, index._ann_dead = ann, len(row_ids), int((~index._live).sum())
        return index

    def search_exact(self, query: np.ndarray, k: int, allowed: np.ndarray | None = None) -> list[tuple[int, float]]:
        """Top ``k`` (id, cosine) by brute force; ``allowed`` restricts to those ids."""
        if allowed is not None:
            rows = np.asarray([self._row[c] for c in allowed.tolist() if c in self._row], dtype=np.int64)
        else:
            rows = np.flatnonzero(self._live)
        if len(rows) == 0 or k <= 0:
            return []
        scores = self._vecs[rows] @ np.asarray(query, dtype=np.float32) if allowed is not None or len(rows) < len(self._ids) \
            else self._vecs @ np.asarray(query, dtype=np.float32)
        return _top(rows, scores, self._ids, k)

    def search(self, query: np.ndarray, k: int, allowed: np.ndarray | None = None) -> list[tuple[int, float]]:
        """Top ``k`` (id, cosine); approximate above the threshold (exact when filtered)."""
        if allowed is not None:
            return self.search_exact(query, k, allowed)
        self._maybe_build_ann()
        if self._ann is None:
            return self.search_exact(query, k)
        q = np.asarray(query, dtype=np.float32).reshape(1, self.dim)
        want = min(self._ann_rows, k + self._ann_dead)
        scores, rows = self._ann.search(q, want)
        out = [(int(self._ids[r]), float(s)) for r, s in zip(rows[0].tolist(), scores[0].tolist())
               if r >= 0 and self._live[r]]
        if len(self._ids) > self._ann_rows:  # the delta since the graph was built
            delta = np.arange(self._ann_rows, len(self._ids))
            delta = delta[self._live[delta]]
            if len(delta):
                ds = self._vecs[delta] @ q[0]
                out += _top(delta, ds, self._ids, k)
        out.sort(key=lambda t: -t[1])
        return out[:k]


def _top(rows: np.ndarray, scores: np.ndarray, ids: np.ndarray, k: int) -> list[tuple[int, float]]:
    if len(scores) != len(rows):  # scores over all rows: keep the live ones
        scores = scores[rows]
    k = min(k, len(rows))
    part = np.argpartition(-scores, k - 1)[:k]
    part = part[np.argsort(-scores[part], kind="stable")]
    return [(int(ids[rows[i]]), float(scores[i])) for i in part.tolist()]


def recall_at_k(approx: list[list[int]], exact: list[list[int]], k: int = 10) -> float:
    """Mean fraction of the exact top-``k`` ids that the approximate top-``k`` found."""
    if not exact:
        return float("nan")
    hits = [len(set(a[:k]) & set(e[:k])) / max(1, min(k, len(e))) for a, e in zip(approx, exact)]
    return float(np.mean(hits))
