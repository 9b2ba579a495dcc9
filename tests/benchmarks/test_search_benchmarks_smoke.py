"""Smoke runs of benchmarks/walk_tree.py and benchmarks/fusion_tune.py on small inputs: they run
end to end and their own checks hold (the figures come from the full runs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.benchmark_smoke, pytest.mark.timeout(120)]


def run(script: str, *args: str, results: Path) -> dict:
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=110,
                          env={**os.environ, "FLYWHEEL_BENCH_RESULTS": str(results), "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (results / f"{result['benchmark']}.json").exists()
    return result


def test_walk_tree_keeps_exactly_the_sources(tmp_path: Path) -> None:
    r = run("walk_tree.py", "--files", "2000", results=tmp_path)
    assert r["walk"]["correct"] and r["walk"]["files_kept"] == r["tree"]["source"] > 2000


def test_fusion_tune_scores_the_grid(tmp_path: Path) -> None:
    r = run("fusion_tune.py", "--packages", "h11", "--max-queries", "8", "--bug-packages", "none",
            results=tmp_path)["docstring_queries"]
    grid = r["mrr@10"]["convex_by_bm25_weight"]
    assert set(grid) == {str(round(0.05 * i, 2)) for i in range(11)}
    assert r["picked_bm25_weight"] in [float(w) for w in grid] and "matches_code" in r
    assert all(0 <= v["function"] <= 1 and 0 <= v["file"] <= 1 for v in grid.values())
