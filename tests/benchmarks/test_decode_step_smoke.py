"""Smoke run of benchmarks/decode_step.py --quick (a few seconds): every layout is timed both ways,
the layouts take the path their docstring says, and the view and the gather give the same logits."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.benchmarks.bench_module import run_benchmark

pytestmark = [pytest.mark.benchmark_smoke, pytest.mark.timeout(120)]


def test_decode_step_quick_times_both_paths(tmp_path: Path) -> None:
    result = run_benchmark("decode_step", "--quick", results=tmp_path, timeout=110)
    assert result["benchmark"] == "decode_step_quick"
    layouts = result["layouts"]
    assert [layouts[k]["view_width"] for k in ("full", "fragmented", "sparse")] == [32, 32, None]
    assert [layouts[k]["rows"] for k in ("full", "fragmented", "sparse")] == [32, 24, 6]
    for name, row in layouts.items():
        assert row["gather_ms"] > 0 and row["view_ms"] > 0, name
        assert row["max_abs_logit_diff"] <= 1e-4, name
