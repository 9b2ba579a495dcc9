"""benchmarks/search_quality.py: the harness's parts, and a small end-to-end run.

No network: the docstring task runs on an installed package (pluggy, capped queries) and the bug
localisation task on a tiny local package with tests (the real run downloads an sdist)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks._search_eval import (  # noqa: E402
    RipgrepBaseline,
    Target,
    build_docstring_tasks,
    enumerate_mutations,
    failure_query,
    first_sentence,
    is_function_hit,
    run_tests,
    strip_docstrings,
    summarize,
)
from embeddings.types import Chunk  # noqa: E402

pytestmark = [pytest.mark.benchmark_smoke]

MATHX = '''
def clamp(x, lo, hi):
    """Clamp a number into the closed interval from lo to hi."""
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x


def mean(values):
    """Return the arithmetic mean of a list of numbers."""
    return sum(values) / len(values)


class Counter:
    def bump(self, n=1):
        """Increase the counter by n and return the new count."""
        self.count = getattr(self, "count", 0) + n
        return self.count
'''

TESTS = '''
from mathx.core import Counter, clamp, mean


def test_clamp_low():
    assert clamp(-5, 0, 10) == 0


def test_clamp_high():
    assert clamp(50, 0, 10) == 10


def test_clamp_inside():
    assert clamp(5, 0, 10) == 5


def test_mean():
    assert mean([1, 2, 3, 6]) == 3


def test_counter():
    c = Counter()
    assert c.bump() == 1 and c.bump(2) == 3
'''


def make_pkg(tmp: Path) -> Path:
    root = tmp / "mathx-1.0"
    (root / "mathx").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "mathx" / "__init__.py").write_text("")
    (root / "mathx" / "core.py").write_text(MATHX)
    (root / "tests" / "test_core.py").write_text(TESTS)
    return root


def test_strip_docstrings_and_targets(tmp_path: Path) -> None:
    stripped, docs = strip_docstrings(MATHX)
    assert '"""' not in stripped
    assert [q for q, _ in docs] == ["clamp", "mean", "Counter.bump"]
    compile(stripped, "x", "exec")
    root = make_pkg(tmp_path)
    targets = build_docstring_tasks(root / "mathx", tmp_path / "out")
    assert {(t.symbol, t.query) for t in targets} == {
        ("clamp", "Clamp a number into the closed interval from lo to hi."),
        ("mean", "Return the arithmetic mean of a list of numbers."),
        ("Counter.bump", "Increase the counter by n and return the new count."),
    }
    t = next(t for t in targets if t.symbol == "mean")
    lines = (tmp_path / "out" / t.path).read_text().splitlines()
    assert lines[t.start_line - 1].startswith("def mean") and "sum(values)" in lines[t.end_line - 1]
    assert first_sentence("Do a thing. More.\n\nDetails") == "Do a thing."


def test_scoring_helpers() -> None:
    t = Target("q", "a.py", "C.m", 10, 20)
    assert is_function_hit(Chunk("a.py", 10, 20, "method", "C.m", "python", "x"), t)
    assert not is_function_hit(Chunk("a.py", 1, 30, "class", "C", "python", "x"), t)
    assert not is_function_hit(Chunk("b.py", 10, 20, "method", "C.m", "python", "x"), t)
    assert is_function_hit(Chunk("a.py", 10, 15, "window", "", "python", "x"), t)
    s = summarize([1, 2, None, 11 and None])
    assert s["n"] == 4 and s["recall@1"] == 0.25 and s["recall@5"] == 0.5 and s["mrr@10"] == 0.375


