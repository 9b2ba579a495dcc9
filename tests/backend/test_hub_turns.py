"""The hub's turn slot: once a client has seen a turn's ``turn_end``, its next message is accepted.

A ``turn_end`` is visible (in the log, and to every watcher) a few event-loop
iterations before the turn's task is gone: the emitting coroutine resumes only
after the writer thread's wake-up, then the session and the hub tear the turn
down (and the hub may evict a session nobody watches). A message sent in that
window must start the next turn, in the session the hub holds, one turn at a time.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agent.events import Event, TurnEnd
from backend.db.engine import make_engine, migrate
from backend.db.log import SessionLog, StoredEvent
from backend.db.writer import EventWriter
from backend.hub import Hub, HubError
from backend.policies import PolicyFactory
from tools.workspace import WorkspaceStore

TURNS = 30


class SeenWriter(EventWriter):
    """A real :class:`EventWriter` that tells the test the moment a ``turn_end`` is
    committed (as a client polling ``/events`` or reading the socket learns of it), and
    then holds the emitting coroutine for ``hold`` loop iterations before it resumes (the
    writer thread descheduled between its commit and its wake-up call)."""

    def __init__(self, log: SessionLog, hold: int) -> None:
        super().__init__(log)
        self.hold = hold
        self.turn_ends: asyncio.Queue[Event] = asyncio.Queue()

    async def append(self, event: Event) -> StoredEvent:
        stored = await super().append(event)
        if isinstance(event, TurnEnd):
            self.turn_ends.put_nowait(stored.event)
            for _ in range(self.hold):
                await asyncio.sleep(0)
        return stored


@pytest.fixture(params=[0, 5], ids=["wakeup-on-time", "wakeup-late"])
async def hub(request: pytest.FixtureRequest, tmp_path: Path):
    engine = make_engine(f"sqlite:///{tmp_path / 'h.db'}")
    migrate(engine)
    log = SessionLog(engine)
    writer = SeenWriter(log, hold=request.param)
    store = WorkspaceStore(tmp_path / "store")
    h = Hub(log_=log, writer=writer, store=store, sandbox=None, policies=PolicyFactory(openai_base_url=None))
    src = tmp_path / "src"
    src.mkdir()
    (src / "f.txt").write_text("x\n")
    yield h, writer, store.from_dir(src)
    await h.shutdown()
    writer.close()
    engine.dispose()


async def test_a_message_sent_the_moment_turn_end_is_seen_starts_the_next_turn(hub) -> None:
    """Nobody watches the session (a REST client: POST /messages after GET /events), so
    each finished turn also evicts it; the next message must still find it, run in the
    live session the hub holds, and be the only turn running."""
    h, writer, ws = hub
    info = await h.create(owner="a", workspace=ws, title="", source={},
                          policy={"kind": "scripted", "outputs": [f"answer {i}" for i in range(TURNS)]})
    await h.send(info, "message 0")
    for i in range(1, TURNS):
        end = await writer.turn_ends.get()  # no wait_for: it would add a task, hence a loop iteration
        assert end.reason == "completed"
        await h.send(info, f"message {i}")  # the moment turn i's turn_end is out: accepted
        live = h.live[info.id]  # the turn runs in the session the hub holds (interrupts reach it)
        assert live.running and not live.turn_ended
        with pytest.raises(HubError) as busy:  # and it is the only one
            await h.send(info, "one too many")
        assert busy.value.status == 409
    last = await writer.turn_ends.get()
    assert last.reason == "completed"
    await asyncio.wait_for(live.turn_task, 10)
    events = await asyncio.to_thread(h.log.all_events, info.id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    kinds = [e.type for e in events if e.type in ("turn_started", "turn_end")]
    assert kinds == ["turn_started", "turn_end"] * TURNS  # one turn at a time
    assert [e.text for e in events if e.type == "user_message"] == [f"message {i}" for i in range(TURNS)]
    assert [e.text for e in events if e.type == "assistant_message"] == [f"answer {i}" for i in range(TURNS)]


async def test_a_watched_session_accepts_a_message_sent_on_turn_end(hub) -> None:
    """A WebSocket client: it reads the stream and sends its next message on each turn_end."""
    h, writer, ws = hub
    info = await h.create(owner="a", workspace=ws, title="", source={},
                          policy={"kind": "scripted", "outputs": [f"answer {i}" for i in range(TURNS)]})
    sent = 1
    await h.send(info, "message 0")
    async for e in h.stream(info, 0):
        if e.type == "turn_end":
            assert e.reason == "completed"
            if sent == TURNS:
                break
            await h.send(info, f"message {sent}")
            sent += 1
    events = await asyncio.to_thread(h.log.all_events, info.id)
    assert [e.text for e in events if e.type == "assistant_message"] == [f"answer {i}" for i in range(TURNS)]
