"""Reading RL runs back from the session log: runs, per-iteration curves, rollouts grouped by task.

What :class:`backend.rl_log.RLSessionLog` records: ``rl_runs`` (a run's
config and status), ``rl_iterations`` (one metrics object per iteration: the
keys ``rl.train.metrics`` and the training loop write, e.g. ``success_rate``,
``mean_reward``, ``tokens_per_solved``, ``parallel_call_share``,
``blind_edit_rate``, ``logprob_diff_mean``, ``heldout_pass_at_1``), and one
session per rollout tagged with run, iteration, task, sample, reward and
status. A run's held-out evaluation rollouts are recorded under the run id
``NAME/heldout`` (``split="heldout"`` here).

Not guaranteed: which metric keys an iteration has (a key that was not
measured is absent, and its curve has ``None`` there); the ``panels`` list
names the curves the issue asks for, each only if some iteration has it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session as DbSession

from backend.db.models import RlIterationRow, RlRunRow, SessionRow

Split = Literal["train", "heldout"]
HELDOUT_SUFFIX = "/heldout"
PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("success rate", ("success_rate", "heldout_success_rate")),
    ("held-out pass@1", ("heldout_pass_at_1",)),
    ("mean reward", ("mean_reward",)),
    ("tokens per solved task", ("tokens_per_solved", "heldout_tokens_per_solved")),
    ("share of model calls with >= 2 parallel calls", ("parallel_call_share", "heldout_parallel_call_share")),
    ("blind-edit rate", ("blind_edit_rate", "heldout_blind_edit_rate")),
    ("malformed-call rate", ("malformed_call_rate", "heldout_malformed_call_rate")),
    ("sampler/trainer mismatch", ("logprob_diff_mean", "logprob_diff_max", "kl_sampler_trainer")),
)
"""Curves worth a panel of their own (title, metric keys), in the order a UI shows them."""


def run_of(run_id: str, split: Split) -> str:
    """The ``rl_run`` tag of a run's rollouts for ``split``."""
    return run_id + HELDOUT_SUFFIX if split == "heldout" else run_id


@dataclass(frozen=True, slots=True)
class RunSummary:
    id: str
    created_at: datetime
    status: str
    notes: str
    iterations: int
    last_iteration: int | None
    rollouts: int
    heldout_rollouts: int


def list_runs(engine: Engine) -> list[RunSummary]:
    """Every recorded run, newest first, with its iteration and rollout counts."""
    with DbSession(engine) as db:
        runs = db.scalars(select(RlRunRow).order_by(RlRunRow.created_at.desc(), RlRunRow.id)).all()
        iters = {r: (n, last) for r, n, last in db.execute(
            select(RlIterationRow.run_id, func.count(), func.max(RlIterationRow.iteration))
            .group_by(RlIterationRow.run_id))}
        rollouts = dict(db.execute(select(SessionRow.rl_run, func.count()).where(SessionRow.kind == "rl")
                                   .group_by(SessionRow.rl_run)).all())
    return [RunSummary(r.id, r.created_at, r.status, r.notes, iters.get(r.id, (0, None))[0],
                       iters.get(r.id, (0, None))[1], int(rollouts.get(r.id, 0)),
                       int(rollouts.get(r.id + HELDOUT_SUFFIX, 0))) for r in runs]


@dataclass(frozen=True, slots=True)
class RunDetail:
    id: str
    created_at: datetime
    status: str
    notes: str
    config: dict[str, Any]
    iterations: list[int]
    series: dict[str, list[float | None]]  # metric key -> its value per iteration (None: not measured)
    panels: list[tuple[str, list[str]]]


def run_detail(engine: Engine, run_id: str) -> RunDetail | None:
    """A run's config and curves (every numeric metric per iteration), or None if it is not recorded."""
    with DbSession(engine) as db:
        run = db.get(RlRunRow, run_id)
        if run is None:
            return None
        rows = db.execute(select(RlIterationRow.iteration, RlIterationRow.metrics)
                          .where(RlIterationRow.run_id == run_id).order_by(RlIterationRow.iteration)).all()
        config = dict(run.config or {})
    iterations = [it for it, _ in rows]
    keys = sorted({k for _, m in rows for k, v in (m or {}).items() if _number(v) is not None and k != "iteration"})
    series = {k: [_number((m or {}).get(k)) for _, m in rows] for k in keys}
    panels = [(title, [k for k in ks if k in series]) for title, ks in PANELS]
    return RunDetail(run.id, run.created_at, run.status, run.notes, config, iterations, series,
                     [(t, ks) for t, ks in panels if ks])


def _number(v: object) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        return None
    return float(v)


@dataclass(frozen=True, slots=True)
class RolloutRef:
    session_id: str
    sample: int | None
    reward: float | None
    status: str | None  # None: recording never finished (see backend.rl_log)
    turns: int
    output_tokens: int
    created_at: datetime


@dataclass(slots=True)
class TaskRollouts:
    task: str
    rollouts: list[RolloutRef] = field(default_factory=list)

    @property
    def rewards(self) -> list[float]:
        return [r.reward for r in self.rollouts if r.reward is not None]


def iteration_rollouts(engine: Engine, run_id: str, iteration: int, split: Split = "train") -> list[TaskRollouts]:
    """The rollouts of one iteration of a run, grouped by task (tasks sorted, samples in order)."""
    s = SessionRow
    q = (select(s.id, s.rl_task, s.rl_sample, s.rl_reward, s.rl_status, s.turns, s.output_tokens, s.created_at)
         .where(s.kind == "rl", s.rl_run == run_of(run_id, split), s.rl_iteration == iteration)
         .order_by(s.rl_task, s.rl_sample, s.id))
    groups: dict[str, TaskRollouts] = {}
    with DbSession(engine) as db:
        for sid, task, sample, reward, status, turns, tokens, created in db.execute(q):
            groups.setdefault(task or "", TaskRollouts(task or "")).rollouts.append(
                RolloutRef(sid, sample, reward, status, turns, tokens, created))
    return list(groups.values())
