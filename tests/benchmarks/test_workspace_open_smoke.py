"""benchmarks/workspace_open.py --quick: a real server and flywheel run open a project in place, and its
ignored .venv is there for the session's commands; only the _quick result is written, no mounts left."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tools.overlay import overlay_unavailable

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(400)
def test_quick_run(tmp_path: Path) -> None:
    results = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "workspace_open.py"), "--quick", "--files", "600",
         "--dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=380,
        env={**os.environ, "FLYWHEEL_BENCH_RESULTS": str(results), "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["benchmark"] == "workspace_open_quick" and result["tree"]["files"] == 600
    assert sorted(p.name for p in results.iterdir()) == ["workspace_open_quick.json"]
    assert result["checks"] == {"command_sees_the_venv": True, "changes_ok": True}
    assert len(result["serve_in_place"]["create_session_ms"]["runs"]) == 2
    assert "targets" not in result  # only a run with 100k files checks them
    if overlay_unavailable(tmp_path) is None:
        assert result["overlay"] == "available"
    with open("/proc/mounts") as f:
        assert str(tmp_path) not in f.read()
