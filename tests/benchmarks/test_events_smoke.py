"""Smoke run of benchmarks/events.py with a small event count (a few seconds)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.benchmark_smoke, pytest.mark.timeout(60)]


def test_events_benchmark_stores_everything(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "events.py"), "--events", "1100"], cwd=ROOT,
                          capture_output=True, text=True, timeout=55,
                          env={**os.environ, "FLYWHEEL_BENCH_RESULTS": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (tmp_path / "events.json").exists()
    for key in ("writer_clean", "writer_one_unserialisable_per_512", "writer_one_refused_row_per_512"):
        assert result[key]["stored"] == 1100, key
    assert result["writer_one_refused_row_per_512"]["stand_ins"] == 2