def test_mutations_break_tests_and_give_queries(tmp_path: Path) -> None:
    root = make_pkg(tmp_path)
    ok, out = run_tests(root, "tests", timeout=60)
    assert ok, out
    muts = enumerate_mutations(root, ["mathx/core.py"], random.Random(0))
    assert {m.symbol for m in muts} <= {"clamp", "mean", "Counter.bump"} and muts
    failing = 0
    for m in muts:
        p = root / m.path
        orig = p.read_text()
        p.write_text(m.new_source)
        try:
            compile(m.new_source, m.path, "exec")
            ok, out = run_tests(root, "tests", timeout=60)
        finally:
            p.write_text(orig)
        if not ok:
            q = failure_query(out)
            assert q and q.startswith("tests/test_core.py test_"), out
            failing += 1
    assert failing >= 1


def test_ripgrep_baseline(tmp_path: Path) -> None:
    root = make_pkg(tmp_path)
    rg = RipgrepBaseline(root, ["mathx/core.py", "tests/test_core.py"])
    assert rg.terms("the arithmetic mean of values") == ["arithmetic", "mean"]  # rarest first
    assert rg.search_files("arithmetic mean")[0] == "mathx/core.py"


@pytest.mark.timeout(300)
def test_end_to_end_small(tmp_path: Path) -> None:
    """The script on pluggy (8 queries) without the network, then the bug task on the local package."""
    env = {**os.environ, "FLYWHEEL_BENCH_RESULTS": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "search_quality.py"), "--packages", "pluggy",
                           "--max-queries", "8", "--bug-package", "none", "--name", "sq_smoke"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads((tmp_path / "sq_smoke.json").read_text())
    pkg = r["docstring_to_function"]["packages"]["pluggy"]
    assert pkg["version"] and pkg["queries"] == 8
    for mode in ("bm25", "vector", "hybrid"):
        for level in ("function", "file"):
            s = pkg["scores"][mode][level]
            assert s["n"] == 8 and 0 <= s["recall@1"] <= s["recall@5"] <= s["recall@10"] <= 1
    assert pkg["scores"]["ripgrep"]["file"]["n"] == 8
    # above chance: the right file among pluggy's ~13 files within the top 5 for most queries
    assert pkg["scores"]["hybrid"]["file"]["recall@5"] >= 0.5

    from benchmarks import search_quality

    res = search_quality.bug_task("mathx==1.0", None, n_mutations=2, seed=0, log=lambda m: None,
                                  local_root=make_pkg(tmp_path / "pkg"))
    assert res["queries"] >= 1 and res["version"] == "1.0"
    assert all(m["path"] == "mathx/core.py" for m in res["mutations"])
    assert res["scores"]["hybrid"]["file"]["n"] == res["queries"]


def test_check_hybrid_reports_the_paired_difference_and_its_interval() -> None:
    from benchmarks.search_quality import check_hybrid, paired_bootstrap

    better = summarize([1, 1, 2, None, 1])
    worse = summarize([2, 3, 2, None, 1])
    scores = {"hybrid": {"file": better}, "bm25": {"file": worse}, "vector": {"file": summarize([None] * 5)}}
    out = check_hybrid(scores)["file"]
    assert out["best_single"] == "bm25" and out["hybrid_not_worse"]
    assert out["difference"] == round(better["mrr@10"] - worse["mrr@10"], 4)
    lo, hi = out["difference_ci95"]
    assert lo <= out["difference"] <= hi and hi > 0
    assert paired_bootstrap([0.5] * 10, [0.5] * 10) == [0.0, 0.0]


def test_src_layout_and_dashed_names_are_found_and_importable(tmp_path: Path) -> None:
    """cachetools-style sdists: the package under src/, imported from there by the tests."""
    from benchmarks.search_quality import find_layout

    root = make_pkg(tmp_path)
    (root / "src").mkdir()
    (root / "mathx").rename(root / "src" / "math_x")
    (root / "tests" / "test_core.py").write_text(TESTS.replace("from mathx.core", "from math_x.core"))
    assert find_layout(root, "math-x") == ("src/math_x", "tests")
    ok, out = run_tests(root, "tests", import_dir="src")
    assert ok, out[-2000:]
    ok, out = run_tests(root, "tests")  # without the src entry the tests cannot import it
    assert not ok and "math_x" in out
