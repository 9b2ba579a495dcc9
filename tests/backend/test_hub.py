"""Hub backpressure: a slow client is dropped without stalling the agent or others."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agent.events import AssistantDelta
from backend.db.engine import make_engine, migrate
from backend.db.log import EventWriter, SessionLog
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
