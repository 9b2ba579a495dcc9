"""The hub sends clients the event the log stored: a stand-in for a bad event, never the bad one; one
encoded line per event, the same for every subscriber and for the backlog."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent.events import AssistantDelta, ErrorEvent, event_to_json
from backend.db.engine import make_engine, migrate
from backend.db.log import SessionLog, StoredEvent
from backend.db.writer import EventWriter
from backend.hub import Hub, _PersistThenBroadcast
from backend.policies import PolicyFactory
from tools.workspace import Workspace, WorkspaceStore


@pytest.fixture
async def hub(tmp_path: Path) -> AsyncIterator[tuple[Hub, Workspace]]:
    engine = make_engine(f"sqlite:///{tmp_path / 'h.db'}")
    migrate(engine)
    log = SessionLog(engine)
    writer = EventWriter(log)
    store = WorkspaceStore(tmp_path / "store")
    h = Hub(log_=log, writer=writer, store=store, sandbox=None, policies=PolicyFactory(openai_base_url=None))
    src = tmp_path / "src"
    src.mkdir()
    try:
        yield h, store.from_dir(src)
    finally:
        await h.shutdown()
        writer.close()
        engine.dispose()


async def test_a_live_client_gets_the_error_stand_in_with_the_same_seq(hub: tuple[Hub, Workspace]) -> None:
    h, ws = hub
    info = await h.create(owner="a", workspace=ws, title="", source={},
                          policy={"kind": "scripted", "outputs": ["x"]})
    stream = h.stream(info, 0)
    first = asyncio.ensure_future(stream.__anext__())  # subscribes, then waits for a live event
    await asyncio.sleep(0.05)
    sink = _PersistThenBroadcast(h, info.id)
    # model_construct skips the validator that makes events serialisable
    await sink.emit(AssistantDelta.model_construct(seq=1, session_id=info.id, turn=1, ts=1.0, step=1, text="\ud800"))
    await sink.emit(AssistantDelta(seq=2, session_id=info.id, turn=1, step=1, text="fine"))
    got = [await asyncio.wait_for(first, 10), await asyncio.wait_for(stream.__anext__(), 10)]
    await stream.aclose()
    assert isinstance(got[0], ErrorEvent) and got[0].seq == 1 and "assistant_delta" in got[0].message
    event_to_json(got[0])  # what the WebSocket sends
    assert got[1].seq == 2 and got[1].text == "fine"


async def test_every_subscriber_and_the_backlog_get_the_one_line_the_log_holds(hub: tuple[Hub, Workspace]) -> None:
    h, ws = hub
    log = h.log
    info = await h.create(owner="a", workspace=ws, title="", source={},
                          policy={"kind": "scripted", "outputs": ["caf\u00e9 \u202e done"], "chunk_chars": 4})

    async def until_end(after: int = 0) -> list[StoredEvent]:
        out = []
        async for s in h.stream_stored(info, after):
            out.append(s)
            if s.event.type == "turn_end":
                return out
        return out

    readers = [asyncio.create_task(until_end()) for _ in range(3)]
    await asyncio.sleep(0.05)  # all three are subscribed
    await h.send(info, "hi")
    live = await asyncio.wait_for(asyncio.gather(*readers), 60)
    backlog = await until_end()  # a late reader: everything from the log
    rows = log.events_stored(info.id)
    assert len(rows) > 5 and [s.seq for s in backlog] == [r.seq for r in rows] == list(range(1, len(rows) + 1))
    for i, row in enumerate(rows):
        # live subscribers share one encoded object; its text is the row's body, and the backlog's
        assert live[0][i] is live[1][i] is live[2][i]
        assert live[0][i].json == row.json == backlog[i].json == event_to_json(live[0][i].event)
    assert "\\u202e" in next(r.json for r in rows if r.event.type == "assistant_message")  # inert line
