"""Frontier replay's buffer (rl.train.replay); the loop's use of it is in test_loop.py."""

from __future__ import annotations

import json

from rl.train.replay import FrontierReplay


def test_varied_tasks_come_back_newest_first_and_others_leave() -> None:
    buf = FrontierReplay(limit=2)
    buf.update(["a", "b", "c"], varied={"a", "c"})
    buf.update(["d", "e"], varied={"e"})
    assert buf.take(2) == ["e", "a"]  # newest iteration first, then draw order
    assert [t for t, _ in buf.entries] == ["c"]  # taken ids leave until update() puts them back
    buf.update(["e", "a", "f"], varied={"a"})  # e was not varied again: gone; a comes back
    assert [t for t, _ in buf.entries] == ["a", "c"]


def test_a_task_is_replayed_at_most_limit_times_in_a_row() -> None:
    buf = FrontierReplay(limit=2)
    buf.update(["a"], varied={"a"})
    runs = []
    for _ in range(4):
        taken = buf.take(1)
        runs.append(taken)
        buf.update(taken or ["x"], varied={"a", "x"})
    # fresh a -> replayed twice -> out; x (drawn fresh when the buffer was empty) takes its place
    assert runs == [["a"], ["a"], [], ["x"]]


def test_take_skips_excluded_ids_and_keeps_them() -> None:
    buf = FrontierReplay()
    buf.update(["a", "b", "c"], varied={"a", "b", "c"})
    assert buf.take(2, exclude={"a"}) == ["b", "c"]
    assert [t for t, _ in buf.entries] == ["a"]
    assert buf.take(5) == ["a"] and buf.take(5) == []


def test_a_task_drawn_fresh_while_buffered_restarts_its_count() -> None:
    buf = FrontierReplay(limit=1)
    buf.update(["a"], varied={"a"})
    assert buf.take(1) == ["a"]
    buf.update(["a"], varied={"a"})  # replayed once = the limit: out
    assert buf.entries == []
    buf.update(["a"], varied={"a"})  # drawn fresh from the order later: back, count 0
    assert buf.entries == [("a", 0)]


def test_state_round_trips_through_json() -> None:
    buf = FrontierReplay(limit=3)
    buf.update(["a", "b"], varied={"a", "b"})
    buf.take(1)
    buf.update(["a"], varied={"a"})
    again = FrontierReplay.from_state(json.loads(json.dumps(buf.to_state())), limit=3)
    assert again.entries == buf.entries == [("a", 1), ("b", 0)]
    assert FrontierReplay.from_state(None, limit=2).entries == []


def test_capacity_drops_the_oldest() -> None:
    buf = FrontierReplay(capacity=3)
    buf.update(["a", "b"], varied={"a", "b"})
    buf.update(["c", "d"], varied={"c", "d"})
    assert [t for t, _ in buf.entries] == ["c", "d", "a"]
