"""Choose the hybrid ranking's weights (``embeddings.fusion``) on tuning packages.

Prose queries (``BM25_WEIGHT``): for each installed package in ``--packages``
(default: ones the search-quality evaluation does not use), strip docstrings as
``benchmarks/search_quality.py`` does, index the copy, and keep each query's
top-50 vector and BM25 lists with their scores. Code queries
(``CODE_QUERY_BM25_WEIGHT``): the bug-localisation task (failing test name +
error output) on the sdists in ``--bug-packages`` (default: none of the
evaluation's sdists). Then score, offline, the convex combination
(``embeddings.fusion.fuse``) at every weight on a grid -- for code queries
also the symbol-link weight and depth (``LINK_WEIGHT``, ``LINK_DEPTH``) --
and equal-weight RRF for reference: MRR@10 at function and file level. Each
pick is the grid point with
the largest worst-case margin over the better single retriever (across both
levels). The result says whether the picks match the weights in the code.

    python benchmarks/fusion_tune.py [--packages httpx,h11,pathspec,tqdm,anyio]
                                     [--bug-packages pathspec==0.12.1,h11==0.14.0,simplejson==4.3.0,idna==3.20] [--max-queries 400]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import write_result  # noqa: E402
from benchmarks._search_eval import build_docstring_tasks, is_function_hit, load_embedder, open_index, py_files  # noqa: E402
from benchmarks.search_quality import mutated_targets, package_dir_and_version  # noqa: E402
from embeddings.fusion import (  # noqa: E402
    BM25_WEIGHT,
    CODE_QUERY_BM25_WEIGHT,
    LINK_DEPTH,
    LINK_WEIGHT,
    POOL,
    fuse,
    is_code_query,
)

DEFAULT_TUNE = "httpx,h11,pathspec,tqdm,anyio"
DEFAULT_BUG_TUNE = "pathspec==0.12.1,h11==0.14.0,simplejson==4.3.0,idna==3.20"
WEIGHTS = [round(0.05 * i, 2) for i in range(0, 11)]  # 0 (vector only) .. 0.5
CODE_WEIGHTS = [round(0.1 * i, 1) for i in range(0, 11)]  # 0 .. 1 (BM25 only)
LINK_WEIGHTS = [0.0, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0]  # 0: no symbol links
LINK_DEPTHS = [1, 2]


def candidate_rows(index, targets: list) -> tuple[list[dict], list[str]]:  # noqa: ANN001
    """Per query: both retrievers' top-``POOL`` (id, score) lists, the symbol-linked chunks at
    each depth in ``LINK_DEPTHS`` (id -> link score), and the ids that are hits."""
    ids: dict[tuple, int] = {}
    paths: list[str] = []
    rows = []
    for t in targets:
        hits: set[int] = set()

        def local(chunk, t=t, hits=hits) -> int:  # noqa: ANN001
            key = (chunk.path, chunk.start_line, chunk.end_line, chunk.content_hash)
            if key not in ids:
                ids[key] = len(paths)
                paths.append(chunk.path)
            if is_function_hit(chunk, t):
                hits.add(ids[key])
            return ids[key]

        lists = {mode: [(local(h.chunk), float(h.score)) for h in index.search(t.query, k=POOL, mode=mode)]
                 for mode in ("vector", "bm25")}
        linked = {d: {local(index.chunk(cid)): score for cid, score in index.linked(t.query, depth=d).items()}
                  for d in LINK_DEPTHS}
        rows.append({"vector": lists["vector"], "bm25": lists["bm25"], "linked": linked, "hits": hits,
                     "path": t.path, "code": is_code_query(t.query)})
    return rows, paths


def collect(name: str, embedder, *, max_queries: int, seed: int) -> dict:  # noqa: ANN001
    """The docstring -> function task on one installed package."""
    src, dist, version = package_dir_and_version(name)
    with tempfile.TemporaryDirectory(prefix=f"ft-{name}-") as tmp:
        root = Path(tmp) / name
        targets = build_docstring_tasks(src, root)
        if len(targets) > max_queries:
            targets = random.Random(seed).sample(targets, max_queries)
        index, _ = open_index(root, py_files(root), embedder, data_dir=Path(tmp) / "index")
        rows, paths = candidate_rows(index, targets)
        return {"distribution": dist, "version": version, "chunks": len(index), "rows": rows, "paths": paths}


def collect_bugs(spec: str, embedder, *, mutations: int, seed: int) -> dict:  # noqa: ANN001
    """The bug-localisation task (``search_quality.mutated_targets``) on one sdist."""
    with mutated_targets(spec, n_mutations=mutations, seed=seed) as bugs:
        root = bugs["root"]
        index, _ = open_index(root, py_files(root), embedder, data_dir=bugs["tmp"] / "index")
        rows, paths = candidate_rows(index, bugs["targets"])
        return {"distribution": bugs["name"], "version": bugs["version"], "chunks": len(index), "rows": rows,
                "paths": paths}


def mrr10(ranked: list[int], row: dict, paths: list[str], level: str) -> float:
    if level == "function":
        return next((1 / (i + 1) for i, c in enumerate(ranked[:10]) if c in row["hits"]), 0.0)
    files: list[str] = []
    for c in ranked:
        if paths[c] not in files:
            files.append(paths[c])
            if len(files) > 10:
                break
            if paths[c] == row["path"]:
                return 1 / len(files)
    return 0.0


def rrf(vector: list, bm25: list, k: int = 60) -> list[tuple[int, float]]:
    fused: dict[int, float] = {}
    for results in (vector, bm25):
        for rank, (cid, _) in enumerate(results):
            fused[cid] = fused.get(cid, 0.0) + 1.0 / (k + rank + 1)
    return sorted(fused.items(), key=lambda t: (-t[1], t[0]))


def evaluate(per_pkg: dict, rank) -> dict:  # noqa: ANN001
    out = {}
    for level in ("function", "file"):
        vals = [mrr10([c for c, _ in rank(r)], r, p["paths"], level) for p in per_pkg.values() for r in p["rows"]]
        out[level] = round(sum(vals) / len(vals), 4)
    return out


def pick(per_pkg: dict, weights: list[float], *, link_weights: list[float] = (0.0,),
         link_depths: list[int] = (1,)) -> dict:
    """Grid of the convex combination (BM25 weight x symbol-link weight x link depth); the pick has
    the largest worst-case margin over the better single retriever at function and file level
    (ties: the smaller link weight, then the shallower depth, then the smaller BM25 weight)."""
    single = {"vector": evaluate(per_pkg, lambda r: r["vector"]), "bm25": evaluate(per_pkg, lambda r: r["bm25"])}
    best_single = {lv: max(single["vector"][lv], single["bm25"][lv]) for lv in ("function", "file")}
    with_links = len(link_weights) > 1
    grid = {}
    points = [(w, g, d) for w in weights for g in link_weights for d in (link_depths if g else link_depths[:1])]
    for w, g, d in points:
        m = evaluate(per_pkg, lambda r, w=w, g=g, d=d: fuse(r["vector"], r["bm25"], w,
                                                            linked=r.get("linked", {}).get(d), link_weight=g))
        m["worst_margin"] = round(min(m[lv] - best_single[lv] for lv in ("function", "file")), 4)
        grid[(w, g, d)] = m
    chosen = max(points, key=lambda p: (grid[p]["worst_margin"], -p[1], -p[2], -p[0]))
    out = {"packages": {n: {"distribution": p["distribution"], "version": p["version"], "queries": len(p["rows"]),
                            "code_queries": sum(r["code"] for r in p["rows"]), "chunks": p["chunks"]}
                        for n, p in per_pkg.items()},
           "mrr@10": {**single, "rrf_equal_weight": evaluate(per_pkg, lambda r: rrf(r["vector"], r["bm25"])),
                      "convex_by_weights" if with_links else "convex_by_bm25_weight":
                          {(point_name(*p) if with_links else str(p[0])): m for p, m in grid.items()}},
           "picked_bm25_weight": chosen[0]}
    if with_links:
        out.update(picked_link_weight=chosen[1], picked_link_depth=chosen[2])
    return out


def point_name(w: float, g: float, d: int) -> str:
    return f"bm25={w} link={g} depth={d}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--packages", default=DEFAULT_TUNE, help=f"installed packages to tune on (default {DEFAULT_TUNE})")
    ap.add_argument("--bug-packages", default=DEFAULT_BUG_TUNE,
                    help=f"sdists for the code-query weights (default {DEFAULT_BUG_TUNE}); 'none' skips it")
    ap.add_argument("--max-queries", type=int, default=400, help="per package (default 400)")
    ap.add_argument("--mutations", type=int, default=40, help="caught mutations per bug package (default 40)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    embedder = load_embedder(None)

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t0:6.1f}s] {msg}", file=sys.stderr, flush=True)

    prose = {}
    for name in args.packages.split(","):
        prose[name] = collect(name, embedder, max_queries=args.max_queries, seed=args.seed)
        log(f"{name}: {len(prose[name]['rows'])} docstring queries, {prose[name]['chunks']} chunks")
    result: dict = {"docstring_queries": pick(prose, WEIGHTS)}
    result["docstring_queries"].update(code_bm25_weight=BM25_WEIGHT,
                                       matches_code=result["docstring_queries"]["picked_bm25_weight"] == BM25_WEIGHT)
    if args.bug_packages.lower() != "none":
        bugs = {}
        for spec in args.bug_packages.split(","):
            bugs[spec] = collect_bugs(spec, embedder, mutations=args.mutations, seed=args.seed)
            log(f"{spec}: {len(bugs[spec]['rows'])} bug-localisation queries")
        r = pick(bugs, CODE_WEIGHTS, link_weights=LINK_WEIGHTS, link_depths=LINK_DEPTHS)
        r.update(code_bm25_weight=CODE_QUERY_BM25_WEIGHT, code_link_weight=LINK_WEIGHT, code_link_depth=LINK_DEPTH,
                 matches_code=(r["picked_bm25_weight"], r["picked_link_weight"], r["picked_link_depth"])
                 == (CODE_QUERY_BM25_WEIGHT, LINK_WEIGHT, LINK_DEPTH))
        result["bug_queries"] = r
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    write_result("fusion_tune", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
