"""benchmarks/workspace_fork.py --quick: runs end to end, writes only the _quick result, leaves no mounts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tools.overlay import overlay_unavailable

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_quick_run(tmp_path: Path) -> None:
    results = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "workspace_fork.py"), "--quick", "--scales", "300,600",
         "--dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=280,
        env={**os.environ, "FLYWHEEL_BENCH_RESULTS": str(results), "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["benchmark"] == "workspace_fork_quick" and result["quick"] is True
    assert sorted(p.name for p in results.iterdir()) == ["workspace_fork_quick.json"]
    for n in ("300", "600"):
        scale = result["scales"][n]
        assert scale["tree"]["files"] == int(n) and scale["shown_files"] == scale["tree"]["source_files"] + 1
        assert scale["fork_ms"]["p50"] > 0 and scale["full_copy_cp_ms"] >= 0
        if overlay_unavailable(tmp_path) is None:
            assert scale["layering"] == "overlay"
    assert "targets" not in result  # only a run with 100k files checks them
    with open("/proc/mounts") as f:
        assert str(tmp_path) not in f.read()
