"""The hub sends clients the event the log stored: a stand-in for a bad event, never the bad one."""

from __future__ import annotations

import asyncio
from pathlib import Path

from agent.events import AssistantDelta, ErrorEvent, event_to_json
from backend.db.engine import make_engine, migrate
from backend.db.log import SessionLog
from backend.db.writer import EventWriter
from backend.hub import Hub, _PersistThenBroadcast
from backend.policies import PolicyFactory
from tools.workspace import WorkspaceStore


async def test_a_live_client_gets_the_error_stand_in_with_the_same_seq(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'h.db'}")
    migrate(engine)
    log = SessionLog(engine)
    writer = EventWriter(log)
    store = WorkspaceStore(tmp_path / "store")
    h = Hub(log_=log, writer=writer, store=store, sandbox=None, policies=PolicyFactory(openai_base_url=None))
    src = tmp_path / "src"
    src.mkdir()
    try:
        info = await h.create(owner="a", workspace=store.from_dir(src), title="", source={},
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
    finally:
        await h.shutdown()
        writer.close()
        engine.dispose()
