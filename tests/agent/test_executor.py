"""The executor: concurrency, per-resource ordering, call-order results, cancellation."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

import pytest

from agent.calls import CallRejected, ToolCall
from agent.executor import Executor
from tools.base import ParamSpec, ParamType, Resources, ToolContext, ToolError, ToolResult, ToolSpec, WHOLE_TREE


class Recorder:
    """A tool that sleeps and records when it ran: the counterpart under test."""

    def __init__(self, name: str, mode: str) -> None:
        self.spec = ToolSpec(name, "test", (ParamSpec("path", ParamType.STRING, "p"),
                                            ParamSpec("ms", ParamType.INTEGER, "sleep", required=False)))
        self.mode = mode
        self.log: list[tuple[str, str, float, float]] = []
        self.cancelled: list[str] = []

    def resources(self, args: Mapping[str, Any]) -> Resources:
        key = frozenset({WHOLE_TREE if args["path"] == "*" else args["path"]})
        return Resources(reads=key) if self.mode == "read" else Resources(writes=key)

    async def run(self, args: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        start = time.perf_counter()
        try:
            await asyncio.sleep(args.get("ms", 50) / 1000)
        except asyncio.CancelledError:
            self.cancelled.append(args["path"])
            raise
        if args["path"] == "boom":
            raise ToolError("boom happened")
        if args["path"] == "bug":
            raise KeyError("oops")
        self.log.append((self.spec.name, args["path"], start, time.perf_counter()))
        return ToolResult(True, f"{self.spec.name}:{args['path']}")


@pytest.fixture
def tools() -> dict[str, Recorder]:
    return {"r": Recorder("r", "read"), "w": Recorder("w", "write")}


def call(i: int, name: str, path: str, ms: int = 50) -> ToolCall:
    return ToolCall(i, f"c{i}", name, {"path": path, "ms": ms})


async def test_independent_calls_run_concurrently(tools) -> None:
    ex = Executor(tools, ToolContext(workspace=None))
    t0 = time.perf_counter()
    for i in range(8):
        ex.submit(call(i, "r", f"f{i}", 100))
    outcomes = await ex.results()
    elapsed = time.perf_counter() - t0
    assert [o.result.output for o in outcomes] == [f"r:f{i}" for i in range(8)]
    assert elapsed < 0.5, elapsed  # sequential would be >= 0.8 s


async def test_results_in_call_order_even_when_finishing_out_of_order(tools) -> None:
    ex = Executor(tools, ToolContext(workspace=None))
    ex.submit(call(0, "r", "slow", 150))
    ex.submit(call(1, "r", "fast", 1))
    outcomes = await ex.results()
    assert [o.call.index for o in outcomes] == [0, 1]
    assert outcomes[1].finished_at < outcomes[0].finished_at


async def test_write_then_read_of_same_path_is_serialised_in_call_order(tools) -> None:
    ex = Executor(tools, ToolContext(workspace=None))
    ex.submit(call(0, "w", "a.py", 80))
    ex.submit(call(1, "r", "a.py", 10))
    ex.submit(call(2, "r", "a.py", 10))
    ex.submit(call(3, "r", "b.py", 10))
    await ex.results()
    runs = {(n, p): (s, e) for n, p, s, e in tools["r"].log + tools["w"].log}
    write_end = runs[("w", "a.py")][1]
    assert all(s >= write_end for (n, p), (s, e) in runs.items() if n == "r" and p == "a.py")
    assert runs[("r", "b.py")][0] < write_end  # unrelated read did not wait


async def test_whole_tree_writer_waits_for_everything_and_blocks_later_calls(tools) -> None:
    ex = Executor(tools, ToolContext(workspace=None))
    ex.submit(call(0, "r", "x", 60))
    ex.submit(call(1, "w", "*", 30))
    ex.submit(call(2, "r", "y", 10))
    await ex.results()
    (_, _, r0s, r0e), (_, _, r2s, _) = sorted(tools["r"].log, key=lambda t: t[1])
    (_, _, ws, we) = tools["w"].log[0]
    assert ws >= r0e and r2s >= we


async def test_tool_errors_become_error_results(tools) -> None:
    ex = Executor(tools, ToolContext(workspace=None))
    ex.submit(call(0, "r", "boom", 1))
    ex.submit(call(1, "r", "bug", 1))
    ex.submit(CallRejected(2, "c2", "nope", "unknown tool 'nope'"))
    a, b, c = await ex.results()
    assert (a.result.ok, a.result.output) == (False, "boom happened")
    assert not b.result.ok and "internal error in r: KeyError" in b.result.output
    assert (c.result.ok, c.result.output) == (False, "unknown tool 'nope'")


async def test_cancel_stops_running_tools(tools) -> None:
    ex = Executor(tools, ToolContext(workspace=None))
    ex.submit(call(0, "r", "long", 5000))
    ex.submit(call(1, "r", "short", 1))
    await asyncio.sleep(0.05)
    t0 = time.perf_counter()
    await ex.cancel()
    assert time.perf_counter() - t0 < 1
    assert tools["r"].cancelled == ["long"]
    settled = ex.settled("cancelled")
    assert settled[0].result.output.startswith("cancelled (after running 0.") and not settled[0].finished
    assert settled[0].result.data["cancelled"] and 30 < settled[0].duration_ms < 1000
    assert settled[1].result.ok and settled[1].finished


async def test_a_finished_tool_is_not_reported_as_cancelled(tools) -> None:
    reported = []

    async def slow_sink(outcome) -> None:
        await asyncio.sleep(0.3)
        reported.append(outcome.call.index)

    ex = Executor(tools, ToolContext(workspace=None), on_result=slow_sink)
    ex.submit(call(0, "w", "done-fast", 1))
    ex.submit(call(1, "r", "slow", 5000))
    await asyncio.sleep(0.05)  # call 0 finished and is being reported; call 1 is running
    await ex.cancel()
    (c0, r0, fin0, _), (c1, r1, fin1, _) = ex.settled("cancelled")
    assert fin0 and r0.ok and reported == [0]
    assert not fin1 and r1.output.startswith("cancelled (after running")


async def test_complete_in_thread_finishes_a_write_despite_cancel(tmp_path) -> None:
    from tools.base import complete_in_thread

    target = tmp_path / "f.txt"

    def slow_write() -> str:
        time.sleep(0.3)
        target.write_text("written")
        return "ok"

    task = asyncio.create_task(complete_in_thread(slow_write))
    await asyncio.sleep(0.05)
    task.cancel()
    assert await task == "ok"  # the write is reported as done, not cancelled
    assert target.read_text() == "written"


class Hooks:
    """Records what the executor reports, in order; refuses the calls in ``refuse``."""

    def __init__(self, refuse: set[str] = frozenset()) -> None:
        self.log: list[tuple[str, str]] = []
        self.refuse = refuse

    async def approve(self, call, resources):
        self.log.append(("approve", call.call_id))
        return ToolResult.error("refused") if call.call_id in self.refuse else None

    async def queued(self, call, waiting_for):
        self.log.append(("queued", f"{call.call_id}<{','.join(waiting_for)}"))

    async def running(self, call):
        self.log.append(("running", call.call_id))

    def output(self, call, text):
        self.log.append(("output", call.call_id))

    async def finished(self, call):
        self.log.append(("finished", call.call_id))


async def test_hooks_see_approval_queue_start_and_finish_in_order(tools) -> None:
    hooks = Hooks(refuse={"c2"})
    reported: list[str] = []

    async def on_result(outcome) -> None:
        reported.append(outcome.call.call_id)
        hooks.log.append(("result", outcome.call.call_id))

    ex = Executor(tools, ToolContext(workspace=None), on_result=on_result, hooks=hooks)
    ex.submit(call(0, "w", "a", 80))
    ex.submit(call(1, "r", "a", 1))  # reads what call 0 writes: queued behind it
    ex.submit(call(2, "w", "a", 1))  # refused: does not wait and never runs
    ex.submit(CallRejected(3, "c3", "nope", "unknown tool"))  # invalid calls are not hooked
    outcomes = await ex.results()
    assert [o.result.output for o in outcomes] == ["w:a", "r:a", "refused", "unknown tool"]
    per = {cid: [k for k, c in hooks.log if c.split("<")[0] == cid] for cid in ("c0", "c1", "c2", "c3")}
    assert per["c0"] == ["approve", "running", "finished", "result"]
    assert per["c1"] == ["approve", "queued", "running", "finished", "result"]
    assert ("queued", "c1<c0") in hooks.log
    assert per["c2"] == ["approve", "finished", "result"] and per["c3"] == ["result"]
    assert hooks.log.index(("running", "c1")) > hooks.log.index(("finished", "c0"))
    assert [t for t in tools["w"].log if t[1] == "a"] and len(tools["w"].log) == 1  # c2 did not run


async def test_a_call_cancelled_while_queued_says_so(tools) -> None:
    ex = Executor(tools, ToolContext(workspace=None), hooks=Hooks())
    ex.submit(call(0, "w", "a", 5000))
    ex.submit(call(1, "r", "a", 1))
    await asyncio.sleep(0.05)
    await ex.cancel()
    first, second = ex.settled("cancelled: stop")
    assert first.result.output.startswith("cancelled: stop (after running 0.") and "no output so far" in \
        first.result.output
    assert second.result.output == "cancelled: stop (it had not started: it was waiting for earlier calls to finish)"
    assert second.duration_ms == 0 and second.result.data == {"cancelled": True, "waited_for": "queued"}
