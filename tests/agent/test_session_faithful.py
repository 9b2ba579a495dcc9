"""A step cut off by a limit, an interrupt or a policy error is recorded as
faithfully as one that ended normally: its raw text, every streamed token id
and logprob, and its true token count (RL learns from these)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent.events import AssistantMessage, ListSink, ToolResultEvent, TurnEnd
from agent.history import history_from_events
from agent.parser import encode_call as call
from agent.policy import PolicyChunk, PolicyError
from agent.prompt import RenderedPrompt
from agent.session import Limits, Session
from tools.registry import default_tools
from tools.workspace import WorkspaceStore

STREAMED = 27  # token ids streamed before the step is cut off


class TokenPolicy:
    """Streams ``STREAMED`` one-token chunks with ids and logprobs, then ``then``:
    hangs (``"hang"``) or raises a PolicyError (``"fail"``)."""

    name = "tokens"

    def __init__(self, then: str, text: str = "thinking "):
        self.then = then
        self.text = text

    async def stream(self, prompt: RenderedPrompt) -> AsyncIterator[PolicyChunk]:
        for i in range(STREAMED):
            yield PolicyChunk(self.text[i % len(self.text)], token_ids=(100 + i,), logprobs=(-0.01 * i,))
            await asyncio.sleep(0)
        if self.then == "fail":
            raise PolicyError("the model server went away")
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


def make(workspace, policy, sink, limits=Limits()) -> Session:
    return Session(workspace=workspace, policy=policy, tools=default_tools(), sink=sink, limits=limits)


def only_message(sink: ListSink) -> AssistantMessage:
    [msg] = sink.of_type(AssistantMessage)
    return msg


def assert_faithful(msg: AssistantMessage, finish: str) -> None:
    assert msg.token_ids == [100 + i for i in range(STREAMED)]
    assert msg.logprobs == pytest.approx([-0.01 * i for i in range(STREAMED)])
    assert msg.output_tokens == STREAMED
    assert len(msg.text) == STREAMED
    assert msg.finish_reason == finish


async def test_wall_clock_limit_keeps_streamed_tokens(workspace) -> None:
    sink = ListSink()
    s = make(workspace, TokenPolicy("hang"), sink, Limits(max_wall_s=0.5))
    outcome = await asyncio.wait_for(s.run_turn("go"), 10)
    assert outcome.reason == "timeout" and outcome.output_tokens == STREAMED
    assert_faithful(only_message(sink), "aborted")
    end = sink.events[-1]
    assert isinstance(end, TurnEnd) and end.output_tokens == STREAMED and end.steps == 1


async def test_interrupt_keeps_streamed_tokens(workspace) -> None:
    sink = ListSink()
    s = make(workspace, TokenPolicy("hang"), sink)
    task = asyncio.create_task(s.run_turn("go"))
    for _ in range(200):
        await asyncio.sleep(0.01)
        if len(sink.events) > STREAMED:  # user, turn_started, deltas...
            break
    assert s.interrupt()
    outcome = await asyncio.wait_for(task, 10)
    assert outcome.reason == "interrupted"
    assert_faithful(only_message(sink), "aborted")


async def test_policy_error_keeps_streamed_tokens(workspace) -> None:
    sink = ListSink()
    s = make(workspace, TokenPolicy("fail"), sink)
    outcome = await asyncio.wait_for(s.run_turn("go"), 10)
    assert outcome.reason == "error"
    assert_faithful(only_message(sink), "error")
    # the conversation the log rebuilds is the one the session holds
    assert history_from_events(sink.events).conversation == s.conversation


async def test_shutdown_is_not_a_user_interrupt(workspace) -> None:
    sink = ListSink()
    s = make(workspace, TokenPolicy("hang"), sink)
    task = asyncio.create_task(s.run_turn("go"))
    await asyncio.sleep(0.2)
    assert s.interrupt(reason="shutdown")
    outcome = await asyncio.wait_for(task, 10)
    end = sink.events[-1]
    assert outcome.reason == "shutdown" and isinstance(end, TurnEnd) and end.reason == "shutdown"
    assert "user" not in end.detail


class CallThenHang:
    """One complete tool call (a slow command would do; a read is enough), then hangs mid-text."""

    name = "call-then-hang"

    async def stream(self, prompt: RenderedPrompt) -> AsyncIterator[PolicyChunk]:
        yield PolicyChunk("Reading.\n" + call("read_file", {"path": "a.txt"}) + "\nand then ")
        await asyncio.sleep(60)

    async def aclose(self) -> None:
        return None


async def test_timeout_mid_step_records_message_before_results(workspace) -> None:
    """The aborted step's message and its calls' results rebuild the same conversation."""
    sink = ListSink()
    s = make(workspace, CallThenHang(), sink, Limits(max_wall_s=0.5))
    outcome = await asyncio.wait_for(s.run_turn("go"), 10)
    assert outcome.reason == "timeout"
    msg = only_message(sink)
    assert msg.text.startswith("Reading.") and msg.text.endswith("and then ") and msg.finish_reason == "aborted"
    [result] = sink.of_type(ToolResultEvent)
    assert result.ok and "alpha" in result.output  # the read had finished: its real result is kept
    assert history_from_events(sink.events).conversation == s.conversation
