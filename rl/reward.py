"""The reward of one rollout: success, plus small documented shaping.

``reward = success + malformed + limit + idle + effort`` where

* ``success`` = 1.0 when the grader passed **and** the rollout changed the
  workspace, else 0.0. The task is what is rewarded; a rollout that edits
  nothing never gets it (a grader passing on the start means a broken task,
  dropped at validation anyway — this is the second guard).
* ``malformed`` = 0 without malformed calls, else
  ``-(MALFORMED_FIRST + MALFORMED_EACH * (k - 1))`` for ``k`` malformed calls,
  at most ``MALFORMED_CAP`` in size. Why: a call the parser or schema rejects
  costs the user a wasted model call. ``MALFORMED_FIRST`` is larger than
  ``LIMIT``, so a failed rollout with a malformed call always scores below
  *every* well-formed failed rollout (Cursor's hack: broken calls to end or
  void hard attempts; here a broken call is scored, never discarded, and is
  never the cheaper way to fail).
* ``limit`` = ``-LIMIT`` when the turn ended on a limit (model calls, tokens,
  wall time): running out is worse than finishing.
* ``idle`` = ``-IDLE`` when the rollout changed nothing and ended the turn
  itself, before any limit. Why: without it, giving up at once (0) scored
  above trying until a limit (``-LIMIT``), and the first experiment's seed 0
  learned exactly that when no attempt in its groups succeeded
  (docs/rl/runs.md). ``IDLE`` is a little more than ``LIMIT``, so giving up
  is strictly the worst well-formed way to fail (an attempt that explored
  until a limit can still teach the group something; and the two differ, so
  an all-failing group still has a direction), yet less than
  ``MALFORMED_FIRST``, so a broken call stays worse than giving up. A failed
  attempt that did change files and ended in time scores 0, the best failure
  (a change is the only way a task is ever solved).
* ``effort`` (successes only) = ``-effort_per_call`` per model call beyond the
  first, at most ``EFFORT_CAP``: among solutions, faster ones (fewer model
  calls: the "feels fast" objective) score higher. Only on successes, so a
  failing rollout never gains by giving up early. ``effort_per_call`` is
  ``EFFORT_PER_CALL`` unless a run sets ``reward.effort_per_call``
  (``rl.config.RewardConfig``; at most ``EFFORT_CAP``): the cap, not the rate,
  is what keeps property 1, so any rate up to it keeps all four.

Properties (tested in ``tests/rl/test_reward.py``):

1. every success scores above every failure (the smallest success,
   ``1 - MALFORMED_CAP - LIMIT - EFFORT_CAP``, is > 0 >= the largest failure);
2. among failures, any rollout with a malformed call scores strictly below
   every rollout without one; for any outcome, one more malformed call never
   raises the reward;
3. a rollout that changed nothing gets no success term and scores below 0;
4. giving up (no change, the turn ended before a limit) scores below
   running out on a limit with the same number of malformed calls.

Grades: a ``GradeResult`` with ``error`` is an infrastructure error and is not
scored (:class:`UngradedError`; the rollout is excluded and counted), except
a timeout (``timed_out``): a validated task's grader finishes on the start
and on the reference, so a hang is the rollout's code, scored as a failure —
otherwise hanging the tests would be a way to void a bad attempt.

Not guaranteed: ``changed`` is derived from ``file_edit`` events unless the
caller passes it (pass ``bool(workspace.diff())`` to count edits made with
``run_command``).
"""

from __future__ import annotations

from collections.abc import Iterable

from agent.events import AssistantMessage, Event, FileEditEvent, ToolCallStarted, TurnEnd
from rl.types import GradeResult

__all__ = ["EFFORT_CAP", "EFFORT_PER_CALL", "IDLE", "LIMIT", "MALFORMED_CAP", "MALFORMED_EACH", "MALFORMED_FIRST",
           "LIMIT_REASONS", "UngradedError", "limit_shares", "reward", "reward_from_counts"]

MALFORMED_FIRST = 0.15
MALFORMED_EACH = 0.05
MALFORMED_CAP = 0.3
LIMIT = 0.1
IDLE = 0.12
EFFORT_PER_CALL = 0.01
EFFORT_CAP = 0.2
LIMIT_REASONS = frozenset({"max_steps", "max_tokens", "timeout"})

assert MALFORMED_FIRST > IDLE > LIMIT and 1 - MALFORMED_CAP - LIMIT - EFFORT_CAP > 0


def limit_shares(ended: str) -> dict[str, float]:
    """``limit_<reason>``: 1.0 for the limit that ended a turn (``ended``: its end reason), 0.0 for
    the others — per rollout; averaged over rollouts, the share each limit ended."""
    return {f"limit_{reason}": float(ended == reason) for reason in sorted(LIMIT_REASONS)}


class UngradedError(ValueError):
    """The grade is an infrastructure error: exclude the rollout, do not score it."""


def reward_from_counts(*, passed: bool, changed: bool, malformed: int, hit_limit: bool,
                       model_calls: int, effort_per_call: float = EFFORT_PER_CALL) -> tuple[float, dict[str, float]]:
    """The reward and its terms from the counts (see the module docstring); ``ValueError`` for an
    ``effort_per_call`` outside ``[0, EFFORT_CAP]``."""
    if not 0.0 <= effort_per_call <= EFFORT_CAP:
        raise ValueError(f"effort_per_call must be in [0, {EFFORT_CAP}], got {effort_per_call}")
    success = 1.0 if passed and changed else 0.0
    mal = 0.0 if malformed <= 0 else -min(MALFORMED_CAP, MALFORMED_FIRST + MALFORMED_EACH * (malformed - 1))
    lim = -LIMIT if hit_limit else 0.0
    idle = -IDLE if not changed and not hit_limit else 0.0
    effort = -min(EFFORT_CAP, effort_per_call * max(0, model_calls - 1)) if success else 0.0
    terms = {"success": success, "malformed": mal, "limit": lim, "idle": idle, "effort": effort}
    return sum(terms.values()), terms


def reward(events: Iterable[Event], grade: GradeResult, *, changed: bool | None = None,
           effort_per_call: float = EFFORT_PER_CALL) -> tuple[float, dict[str, float]]:
    """(reward, terms) for a rollout's events and its grade; :class:`UngradedError` for an
    infrastructure-error grade."""
    if grade.error and not grade.timed_out:
        raise UngradedError(f"not scored: {grade.error}")
    evs = list(events)

    return reward_from_counts(
        passed=grade.passed and not grade.timed_out,
        changed=changed if changed is not None else any(isinstance(e, FileEditEvent) for e in evs),
        malformed=sum(1 for e in evs if isinstance(e, ToolCallStarted) and not e.valid),
        hit_limit=any(isinstance(e, TurnEnd) and e.reason in LIMIT_REASONS for e in evs),
        model_calls=sum(1 for e in evs if isinstance(e, AssistantMessage)),
        effort_per_call=effort_per_call,
    )
