"""Helpers for ``benchmarks/search_quality.py`` and ``benchmarks/index_build.py``.

* building the docstring -> function task set (a stripped copy of a package),
* injecting bugs into a package whose sdist ships its tests (re-exported from
  :mod:`rl.tasks.mutations`, the one implementation RL's real-code tasks use too),
* a ripgrep keyword baseline,
* scoring (MRR@10, recall@1/5/10 at function and file level),
* ``open_index``: the project's index (``embeddings.index``) when it exists,
  else a small private adapter with the same ``search`` signature (ast function
  chunks, bm25s, the bundled MiniLM, reciprocal rank fusion). The result JSON
  says which one was measured.
"""

from __future__ import annotations

import ast
import math
import os
import re
import shutil
import subprocess
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from embeddings.types import Chunk, SearchHit
from rl.tasks.mutations import (  # noqa: F401 - re-exported for the benchmarks
    Mutation,
    enumerate_mutations,
    failure_query,
    functions,
    run_tests,
)

MODES = ("bm25", "vector", "hybrid")
KS = (1, 5, 10)


# -- targets -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Target:
    """One query with its expected function (``symbol`` in ``path``, lines start-end)."""

    query: str
    path: str  # relative to the indexed root, '/'-separated
    symbol: str  # qualified name
    start_line: int
    end_line: int
    meta: dict = field(default_factory=dict, compare=False, hash=False)


_functions = functions


def first_sentence(doc: str) -> str:
    doc = doc.strip()
    para = re.split(r"\n\s*\n", doc, maxsplit=1)[0]
    para = " ".join(para.split())
    m = re.search(r"(.+?[.!?])(\s|$)", para)
    return (m.group(1) if m else para)[:300]


def strip_docstrings(source: str) -> tuple[str, list[tuple[str, str]]]:
    """Remove every function's docstring; return (new source, [(qualname, docstring)])."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    removals: list[tuple[int, int, str | None]] = []  # (first, last) 1-based, replacement
    docs: list[tuple[str, str]] = []
    for qual, fn in _functions(tree):
        doc = ast.get_docstring(fn, clean=True)
        if not doc:
            continue
        node = fn.body[0]
        if node.lineno == fn.lineno or node.end_lineno is None:  # one-liner `def f(): "doc"` - skip
            continue
        docs.append((qual, doc))
        indent = re.match(r"\s*", lines[node.lineno - 1]).group(0)
        repl = f"{indent}pass\n" if len(fn.body) == 1 else None
        removals.append((node.lineno, node.end_lineno, repl))
    for first, last, repl in sorted(removals, reverse=True):
        lines[first - 1:last] = [repl] if repl else []
    return "".join(lines), docs


def build_docstring_tasks(pkg_dir: Path, out_dir: Path, *, rel_prefix: str = "") -> list[Target]:
    """Copy the package's .py files to ``out_dir`` with function docstrings removed; one target
    per function whose docstring's first sentence has at least 3 words."""
    targets: list[Target] = []
    for src in sorted(pkg_dir.rglob("*.py")):
        rel = src.relative_to(pkg_dir)
        if any(p in ("tests", "test", "__pycache__") for p in rel.parts):
            continue
        try:
            text = src.read_text(encoding="utf-8")
            stripped, docs = strip_docstrings(text)
            tree = ast.parse(stripped)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        dst = out_dir / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_text(stripped, encoding="utf-8")
        spans = {q: (fn.lineno, fn.end_lineno or fn.lineno) for q, fn in _functions(tree)}
        seen: set[str] = set()
        for qual, doc in docs:
            q = first_sentence(doc)
            if len(q.split()) < 3 or qual not in spans or qual in seen:
                continue
            seen.add(qual)
            s, e = spans[qual]
            targets.append(Target(q, rel_prefix + rel.as_posix(), qual, s, e))
    return targets


# -- scoring -----------------------------------------------------------------------------------------


def is_function_hit(chunk: Chunk, t: Target) -> bool:
    """The chunk of that function: same file and either the same symbol, or (for chunks without
    a matching symbol, e.g. line windows or split functions) it lies inside the function and
    covers its ``def`` line or most of it."""
    if chunk.path != t.path:
        return False
    if chunk.symbol:
        if chunk.symbol == t.symbol or chunk.symbol.endswith("." + t.symbol):
            return True
        if chunk.kind in ("function", "method", "class"):
            return False
    inside = chunk.start_line >= t.start_line and chunk.end_line <= t.end_line
    covers_def = chunk.start_line <= t.start_line <= chunk.end_line
    return (covers_def and chunk.end_line <= t.end_line + 5) or (inside and chunk.start_line == t.start_line)


def rank_of(items: list, pred: Callable[[object], bool], k: int = 10) -> int | None:
    for i, it in enumerate(items[:k]):
        if pred(it):
            return i + 1
    return None


