"""agent.recorded_tools: external tools in a replay answer from the recording."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from agent.events import ListSink, ToolResultEvent
from agent.parser import encode_call as call
from agent.policies.scripted import ScriptedPolicy
from agent.recorded_tools import RecordedTool, recorded_tools, spec_from_record, spec_record
from agent.runtime import SessionParts, build_session
from backend.replay import reexecute
from tools.base import ParamSpec, ParamType, Resources, ToolContext, ToolError, ToolResult, ToolSpec
from tools.workspace import WorkspaceStore

SPEC = ToolSpec("mcp__s__ask", "asks", (ParamSpec("q", ParamType.STRING, "question"),
                                        ParamSpec("opts", ParamType.JSON, "options", False, None, '{"type":"array"}')))


class Live:
    spec = SPEC

    def __init__(self) -> None:
        self.calls: list[Mapping[str, Any]] = []

    def resources(self, args: Mapping[str, Any]) -> Resources:
        return Resources(process_writes=frozenset({"mcp://s"}))

    async def run(self, args: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        self.calls.append(dict(args))
        return ToolResult(True, f"live answer {len(self.calls)} to {args['q']}")


def test_specs_survive_their_record() -> None:
    assert spec_from_record(spec_record(SPEC)) == SPEC
    with pytest.raises(ValueError, match="not a recorded tool spec"):
        spec_from_record({"name": "x"})


async def test_a_session_re_executes_with_recorded_answers_and_no_live_call(tmp_path) -> None:  # noqa: ANN001
    src = tmp_path / "src"
    src.mkdir()
    store = WorkspaceStore(tmp_path / "store")
    live = Live()
    outputs = [call("mcp__s__ask", {"q": "a"}) + call("mcp__s__ask", {"q": "b", "opts": "[1]"})
               + call("mcp__s__ask", {"q": "a"}), "done"]
    sink = ListSink()
    session = build_session(SessionParts(store.from_dir(src), extra_tools=(live,)), policy=ScriptedPolicy(outputs),
                            sink=sink)
    await session.run_turn("ask")
    assert len(live.calls) == 3
    tools = recorded_tools([spec_record(SPEC)], sink.events)
    report = await reexecute("s", sink.events, SessionParts(store.from_dir(src), extra_tools=tuple(tools)))
    assert report.counts == {"same": 0, "differs": 0, "missing": 0, "extra": 0, "recorded": 3}
    assert len(live.calls) == 3  # nothing was called again
    recorded = {e.call_id: e.output for e in sink.events if isinstance(e, ToolResultEvent)}
    assert recorded["t1s1c2"] == "live answer 3 to a"  # same arguments: answered in their recorded order


async def test_calls_the_recording_lacks_go_live_or_fail_clearly() -> None:
    tool = RecordedTool(SPEC, [])
    with pytest.raises(ToolError, match="a replay does not call it again"):
        await tool.run({"q": "new"}, ToolContext(workspace=None))  # type: ignore[arg-type]
    live = Live()
    assert (await RecordedTool(SPEC, [], live).run({"q": "new"}, ToolContext(workspace=None))).output == \
        "live answer 1 to new"  # type: ignore[arg-type]
    assert recorded_tools([{"bad": "record"}], []) == []
