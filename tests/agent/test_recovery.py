"""Closing a turn the log left open (``kill -9`` mid-step): the partial step,
cancelled results for running calls, the true step count, and a conversation
that tells the model what is already in the workspace."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from agent.events import (
    AssistantMessage,
    Event,
    FileEditEvent,
    ListSink,
    ToolCallStarted,
    ToolResultEvent,
    TurnEnd,
)
from agent.history import CRASH_CANCELLED, closing_events, history_from_events
from agent.parser import StreamParser, ParsedCall
from agent.parser import encode_call as call
from agent.policy import PolicyChunk
from agent.prompt import RenderedPrompt
from agent.session import Session
from tools.base import ParamSpec, ParamType, Resources, ToolContext, ToolResult, ToolSpec
from tools.registry import default_tools
from tools.workspace import WorkspaceStore

EDIT = call("edit_file", {"path": "a.txt", "search": "alpha", "replace": "beta"})
BLOCK = call("block", {"why": "a long command"})


class Block:
    """A tool that runs until it is cancelled (a long command, say)."""

    spec = ToolSpec("block", "waits forever", (ParamSpec("why", ParamType.STRING, "why"),))

    def resources(self, args: Mapping[str, Any]) -> Resources:
        return Resources()

    async def run(self, args: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        await asyncio.sleep(60)
        return ToolResult(True, "never")


class EditThenHang:
    """Step 1: prose, an edit, a blocking call, more prose; then the model stalls (the crash hits here)."""

    name = "edit-then-hang"

    async def stream(self, prompt: RenderedPrompt) -> AsyncIterator[PolicyChunk]:
        for piece in ("I'll fix it.\n", EDIT, "\n", BLOCK, "\nNow let me ", "<tool_call name=\"read_"):
            yield PolicyChunk(piece)
            await asyncio.sleep(0.01)
        await asyncio.sleep(60)

    async def aclose(self) -> None:
        return None


@pytest.fixture
def workspace(tmp_path: Path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("alpha\n")
    ws = WorkspaceStore(tmp_path / "store").from_dir(src)
    yield ws
    ws.delete()


async def crashed_log(workspace) -> list[Event]:
    """The events persisted when the process died: the sink's list at that instant."""
    sink = ListSink()
    s = Session(workspace=workspace, policy=EditThenHang(), tools=[*default_tools(), Block()], sink=sink)
    task = asyncio.create_task(s.run_turn("fix a.txt"))
    for _ in range(500):
        await asyncio.sleep(0.01)
        if sink.of_type(FileEditEvent) and len(sink.of_type(ToolCallStarted)) == 2:
            break
    await asyncio.sleep(0.1)  # the trailing prose and the unclosed call arrive
    persisted = list(sink.events)
    task.cancel()  # the "process" is gone; nothing it writes from here on is in the log
    with pytest.raises(asyncio.CancelledError):
        await task
    return persisted


async def test_open_turn_is_closed_faithfully(workspace) -> None:
    log = await crashed_log(workspace)
    assert not log[-1].type == "turn_end" and not any(isinstance(e, AssistantMessage) for e in log)
    closing = closing_events(log)
    assert [e.seq for e in closing] == list(range(log[-1].seq + 1, log[-1].seq + 1 + len(closing)))

    [msg] = [e for e in closing if isinstance(e, AssistantMessage)]
    assert msg.step == 1 and msg.finish_reason == "aborted"
    assert msg.text.startswith("I'll fix it.\n") and "Now let me " in msg.text
    assert "read_" not in msg.text  # the call never closed: it never ran, so it is not in the record
    parser = StreamParser()
    calls = [e for e in [*parser.feed(msg.text), *parser.finish()] if isinstance(e, ParsedCall)]
    assert [(c.name, dict(c.params)) for c in calls] == [
        ("edit_file", {"path": "a.txt", "search": "alpha", "replace": "beta"}), ("block", {"why": "a long command"}),
    ]

    [cancelled] = [e for e in closing if isinstance(e, ToolResultEvent)]
    assert cancelled.name == "block" and not cancelled.ok and cancelled.output == CRASH_CANCELLED
    end = closing[-1]
    assert isinstance(end, TurnEnd) and end.reason == "shutdown" and end.steps == 1 and end.output_tokens > 0

    # The model's next prompt says the edit happened — as it did, in the workspace.
    assert (workspace.root / "a.txt").read_text() == "beta\n"
    conversation = history_from_events([*log, *closing]).conversation
    assert [m.role for m in conversation] == ["user", "assistant", "tool"]
    assert "<tool_result" in conversation[2].content and "a.txt" in conversation[2].content
    assert CRASH_CANCELLED in conversation[2].content
    assert closing_events([*log, *closing]) == []  # idempotent: a second restart adds nothing


async def test_crash_between_steps_adds_no_message(workspace) -> None:
    """A crash after a step was recorded closes the turn without inventing a step."""
    from agent.policies.scripted import ScriptedPolicy

    sink = ListSink()
    s = Session(workspace=workspace, policy=ScriptedPolicy(["look " + call("read_file", {"path": "a.txt"}), "ok"]),
                tools=default_tools(), sink=sink)
    await s.run_turn("look")
    upto = next(i for i, e in enumerate(sink.events) if getattr(e, "step", None) == 2)
    log = sink.events[:upto]  # died while step 2 had not streamed anything
    closing = closing_events(log)
    assert not any(isinstance(e, AssistantMessage) for e in closing)
    assert isinstance(closing[-1], TurnEnd) and closing[-1].steps == 1


async def test_feedback_after_a_turn_does_not_reopen_it_and_one_during_a_turn_is_kept(workspace) -> None:
    """``feedback`` events are added by the server between or during turns (agent.events.FeedbackEvent)."""
    from agent.events import FeedbackEvent

    log = await crashed_log(workspace)
    closing = closing_events(log)
    done = [*log, *closing]
    after = FeedbackEvent(seq=done[-1].seq + 1, session_id=done[-1].session_id, turn=done[-1].turn,
                          target="turn", of_turn=1, rating="down", by="alice")
    assert closing_events([*done, after]) == []  # the turn had ended; the rating does not reopen it
    during = FeedbackEvent(seq=log[-1].seq + 1, session_id=log[-1].session_id, turn=log[-1].turn,
                           target="turn", of_turn=1, rating="up", by="alice")
    reclosed = closing_events([*log, during])
    assert [e.type for e in reclosed] == [e.type for e in closing]
    assert reclosed[0].seq == during.seq + 1  # the closing events come after it
    assert history_from_events([*log, during, *reclosed]).conversation == history_from_events(done).conversation
