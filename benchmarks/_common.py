"""Shared by the benchmark scripts: result writing, percentiles, repo on sys.path."""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# FLYWHEEL_BENCH_RESULTS redirects the result files (the smoke tests write to a temporary dir)
RESULTS = Path(os.environ.get("FLYWHEEL_BENCH_RESULTS") or ROOT / "benchmarks" / "results")
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile, q in [0, 100]."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[k]


def median(values: list[float]) -> float:
    return statistics.median(values)


def write_result(name: str, data: dict) -> None:
    """Write benchmarks/results/NAME.json and print the object as the last line."""
    data = {"benchmark": name, "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()}, **data}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(data, indent=2) + "\n")
    print(json.dumps(data))
