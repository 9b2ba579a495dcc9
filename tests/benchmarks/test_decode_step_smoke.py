"""Smoke run of benchmarks/decode_step.py --quick (a few seconds): every layout is timed both ways,
the layouts take the path their docstring says, and the view and the gather give the same logits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.benchmark_smoke, pytest.mark.timeout(120)]


def test_decode_step_quick_times_both_paths(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "decode_step.py"), "--quick"], cwd=ROOT,
                          capture_output=True, text=True, timeout=110,
                          env={**os.environ, "FLYWHEEL_BENCH_RESULTS": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "decode_step_quick.json").read_text())
    layouts = result["layouts"]
    assert [layouts[k]["view_width"] for k in ("full", "fragmented", "sparse")] == [32, 32, None]
    assert [layouts[k]["rows"] for k in ("full", "fragmented", "sparse")] == [32, 24, 6]
    for name, row in layouts.items():
        assert row["gather_ms"] > 0 and row["view_ms"] > 0, name
        assert row["max_abs_logit_diff"] <= 1e-4, name
