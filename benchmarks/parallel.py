"""Executor parallelism and per-call overhead.

1. Eight independent calls that each take 100 ms, run through the executor
   concurrently vs one after another (target: ≥ 5× faster).
2. Per-call overhead of the executor for a small ``read_file``: for each call,
   the time from submit to outcome minus that call's own tool run time,
   p50/p99; the direct ``run`` time is reported beside it (interleaved).
3. Three independent ``run_command`` calls of ``sleep 1`` in one step, through
   the real executor and the real bubblewrap sandbox, vs the same three in
   three steps (target: ≥ 2.5× faster). Skipped (null) without bubblewrap.

Usage: python benchmarks/parallel.py [--quick]   (--quick: fewer rounds, written to
results/parallel_quick.json)
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from _common import median, percentile, write_result

from agent.calls import ToolCall
from agent.executor import Executor
from tools.base import ParamSpec, ParamType, Resources, ToolContext, ToolResult, ToolSpec
from tools.read_file import ReadFile
from tools.run_command import RunCommand
from tools.sandbox import BubblewrapSandbox, probe_bwrap
from tools.workspace import WorkspaceStore


class Wait100:
    """A call that takes 100 ms and touches only its own key."""

    spec = ToolSpec("wait", "sleeps 100 ms", (ParamSpec("key", ParamType.STRING, "resource"),))

    def resources(self, args: Mapping[str, Any]) -> Resources:
        return Resources(reads=frozenset({args["key"]}))

    async def run(self, args: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        await asyncio.sleep(0.1)
        return ToolResult(True, args["key"])


async def parallel_vs_sequential(rounds: int = 5) -> dict[str, float]:
    tools = {"wait": Wait100()}
    ctx = ToolContext(workspace=None)
    par, seq = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        ex = Executor(tools, ctx)
        for i in range(8):
            ex.submit(ToolCall(i, f"c{i}", "wait", {"key": f"k{i}"}))
        await ex.results()
        par.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for i in range(8):
            ex = Executor(tools, ctx)
            ex.submit(ToolCall(i, f"c{i}", "wait", {"key": f"k{i}"}))
            await ex.results()
        seq.append(time.perf_counter() - t0)
    return {"parallel_s": median(par), "sequential_s": median(seq), "speedup": median(seq) / median(par)}


async def read_file_overhead(n: int = 500) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        (src / "small.py").write_text("".join(f"line {i}\n" for i in range(40)))
        store = WorkspaceStore(Path(tmp) / "store")
        ws = store.from_dir(src)
        ctx = ToolContext(workspace=ws)
        tool = ReadFile()
        args = {"path": "small.py"}
        direct, through, overhead = [], [], []
        for i in range(n):
            t0 = time.perf_counter()
            await tool.run(args, ctx)
            direct.append((time.perf_counter() - t0) * 1e3)
            t0 = time.perf_counter()
            ex = Executor({"read_file": tool}, ctx)
            ex.submit(ToolCall(0, f"c{i}", "read_file", args))
            [outcome] = await ex.results()
            total = (time.perf_counter() - t0) * 1e3
            through.append(total)
            overhead.append(total - outcome.duration_ms)  # same call: total minus the tool's own time
        ws.close()
    return {
        "direct_p50_ms": median(direct), "direct_p99_ms": percentile(direct, 99),
        "executor_p50_ms": median(through), "executor_p99_ms": percentile(through, 99),
        "overhead_p50_ms": median(overhead), "overhead_p99_ms": percentile(overhead, 99),
        "n": n,
    }


async def three_sleep_commands(rounds: int = 3) -> dict[str, float] | None:
    if probe_bwrap() is not None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        ws = WorkspaceStore(Path(tmp) / "store").from_dir(src)
        ctx = ToolContext(workspace=ws, sandbox=BubblewrapSandbox())
        tools = {"run_command": RunCommand()}
        call = {"command": "sleep 1"}
        par, seq = [], []
        for _ in range(rounds):
            t0 = time.perf_counter()
            ex = Executor(tools, ctx)
            for i in range(3):
                ex.submit(ToolCall(i, f"c{i}", "run_command", call))
            assert all(o.result.ok for o in await ex.results())
            par.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            for i in range(3):
                ex = Executor(tools, ctx)
                ex.submit(ToolCall(i, f"c{i}", "run_command", call))
                assert all(o.result.ok for o in await ex.results())
            seq.append(time.perf_counter() - t0)
        ws.close()
    return {"parallel_s": median(par), "sequential_s": median(seq), "speedup": median(seq) / median(par)}


async def amain(quick: bool = False) -> None:
    result: dict[str, Any] = {"eight_100ms_calls": await parallel_vs_sequential(2 if quick else 5)}
    result["read_file_overhead"] = await read_file_overhead(100 if quick else 500)
    result["three_sleep_1_commands"] = await three_sleep_commands(1 if quick else 3)
    result["targets"] = {"speedup_min": 5.0, "commands_speedup_min": 2.5}
    commands = result["three_sleep_1_commands"]
    result["pass"] = result["eight_100ms_calls"]["speedup"] >= 5.0 and (
        commands is None or commands["speedup"] >= 2.5
    )
    write_result("parallel", result, quick=quick)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run; writes parallel_quick.json)")
    asyncio.run(amain(ap.parse_args().quick))
