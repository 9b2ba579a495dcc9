"""Semantic search latency at 10k and 100k chunks, and recall@10 of the
approximate (HNSW) index against exact search.

The real tree: copies of installed packages (default httpx, ~800 chunks;
``--packages sentence_transformers,pydantic,httpx`` gives ~10k real chunks but
takes many minutes to embed on this 2-core machine), chunked by
embeddings.chunking and embedded with the bundled MiniLM (cached in
``--data-dir``, so a rerun embeds nothing).

Each scale larger than the real tree is SYNTHETIC: the real chunks are
replicated (each copy under its own path prefix, so BM25 sees every document)
and every copy after the first gets a blend of its real vector, half of
another random real vector and Gaussian noise (sigma per dimension
``--noise``), re-normalised: the vectors stay in the region real embeddings
occupy (uniform random vectors do not), without being near-duplicates. Below the ANN
threshold (50k) vector search is exact; above it, faiss HNSW.

Queries are real: the first sentence of real docstrings, embedded with MiniLM
on this CPU. Reported separately: query embedding time; search time with the
query already embedded; end-to-end (a fresh query, embedding included).

Usage: python benchmarks/search_latency.py [--packages a,b] [--scales 10000,100000] [--queries 200]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
from _common import percentile, write_result

from embeddings.embedder import SentenceTransformerEmbedder
from embeddings.index import WorkspaceIndex
from embeddings.types import Chunk
from embeddings.vectors import ANN_THRESHOLD, recall_at_k

os.environ.setdefault("HF_HUB_OFFLINE", "1")
_DOC = re.compile(r'"""\s*([^"\n]{20,160}?)[.\n]')


def build_tree(packages: list[str], dest: Path) -> dict[str, str]:
    versions = {}
    for name in packages:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            raise SystemExit(f"{name} is not installed")
        shutil.copytree(Path(spec.origin).parent, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
        try:
            versions[name] = importlib.metadata.version(name.replace("_", "-"))
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "?"
    return versions


def queries_from(chunks: list[Chunk], n: int) -> list[str]:
    out: list[str] = []
    for c in chunks:
        m = _DOC.search(c.text)
        if m and m.group(1).strip() not in out:
            out.append(m.group(1).strip())
    rng = np.random.default_rng(0)
    return [out[i] for i in rng.permutation(len(out))[:n]]


def stats_ms(values: list[float]) -> dict[str, float]:
    return {"p50_ms": round(percentile(values, 50) * 1000, 2), "p95_ms": round(percentile(values, 95) * 1000, 2),
            "max_ms": round(max(values) * 1000, 2)}


def time_search(index: WorkspaceIndex, queries: list[str], mode: str, k: int = 10) -> list[float]:
    out = []
    for q in queries:
        t = time.perf_counter()
        index.search(q, k=k, mode=mode)  # type: ignore[arg-type]
        out.append(time.perf_counter() - t)
    return out


def measure(index: WorkspaceIndex, queries: list[str], fresh: list[str]) -> dict:
    for q in queries:  # embed once: the timings below then exclude the model
        index.embed_query(q)
    index.search(queries[0])  # builds BM25 / ANN
    res = {mode: stats_ms(time_search(index, queries, mode)) for mode in ("hybrid", "vector", "bm25")}
    res["hybrid_end_to_end_fresh_queries"] = stats_ms(time_search(index, fresh, "hybrid"))
    return res


def synthetic(real: WorkspaceIndex, n: int, noise: float, seed: int = 1,
              mix: float = 0.5) -> tuple[list[Chunk], np.ndarray]:
    """``n`` chunks: the real ones, then copies under ``copyJ/`` prefixes whose vectors are
    blends (real + ``mix`` * another random real vector + noise): distinct points spread like
    real embeddings, not clusters of near-duplicates (which no ANN graph handles well)."""
    chunks = real.chunks()
    base = real._vectors
    assert base is not None
    ids = [cid for p in real.files for cid in real._files[p].ids]  # same order as chunks()
    base_vecs = base._vecs[[base._row[i] for i in ids]]
    rng = np.random.default_rng(seed)
    out_c: list[Chunk] = []
    parts = []
    for j in range(-(-n // len(chunks))):
        out_c += [Chunk(f"copy{j}/{c.path}", c.start_line, c.end_line, c.kind, c.symbol, c.language, c.text)
                  for c in chunks]
        other = base_vecs[rng.permutation(len(base_vecs))]
        v = base_vecs if j == 0 else (base_vecs + mix * other
                                      + noise * rng.standard_normal(base_vecs.shape).astype(np.float32))
        parts.append(v / np.linalg.norm(v, axis=1, keepdims=True))
    return out_c[:n], np.concatenate(parts)[:n].astype(np.float32)


def scale(real: WorkspaceIndex, n: int, args: argparse.Namespace, tmp: Path, queries: list[str],
          fresh: list[str]) -> dict:
    if len(real) >= n:
        index, synthetic_ = real, False
        load_s = 0.0
    else:
        chunks, vecs = synthetic(real, n, args.noise)
        index = WorkspaceIndex(tmp / f"empty{n}", embedder=real.embedder, data_dir=tmp / f"data{n}", load=False)
        t = time.perf_counter()
        index.load_chunks(chunks, vecs)
        assert index._vectors is not None
        index._vectors.build()
        load_s, synthetic_ = time.perf_counter() - t, True
    t = time.perf_counter()
    index.search(queries[0])
    first_s = time.perf_counter() - t
    assert index._vectors is not None
    res = {"chunks": len(index), "synthetic": synthetic_, "ann": index._vectors.uses_ann,
           "load_and_ann_build_seconds": round(load_s, 1), "bm25_build_seconds": round(first_s, 1),
           **measure(index, queries, fresh)}
    qv = [index.embed_query(q) for q in queries]
    approx = [[i for i, _ in index._vectors.search(q, 10)] for q in qv]
    exact, exact_t = [], []
    for q in qv:
        t = time.perf_counter()
        exact.append([i for i, _ in index._vectors.search_exact(q, 10)])
        exact_t.append(time.perf_counter() - t)
    res["recall_at_10_vs_exact"] = round(recall_at_k(approx, exact, 10), 4)
    ann = index._vectors._ann
    if ann is not None:  # the recall/latency trade-off of HNSW's efSearch on this graph
        sweep = {}
        default_ef = ann.hnsw.efSearch
        for ef in (64, 128, 256, 512, 1024):
            ann.hnsw.efSearch = ef
            t = time.perf_counter()
            got = [[i for i, _ in index._vectors.search(q, 10)] for q in qv]
            sweep[str(ef)] = {"recall_at_10": round(recall_at_k(got, exact, 10), 4),
                              "mean_ms": round((time.perf_counter() - t) / len(qv) * 1000, 3)}
        ann.hnsw.efSearch = default_ef
        res["hnsw_ef_search_default"] = default_ef
        res["hnsw_ef_search_sweep"] = sweep
    res["exact_vector_search"] = stats_ms(exact_t)
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--packages", default="httpx",
                    help="installed packages whose source is the real tree (sentence_transformers,pydantic,httpx "
                    "gives ~10k real chunks; slow to embed on 2 CPU cores)")
    ap.add_argument("--scales", default="10000,100000")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--noise", type=float, default=0.03)
    ap.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "flywheel-bench-index")
    args = ap.parse_args()
    embedder = SentenceTransformerEmbedder()
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        versions = build_tree(args.packages.split(","), tree)
        real = WorkspaceIndex(tree, embedder=embedder, data_dir=args.data_dir)
        t = time.perf_counter()
        built = real.refresh(progress=True)
        build_s = time.perf_counter() - t
        all_q = queries_from(real.chunks(), 2 * args.queries)
        queries, fresh = all_q[: len(all_q) // 2], all_q[len(all_q) // 2:]
        emb_times = []
        for q in fresh:
            t = time.perf_counter()
            embedder.embed([q])
            emb_times.append(time.perf_counter() - t)
        results = {f"at_{int(n) // 1000}k": scale(real, int(n), args, Path(tmp), queries, fresh)
                   for n in args.scales.split(",")}
        real_chunks = len(real)
        real.close()
    write_result("search_latency", {
        "packages": versions, "model": embedder.name, "ann_threshold": ANN_THRESHOLD,
        "real_tree": {"chunks": real_chunks, "build_seconds": round(build_s, 1), "embedded": built.embedded,
                      "reused": built.reused},
        "query_embedding": stats_ms(emb_times),
        "queries": len(queries), "k": 10, "noise_sigma": args.noise, **results,
        "note": "per-mode times exclude query embedding (queries pre-embedded); "
                "hybrid_end_to_end_fresh_queries includes it. Scales above the real tree's chunk count are "
                "SYNTHETIC (real chunks replicated, vectors = real + 0.5 * another real vector + Gaussian noise, normalised); see the docstring.",
    })


if __name__ == "__main__":
    main()
