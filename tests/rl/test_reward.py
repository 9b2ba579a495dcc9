"""rl.reward: the ordering properties the docstring states, on exhaustive small grids."""

from __future__ import annotations

import itertools

import pytest

from agent.events import AssistantMessage, FileEditEvent, ToolCallStarted, TurnEnd
from rl.reward import UngradedError, reward, reward_from_counts
from rl.types import GradeResult

GRID = list(itertools.product([False, True], [False, True], range(0, 12), [False, True], range(1, 60)))


def _r(passed: bool, changed: bool, malformed: int, limit: bool, calls: int) -> float:
    return reward_from_counts(passed=passed, changed=changed, malformed=malformed, hit_limit=limit,
                              model_calls=calls)[0]


def test_every_success_beats_every_failure() -> None:
    wins = [_r(*g) for g in GRID if g[0] and g[1]]
    losses = [_r(*g) for g in GRID if not (g[0] and g[1])]
    assert min(wins) > max(losses)


def test_malformed_failure_below_every_well_formed_failure() -> None:
    failed = [g for g in GRID if not (g[0] and g[1])]
    assert max(_r(*g) for g in failed if g[2] > 0) < min(_r(*g) for g in failed if g[2] == 0)


def test_one_more_malformed_call_never_helps() -> None:
    for p, c, m, lim, calls in GRID:
        assert _r(p, c, m + 1, lim, calls) <= _r(p, c, m, lim, calls)


def test_ending_without_touching_anything_is_never_rewarded() -> None:
    assert max(_r(*g) for g in GRID if not g[1]) < 0.0
    value, terms = reward([AssistantMessage(step=1, text="done")], GradeResult(True, "", 0.1))
    assert terms["success"] == 0.0 and terms["idle"] == -0.12 and value == pytest.approx(-0.12)


def test_giving_up_never_beats_running_out() -> None:
    # the hack the first experiment found: with nothing succeeding, end the turn at once
    for p, c, m, _, calls in GRID:
        if not (p and c):
            assert _r(p, False, m, False, 1) < _r(p, c, m, True, calls), (p, c, m, calls)


def test_from_events() -> None:
    events = [
        AssistantMessage(step=1, text="x"),
        ToolCallStarted(step=1, index=0, call_id="c1", name=None, args={}, valid=False),
        FileEditEvent(call_id="c2", path="a.py", diff="-"),
        AssistantMessage(step=2, text="y"),
        TurnEnd(reason="completed", steps=2, output_tokens=5),
    ]
    value, terms = reward(events, GradeResult(True, "", 0.1))
    assert terms == {"success": 1.0, "malformed": -0.15, "limit": 0.0, "idle": 0.0, "effort": -0.01}
    assert value == pytest.approx(0.84)
    _, terms = reward([*events[:-1], TurnEnd(reason="max_steps", steps=2, output_tokens=5)],
                      GradeResult(False, "", 0.1))
    assert terms["limit"] == -0.1 and terms["idle"] == 0.0 and terms["effort"] == 0.0


def test_infra_error_is_not_scored_but_a_timeout_is_a_failure() -> None:
    with pytest.raises(UngradedError, match="not scored: sandbox broke"):
        reward([], GradeResult(False, "", 0.0, error="sandbox broke"))
    edit = FileEditEvent(call_id="c", path="a.py", diff="-")
    value, terms = reward([edit], GradeResult(True, "", 60.0, error="timed out", timed_out=True))
    assert terms["success"] == 0.0 and value == 0.0


@pytest.mark.parametrize("rate", [0.0, 0.04, 0.2])
def test_every_effort_rate_up_to_the_cap_keeps_the_orderings(rate: float) -> None:
    def r(passed: bool, changed: bool, malformed: int, limit: bool, calls: int) -> float:
        return reward_from_counts(passed=passed, changed=changed, malformed=malformed, hit_limit=limit,
                                  model_calls=calls, effort_per_call=rate)[0]

    wins = [r(*g) for g in GRID if g[0] and g[1]]
    assert min(wins) > max(r(*g) for g in GRID if not (g[0] and g[1]))
    # among solutions, one more model call never helps and costs exactly the rate until the cap
    assert r(True, True, 0, False, 2) - r(True, True, 0, False, 1) == pytest.approx(-rate)
    assert all(r(True, True, 0, False, c + 1) <= r(True, True, 0, False, c) for c in range(1, 59))


@pytest.mark.parametrize("rate", [-0.01, 0.21])
def test_an_effort_rate_outside_the_cap_is_refused(rate: float) -> None:
    with pytest.raises(ValueError, match="effort_per_call"):
        reward_from_counts(passed=True, changed=True, malformed=0, hit_limit=False, model_calls=3,
                           effort_per_call=rate)
