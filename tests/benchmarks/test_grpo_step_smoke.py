"""Smoke run of benchmarks/grpo_step.py --quick (seconds): both arms train, and the sorted
micro-batches pad less than index order on the same rollouts."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.benchmarks.bench_module import run_benchmark

pytestmark = [pytest.mark.benchmark_smoke, pytest.mark.timeout(180)]


def test_grpo_step_quick_times_both_arms(tmp_path: Path) -> None:
    result = run_benchmark("grpo_step", "--quick", results=tmp_path, timeout=170)
    assert result["benchmark"] == "grpo_step_quick"
    assert result["config"]["rows"] == 24
    assert all(v > 0 for v in result["seconds_per_update"].values())
    pad = result["pad_share"]
    assert 0.0 <= pad["sorted"] < pad["index_order"] < 1.0
