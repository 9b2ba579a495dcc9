"""Every benchmark answers ``--help`` with its usage (and runs nothing), and a ``--quick``
run never overwrites a committed result (``benchmarks/_common.py``)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
SCRIPTS = sorted(p for p in BENCH.glob("*.py") if not p.name.startswith("_"))


def common() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_common_under_test", BENCH / "_common.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("script", [p.name for p in SCRIPTS])
def test_each_benchmark_parses_its_command_line(script: str) -> None:
    source = (BENCH / script).read_text()
    assert "ArgumentParser(" in source or "simple_cli(" in source


@pytest.mark.timeout(600)
def test_help_prints_usage_and_writes_nothing(tmp_path: Path) -> None:
    scripts = SCRIPTS
    committed = {p.name: p.stat().st_mtime_ns for p in (BENCH / "results").rglob("*.json")}
    env = {**os.environ, "FLYWHEEL_BENCH_RESULTS": str(tmp_path / "results"), "OMP_NUM_THREADS": "1"}

    def run(script: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["nice", "-n", "19", sys.executable, str(script), "--help"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=300)

    with ThreadPoolExecutor(max_workers=3) as pool:
        done = dict(zip([s.name for s in scripts], pool.map(run, scripts), strict=True))
    for name, r in done.items():
        assert r.returncode == 0, (name, r.stderr[-2000:])
        assert r.stdout.startswith("usage:"), (name, r.stdout[:300])
        assert "Traceback" not in r.stderr, (name, r.stderr[-2000:])
    assert not (tmp_path / "results").exists()  # nothing ran
    assert {p.name: p.stat().st_mtime_ns for p in (BENCH / "results").rglob("*.json")} == committed


def test_a_quick_run_writes_name_quick(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    c = common()
    monkeypatch.setattr(c, "RESULTS", tmp_path)
    monkeypatch.setattr(c, "REDIRECTED", False)  # as in benchmarks/results: the committed directory
    assert c.write_result("bench", {"x": 1}) == tmp_path / "bench.json"
    assert c.write_result("bench", {"x": 2}, quick=True) == tmp_path / "bench_quick.json"
    assert c.write_result("bench", {"x": 3, "quick": True}) == tmp_path / "bench_quick.json"
    monkeypatch.setattr(sys, "argv", ["bench.py", "--quick"])
    assert c.write_result("bench", {"x": 4}) == tmp_path / "bench_quick.json"
    assert c.write_result("bench_quick", {"x": 5}) == tmp_path / "bench_quick.json"  # not bench_quick_quick
    assert c.write_result("quantize_gpu_quick", {}) == tmp_path / "quantize_gpu_quick.json"
    assert json.loads((tmp_path / "bench.json").read_text())["x"] == 1  # the full result is untouched
    quick = json.loads((tmp_path / "bench_quick.json").read_text())
    assert quick["x"] == 5 and quick["benchmark"] == "bench_quick"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.json", "bench_quick.json", "quantize_gpu_quick.json"]
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(last)["benchmark"] == "quantize_gpu_quick"


def test_simple_cli_gives_help_and_refuses_options(capsys: pytest.CaptureFixture[str]) -> None:
    c = common()
    with pytest.raises(SystemExit) as info:
        c.simple_cli("Measures things.\n\nDetails.", ["--help"])
    assert info.value.code == 0 and "Measures things." in capsys.readouterr().out
    with pytest.raises(SystemExit) as info:
        c.simple_cli("Measures things.", ["--bogus"])
    assert info.value.code == 2
    assert c.simple_cli("x", []) is not None
