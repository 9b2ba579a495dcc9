"""What MCP adds to a tool call, both ways.

Serving (``flywheel mcp``): ``read_file`` and ``grep`` on a small project, called
(a) in-process through :class:`agent.tool_runner.ToolRunner` (the session's
validator and executor, no protocol), (b) over stdio and (c) over streamable HTTP
with the official ``mcp`` client against a ``flywheel mcp`` process. Calls are
interleaved (a, b, c, a, b, c, …) so machine drift hits all alike; the ratios
come from one run.

Using (``tools.mcp_client``): a trivial external tool (``add`` of
tests/tools/mcp_servers/tiny.py, on the SDK's MCPServer) called through
Flywheel's ``McpTool.run``, against a built-in tool of similar work (``list_dir``
of an empty directory) through the executor.

Prints one JSON object on its last line and writes ``benchmarks/results/mcp_call.json``
(``--quick``: fewer calls, ``mcp_call_quick.json``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from _common import ROOT, percentile, write_result

TINY = ROOT / "tests" / "tools" / "mcp_servers" / "tiny.py"
TOKEN = "bench-token-0123456789abcdef"


def summary(samples: list[float]) -> dict[str, float]:
    return {"p50_ms": round(percentile(samples, 50) * 1000, 3), "p99_ms": round(percentile(samples, 99) * 1000, 3),
            "n": len(samples)}


def make_project(root: Path) -> Path:
    (root / "src").mkdir(parents=True)
    for i in range(20):
        (root / "src" / f"mod{i}.py").write_text("".join(f"def f{j}(x):\n    return x + {j}\n\n" for j in range(50)))
    return root


async def timed(fn: Callable[[], Awaitable[object]]) -> float:
    t0 = time.perf_counter()
    await fn()
    return time.perf_counter() - t0


async def serving(calls: int, tmp: Path) -> dict[str, object]:
    from mcp import Client, StdioServerParameters
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    from agent.runtime import SessionParts
    from agent.tool_runner import ToolRunner
    from tools.workspace import WorkspaceStore

    project = make_project(tmp / "project")
    runner = ToolRunner(SessionParts(WorkspaceStore(tmp / "store").attach(project)))
    env = {"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    argv = [sys.executable, "-m", "backend.cli", "mcp", "--workspace", str(project), "--no-commands"]
    http = subprocess.Popen([*argv, "--transport", "http", "--port", "0", "--token", TOKEN], cwd=ROOT,
                            env={**os.environ, **env}, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert http.stderr is not None
        url = ""
        while not url:
            line = http.stderr.readline()
            if not line:
                raise SystemExit(f"flywheel mcp --transport http exited ({http.wait()})")
            if " at http://" in line:
                url = line.split(" at ", 1)[1].split(" ", 1)[0]
        stdio = StdioServerParameters(command=argv[0], args=argv[1:], cwd=str(ROOT), env=env)
        async with Client(stdio, mode="legacy") as over_stdio, \
                create_mcp_http_client(headers={"Authorization": f"Bearer {TOKEN}"}) as client, \
                Client(streamable_http_client(url, http_client=client), mode="legacy") as over_http:
            out: dict[str, object] = {}
            for name, args in (("read_file", {"path": "src/mod3.py", "start_line": 10, "end_line": 60}),
                               ("grep", {"pattern": "return x \\+ 4[0-9]", "path": "src"})):
                ways: dict[str, Callable[[], Awaitable[object]]] = {
                    "in_process": lambda: runner.call(name, args),  # noqa: B023
                    "stdio": lambda: over_stdio.call_tool(name, args),  # noqa: B023
                    "http": lambda: over_http.call_tool(name, args),  # noqa: B023
                }
                for fn in ways.values():  # warm up
                    await fn()
                samples: dict[str, list[float]] = {k: [] for k in ways}
                for _ in range(calls):
                    for way, fn in ways.items():
                        samples[way].append(await timed(fn))
                base = percentile(samples["in_process"], 50)
                out[name] = {**{k: summary(v) for k, v in samples.items()},
                             "stdio_over_in_process_p50": round(percentile(samples["stdio"], 50) / base, 2),
                             "http_over_in_process_p50": round(percentile(samples["http"], 50) / base, 2)}
            return out
    finally:
        http.terminate()
        http.wait(10)
        if http.stderr is not None:
            http.stderr.close()


async def using(calls: int, tmp: Path) -> dict[str, object]:
    from agent.runtime import SessionParts
    from agent.tool_runner import ToolRunner
    from tools.base import ToolContext
    from tools.mcp_client import McpServerConfig, connect_mcp_servers
    from tools.workspace import WorkspaceStore

    (tmp / "empty").mkdir()
    runner = ToolRunner(SessionParts(WorkspaceStore(tmp / "store2").attach(tmp / "empty")))
    async with await connect_mcp_servers([McpServerConfig("tiny", command=sys.executable,
                                                          args=(str(TINY),))]) as toolset:
        add = next(t for t in toolset.tools if t.remote_name == "add")
        ctx = ToolContext(workspace=None)  # type: ignore[arg-type]
        ways: dict[str, Callable[[], Awaitable[object]]] = {
            "built_in_list_dir": lambda: runner.call("list_dir", {}),
            "external_add_stdio": lambda: add.run({"a": 1, "b": 2}, ctx),
        }
        for fn in ways.values():
            await fn()
        samples: dict[str, list[float]] = {k: [] for k in ways}
        for _ in range(calls):
            for way, fn in ways.items():
                samples[way].append(await timed(fn))
    return {**{k: summary(v) for k, v in samples.items()},
            "external_over_built_in_p50": round(percentile(samples["external_add_stdio"], 50)
                                                / percentile(samples["built_in_list_dir"], 50), 2)}


async def main(quick: bool) -> dict[str, object]:
    calls = 20 if quick else 200
    with tempfile.TemporaryDirectory(prefix="fw-bench-mcp-") as tmp:
        return {"quick": quick, "calls_per_way": calls, "serving": await serving(calls, Path(tmp)),
                "using": await using(calls, Path(tmp))}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="20 calls per way instead of 200")
    args = parser.parse_args()
    write_result("mcp_call", asyncio.run(main(args.quick)), quick=args.quick)
