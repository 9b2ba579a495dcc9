"""Smoke runs of the server benchmarks' --quick modes (benchmarks/load.py and
benchmarks/crash.py): each starts a real ``flywheel serve`` process and must
pass its own checks. Together they take about 15 s; each is bounded at 60 s."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.benchmark_smoke, pytest.mark.timeout(60)]


def run_quick(script: str, results: Path, *args: str) -> dict:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--quick", "--timeout", "50", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=55,
        env={**os.environ, "FLYWHEEL_BENCH_RESULTS": str(results)},
    )
    lines = proc.stdout.strip().splitlines()
    assert lines, f"{script} printed nothing (rc {proc.returncode}):\n{proc.stderr[-3000:]}"
    result = json.loads(lines[-1])
    assert (results / f"{result['benchmark']}.json").exists()
    assert proc.returncode == 0, f"{script} failed:\n{lines[-1]}\n{proc.stderr[-3000:]}"
    return result


def test_load_quick(tmp_path: Path) -> None:
    r = run_quick("load.py", tmp_path)
    assert r["errors"] == 0, r["error_samples"]
    assert r["turns_completed"] == r["turns_expected"] == r["sessions"] * r["turns_per_session"]
    assert r["latency_ms"]["n"] == r["events_received"] > 0
    assert r["server_cpu_ms_per_event"] > 0
    assert r["server_rss_mb"]["peak"] > 0
    assert r["pass"]


def test_crash_quick(tmp_path: Path) -> None:
    r = run_quick("crash.py", tmp_path)
    assert r["lost"] == 0 and r["mismatched"] == 0, r["problem_samples"]
    assert r["events_checked"] == r["events_received"] > 0
    assert r["interrupted_marked_ok"] == r["resumed_ok"] == r["sessions"], r["problem_samples"]
    assert r["problems"] == 0, r["problem_samples"]
    assert r["pass"]
