"""The Session loop end to end: real tools, real workspace, scripted or HTTP policy."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import pytest

from agent.events import (
    AssistantMessage,
    ErrorEvent,
    FileEditEvent,
    ListSink,
    ToolCallDelta,
    ToolCallStarted,
    ToolResultEvent,
    TurnEnd,
)
from agent.parser import encode_call as call
from agent.policies.openai_compat import OpenAICompatPolicy, OpenAIConfig
from agent.policies.scripted import ScriptedPolicy
from agent.session import Limits, Session
from tests.openai_server import ScriptedChatServer
from tools.registry import default_tools
from tools.sandbox import make_sandbox
from tools.workspace import WorkspaceStore

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")


@pytest.fixture
def workspace(tmp_path: Path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "app.py").write_text("def add(a, b):\n    return a - b\n")
    (src / "notes.md").write_text("# notes\n")
    ws = WorkspaceStore(tmp_path / "store").from_dir(src)
    yield ws
    ws.delete()


def session(workspace, outputs, sink=None, limits=Limits(), sandbox=None, **kw) -> Session:
    return Session(
        workspace=workspace, policy=ScriptedPolicy(outputs, **kw), tools=default_tools(),
        sink=sink or ListSink(), limits=limits, sandbox=sandbox,
    )


async def test_turn_reads_edits_and_ends_with_answer(workspace) -> None:
    sink = ListSink()
    s = session(workspace, [
        "Looking.\n" + call("read_file", {"path": "app.py"}) + call("read_file", {"path": "notes.md"}),
        "Fix:\n" + call("edit_file", {"path": "app.py", "search": "a - b", "replace": "a + b"}),
        "Fixed the sign.",
    ], sink)
    outcome = await s.run_turn("fix add")
    assert outcome.reason == "completed" and outcome.steps == 3 and outcome.final_text == "Fixed the sign."
    assert (workspace.root / "app.py").read_text() == "def add(a, b):\n    return a + b\n"
    seqs = [e.seq for e in sink.events]
    assert seqs == list(range(1, len(seqs) + 1))
    [edit] = sink.of_type(FileEditEvent)
    assert edit.path == "app.py" and "+    return a + b" in edit.diff
    assert isinstance(sink.events[-1], TurnEnd)
    # results of step 1 went back to the model in call order
    second_prompt = s.policy.prompts[1].messages[-1]["content"]
    assert second_prompt.index('index="0"') < second_prompt.index('index="1"')
    assert "return a - b" in second_prompt


async def test_malformed_calls_go_back_to_the_model_as_errors(workspace) -> None:
    sink = ListSink()
    s = session(workspace, [
        call("nope", {}) + call("read_file", {"paht": "x"}) + '<tool_call name="grep"><param name="pattern">x',
        "ok, giving up",
    ], sink)
    outcome = await s.run_turn("go")
    assert outcome.reason == "completed"
    results = sink.of_type(ToolResultEvent)
    assert [r.ok for r in results] == [False, False, False]
    feedback = s.policy.prompts[1].messages[-1]["content"]
    assert "unknown tool 'nope'" in feedback
    assert "unknown parameter 'paht'" in feedback and "missing required parameter(s): path" in feedback
    assert "unclosed" in feedback
    assert [e.valid for e in sink.of_type(ToolCallStarted)] == [False, False, False]


async def test_tool_starts_while_model_is_still_streaming(workspace) -> None:
    sink = ListSink()
    long_tail = " and more thinking" * 40
    s = session(workspace, [call("read_file", {"path": "app.py"}) + long_tail, "done"], sink,
                chunk_chars=8, delay_s=0.002)
    await s.run_turn("go")
    result = sink.of_type(ToolResultEvent)[0]
    message = sink.of_type(AssistantMessage)[0]
    assert result.seq < message.seq  # the result arrived before the model finished writing


async def test_partial_call_deltas_are_streamed(workspace) -> None:
    sink = ListSink()
    content = "line\n" * 50
    s = session(workspace, [call("write_file", {"path": "new.txt", "content": content}), "done"], sink,
                chunk_chars=16)
    await s.run_turn("write")
    deltas = [d for d in sink.of_type(ToolCallDelta) if d.param == "content"]
    assert len(deltas) > 5 and "".join(d.text for d in deltas) == content
    assert (workspace.root / "new.txt").read_text() == content


async def test_max_steps_limit(workspace) -> None:
    s = session(workspace, [call("list_dir", {})] * 5, limits=Limits(max_steps=3))
    outcome = await s.run_turn("loop")
    assert outcome.reason == "max_steps" and outcome.steps == 3


async def test_max_tokens_limit(workspace) -> None:
    s = session(workspace, ["x" * 4000, "never"], limits=Limits(max_output_tokens=100))
    outcome = await s.run_turn("talk")
    assert outcome.reason == "max_tokens"


async def test_wall_time_limit(workspace) -> None:
    s = session(workspace, ["slow " * 200], limits=Limits(max_wall_s=0.3), chunk_chars=1, delay_s=0.01)
    t0 = time.perf_counter()
    outcome = await s.run_turn("slow")
    assert outcome.reason == "timeout" and time.perf_counter() - t0 < 2


async def test_policy_failure_ends_turn_with_error_event(workspace) -> None:
    sink = ListSink()
    s = Session(workspace=workspace, tools=default_tools(), sink=sink,
                policy=OpenAICompatPolicy(OpenAIConfig(base_url="http://127.0.0.1:9/v1", connect_timeout_s=1)))
    outcome = await s.run_turn("hello")
    await s.policy.aclose()
    assert outcome.reason == "error"
    [err] = sink.of_type(ErrorEvent)
    assert err.source == "policy" and "cannot reach" in err.message


async def test_openai_policy_drives_the_same_loop(workspace) -> None:
    server = ScriptedChatServer([call("read_file", {"path": "app.py"}), "It subtracts."])
    sink = ListSink()
    with server.running():
        policy = OpenAICompatPolicy(OpenAIConfig(base_url=server.base_url))
        s = Session(workspace=workspace, policy=policy, tools=default_tools(), sink=sink)
        outcome = await s.run_turn("what does add do?")
        await policy.aclose()
    assert outcome.reason == "completed" and outcome.final_text == "It subtracts."
    assert sink.of_type(ToolResultEvent)[0].ok
    assert "return a - b" in server.requests[1]["body"]["messages"][-1]["content"]


@needs_bwrap
async def test_interrupt_kills_running_command_and_ends_turn(workspace) -> None:
    sink = ListSink()
    marker = f"fw-interrupt-{time.time_ns()}"
    s = session(workspace, [call("run_command", {"command": f"sleep 30; echo {marker} > done.txt"}), "never"],
                sink, sandbox=make_sandbox())
    task = asyncio.create_task(s.run_turn("run"))
    for _ in range(200):
        await asyncio.sleep(0.02)
        if sink.of_type(ToolCallStarted):
            break
    await asyncio.sleep(0.2)
    t0 = time.perf_counter()
    assert s.interrupt()
    outcome = await task
    assert outcome.reason == "interrupted" and time.perf_counter() - t0 < 5
    assert not (workspace.root / "done.txt").exists()
    proc = await asyncio.create_subprocess_exec("pgrep", "-f", marker, stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    assert out.strip() == b""
    assert "cancelled: the user interrupted the turn" in s.conversation[-1].content
    # the session is usable again
    s.policy.outputs.append("back")
    assert (await s.run_turn("again")).reason == "completed"


class ExplodingPolicy:
    """A policy with a bug: raises a non-PolicyError mid-stream."""

    name = "exploding"

    async def stream(self, prompt):
        from agent.policy import PolicyChunk

        yield PolicyChunk("partial ")
        raise KeyError("bug in policy")

    async def aclose(self) -> None:
        pass


async def test_a_buggy_policy_ends_the_turn_with_error(workspace) -> None:
    sink = ListSink()
    s = Session(workspace=workspace, policy=ExplodingPolicy(), tools=default_tools(), sink=sink)
    outcome = await s.run_turn("go")
    assert outcome.reason == "error" and "KeyError" in sink.events[-1].detail
    assert isinstance(sink.events[-1], TurnEnd)


async def test_interrupt_before_the_turn_starts_still_closes_it(workspace) -> None:
    sink = ListSink()
    s = session(workspace, ["never used"], sink)
    task = asyncio.create_task(s.run_turn("go"))
    await asyncio.sleep(0)  # the turn task exists but has not run yet
    assert s.interrupt() and s.interrupt()  # idempotent
    outcome = await task
    assert outcome.reason == "interrupted"
    assert [e.type for e in sink.events] == ["user_message", "turn_started", "turn_end"]


async def test_cancelling_the_caller_closes_the_turn_and_stops_tools(workspace) -> None:
    sink = ListSink()
    s = session(workspace, [call("read_file", {"path": "app.py"}) + " and on" * 400, "x"], sink,
                chunk_chars=4, delay_s=0.005)
    task = asyncio.create_task(s.run_turn("go"))
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert isinstance(sink.events[-1], TurnEnd) and sink.events[-1].reason == "interrupted"
    n = len(sink.events)
    await asyncio.sleep(0.2)
    assert len(sink.events) == n  # nothing arrives after turn_end
    assert (await s.run_turn("again")).reason == "completed"


async def test_too_many_calls_stops_reading_the_response(workspace) -> None:
    sink = ListSink()
    s = session(workspace, ['<tool_call name="list_dir"/>' * 500, "done"], sink, limits=Limits(max_calls_per_step=5))
    outcome = await s.run_turn("flood")
    assert outcome.reason == "completed"
    started = sink.of_type(ToolCallStarted)
    assert len(started) == 6 and not started[-1].valid
    assert "too many tool calls" in s.policy.prompts[1].messages[-1]["content"]


async def test_finish_reason_length_is_reported(workspace) -> None:
    class Truncated:
        name = "truncated"

        async def stream(self, prompt):
            from agent.policy import PolicyChunk

            yield PolicyChunk("cut off mid-sen", finish_reason="length")

        async def aclose(self) -> None:
            pass

    s = Session(workspace=workspace, policy=Truncated(), tools=default_tools())
    assert (await s.run_turn("go")).reason == "max_tokens"
