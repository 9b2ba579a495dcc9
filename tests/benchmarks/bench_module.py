"""Benchmark scripts (``benchmarks/NAME.py``) under test: imported as a module, its siblings importable, or run as a subprocess."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def load_benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` loaded afresh (a new module object per call; not put in ``sys.modules``)."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(f"{name.lstrip('_')}_under_test", BENCH / f"{name}.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_benchmark(name: str, *args: str, results: Path, timeout: float) -> dict:
    """Run ``benchmarks/<name>.py args`` as a user would (a subprocess, results written under
    ``results``); returns the JSON result it wrote, ``<result name>.json`` taken from its last line."""
    import json
    import os
    import subprocess

    proc = subprocess.run([sys.executable, str(BENCH / f"{name}.py"), *args], cwd=BENCH.parent,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "FLYWHEEL_BENCH_RESULTS": str(results)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    written = json.loads(proc.stdout.strip().splitlines()[-1])["benchmark"]
    return json.loads((results / f"{written}.json").read_text())
