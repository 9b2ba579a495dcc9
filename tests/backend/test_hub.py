"""Hub backpressure: a slow client is dropped without stalling the agent or others."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agent.events import AssistantDelta, FeedbackEvent
from backend.db.engine import make_engine, migrate
from backend.db.log import SessionLog
from backend.db.writer import EventWriter
from backend.hub import Hub, SlowClient
from backend.policies import PolicyFactory
from tools.workspace import WorkspaceStore


@pytest.fixture
async def hub(tmp_path: Path):
    engine = make_engine(f"sqlite:///{tmp_path / 'h.db'}")
    migrate(engine)
    log = SessionLog(engine)
    writer = EventWriter(log)
    store = WorkspaceStore(tmp_path / "store")
    h = Hub(log_=log, writer=writer, store=store, sandbox=None, policies=PolicyFactory(openai_base_url=None),
            client_queue_events=16)
    src = tmp_path / "src"
    src.mkdir()
    (src / "f.txt").write_text("x\n")
    yield h, store.from_dir(src)
    await h.shutdown()
    writer.close()
    engine.dispose()


async def test_slow_client_is_dropped_fast_one_gets_everything(hub) -> None:
    h, ws = hub
    info = await h.create(owner="a", workspace=ws, title="", source={},
                          policy={"kind": "scripted", "outputs": ["word " * 400], "chunk_chars": 5})
    slow = h.stream(info, 0)
    slow_first = asyncio.create_task(slow.__anext__())  # subscribes; reads one event, then never again
    fast_seen: list[int] = []

    async def fast() -> None:
        async for e in h.stream(info, 0):
            fast_seen.append(e.seq)
            if e.type == "turn_end":
                return

    reader = asyncio.create_task(fast())
    await asyncio.sleep(0.05)
    await h.send(info, "talk")
    await asyncio.wait_for(reader, 20)
    assert (await slow_first).seq == 1
    assert fast_seen == list(range(1, len(fast_seen) + 1)) and len(fast_seen) > 16
    with pytest.raises(SlowClient) as exc:
        async for _ in slow:
            pass
    assert "reconnect with after=" in str(exc.value)
    # the dropped client resumes from its last seq and misses nothing
    resumed = [e.seq async for e in _until_end(h.stream(info, exc.value.last_seq))]
    assert resumed == list(range(exc.value.last_seq + 1, fast_seen[-1] + 1))


async def _until_end(stream):
    async for e in stream:
        yield e
        if e.type == "turn_end":
            return


async def test_events_are_durable_before_subscribers_see_them(hub) -> None:
    h, ws = hub
    info = await h.create(owner="a", workspace=ws, title="", source={},
                          policy={"kind": "scripted", "outputs": ["hello there"], "chunk_chars": 3})
    checked = 0
    await h.send(info, "hi")
    async for e in h.stream(info, 0):
        if isinstance(e, AssistantDelta):
            stored = await asyncio.to_thread(h.log.events, info.id, after=e.seq - 1, limit=1)
            assert stored and stored[0] == e
            checked += 1
        if e.type == "turn_end":
            break
    assert checked >= 3


async def test_unused_sessions_leave_memory_and_come_back_from_the_log(hub) -> None:
    h, ws = hub
    info = await h.create(owner="a", workspace=ws, title="", source={},
                          policy={"kind": "scripted", "outputs": ["first answer", "second answer"]})
    await h.send(info, "one")
    await asyncio.wait_for(h.live[info.id].turn_task, 10)
    await asyncio.sleep(0.05)
    assert info.id not in h.live  # nobody watches, nothing runs: evicted
    await h.send(info, "two")  # rebuilt from the log: same conversation, next output, next seq
    live = h.live[info.id]
    assert [m.content for m in live.session.conversation[:2]] == ["one", "first answer"]
    await asyncio.wait_for(live.turn_task, 10)
    events = await asyncio.to_thread(h.log.all_events, info.id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert [e.text for e in events if e.type == "assistant_message"] == ["first answer", "second answer"]


async def _approve_when_asked(h, info, answers: dict[str, tuple[bool, str]], after: int = 0) -> list:
    """Watch the session from ``after`` and answer each approval request from ``answers``;
    the events, to turn_end."""
    from backend.hub import HubError

    seen = []
    async for e in _until_end(h.stream(info, after)):
        seen.append(e)
        if e.type == "approval_requested":
            approved, reason = answers[e.call_id]
            await h.answer_approval(info, e.call_id, approved=approved, reason=reason)
            with pytest.raises(HubError) as exc:  # once only
                await h.answer_approval(info, e.call_id, approved=True)
            assert exc.value.status == 409
    return seen


async def test_approval_mode_is_kept_with_the_session_and_survives_eviction(hub) -> None:
    from agent.parser import encode_call as call

    h, ws = hub
    outputs = [call("write_file", {"path": "a.txt", "content": "1\n"}), "turn one done",
               call("write_file", {"path": "b.txt", "content": "2\n"}), "turn two done"]
    info = await h.create(owner="a", workspace=ws, title="", source={"kind": "dir"},
                          policy={"kind": "scripted", "outputs": outputs}, approval_mode="ask-edits")
    assert info.source == {"kind": "dir", "approval_mode": "ask-edits"}
    watcher = asyncio.create_task(_approve_when_asked(h, info, {"t1s1c0": (False, "not a.txt")}))
    await asyncio.sleep(0.05)
    await h.send(info, "one")
    first = await asyncio.wait_for(watcher, 20)
    refused = next(e for e in first if e.type == "tool_result")
    assert not refused.ok and "The user said: not a.txt" in refused.output and not (ws.root / "a.txt").exists()
    await asyncio.sleep(0.05)
    assert info.id not in h.live  # evicted; the mode comes back from the log
    watcher = asyncio.create_task(_approve_when_asked(h, info, {"t2s1c0": (True, "")}, after=first[-1].seq))
    await asyncio.sleep(0.05)
    await h.send(info, "two")
    second = await asyncio.wait_for(watcher, 20)
    assert [e.type for e in second if e.type.startswith("approval")][-2:] == ["approval_requested",
                                                                              "approval_resolved"]
    assert (ws.root / "b.txt").read_text() == "2\n"


async def test_a_branch_reapplies_recorded_answers_and_then_asks(hub) -> None:
    from agent.parser import encode_call as call

    h, ws = hub
    outputs = [call("write_file", {"path": "a.txt", "content": "1\n"}) + call("write_file",
                                                                               {"path": "c.txt", "content": "3\n"}),
               "done"]
    info = await h.create(owner="a", workspace=ws, title="", source={},
                          policy={"kind": "scripted", "outputs": outputs}, approval_mode="ask-edits")
    watcher = asyncio.create_task(_approve_when_asked(h, info, {"t1s1c0": (False, "no"), "t1s1c1": (True, "")}))
    await asyncio.sleep(0.05)
    await h.send(info, "go")
    await asyncio.wait_for(watcher, 20)
    branch_policy = {"kind": "scripted", "outputs": [call("write_file", {"path": "d.txt", "content": "4\n"}), "ok"]}
    new = await asyncio.wait_for(h.branch(info, owner="a", from_step=1, policy=branch_policy), 20)  # never waits
    live = h.live[new.id]
    assert live.session.approval_mode == "ask-edits"
    for _ in range(200):  # the continuation asks about its own call
        if live.approvals.pending():
            break
        await asyncio.sleep(0.02)
    [pending] = live.approvals.pending()
    await h.answer_approval(new, pending.call_id, approved=False)
    await asyncio.wait_for(live.turn_task, 20)
    events = await asyncio.to_thread(h.log.all_events, new.id)
    resolved = [(e.call_id, e.approved, e.by) for e in events if e.type == "approval_resolved"]
    assert resolved == [("t1s1c0", False, "recording"), ("t1s1c1", True, "recording"),
                        (pending.call_id, False, "user")]
    results = {e.call_id: e for e in events if e.type == "tool_result"}
    assert not results["t1s1c0"].ok and results["t1s1c1"].ok
    branch_ws = live.workspace
    assert not (branch_ws.root / "a.txt").exists() and (branch_ws.root / "c.txt").exists()


async def test_bad_modes_and_answers_are_refused(hub) -> None:
    from backend.hub import HubError

    h, ws = hub
    with pytest.raises(HubError) as exc:
        await h.create(owner="a", workspace=ws, title="", source={}, policy={"kind": "scripted", "outputs": []},
                       approval_mode="yolo")
    assert exc.value.status == 400
    info = await h.create(owner="a", workspace=ws, title="", source={}, policy={"kind": "scripted", "outputs": []})
    with pytest.raises(HubError) as exc:
        await h.answer_approval(info, "t1s1c0", approved=True)
    assert exc.value.status == 409
    with pytest.raises(HubError) as exc:
        await h.answer_approval(info, "t1s1c0", approved=True, reason="x" * 2001)
    assert exc.value.status == 400


async def test_an_interrupt_right_after_send_is_not_lost(hub) -> None:
    """The hub records the status before the session's turn starts; an interrupt in that
    window must still stop the turn (one waiting for an approval would wait for ever)."""
    from agent.parser import encode_call as call

    h, ws = hub
    info = await h.create(owner="a", workspace=ws, title="", source={}, approval_mode="ask-edits",
                          policy={"kind": "scripted", "outputs": [call("write_file", {"path": "a", "content": ""})]})
    await h.send(info, "go")
    assert await asyncio.wait_for(h.interrupt(info), 10)  # at once: the turn has not begun yet
    events = await asyncio.to_thread(h.log.all_events, info.id)
    assert events[-1].type == "turn_end" and events[-1].reason == "interrupted"


async def test_a_workspace_view_is_what_the_live_sessions_tools_act_on(hub) -> None:
    h, ws = hub
    seen: list[str] = []

    class Upper:
        """A view whose reads shout: the read_file result shows the tools used it."""

        def __init__(self, inner):
            self._inner = inner

        def __getattr__(self, name):
            return getattr(self._inner, name)

        def read_bytes(self, rel, *, limit=None):
            seen.append(rel)
            return self._inner.read_bytes(rel, limit=limit).upper()

    h.workspace_view = lambda info, workspace: Upper(workspace)
    read = '<tool_call name="read_file">\n<param name="path">f.txt</param>\n</tool_call>'
    info = await h.create(owner="a", workspace=ws, title="", source={},
                          policy={"kind": "scripted", "outputs": [read, "done"]})
    await h.send(info, "read it")
    events = [e async for e in _until_end(h.stream(info, 0))]
    result = next(e for e in events if e.type == "tool_result")
    assert seen == ["f.txt"] and "X" in result.output
    assert (ws.root / "f.txt").read_text() == "x\n"


async def test_record_event_returns_the_stored_event_live_or_not(hub) -> None:
    h, ws = hub
    info = await h.create(owner="a", workspace=ws, title="", source={}, policy={"kind": "scripted", "outputs": ["x"]})
    assert info.id not in h.live
    cold = await h.record_event(info, FeedbackEvent(target="turn", of_turn=0, rating="up", by="a"))
    assert isinstance(cold, FeedbackEvent) and cold.seq == 1 and cold.session_id == info.id  # straight to the log
    await h.get_live(info)
    warm = await h.record_event(info, FeedbackEvent(target="turn", of_turn=0, rating="down", by="a"))
    assert isinstance(warm, FeedbackEvent) and warm.seq == 2
    assert [e.seq for e in await asyncio.to_thread(h.log.all_events, info.id)] == [1, 2]
