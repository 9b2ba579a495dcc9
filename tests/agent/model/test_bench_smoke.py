"""benchmarks/moe_train.py --quick runs end to end and writes its result file (~10 s)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.timeout(90)
def test_moe_train_quick(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "moe_train.py"), "--quick"], cwd=ROOT,
                          capture_output=True, text=True, timeout=85,
                          env={**os.environ, "FLYWHEEL_BENCH_RESULTS": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "moe_train.json").read_text())
    assert result["quick"] and result["throughput"][0]["tokens_per_s"] > 0
    if "parity" in result:
        assert result["parity"]["fp32"]["curve"] and result["parity"]["mxfp8"]["curve"]
