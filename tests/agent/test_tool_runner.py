"""agent.tool_runner: one call at a time, through the session's validator and executor."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from agent.runtime import SessionParts
from agent.tool_runner import ToolRunner, raw_params
from tools.base import ParamSpec, ParamType, Resources, ToolContext, ToolResult, ToolSpec
from tools.workspace import WorkspaceStore


def test_raw_params_write_json_as_a_model_would() -> None:
    assert raw_params({"s": " a ", "b": True, "f": False, "i": 3, "x": 2.5, "l": [1, "é"], "n": None}) == (
        ("s", " a "), ("b", "true"), ("f", "false"), ("i", "3"), ("x", "2.5"), ("l", '[1, "é"]'))


@pytest.fixture
def workspace(tmp_path: Path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("one\n")
    ws = WorkspaceStore(tmp_path / "store").from_dir(src)
    yield ws
    ws.delete()


class Slow:
    """A tool that takes ``ms`` and records when it ran; it writes ``path`` (so calls on one path conflict)."""

    spec = ToolSpec("slow", "sleeps", (ParamSpec("path", ParamType.STRING, "p"), ParamSpec("ms", ParamType.INTEGER, "ms")))

    def __init__(self) -> None:
        self.spans: list[tuple[str, float, float]] = []

    def resources(self, args: Mapping[str, Any]) -> Resources:
        return Resources(writes=frozenset({args["path"]}))

    async def run(self, args: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        t0 = time.monotonic()
        await asyncio.sleep(args["ms"] / 1000)
        self.spans.append((args["path"], t0, time.monotonic()))
        return ToolResult(True, f"slept on {args['path']}")


async def test_results_are_the_executors_and_bad_calls_read_as_the_model_reads_them(workspace) -> None:
    runner = ToolRunner(SessionParts(workspace))
    assert [s.name for s in runner.specs] == ["read_file", "list_dir", "glob", "grep", "edit_file", "write_file"]
    assert (await runner.call("read_file", {"path": "a.txt"})).output == "    1\tone\n"
    missing = await runner.call("read_file", {})
    assert not missing.ok and missing.output.startswith("invalid call to read_file: missing required parameter(s): path")
    assert "run_command" in (await runner.call("run_command", {"command": "ls"})).output  # unknown: no sandbox
    host = await runner.call("read_file", {"path": "nope.txt"})
    assert not host.ok and str(workspace.root) not in host.output  # host paths scrubbed, as in a session


async def test_conflicting_calls_keep_their_order_and_others_run_at_once(workspace) -> None:
    slow = Slow()
    runner = ToolRunner(SessionParts(workspace, extra_tools=(slow,)))
    await asyncio.gather(runner.call("slow", {"path": "x", "ms": 300}), runner.call("slow", {"path": "x", "ms": 10}),
                         runner.call("slow", {"path": "y", "ms": 10}))
    spans = {(p, round(e - s, 1)): (s, e) for p, s, e in slow.spans}
    first_x, second_x = sorted((v for k, v in spans.items() if k[0] == "x"), key=lambda v: v[0])
    assert second_x[0] >= first_x[1]  # the second call on x waited for the first
    (y,) = [v for k, v in spans.items() if k[0] == "y"]
    assert y[1] < first_x[1]  # y did not wait


async def test_cancelling_the_caller_cancels_the_tool(workspace) -> None:
    slow = Slow()
    runner = ToolRunner(SessionParts(workspace, extra_tools=(slow,)))
    task = asyncio.create_task(runner.call("slow", {"path": "x", "ms": 5000}))
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert slow.spans == [] and runner._running == []
