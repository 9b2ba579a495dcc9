"""Overhead of a sandboxed ``true`` over a bare subprocess ``true``.

Runs are interleaved (bare, sandboxed, sandboxed-without-cgroups, repeat) so
that drift in machine load hits every variant alike. The bare baseline is an
asyncio subprocess; the sandboxed runs go through ``BubblewrapSandbox.run``
(launcher shell, cgroup create/join/remove, bwrap namespaces and the
allow-listed mounts, teardown, the after-command disk check of the empty
workspace). ``disk_check_5000_files`` times that disk check alone
(:func:`tools.disk_usage.tree_usage`) on a tree of 5000 small files in 50
directories, the cost each command adds per workspace of that size.

Prints one JSON object on the last line and writes it to
``benchmarks/results/sandbox.json`` (``--quick``: 5 runs each, written to
``sandbox_quick.json``). Usage: ``.venv/bin/python benchmarks/sandbox.py [--quick] [RUNS]``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import platform
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from _common import percentile, write_result

from tools.cgroups import CgroupV1
from tools.disk_usage import tree_usage
from tools.sandbox import BubblewrapSandbox, probe_bwrap


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def _summary(samples: list[float]) -> dict[str, float]:
    return {
        "p50_ms": _ms(percentile(samples, 50)),
        "p99_ms": _ms(percentile(samples, 99)),
        "mean_ms": _ms(statistics.fmean(samples)),
        "min_ms": _ms(min(samples)),
    }


async def _bare() -> None:
    proc = await asyncio.create_subprocess_exec(
        "true", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    if await proc.wait() != 0:
        raise RuntimeError("bare true failed")


async def _boxed(sandbox: BubblewrapSandbox, ws: Path) -> None:
    result = await sandbox.run("true", ws)
    if result.exit_code != 0:
        raise RuntimeError(f"sandboxed true failed: {result}")


async def main(runs: int) -> dict[str, object]:
    reason = probe_bwrap()
    if reason is not None:
        raise SystemExit(f"bubblewrap unusable: {reason}")
    with tempfile.TemporaryDirectory(prefix="fw-bench-") as tmp:
        ws = Path(tmp)
        full = BubblewrapSandbox()
        no_cg = BubblewrapSandbox(cgroups=CgroupV1.disabled())
        variants = {
            "bare": lambda: _bare(),
            "sandbox": lambda: _boxed(full, ws),
            "sandbox_no_cgroups": lambda: _boxed(no_cg, ws),
        }
        samples: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(3):  # warm-up: page cache, first-run costs
            for run in variants.values():
                await run()
        for _ in range(runs):
            for name, run in variants.items():
                t0 = time.perf_counter()
                await run()
                samples[name].append(time.perf_counter() - t0)
        enforced = (await full.run("true", ws)).enforced
        tree = Path(tmp) / "tree"
        for d in range(50):
            (tree / f"d{d}").mkdir(parents=True)
            for f in range(100):
                (tree / f"d{d}" / f"f{f}.py").write_text("x = 1\n")
        walks = []
        for _ in range(20):
            t0 = time.perf_counter()
            tree_usage(tree)
            walks.append(time.perf_counter() - t0)
    stats = {name: _summary(s) for name, s in samples.items()}
    return {
        "measures": "sandbox_overhead_true",
        "runs_each": runs,
        "bare": stats["bare"],
        "sandbox": stats["sandbox"],
        "sandbox_no_cgroups": stats["sandbox_no_cgroups"],
        "overhead_p50_ms": round(stats["sandbox"]["p50_ms"] - stats["bare"]["p50_ms"], 3),
        "overhead_p99_ms": round(stats["sandbox"]["p99_ms"] - stats["bare"]["p99_ms"], 3),
        "disk_check_5000_files": _summary(walks),
        "enforced": enforced,
        "host": {
            "kernel": platform.release(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        },
    }


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="?", type=int, help="runs of each variant (default 50; --quick: 5)")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 5 runs each, written to sandbox_quick.json")
    args = ap.parse_args()
    if args.runs is not None and args.runs < 1:
        ap.error("RUNS must be at least 1")
    logging.basicConfig(level=logging.ERROR)
    report = asyncio.run(main(args.runs or (5 if args.quick else 50)))
    write_result("sandbox", report, quick=args.quick)
