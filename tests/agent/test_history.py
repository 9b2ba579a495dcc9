"""The log rebuilds exactly the conversation the live session held."""

from __future__ import annotations

import asyncio
import shutil
import time

import pytest

from agent.events import ListSink, ToolCallStarted
from agent.history import history_from_events
from agent.parser import encode_call as call
from agent.policies.scripted import ScriptedPolicy
from agent.session import Session
from tools.registry import default_tools
from tools.sandbox import make_sandbox
from tools.workspace import WorkspaceStore


@pytest.fixture
def workspace(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.py").write_text("x = 1\n")
    ws = WorkspaceStore(tmp_path / "store").from_dir(src)
    yield ws
    ws.delete()


async def test_rebuilt_conversation_equals_live_one(workspace) -> None:
    sink = ListSink()
    s = Session(workspace=workspace, tools=default_tools(), sink=sink, policy=ScriptedPolicy([
        "look " + call("read_file", {"path": "a.py"}) + call("nope", {}) + call("grep", {"pattern": "x"}),
        "done",
        call("edit_file", {"path": "a.py", "search": "x = 1", "replace": "x = 2"}),
        "edited",
    ]))
    await s.run_turn("first")
    await s.run_turn("second")
    h = history_from_events(sink.events)
    assert h.conversation == s.conversation
    assert h.turns == 2 and h.last_seq == sink.events[-1].seq
    assert [t for _, _, t in h.outputs][1] == "done"


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")
async def test_rebuilt_conversation_after_interrupt(workspace) -> None:
    sink = ListSink()
    s = Session(workspace=workspace, tools=default_tools(), sink=sink, sandbox=make_sandbox(),
                policy=ScriptedPolicy([call("read_file", {"path": "a.py"}) + call("run_command", {"command": "sleep 20"})
                                       + " still talking " * 50], chunk_chars=8, delay_s=0.01))
    task = asyncio.create_task(s.run_turn("go"))
    t0 = time.monotonic()
    while len(sink.of_type(ToolCallStarted)) < 2 and time.monotonic() - t0 < 10:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.1)
    s.interrupt()
    assert (await task).reason == "interrupted"
    h = history_from_events(sink.events)
    assert h.conversation == s.conversation
    assert "cancelled: the user interrupted the turn" in h.conversation[-1].content