def dedup_files(paths: Iterable[str]) -> list[str]:
    seen: dict[str, None] = {}
    for p in paths:
        seen.setdefault(p, None)
    return list(seen)


def summarize(ranks: list[int | None]) -> dict:
    n = len(ranks)
    if n == 0:
        return {"n": 0}
    out: dict = {"n": n, "mrr@10": round(sum(1 / r for r in ranks if r) / n, 4)}
    for k in KS:
        out[f"recall@{k}"] = round(sum(1 for r in ranks if r and r <= k) / n, 4)
    out["_rr"] = [1 / r if r else 0.0 for r in ranks]  # per query, for paired comparisons (not written out)
    return out


def strip_private(d: object) -> object:
    """``d`` without keys that start with '_' (per-query data kept for the comparisons)."""
    if isinstance(d, dict):
        return {k: strip_private(v) for k, v in d.items() if not (isinstance(k, str) and k.startswith("_"))}
    if isinstance(d, list):
        return [strip_private(v) for v in d]
    return d


def score_index(index, targets: list[Target], *, k_chunks: int = 50) -> dict:
    """Per mode: function-level and file-level metrics (and, under ``_ranks``, each query's rank
    of its target in the top 10, None when missing)."""
    res: dict = {}
    for mode in MODES:
        fn_ranks: list[int | None] = []
        file_ranks: list[int | None] = []
        for t in targets:
            hits: list[SearchHit] = index.search(t.query, k=k_chunks, mode=mode)
            chunks = [h.chunk for h in hits]
            fn_ranks.append(rank_of(chunks, lambda c, t=t: is_function_hit(c, t)))
            files = dedup_files(c.path for c in chunks)
            file_ranks.append(rank_of(files, lambda p, t=t: p == t.path))
        res[mode] = {"function": summarize(fn_ranks), "file": summarize(file_ranks),
                     "_ranks": {"function": fn_ranks, "file": file_ranks}}
    return res


# -- ripgrep baseline ----------------------------------------------------------------------------------

_STOP = set("""a an and are as at be by can for from has have if in into is it its of on or that the this to
was were will with which when not no return returns given use used using all any each get set object value
values function method class true false none new if else than then there these those their them may must
should would could one two also only more most other such same some""".split())
WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]{2,}")


class RipgrepBaseline:
    """Lexical baseline: take the query's (up to) 3 rarest identifier-like words (document
    frequency over the tree's files), ``rg -c -i -F`` for each, rank files by total match
    count. File level only."""

    def __init__(self, root: Path, files: list[str], rg: str = "/usr/bin/rg"):
        self.root, self.rg = root, rg
        self.df: Counter[str] = Counter()
        for f in files:
            try:
                self.df.update(set(w.lower() for w in WORD.findall((root / f).read_text(errors="replace"))))
            except OSError:
                pass

    def terms(self, query: str, n: int = 3) -> list[str]:
        words = {w.lower() for w in WORD.findall(query)} - _STOP
        present = [w for w in words if self.df.get(w, 0) > 0]
        return sorted(present, key=lambda w: (self.df[w], w))[:n]

    def search_files(self, query: str) -> list[str]:
        terms = self.terms(query)
        if not terms:
            return []
        counts: Counter[str] = Counter()
        for term in terms:
            p = subprocess.run([self.rg, "-c", "-i", "-F", "--no-messages", "-g", "*.py", term, "."],
                               cwd=self.root, capture_output=True, text=True)
            for line in p.stdout.splitlines():
                path, _, c = line.rpartition(":")
                if c.isdigit():
                    counts[path.removeprefix("./")] += int(c)
        return [p for p, _ in counts.most_common()]


def score_ripgrep(rg: RipgrepBaseline, targets: list[Target]) -> dict:
    return {"file": summarize([rank_of(rg.search_files(t.query), lambda p, t=t: p == t.path) for t in targets])}


# -- index: the project's, or a private adapter ----------------------------------------------------------


