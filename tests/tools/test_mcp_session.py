"""External MCP tools inside a real Session (built by agent.runtime.build_session): in the
prompt, validated like built-in tools, run in parallel, approved as commands, recorded as
events; a server that is slow or gone gives the model an error result and the turn ends."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from agent.approval import ApprovalDecision, ApprovalRequest
from agent.events import ApprovalRequested, ListSink, ToolCallQueued, ToolCallStarted, ToolResultEvent, TurnEnd
from agent.parser import encode_call as call
from agent.policies.scripted import ScriptedPolicy
from agent.prompt import render_prompt
from agent.runtime import SessionParts, build_session
from tools.mcp_client import McpServerConfig, McpToolset, connect_mcp_servers
from tools.workspace import WorkspaceStore

SERVERS = Path(__file__).with_name("mcp_servers")
pytestmark = pytest.mark.timeout(240)  # the servers start in seconds; far slower on a loaded machine


@pytest.fixture
def workspace(tmp_path: Path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "notes.txt").write_text("one\n")
    ws = WorkspaceStore(tmp_path / "store").from_dir(src)
    yield ws
    ws.delete()


async def tiny(**kw: object) -> McpToolset:
    kw.setdefault("connect_timeout_s", 90.0)  # slow to start only on a loaded machine
    return await connect_mcp_servers([McpServerConfig("tiny", command=sys.executable,
                                                      args=(str(SERVERS / "tiny.py"),), **kw)])  # type: ignore[arg-type]


async def run(workspace, toolset: McpToolset, outputs: list[str], **kw: object) -> tuple[ListSink, object]:
    sink = ListSink()
    policy = ScriptedPolicy(outputs)
    session = build_session(SessionParts(workspace, extra_tools=tuple(toolset.tools)), policy=policy, sink=sink,
                            **kw)  # type: ignore[arg-type]
    outcome = await session.run_turn("use the tools")
    return sink, (outcome, policy, session)


def results(sink: ListSink) -> dict[str, ToolResultEvent]:
    """Results by call id, in call order (events come in the order calls finish)."""
    return dict(sorted((e.call_id, e) for e in sink.events if isinstance(e, ToolResultEvent)))


async def test_the_scripted_policy_calls_external_tools_like_built_in_ones(workspace) -> None:
    async with await tiny() as toolset:
        outputs = [call("mcp__tiny__add", {"a": "2", "b": "3"})
                   + call("mcp__tiny__echo", {"text": "hi", "tags": '["a", "b"]'})
                   + call("read_file", {"path": "notes.txt"}), "done"]
        sink, (outcome, policy, session) = await run(workspace, toolset, outputs)
        assert outcome.reason == "completed"
        prompt = session.conversation  # the model's second call saw the results in call order
        started = [e for e in sink.events if isinstance(e, ToolCallStarted)]
        assert [(e.name, e.args, e.valid) for e in started] == [
            ("mcp__tiny__add", {"a": 2, "b": 3}, True), ("mcp__tiny__echo", {"text": "hi", "tags": ["a", "b"]}, True),
            ("read_file", {"path": "notes.txt"}, True)]
        got = results(sink)
        assert [(r.name, r.ok, r.output) for r in got.values()] == [
            ("mcp__tiny__add", True, "5"), ("mcp__tiny__echo", True, "hi a,b"), ("read_file", True, "    1\tone\n")]
        assert got["t1s1c0"].data["mcp_server"] == "tiny"
        assert '<tool_result name="mcp__tiny__add" index="0" status="ok">\n5\n</tool_result>' in prompt[2].content
        system = render_prompt([], session.specs).messages[0]["content"]
        assert "## mcp__tiny__add\nAdd two integers.\nParameters:\n- a (integer, required): A" in system
        assert "- tags (json, optional, default None): Tags Schema:" in system


async def test_invalid_calls_are_rejected_before_the_server_sees_them(workspace) -> None:
    async with await tiny() as toolset:
        outputs = [call("mcp__tiny__add", {"a": "two", "b": "3"}) + call("mcp__tiny__echo", {"text": "x",
                                                                                           "tags": "[1, 2]"})
                   + call("mcp__tiny__echo", {"text": "x", "tags": "not json"}) + call("mcp__tiny__nope", {}), "ok"]
        sink, _ = await run(workspace, toolset, outputs)
        got = list(results(sink).values())
        assert all(not r.ok for r in got)
        assert "parameter 'a' must be an integer, got 'two'" in got[0].output
        assert "parameter 'tags'[0]: 1 is not of type 'string'" in got[1].output
        assert "parameter 'tags' must be JSON" in got[2].output
        assert got[3].output.startswith("unknown tool 'mcp__tiny__nope'; available tools: ")
        assert "expected form:\n<tool_call name=\"mcp__tiny__add\">" in got[0].output


async def test_external_calls_run_in_parallel_and_are_not_ordered_behind_edits(workspace) -> None:
    async with await tiny() as toolset:
        outputs = [call("write_file", {"path": "notes.txt", "content": "two\n"})
                   + call("mcp__tiny__slow", {"seconds": "1"}) + call("mcp__tiny__slow", {"seconds": "1"})
                   + call("mcp__tiny__slow", {"seconds": "1"}), "ok"]
        t0 = time.monotonic()
        sink, (outcome, _, _) = await run(workspace, toolset, outputs)
        took = time.monotonic() - t0
        assert outcome.reason == "completed" and all(r.ok for r in results(sink).values())
        assert not [e for e in sink.events if isinstance(e, ToolCallQueued)]  # nothing waited for the edit
        assert took < 2.9, f"three 1 s calls took {took:.1f} s: not parallel"


async def test_a_server_that_writes_the_workspace_is_ordered_like_a_command(workspace) -> None:
    async with await tiny(writes_workspace=True) as toolset:
        outputs = [call("write_file", {"path": "notes.txt", "content": "two\n"})
                   + call("mcp__tiny__add", {"a": "1", "b": "1"}), "ok"]
        sink, _ = await run(workspace, toolset, outputs)
        queued = [e for e in sink.events if isinstance(e, ToolCallQueued)]
        assert [(e.call_id, e.waiting_for) for e in queued] == [("t1s1c1", ["t1s1c0"])]


class Refuse:
    def __init__(self) -> None:
        self.asked: list[ApprovalRequest] = []

    async def decide(self, request: ApprovalRequest) -> ApprovalDecision:
        self.asked.append(request)
        return ApprovalDecision(False, "not now")


async def test_external_calls_are_asked_about_like_commands(workspace) -> None:
    async with await tiny() as toolset:
        approver = Refuse()
        sink, _ = await run(workspace, toolset, [call("mcp__tiny__add", {"a": "1", "b": "1"}), "ok"],
                            approval_mode="ask-commands", approver=approver)
        assert [(r.name, r.kind) for r in approver.asked] == [("mcp__tiny__add", "command")]
        assert [e.kind for e in sink.events if isinstance(e, ApprovalRequested)] == ["command"]
        (refused,) = results(sink).values()
        assert not refused.ok and "not now" in refused.output


@pytest.mark.timeout(200)
async def test_a_slow_or_dead_server_gives_error_results_and_the_turn_ends(workspace) -> None:
    async with await tiny(call_timeout_s=1.0) as toolset:
        outputs = [call("mcp__tiny__slow", {"seconds": "30"}) + call("read_file", {"path": "notes.txt"}),
                   call("mcp__tiny__die", {}), "I could not use the tool."]
        t0 = time.monotonic()
        sink, (outcome, _, _) = await run(workspace, toolset, outputs)
        assert time.monotonic() - t0 < 10
        assert outcome.reason == "completed"
        got = results(sink)
        assert not got["t1s1c0"].ok and "did not answer the call to 'slow' within 1 s" in got["t1s1c0"].output
        assert got["t1s1c1"].ok  # the built-in call beside it was not held up
        assert not got["t1s2c0"].ok and "MCP server 'tiny'" in got["t1s2c0"].output
        assert [e.reason for e in sink.events if isinstance(e, TurnEnd)] == ["completed"]
