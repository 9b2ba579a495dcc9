"""Smoke run of benchmarks/copy_successor_cost.py --quick (seconds): both phases timed in both arms."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.benchmarks.bench_module import run_benchmark

pytestmark = [pytest.mark.benchmark_smoke, pytest.mark.timeout(120)]


def test_copy_successor_cost_quick_times_both_arms(tmp_path: Path) -> None:
    result = run_benchmark("copy_successor_cost", "--quick", results=tmp_path, timeout=110)
    assert result["benchmark"] == "copy_successor_cost_quick"
    assert set(result["phases"]) == {"decode", "train"}
    for name, row in result["phases"].items():
        assert row["without_ms"] > 0 and row["with_ms"] > 0, name
        assert row["ratio"] == pytest.approx(row["with_ms"] / row["without_ms"], rel=0.01), name