def load_embedder(name: str | None = None):
    """The project's embedder (``embeddings.embedder``): the bundled MiniLM by default."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from embeddings.embedder import DEFAULT_MODEL, SentenceTransformerEmbedder

    return SentenceTransformerEmbedder(name or DEFAULT_MODEL)


def _fallback_chunks(rel: str, text: str, window: int = 40) -> list[Chunk]:
    """Python: one chunk per function/method (+ class headers); other lines in windows."""
    lines = text.splitlines()
    out: list[Chunk] = []
    covered = [False] * (len(lines) + 2)
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        tree = None
    if tree is not None:
        for qual, fn in _functions(tree):
            s = min([fn.lineno] + [d.lineno for d in fn.decorator_list])
            e = fn.end_lineno or fn.lineno
            kind = "method" if "." in qual else "function"
            out.append(Chunk(rel, s, e, kind, qual, "python", "\n".join(lines[s - 1:e])))
            for i in range(s, e + 1):
                covered[i] = True
    i = 1
    while i <= len(lines):
        if covered[i] or not lines[i - 1].strip():
            i += 1
            continue
        j = i
        while j <= len(lines) and not covered[j] and j - i < window:
            j += 1
        body = "\n".join(lines[i - 1:j - 1])
        if body.strip():
            out.append(Chunk(rel, i, j - 1, "window", "", "python" if rel.endswith(".py") else "text", body))
        i = j
    return out


def split_identifiers(text: str) -> list[str]:
    toks: list[str] = []
    for w in re.findall(r"[A-Za-z0-9_]+", text):
        lw = w.lower()
        toks.append(lw)
        parts = [p.lower() for p in re.findall(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+", w)]
        if len(parts) > 1:
            toks += parts
    return toks


class PrivateIndex:
    """Stand-in with the project's ``search`` signature, used only until ``embeddings.index``
    exists. Exact cosine search over MiniLM embeddings, bm25s over identifier-split tokens,
    RRF (k=60) for hybrid."""

    kind = "private-adapter"

    def __init__(self, root: Path, files: list[str], embedder=None, *,
                 chunker: Callable[[str, str], list[Chunk]] | None = None):
        import bm25s
        import numpy as np

        self.chunks: list[Chunk] = []
        for rel in files:
            try:
                text = (root / rel).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            self.chunks += (chunker or _fallback_chunks)(rel, text)
        self.embedder = embedder or load_embedder()
        self.vecs = np.asarray(self.embedder.embed([c.text for c in self.chunks]))
        self.bm25 = bm25s.BM25()
        self.bm25.index([split_identifiers(c.path + " " + c.symbol + " " + c.text) or ["_"] for c in self.chunks],
                        show_progress=False)

    def _vector(self, query: str, k: int) -> list[tuple[int, float]]:
        import numpy as np

        q = self.embedder.embed([query])[0]
        sims = self.vecs @ q
        k = min(k, len(sims))
        idx = np.argpartition(-sims, k - 1)[:k]
        idx = idx[np.argsort(-sims[idx])]
        return [(int(i), float(sims[i])) for i in idx]

    def _bm25(self, query: str, k: int) -> list[tuple[int, float]]:
        toks = split_identifiers(query) or ["_"]
        docs, scores = self.bm25.retrieve([toks], k=min(k, len(self.chunks)), show_progress=False)
        return [(int(d), float(s)) for d, s in zip(docs[0], scores[0]) if s > 0]

    def __len__(self) -> int:
        return len(self.chunks)

    def search(self, query: str, k: int = 10, path_glob: str | None = None, mode: str = "hybrid") -> list[SearchHit]:
        if mode == "vector":
            res = self._vector(query, k)
        elif mode == "bm25":
            res = self._bm25(query, k)
        else:
            depth = max(50, k)
            fused: dict[int, float] = {}
            for lst in (self._vector(query, depth), self._bm25(query, depth)):
                for r, (i, _) in enumerate(lst):
                    fused[i] = fused.get(i, 0.0) + 1.0 / (60 + r + 1)
            res = sorted(fused.items(), key=lambda kv: -kv[1])[:k]
        return [SearchHit(self.chunks[i], s, mode) for i, s in res]


def open_index(root: Path, files: list[str], embedder=None, *, data_dir: Path | None = None,
               private: bool = False):
    """The project's :class:`embeddings.index.WorkspaceIndex` over ``root`` (built with
    ``refresh``; its embedding cache in ``data_dir``, default a directory inside ``root``'s
    parent), or :class:`PrivateIndex` when ``private`` or the project's index is missing.
    Returns (index, description)."""
    if not private:
        try:
            from embeddings.index import WorkspaceIndex
        except ImportError:
            WorkspaceIndex = None  # noqa: N806
        if WorkspaceIndex is not None:
            idx = WorkspaceIndex(root, embedder=embedder or load_embedder(),
                                 data_dir=data_dir or Path(str(root) + ".index"))
            idx.refresh(progress=False, save=False)
            return idx, "embeddings.index.WorkspaceIndex"
    return PrivateIndex(root, files, embedder), PrivateIndex.kind


def py_files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*.py") if "__pycache__" not in p.parts)


# -- bug injection: one implementation, shared with RL's real-code tasks (rl/tasks/mutations.py) -----------

def copy_tree(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


def rrf(*ranked: list, k: int = 60) -> list:
    scores: dict = {}
    for lst in ranked:
        for r, x in enumerate(lst):
            scores[x] = scores.get(x, 0.0) + 1.0 / (k + r + 1)
    return sorted(scores, key=lambda x: -scores[x])


def fmt(x: float) -> str:
    return "nan" if math.isnan(x) else f"{x:.3f}"
