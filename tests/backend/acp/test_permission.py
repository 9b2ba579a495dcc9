"""What each mode asks the editor, and how answers, silence and failures are read."""

from __future__ import annotations

import asyncio
from typing import Any

from acp.schema import AllowedOutcome, DeniedOutcome, RequestPermissionResponse, ToolCallUpdate

from agent.events import ApprovalRequested
from backend.acp.permission import Permissions

CMD = ApprovalRequested(step=1, index=0, call_id="c", name="run_command", args={"command": "ls"}, kind="command")
EDIT = ApprovalRequested(step=1, index=1, call_id="e", name="edit_file", args={"path": "a.py"}, kind="edit")
TC = ToolCallUpdate(tool_call_id="c")


def answering(option: str | None, asked: list[str]):
    async def ask(tool_call: Any, options: Any) -> RequestPermissionResponse:
        asked.append(tool_call.tool_call_id)
        if option is None:
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id=option))
    return ask


async def test_modes_decide_what_is_asked() -> None:
    asked: list[str] = []
    p = Permissions(answering("reject_once", asked))
    assert (await p.decide(EDIT, TC)).approved  # agent mode: edits go ahead
    assert not (await p.decide(CMD, TC)).approved and asked == ["c"]
    p.mode = "ask"
    assert not (await p.decide(EDIT, TC)).approved and asked == ["c", "c"]
    p.mode = "auto"
    decision = await p.decide(CMD, TC)
    assert decision.approved and decision.reason == "allowed by the auto mode" and len(asked) == 2


async def test_always_covers_the_same_command_only() -> None:
    asked: list[str] = []
    p = Permissions(answering("allow_always", asked))
    assert (await p.decide(CMD, TC)).approved
    assert (await p.decide(CMD, TC)).reason == "allowed by always allowed in this session"
    other = CMD.model_copy(update={"args": {"command": "rm -rf ."}})
    assert (await p.decide(other, TC)).approved and len(asked) == 2


async def test_silence_a_cancelled_question_and_a_failure_all_refuse() -> None:
    async def never(tool_call: Any, options: Any) -> Any:
        await asyncio.Event().wait()

    async def broken(tool_call: Any, options: Any) -> Any:
        raise ConnectionError("editor gone")

    late = await Permissions(never, timeout_s=0.05).decide(CMD, TC)
    assert not late.approved and "no answer from the editor within 0.05 s" in late.reason
    cancelled = await Permissions(answering(None, [])).decide(CMD, TC)
    assert not cancelled.approved and "cancelled" in cancelled.reason
    failed = await Permissions(broken).decide(CMD, TC)
    assert not failed.approved and "editor gone" in failed.reason
