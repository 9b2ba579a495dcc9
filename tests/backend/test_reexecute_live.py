"""Replay stays faithful with the live-state events: a session whose commands streamed output
and whose calls were approved or refused re-executes with 0 divergences."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from agent.approval import ApprovalDecision, ApprovalRequest, recorded_decisions
from agent.events import ApprovalResolved, ListSink, ToolOutputDelta
from agent.parser import encode_call as call
from agent.policies.scripted import ScriptedPolicy
from agent.runtime import SessionParts, build_session
from backend.replay import compare, recorded_turns, reexecute, run_recording
from tools.sandbox import make_sandbox
from tools.workspace import WorkspaceStore

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")

OUTPUTS = [
    "Running.\n" + call("run_command", {"command": "echo one; sleep 0.3; echo two"})
    + call("run_command", {"command": "rm -f keep.txt"}) + call("write_file", {"path": "new.txt", "content": "n\n"}),
    "Done.",
]


class Answers:
    def __init__(self, refuse: set[str]) -> None:
        self.refuse = refuse

    async def decide(self, request: ApprovalRequest) -> ApprovalDecision:
        return ApprovalDecision(request.call_id not in self.refuse, "keep it" if request.call_id in self.refuse else "")


@pytest.fixture
def original(tmp_path: Path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "keep.txt").write_text("kept\n")
    return WorkspaceStore(tmp_path / "store").from_dir(src)


async def record(original, refuse: set[str]) -> list:
    sink = ListSink()
    session = build_session(SessionParts(original, make_sandbox()), policy=ScriptedPolicy(OUTPUTS), sink=sink,
                            approval_mode="ask-edits", approver=Answers(refuse))
    assert (await session.run_turn("go")).reason == "completed"
    return sink.events


async def test_streamed_and_approved_calls_reexecute_with_no_divergence(original) -> None:
    events = await record(original, refuse=set())
    assert [d.text for d in events if isinstance(d, ToolOutputDelta)] == ["one\n", "two\n"]
    assert len([e for e in events if isinstance(e, ApprovalResolved)]) == 3
    copy = original.store.from_snapshot(original.base)
    report = await reexecute("s", events, SessionParts(copy, make_sandbox()))  # replay runs in auto
    assert report.counts == {"same": 3, "differs": 0, "missing": 0, "extra": 0}, report.to_json()


async def test_a_refused_call_is_refused_again_when_recorded_answers_are_reapplied(original) -> None:
    events = await record(original, refuse={"t1s1c1"})
    assert (original.root / "keep.txt").exists()
    copy = original.store.from_snapshot(original.base)
    sink = ListSink()
    session = build_session(SessionParts(copy, make_sandbox()), policy=ScriptedPolicy([]), sink=sink,
                            recorded_approvals=recorded_decisions(events))
    await run_recording(recorded_turns(events), session)
    report = compare("s", events, sink.events)
    assert report.counts == {"same": 3, "differs": 0, "missing": 0, "extra": 0}, report.to_json()
    assert (copy.root / "keep.txt").exists()  # the refused rm did not run in the replay either
    assert [e.by for e in sink.events if isinstance(e, ApprovalResolved)] == ["recording"] * 3
