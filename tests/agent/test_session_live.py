"""Live, honest tool state in the Session: approvals, queued calls, streamed output,
cancelled calls that keep how long they ran and what they printed."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from agent.approval import ApprovalDecision, ApprovalRequest, PendingApprovals
from agent.events import (
    ApprovalRequested,
    ApprovalResolved,
    ListSink,
    ToolCallQueued,
    ToolCallRunning,
    ToolCallStarted,
    ToolOutputDelta,
    ToolResultEvent,
)
from agent.parser import encode_call as call
from agent.policies.scripted import ScriptedPolicy
from agent.runtime import SessionParts, build_session
from agent.session import Limits, Session
from tools.base import WHOLE_TREE, ParamSpec, ParamType, Resources, ToolContext, ToolResult, ToolSpec
from tools.progress import report_output
from tools.registry import default_tools
from tools.workspace import WorkspaceStore

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")


class Printer:
    """A command-like tool (its own process, may write anywhere) that prints over time."""

    spec = ToolSpec("printer", "prints lines", (
        ParamSpec("lines", ParamType.INTEGER, "how many"), ParamSpec("ms", ParamType.INTEGER, "pause after each"),
        ParamSpec("text", ParamType.STRING, "what to print", required=False, default="line"),
    ))

    def __init__(self) -> None:
        self.ran: list[int] = []

    def resources(self, args: Mapping[str, Any]) -> Resources:
        return Resources(reads=frozenset({WHOLE_TREE}), process_writes=frozenset({WHOLE_TREE}))

    async def run(self, args: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        self.ran.append(args["lines"])
        for i in range(args["lines"]):
            report_output(f"{args.get('text') or 'line'} {i}\n")
            await asyncio.sleep(args["ms"] / 1000)
        return ToolResult(True, f"printed {args['lines']} lines")


class Answers:
    """An approver that answers from a table (and records what it was asked)."""

    def __init__(self, answers: dict[str, ApprovalDecision]) -> None:
        self.answers = answers
        self.asked: list[ApprovalRequest] = []

    async def decide(self, request: ApprovalRequest) -> ApprovalDecision:
        self.asked.append(request)
        return self.answers.get(request.call_id, ApprovalDecision(True))


@pytest.fixture
def workspace(tmp_path: Path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "app.py").write_text("def add(a, b):\n    return a - b\n")
    ws = WorkspaceStore(tmp_path / "store").from_dir(src)
    yield ws
    ws.delete()


def make(workspace, outputs: list[str], *, printer: Printer | None = None, limits: Limits = Limits(),
         **kw: Any) -> tuple[Session, ListSink]:
    sink = ListSink()
    tools = [printer or Printer(), *default_tools()]
    return Session(workspace=workspace, policy=ScriptedPolicy(outputs), tools=tools, sink=sink, limits=limits,
                   **kw), sink


def of(sink: ListSink, call_id: str) -> list[str]:
    return [e.type for e in sink.events if getattr(e, "call_id", None) == call_id]


# -- approvals ----------------------------------------------------------------------------


async def test_ask_commands_refusal_reaches_the_model_and_the_tool_never_runs(workspace) -> None:
    printer = Printer()
    answers = Answers({"t1s1c0": ApprovalDecision(False, "not on my machine")})
    s, sink = make(workspace, [
        call("printer", {"lines": "1", "ms": "0"}) + call("edit_file", {"path": "app.py", "search": "a - b",
                                                                        "replace": "a + b"}),
        "ok",
    ], printer=printer, approval_mode="ask-commands", approver=answers)
    outcome = await s.run_turn("go")
    assert outcome.reason == "completed"
    assert printer.ran == [] and [r.call_id for r in answers.asked] == ["t1s1c0"]  # the edit was not asked about
    assert (workspace.root / "app.py").read_text().endswith("a + b\n")
    assert of(sink, "t1s1c0") == ["tool_call_started", "approval_requested", "approval_resolved", "tool_result"]
    [req] = sink.of_type(ApprovalRequested)
    assert (req.kind, req.name, req.args) == ("command", "printer", {"lines": 1, "ms": 0})
    [res] = sink.of_type(ApprovalResolved)
    assert (res.approved, res.reason, res.by) == (False, "not on my machine", "user")
    refused = next(e for e in sink.of_type(ToolResultEvent) if e.call_id == "t1s1c0")
    assert not refused.ok and refused.data["declined"] and refused.duration_ms < 50
    assert "the user declined this command; it did not run. The user said: not on my machine" in refused.output
    assert "the user declined this command" in s.policy.prompts[1].messages[-1]["content"]


async def test_ask_edits_asks_about_edits_and_commands_but_not_reads(workspace) -> None:
    answers = Answers({})
    s, sink = make(workspace, [
        call("read_file", {"path": "app.py"}) + call("edit_file", {"path": "app.py", "search": "a - b",
                                                                   "replace": "a + b"})
        + call("printer", {"lines": "1", "ms": "0"}),
        "ok",
    ], approval_mode="ask-edits", approver=answers)
    await s.run_turn("go")
    assert [(r.call_id, r.kind) for r in answers.asked] == [("t1s1c1", "edit"), ("t1s1c2", "command")]
    assert all(e.ok for e in sink.of_type(ToolResultEvent))
    assert (workspace.root / "app.py").read_text().endswith("a + b\n")
    assert [e.by for e in sink.of_type(ApprovalResolved)] == ["user", "user"]


async def test_auto_asks_nothing(workspace) -> None:
    s, sink = make(workspace, [call("printer", {"lines": "1", "ms": "0"}), "ok"])
    await s.run_turn("go")
    assert s.approval_mode == "auto" and not sink.of_type(ApprovalRequested)


def test_a_mode_that_asks_needs_someone_to_ask(workspace) -> None:
    with pytest.raises(ValueError, match="needs an approver"):
        make(workspace, [], approval_mode="ask-commands")
    with pytest.raises(ValueError, match="unknown approval mode"):
        make(workspace, [], approval_mode="never")


async def test_an_interrupt_while_waiting_for_approval_withdraws_the_request(workspace) -> None:
    pending = PendingApprovals()
    s, sink = make(workspace, [call("printer", {"lines": "1", "ms": "0"}), "unreached"],
                   approval_mode="ask-commands", approver=pending)
    turn = asyncio.create_task(s.run_turn("go"))
    for _ in range(200):
        if pending.pending():
            break
        await asyncio.sleep(0.01)
    assert [r.call_id for r in pending.pending()] == ["t1s1c0"]
    s.interrupt()
    assert (await turn).reason == "interrupted"
    assert pending.pending() == []
    [result] = sink.of_type(ToolResultEvent)
    assert result.output == ("cancelled: the user interrupted the turn (it had not started: it was waiting for "
                             "the user's approval)")
    assert result.data == {"cancelled": True, "waited_for": "approval"} and result.duration_ms == 0
    assert of(sink, "t1s1c0") == ["tool_call_started", "approval_requested", "tool_result"]


async def test_an_approver_that_fails_refuses(workspace) -> None:
    class Broken:
        async def decide(self, request: ApprovalRequest) -> ApprovalDecision:
            raise OSError("no terminal")

    printer = Printer()
    s, sink = make(workspace, [call("printer", {"lines": "1", "ms": "0"}), "ok"], printer=printer,
                   approval_mode="ask-commands", approver=Broken())
    await s.run_turn("go")
    assert printer.ran == [] and not sink.of_type(ToolResultEvent)[0].ok
    assert "asking for approval failed: OSError" in sink.of_type(ApprovalResolved)[0].reason


async def test_recorded_answers_are_reapplied_once_whatever_the_mode(workspace) -> None:
    printer = Printer()
    s, sink = make(workspace, [call("printer", {"lines": "1", "ms": "0"}) + call("printer", {"lines": "2", "ms": "0"}),
                               "ok"], printer=printer,
                   recorded_approvals={"t1s1c0": ApprovalDecision(False, "recorded no")})
    await s.run_turn("go")
    assert printer.ran == [2]  # the refused one did not run, the other was never asked about (auto)
    [res] = sink.of_type(ApprovalResolved)
    assert (res.call_id, res.approved, res.by) == ("t1s1c0", False, "recording")


# -- queued, running ------------------------------------------------------------------------


async def test_a_call_waiting_for_a_conflicting_one_is_queued_then_running(workspace) -> None:
    s, sink = make(workspace, [
        call("printer", {"lines": "3", "ms": "40"}) + call("write_file", {"path": "out.txt", "content": "x\n"})
        + call("read_file", {"path": "app.py"}),
        "ok",
    ])
    await s.run_turn("go")
    assert of(sink, "t1s1c0") == ["tool_call_started"] + ["tool_output_delta"] * len(
        [e for e in sink.of_type(ToolOutputDelta) if e.call_id == "t1s1c0"]) + ["tool_result"]
    assert of(sink, "t1s1c1") == ["tool_call_started", "tool_call_queued", "tool_call_running", "tool_result",
                                  "file_edit"]
    [queued] = sink.of_type(ToolCallQueued)
    assert queued.waiting_for == ["t1s1c0"]
    running = sink.of_type(ToolCallRunning)[0]
    first_result = next(e for e in sink.of_type(ToolResultEvent) if e.call_id == "t1s1c0")
    assert first_result.seq < running.seq  # it ran only once the command was done
    assert of(sink, "t1s1c2") == ["tool_call_started", "tool_result"]  # a read runs alongside the command


# -- live output ------------------------------------------------------------------------------


async def test_output_streams_coalesced_and_before_its_result(workspace) -> None:
    s, sink = make(workspace, [call("printer", {"lines": "20", "ms": "15"}), "ok"],
                   limits=Limits(output_delta_interval_s=0.1))
    t0 = time.monotonic()
    await s.run_turn("go")
    took = time.monotonic() - t0
    deltas = sink.of_type(ToolOutputDelta)
    assert "".join(d.text for d in deltas) == "".join(f"line {i}\n" for i in range(20))
    assert 2 <= len(deltas) <= took / 0.1 + 2  # several, but at most one per interval
    # at most one delta per interval while the command runs; the last one is the flush at its exit,
    # which may come sooner after the one before it (on a loaded machine the last lines arrive late)
    gaps = [b.ts - a.ts for a, b in zip(deltas, deltas[1:-1])]
    assert not gaps or min(gaps) >= 0.09, gaps
    result = next(e for e in sink.of_type(ToolResultEvent) if e.call_id == "t1s1c0")
    assert all(d.seq < result.seq for d in deltas) and not any(d.cut for d in deltas)
    assert [e.seq for e in sink.events] == list(range(1, len(sink.events) + 1))
    # the model reads the result, not the live stream
    assert "printed 20 lines" in s.policy.prompts[1].messages[-1]["content"]


async def test_live_output_is_capped_per_call(workspace) -> None:
    s, sink = make(workspace, [call("printer", {"lines": "400", "ms": "0", "text": "0123456789"}), "ok"],
                   limits=Limits(max_live_output_bytes=1000, output_delta_interval_s=0.01))
    await s.run_turn("go")
    deltas = sink.of_type(ToolOutputDelta)
    assert sum(len(d.text.encode()) for d in deltas) <= 1000
    assert deltas[-1].cut and not any(d.cut for d in deltas[:-1])
    assert sink.of_type(ToolResultEvent)[0].ok


async def test_host_paths_are_scrubbed_from_live_output_even_split_across_reads(workspace) -> None:
    root = str(workspace.root)

    class PathPrinter(Printer):
        async def run(self, args: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
            report_output(f"at {root[:10]}")
            await asyncio.sleep(0.05)
            report_output(f"{root[10:]}/app.py and {root}\n")
            return ToolResult(True, "ok")

    s, sink = make(workspace, [call("printer", {"lines": "0", "ms": "0"}), "ok"], printer=PathPrinter(),
                   limits=Limits(output_delta_interval_s=0.01))
    await s.run_turn("go")
    deltas = sink.of_type(ToolOutputDelta)
    text = "".join(d.text for d in deltas)
    assert text == "at app.py and .\n" and len(deltas) >= 1
    assert all(root not in d.text and root[:10] not in d.text for d in deltas)


async def test_a_cancelled_call_keeps_how_long_it_ran_and_what_it_printed(workspace) -> None:
    s, sink = make(workspace, [call("printer", {"lines": "1000", "ms": "20", "text": "tick"}), "unreached"])
    turn = asyncio.create_task(s.run_turn("go"))
    await asyncio.sleep(0.5)
    s.interrupt()
    assert (await turn).reason == "interrupted"
    [result] = sink.of_type(ToolResultEvent)
    assert result.output.startswith("cancelled: the user interrupted the turn (after running 0.")
    assert "Its output so far:\ntick 0\ntick 1\n" in result.output
    assert result.data["cancelled"] and 0.3 < result.data["ran_s"] < 2 and 300 < result.duration_ms < 2000
    deltas = sink.of_type(ToolOutputDelta)
    assert deltas and all(d.seq < result.seq for d in deltas)
    assert "".join(d.text for d in deltas) in result.output  # the live view and the result agree
    assert "Its output so far:\ntick 0" in s.conversation[-1].content  # and the model reads it too


# -- the real command tool ---------------------------------------------------------------------


@needs_bwrap
async def test_a_real_command_streams_through_the_factory(workspace) -> None:
    from tools.sandbox import make_sandbox

    sink = ListSink()
    s = build_session(SessionParts(workspace, make_sandbox()), policy=ScriptedPolicy([
        call("run_command", {"command": "echo one; sleep 0.5; echo two"}), "ok"]), sink=sink,
        approval_mode="ask-commands", approver=Answers({}))
    await s.run_turn("go")
    deltas = sink.of_type(ToolOutputDelta)
    assert [d.text for d in deltas] == ["one\n", "two\n"]
    started = sink.of_type(ToolCallStarted)[0]
    assert of(sink, started.call_id) == ["tool_call_started", "approval_requested", "approval_resolved",
                                         "tool_call_running", "tool_output_delta", "tool_output_delta",
                                         "tool_result"]
