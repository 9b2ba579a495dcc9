"""agent.approval: modes, what each asks about, the server's pending answers, recorded answers."""

from __future__ import annotations

import asyncio
import threading

import pytest

from agent.approval import (
    APPROVAL_MODES,
    ApprovalDecision,
    ApprovalError,
    ApprovalRequest,
    PendingApprovals,
    PromptApprover,
    approval_kind,
    declined_result,
    parse_approval_mode,
    recorded_decisions,
)
from agent.events import ApprovalResolved, AssistantMessage, ToolCallStarted
from tools.base import WHOLE_TREE, Resources
from tools.registry import default_tools

TOOLS = {t.spec.name: t for t in default_tools(commands=True)}


def kind(mode: str, name: str, **args: object) -> str | None:
    return approval_kind(parse_approval_mode(mode), TOOLS[name].resources(args))


def test_modes_ask_about_what_they_say() -> None:
    assert APPROVAL_MODES == ("auto", "ask-commands", "ask-edits")
    for name, args in [("run_command", {"command": "ls"}), ("edit_file", {"path": "a", "search": "x", "replace": "y"}),
                       ("write_file", {"path": "a", "content": ""}), ("read_file", {"path": "a"})]:
        assert kind("auto", name, **args) is None
    assert kind("ask-commands", "run_command", command="ls") == "command"
    assert kind("ask-commands", "edit_file", path="a", search="x", replace="y") is None
    # ask-edits asks about everything that may change the tree: a command can rewrite any file
    assert kind("ask-edits", "run_command", command="sed -i s/a/b/ f") == "command"
    assert kind("ask-edits", "write_file", path="a", content="") == "edit"
    assert kind("ask-edits", "edit_file", path="a", search="x", replace="y") == "edit"
    for name in ("read_file", "grep", "glob", "list_dir"):
        args = {"path": "."} if name in ("read_file", "list_dir") else {"pattern": "x"}
        assert kind("ask-edits", name, **args) is None
    assert approval_kind("ask-edits", Resources(reads=frozenset({WHOLE_TREE}))) is None


def test_an_unknown_mode_is_refused_in_one_line() -> None:
    with pytest.raises(ApprovalError) as exc:
        parse_approval_mode("ask-everything")
    assert str(exc.value) == "unknown approval mode 'ask-everything': use one of auto, ask-commands, ask-edits"
    with pytest.raises(ApprovalError):
        parse_approval_mode(None)


def test_a_refusal_reads_as_one_for_the_model() -> None:
    req = ApprovalRequest("t1s1c0", "run_command", {"command": "rm -rf build"}, "command")
    r = declined_result(req, ApprovalDecision(False, "  keep the build  "))
    assert not r.ok and r.data == {"declined": True}
    assert r.output.startswith("the user declined this command; it did not run. The user said: keep the build ")
    edit = declined_result(ApprovalRequest("c", "write_file", {"path": "a"}, "edit"), ApprovalDecision(False))
    assert edit.output.startswith("the user declined this write_file call; it did not run. Do not repeat")
    assert req.describe() == "rm -rf build"
    assert ApprovalRequest("c", "write_file", {"path": "a.py"}, "edit").describe() == "write_file a.py"


async def test_pending_requests_wait_for_their_answer() -> None:
    p = PendingApprovals()
    a = asyncio.create_task(p.decide(ApprovalRequest("c0", "run_command", {"command": "a"}, "command")))
    b = asyncio.create_task(p.decide(ApprovalRequest("c1", "run_command", {"command": "b"}, "command")))
    await asyncio.sleep(0)
    assert [r.call_id for r in p.pending()] == ["c0", "c1"]
    p.answer("c1", ApprovalDecision(False, "no"))
    assert await b == ApprovalDecision(False, "no") and not a.done()
    with pytest.raises(ApprovalError, match="no approval request is open for call 'c1'"):
        p.answer("c1", ApprovalDecision(True))  # answered already
    with pytest.raises(ApprovalError):
        p.answer("nope", ApprovalDecision(True))
    a.cancel()  # the turn ended: the request is withdrawn
    await asyncio.wait([a])
    assert p.pending() == []
    with pytest.raises(ApprovalError):
        p.answer("c0", ApprovalDecision(True))


async def test_a_prompt_approver_asks_one_question_at_a_time() -> None:
    active, seen = [], []
    lock = threading.Lock()

    def ask(req: ApprovalRequest) -> ApprovalDecision:
        with lock:
            active.append(req.call_id)
            assert len(active) == 1, active
        threading.Event().wait(0.05)
        with lock:
            active.remove(req.call_id)
            seen.append(req.call_id)
        return ApprovalDecision(req.call_id != "c1")

    approver = PromptApprover(ask)
    reqs = [ApprovalRequest(f"c{i}", "run_command", {"command": "x"}, "command") for i in range(3)]
    answers = await asyncio.gather(*(approver.decide(r) for r in reqs))
    assert [a.approved for a in answers] == [True, False, True] and seen == ["c0", "c1", "c2"]


def test_recorded_decisions_by_call_and_up_to_a_step() -> None:
    events = [
        AssistantMessage(turn=1, step=1, text=""), ToolCallStarted(turn=1, step=1, index=0, call_id="t1s1c0",
                                                                   name="run_command", args={}),
        ApprovalResolved(turn=1, step=1, index=0, call_id="t1s1c0", approved=False, reason="no"),
        AssistantMessage(turn=1, step=2, text=""), ToolCallStarted(turn=1, step=2, index=0, call_id="t1s2c0",
                                                                   name="run_command", args={}),
        ApprovalResolved(turn=1, step=2, index=0, call_id="t1s2c0", approved=True),
    ]
    assert recorded_decisions(events) == {"t1s1c0": ApprovalDecision(False, "no"), "t1s2c0": ApprovalDecision(True)}
    assert recorded_decisions(events, model_calls=1) == {"t1s1c0": ApprovalDecision(False, "no")}
    assert recorded_decisions(events, model_calls=0) == {}


def test_unasked_calls_of_a_recording_are_replayed_without_asking() -> None:
    events = [
        AssistantMessage(turn=1, step=1, text=""),
        ToolCallStarted(turn=1, step=1, index=0, call_id="t1s1c0", name="run_command", args={}),
        ToolCallStarted(turn=1, step=1, index=1, call_id="t1s1c1", name="run_command", args={}),
        ApprovalResolved(turn=1, step=1, index=1, call_id="t1s1c1", approved=False),
        AssistantMessage(turn=1, step=2, text=""),
        ToolCallStarted(turn=1, step=2, index=0, call_id="t1s2c0", name="run_command", args={}),
    ]
    assert recorded_decisions(events, model_calls=1, unasked=True) == {
        "t1s1c0": None, "t1s1c1": ApprovalDecision(False)}
