"""BM25 over chunks with bm25s, tokenised for code.

The tokenizer splits identifiers (``parse_HTTPRequest`` → ``parse``, ``http``,
``request``) and keeps the whole identifier too, so both exact names and their
words match. bm25s builds a static sparse index; changes since its build are
handled as a delta (see :class:`BM25Index`). Not guaranteed: no stemming, no stop words
beyond a small English list.
"""

from __future__ import annotations

import math
import re

import numpy as np

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\d+")
_PART = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")
_STOP = frozenset("a an the of to in on and or is are be for with as by it this that at from".split())


def tokenize(text: str) -> list[str]:
    out: list[str] = []
    for word in _WORD.findall(text):
        low = word.lower()
        parts = [p.lower() for p in _PART.findall(word)]
        if low not in _STOP and len(low) > 1:
            out.append(low)
        if len(parts) > 1:
            out.extend(p for p in parts if p not in _STOP and len(p) > 1)
    return out


class BM25Index:
    """BM25 (Lucene variant, k1=1.5, b=0.75) over a bm25s index plus a delta.

    Rebuilding bm25s' index costs ~0.3 s at 10k chunks and seconds at 100k, too
    slow for every edit. So chunks added since the last build are scored here in
    Python (the delta) and removed ones are masked out of bm25s' scores; the
    index is rebuilt when the delta passes ``rebuild_fraction`` of its size.
    Departure from exact BM25: between rebuilds, bm25s' scores use the corpus
    statistics (idf, average length) of its build, the delta those of now.
    """

    def __init__(self, *, k1: float = 1.5, b: float = 0.75, rebuild_fraction: float = 0.25,
                 min_rebuild: int = 2000) -> None:
        self.k1, self.b = k1, b
        self.rebuild_fraction, self.min_rebuild = rebuild_fraction, min_rebuild
        self._tokens: dict[int, list[str]] = {}
        self._df: dict[str, int] = {}
        self._total_len = 0
        self._retriever = None
        self._order: np.ndarray = np.zeros(0, dtype=np.int64)
        self._built: dict[int, int] = {}  # id -> position in _order
        self._dead: set[int] = set()  # built ids removed since
        self._delta: set[int] = set()  # ids added since the build

    def __len__(self) -> int:
        return len(self._tokens)

    def add(self, cid: int, text: str) -> None:
        if cid in self._tokens:
            self.remove(cid)
        toks = tokenize(text)
        self._tokens[cid] = toks
        self._total_len += len(toks)
        for t in set(toks):
            self._df[t] = self._df.get(t, 0) + 1
        self._delta.add(cid)

    def remove(self, cid: int) -> None:
        toks = self._tokens.pop(cid, None)
        if toks is None:
            return
        self._total_len -= len(toks)
        for t in set(toks):
            self._df[t] -= 1
        if cid in self._delta:
            self._delta.discard(cid)
        else:
            self._dead.add(cid)

    def _build(self) -> None:
        import bm25s

        self._order = np.fromiter(self._tokens.keys(), dtype=np.int64, count=len(self._tokens))
        self._built = {int(c): i for i, c in enumerate(self._order.tolist())}
        corpus = [self._tokens[int(c)] or [""] for c in self._order]
        retriever = bm25s.BM25(k1=self.k1, b=self.b)
        retriever.index(corpus, show_progress=False)
        self._retriever, self._dead, self._delta = retriever, set(), set()

    def _stale(self) -> bool:
        if self._retriever is None:
            return bool(self._tokens)
        changes = len(self._delta) + len(self._dead)
        return changes > max(self.min_rebuild, self.rebuild_fraction * len(self._built))

    def scores(self, query: str) -> tuple[np.ndarray, np.ndarray]:
        """(ids, scores) for every chunk that could match; empty when nothing can."""
        qt = tokenize(query)
        empty = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
        if not self._tokens or not qt:
            return empty
        if self._stale():
            self._build()
        ids_parts, score_parts = [], []
        if self._retriever is not None and len(self._order):
            vocab = self._retriever.vocab_dict
            known = [t for t in qt if t in vocab]
            if known:
                sc = np.asarray(self._retriever.get_scores(known), dtype=np.float32)
                if self._dead:
                    sc[[self._built[c] for c in self._dead]] = 0.0
                ids_parts.append(self._order)
                score_parts.append(sc)
        if self._delta:
            ids_parts.append(np.fromiter(self._delta, dtype=np.int64, count=len(self._delta)))
            score_parts.append(self._score_delta(ids_parts[-1], qt))
        if not ids_parts:
            return empty
        return np.concatenate(ids_parts), np.concatenate(score_parts)

    def _score_delta(self, ids: np.ndarray, qt: list[str]) -> np.ndarray:
        n = len(self._tokens)
        avgdl = self._total_len / max(n, 1)
        idf = {t: math.log(1 + (n - self._df.get(t, 0) + 0.5) / (self._df.get(t, 0) + 0.5)) for t in set(qt)}
        out = np.zeros(len(ids), dtype=np.float32)
        for i, cid in enumerate(ids.tolist()):
            toks = self._tokens[cid]
            norm = self.k1 * (1 - self.b + self.b * len(toks) / avgdl)
            s = 0.0
            for t in qt:
                tf = toks.count(t)
                if tf:
                    s += idf[t] * tf / (tf + norm)  # Lucene: no (k1 + 1) factor, as bm25s
            out[i] = s
        return out

    def search(self, query: str, k: int, allowed: set[int] | None = None) -> list[tuple[int, float]]:
        ids, scores = self.scores(query)
        if len(ids) == 0:
            return []
        if allowed is not None:
            mask = np.fromiter((int(c) in allowed for c in ids), dtype=bool, count=len(ids))
            ids, scores = ids[mask], scores[mask]
        pos = np.flatnonzero(scores > 0)
        if len(pos) == 0:
            return []
        k = min(k, len(pos))
        top = pos[np.argpartition(-scores[pos], k - 1)[:k]]
        top = top[np.argsort(-scores[top], kind="stable")]
        return [(int(ids[i]), float(scores[i])) for i in top.tolist()]
