"""Approval prompts on a terminal (``backend/terminal_input.py``), through a real session."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import pytest

from agent.approval import ApprovalDecision, ApprovalRequest
from agent.events import ListSink
from agent.parser import encode_call
from agent.policies.scripted import ScriptedPolicy
from agent.runtime import SessionParts, build_session
from backend.terminal_input import MAX_SHOWN_LINES, TerminalApprover, check_can_ask, parse_answer, question


def test_a_command_is_shown_whole() -> None:
    lines = [f"echo line {i}" for i in range(60)]  # more than the transcript shows of a command
    q = question(ApprovalRequest("t1s1c0", "run_command", {"command": "\n".join(lines), "timeout": 5}, "command"))
    assert q.splitlines()[0] == "the agent wants to run this command (run_command t1s1c0):"
    assert "  $ echo line 0" in q and "  > echo line 59" in q and "with timeout=5" in q


def test_an_edit_is_shown_as_its_diff_and_a_new_file_as_its_content() -> None:
    q = question(ApprovalRequest("c", "edit_file", {"path": "app.py", "search": "a - b\nkeep", "replace": "a + b\nkeep"},
                                 "edit"))
    assert "the agent wants to edit app.py" in q and "  -a - b" in q and "  +a + b" in q and "   keep" in q
    content = "".join(f"row {i}\n" for i in range(MAX_SHOWN_LINES + 5))
    q = question(ApprovalRequest("c", "write_file", {"path": "big.txt", "content": content}, "edit"))
    assert f"write big.txt ({MAX_SHOWN_LINES + 5} lines" in q and "  + row 0" in q
    assert f"  + row {MAX_SHOWN_LINES - 1}" in q and f"row {MAX_SHOWN_LINES}\n" not in q and "5 more lines not shown" in q


def test_model_text_cannot_act_on_the_terminal() -> None:
    q = question(ApprovalRequest("c", "run_command", {"command": "echo \x1b]52;c;aGk=\x07"}, "command"))
    assert "\x1b" not in q and "\x07" not in q and "^[]52;c;aGk=^G" in q


@pytest.mark.parametrize(("line", "decision"), [
    ("y", ApprovalDecision(True)), (" YES ", ApprovalDecision(True)),
    ("n", ApprovalDecision(False)), ("no  use make test ", ApprovalDecision(False, "use make test")),
    (None, ApprovalDecision(False)), ("maybe", None), ("", None),
])
def test_answers(line: str | None, decision: ApprovalDecision | None) -> None:
    assert parse_answer(line) == decision


async def test_an_unclear_answer_is_asked_again() -> None:
    answers: asyncio.Queue[str | None] = asyncio.Queue()
    for line in ("maybe", "n not now"):
        answers.put_nowait(line)
    out = io.StringIO()
    approver = TerminalApprover(answers.get, out, color=False)
    decision = await approver.decide(ApprovalRequest("c", "run_command", {"command": "rm -rf build"}, "command"))
    assert decision == ApprovalDecision(False, "not now")
    assert "  $ rm -rf build" in out.getvalue() and "please answer y or n (not 'maybe')" in out.getvalue()
    assert out.getvalue().count("allow? y = yes") == 2


def test_nobody_to_ask_is_refused_in_one_line() -> None:
    assert check_can_ask("auto", interactive=False, yes=False, command="flywheel run") is None
    assert check_can_ask("ask-commands", interactive=False, yes=True, command="flywheel run") is None
    assert check_can_ask("ask-commands", interactive=True, yes=False, command="flywheel run") is None
    why = check_can_ask("ask-edits", interactive=False, yes=False, command="flywheel chat")
    assert why is not None and "\n" not in why and "--yes" in why and "asks before edits and commands" in why


async def test_a_session_asks_the_terminal_and_a_refusal_keeps_the_file(tmp_path: Path) -> None:
    from tools.workspace import WorkspaceStore

    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("old\n")
    ws = WorkspaceStore(tmp_path / "store").from_dir(src)
    answers: asyncio.Queue[str | None] = asyncio.Queue()
    answers.put_nowait("n keep it")
    out, sink = io.StringIO(), ListSink()
    policy = ScriptedPolicy([encode_call("write_file", {"path": "a.txt", "content": "new\n"}), "ok"])
    session = build_session(SessionParts(workspace=ws, sandbox=None), policy=policy, sink=sink,
                            approval_mode="ask-edits", approver=TerminalApprover(answers.get, out, color=False))
    await session.run_turn("change it")
    assert "the agent wants to write a.txt (1 line, 4 bytes" in out.getvalue() and "  + new" in out.getvalue()
    resolved = [e for e in sink.events if e.type == "approval_resolved"]
    assert [(e.approved, e.reason, e.by) for e in resolved] == [(False, "keep it", "user")]
    result = next(e for e in sink.events if e.type == "tool_result")
    assert not result.ok and "The user said: keep it" in result.output
    assert (ws.root / "a.txt").read_text() == "old\n"


async def test_a_question_is_withdrawn_when_the_turn_is_interrupted(tmp_path: Path) -> None:
    from tools.workspace import WorkspaceStore

    src = tmp_path / "src"
    src.mkdir()
    ws = WorkspaceStore(tmp_path / "store").from_dir(src)
    never: asyncio.Queue[str | None] = asyncio.Queue()  # the user does not answer
    out, sink = io.StringIO(), ListSink()
    session = build_session(
        SessionParts(workspace=ws, sandbox=None), sink=sink, approval_mode="ask-edits",
        policy=ScriptedPolicy([encode_call("write_file", {"path": "b.txt", "content": "x"})]),
        approver=TerminalApprover(never.get, out, color=False))
    turn = asyncio.create_task(session.run_turn("go"))
    while "allow?" not in out.getvalue():
        await asyncio.sleep(0.01)
    session.interrupt()
    outcome = await asyncio.wait_for(turn, 5)  # nothing blocks on the unanswered question
    assert outcome.reason == "interrupted" and not (ws.root / "b.txt").exists()
