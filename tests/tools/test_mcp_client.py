"""tools.mcp_client against real MCP servers over stdio: a tiny one on the official SDK
(tests/tools/mcp_servers/tiny.py) and a misbehaving one on raw JSON-RPC (broken.py).
Every failure must come back as a clear ToolError, in bounded time."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from tools.base import ParamType, ToolContext, ToolError
from tools.mcp_client import McpConfigError, McpServerConfig, McpTool, McpToolset, connect_mcp_servers

SERVERS = Path(__file__).with_name("mcp_servers")
pytestmark = pytest.mark.timeout(240)  # the servers start in seconds; far slower on a loaded machine
CTX = ToolContext(workspace=None)  # type: ignore[arg-type]  # external tools never touch it


SLOW_START = 90.0  # a Python server starts in ~2 s, but far slower on a loaded machine; the tests are not about that


def tiny(**kw: object) -> McpServerConfig:
    kw.setdefault("connect_timeout_s", SLOW_START)
    return McpServerConfig("tiny", command=sys.executable, args=(str(SERVERS / "tiny.py"),), **kw)  # type: ignore[arg-type]


def broken(**kw: object) -> McpServerConfig:
    kw.setdefault("connect_timeout_s", SLOW_START)
    return McpServerConfig("broken", command=sys.executable, args=(str(SERVERS / "broken.py"),), **kw)  # type: ignore[arg-type]


def by_remote(toolset: McpToolset) -> dict[str, McpTool]:
    return {t.remote_name: t for t in toolset.tools}


async def test_tools_become_specs_named_by_server() -> None:
    async with await connect_mcp_servers([tiny()]) as toolset:
        assert toolset.failures == {} and toolset.skipped == {}
        tools = by_remote(toolset)
        assert set(tools) == {"add", "echo", "slow", "picture", "fail", "die", "big", "counter"}
        add = tools["add"].spec
        assert add.name == "mcp__tiny__add" and add.description == "Add two integers."
        assert [(p.name, p.type, p.required) for p in add.params] == [("a", ParamType.INTEGER, True),
                                                                       ("b", ParamType.INTEGER, True)]
        tags = tools["echo"].spec.param("tags")
        assert tags is not None and tags.type is ParamType.JSON and not tags.required and tags.schema
        assert tools["slow"].spec.params[0].type is ParamType.NUMBER
        assert toolset.describe() == [{"name": "tiny", "transport": "stdio", "command": sys.executable,
                                       "args": [str(SERVERS / "tiny.py")], "writes_workspace": False,
                                       "tools": [t.spec.name for t in toolset.tools]}]


async def test_calls_return_text_error_results_and_named_images() -> None:
    async with await connect_mcp_servers([tiny()]) as toolset:
        tools = by_remote(toolset)
        added = await tools["add"].run({"a": 2, "b": 40}, CTX)
        assert (added.ok, added.output) == (True, "42") and added.data["structured"] == {"result": 42}
        echoed = await tools["echo"].run({"text": "hi", "tags": ["x", "y"]}, CTX)
        assert echoed.output == "hi x,y"
        failed = await tools["fail"].run({"why": "because"}, CTX)
        assert not failed.ok and "failing on purpose: because" in failed.output
        picture = await tools["picture"].run({}, CTX)
        assert picture.ok and picture.output.startswith("[image image/png,") and "not shown" in picture.output


async def test_arguments_are_checked_against_the_whole_schema_before_sending() -> None:
    async with await connect_mcp_servers([tiny()]) as toolset:
        with pytest.raises(ToolError, match="invalid call to mcp__tiny__add: 'b' is a required property"):
            await by_remote(toolset)["add"].run({"a": 1}, CTX)


@pytest.mark.timeout(200)
async def test_a_slow_call_times_out_and_the_server_still_answers() -> None:
    async with await connect_mcp_servers([tiny(call_timeout_s=1.0)]) as toolset:
        tools = by_remote(toolset)
        t0 = time.monotonic()
        with pytest.raises(ToolError, match=r"did not answer the call to 'slow' within 1 s"):
            await tools["slow"].run({"seconds": 30}, CTX)
        assert time.monotonic() - t0 < 5
        assert (await tools["add"].run({"a": 1, "b": 1}, CTX)).output == "2"


@pytest.mark.timeout(200)
async def test_a_server_that_exits_is_an_error_quoting_its_stderr_then_it_is_started_again() -> None:
    async with await connect_mcp_servers([tiny(call_timeout_s=10.0)]) as toolset:
        tools = by_remote(toolset)
        with pytest.raises(ToolError) as died:
            await tools["die"].run({}, CTX)
        assert "MCP server 'tiny' is not reachable" in str(died.value)
        assert "tiny: exiting on request" in str(died.value)
        assert (await tools["add"].run({"a": 3, "b": 4}, CTX)).output == "7"  # a fresh process


@pytest.mark.timeout(200)
async def test_servers_that_cannot_start_are_left_out_with_the_reason() -> None:
    silent = McpServerConfig("silent", command=sys.executable, args=("-c", "import time; time.sleep(60)"),
                             connect_timeout_s=1.0)
    quits = McpServerConfig("quits", command=sys.executable,
                            args=("-c", "import sys; print('no config here', file=sys.stderr); sys.exit(2)"),
                            connect_timeout_s=SLOW_START)
    missing = McpServerConfig("missing", command="/nonexistent/mcp-server")
    t0 = time.monotonic()
    async with await connect_mcp_servers([silent, quits, missing, tiny()]) as toolset:
        assert time.monotonic() - t0 < SLOW_START + 10  # bounded by the connect timeouts, not hung
        assert set(toolset.failures) == {"silent", "quits", "missing"}
        assert "no answer in time" in toolset.failures["silent"]
        assert "no config here" in toolset.failures["quits"]
        assert "No such file or directory" in toolset.failures["missing"]
        assert {t.server for t in toolset.tools} == {"tiny"}


@pytest.mark.timeout(200)
async def test_a_misbehaving_server_gives_clear_errors_never_a_hang() -> None:
    async with await connect_mcp_servers([broken(call_timeout_s=1.5)]) as toolset:
        assert set(toolset.skipped) == {"mcp__broken__bad_schema"}
        assert "not a valid JSON Schema" in toolset.skipped["mcp__broken__bad_schema"]
        tools = by_remote(toolset)
        assert (await tools["ok"].run({"x": "1"}, CTX)).output == "fine 1"
        for name in ("hang", "garbage"):
            with pytest.raises(ToolError, match=rf"did not answer the call to '{name}' within 1.5 s"):
                await tools[name].run({}, CTX)
        with pytest.raises(ToolError, match="returned a malformed result for 'bad_result'"):
            await tools["bad_result"].run({}, CTX)
        with pytest.raises(ToolError) as crashed:
            await tools["crash"].run({}, CTX)
        assert "broken: crashing" in str(crashed.value)


async def test_a_malformed_tool_list_leaves_the_server_out() -> None:
    bad = McpServerConfig("bad", command=sys.executable, args=(str(SERVERS / "broken.py"), "--bad-list"),
                          connect_timeout_s=SLOW_START)
    async with await connect_mcp_servers([bad]) as toolset:
        assert toolset.tools == []
        assert toolset.failures["bad"].startswith("malformed answer from the server (ListToolsResult: "
                                                  "tools.0.inputSchema.properties:")


async def test_one_name_twice_is_refused() -> None:
    with pytest.raises(McpConfigError, match="given twice: tiny"):
        await connect_mcp_servers([tiny(), tiny()])
