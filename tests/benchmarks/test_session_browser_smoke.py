"""Smoke run of benchmarks/session_browser.py on a small SQLite database (a few seconds)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.benchmark_smoke, pytest.mark.timeout(120)]


def test_session_browser_benchmark_times_every_case(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "session_browser.py"), "--sessions", "600",
                           "--requests", "36", "--no-postgres"], cwd=ROOT, capture_output=True, text=True,
                          timeout=110, env={**os.environ, "FLYWHEEL_BENCH_RESULTS": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (tmp_path / "session_browser.json").exists()
    sqlite = result["sqlite"]
    assert sqlite["sessions"] == 600 and sqlite["list"]["n"] > 0 and sqlite["search"]["n"] > 0
    cases = sqlite["by_case"]
    assert {"list_first_page", "list_next_pages", "search_common", "search_rare", "search_prefix"} <= set(cases)
    assert cases["search_common"]["mean_hits"] > 0 and cases["list_next_pages"]["mean_hits"] == 50
    assert result["postgresql"].startswith("skipped")
