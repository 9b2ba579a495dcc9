"""Smoke run of benchmarks/grpo_step.py --quick (seconds): both arms train, and the sorted
micro-batches pad less than index order on the same rollouts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.benchmark_smoke, pytest.mark.timeout(180)]


def test_grpo_step_quick_times_both_arms(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "grpo_step.py"), "--quick"], cwd=ROOT,
                          capture_output=True, text=True, timeout=170,
                          env={**os.environ, "FLYWHEEL_BENCH_RESULTS": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "grpo_step_quick.json").read_text())
    assert result["config"]["rows"] == 24
    assert all(v > 0 for v in result["seconds_per_update"].values())
    pad = result["pad_share"]
    assert 0.0 <= pad["sorted"] < pad["index_order"] < 1.0
