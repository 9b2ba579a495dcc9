"""RL runs for support staff (staff only): runs, their curves, and the rollouts behind each curve point.

Each rollout is a session (``kind`` rl): open it with the session and replay
routes. See :mod:`backend.db.rl_runs` for what is recorded.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query
from pydantic import BaseModel, Field

from backend.api.deps import StaffUser, StateDep
from backend.api.routes.sessions import MAX_SEQ
from backend.db.rl_runs import Split, iteration_rollouts, list_runs, run_detail
from backend.errors import NotFound

router = APIRouter(prefix="/v1/rl", tags=["rl"])
RunId = Annotated[str, Path(max_length=64, description="an RL run id")]


class Run(BaseModel):
    id: str
    created_at: str = Field(description="ISO 8601, UTC (ends with Z)")
    status: str = Field(description="running, finished, stopped or failed")
    notes: str
    iterations: int = Field(description="iterations with recorded metrics")
    last_iteration: int | None
    rollouts: int = Field(description="training rollouts recorded")
    heldout_rollouts: int = Field(description="held-out evaluation rollouts recorded")


class Panel(BaseModel):
    title: str
    keys: list[str] = Field(description="keys of series drawn on this panel")


class RunCurves(BaseModel):
    id: str
    created_at: str
    status: str
    notes: str
    config: dict[str, Any] = Field(description="the run's validated config (rl/config.py)")
    iterations: list[int] = Field(description="the x axis: iterations with metrics, ascending")
    series: dict[str, list[float | None]] = Field(
        description="every numeric metric, one value per iteration (null: not measured at that iteration): "
        "success_rate, mean_reward, tokens_per_solved, parallel_call_share, blind_edit_rate, logprob_diff_mean, "
        "kl_sampler_trainer, heldout_*, loss, time_*_s, ...")
    panels: list[Panel] = Field(description="the curves the UI shows first, each with the keys it has")


class Rollout(BaseModel):
    session_id: str = Field(description="open with GET /v1/sessions/{id}, /timeline, /calls, ...")
    sample: int | None
    reward: float | None
    status: str | None = Field(description="finished, limit, policy_error, infra_error; null: never finished recording")
    turns: int
    output_tokens: int
    created_at: str


class TaskGroup(BaseModel):
    task: str
    rollouts: list[Rollout]
    mean_reward: float | None
    best_reward: float | None


class IterationRollouts(BaseModel):
    run: str
    iteration: int
    split: Split
    tasks: list[TaskGroup]


def _iso(t: Any) -> str:
    return t.isoformat() + "Z"


@router.get("/runs")
async def runs(state: StateDep, _: StaffUser) -> list[Run]:
    """Every RL run, newest first."""
    got = await asyncio.to_thread(list_runs, state.log.engine)
    return [Run(id=r.id, created_at=_iso(r.created_at), status=r.status, notes=r.notes, iterations=r.iterations,
                last_iteration=r.last_iteration, rollouts=r.rollouts, heldout_rollouts=r.heldout_rollouts) for r in got]


@router.get("/runs/{run_id}")
async def run_curves(run_id: RunId, state: StateDep, _: StaffUser) -> RunCurves:
    """A run's config and its per-iteration curves."""
    d = await asyncio.to_thread(run_detail, state.log.engine, run_id)
    if d is None:
        raise NotFound(f"no RL run {run_id}")
    return RunCurves(id=d.id, created_at=_iso(d.created_at), status=d.status, notes=d.notes, config=d.config,
                     iterations=d.iterations, series=d.series,
                     panels=[Panel(title=t, keys=ks) for t, ks in d.panels])


@router.get("/runs/{run_id}/iterations/{iteration}/rollouts")
async def rollouts(
    run_id: RunId, state: StateDep, _: StaffUser,
    iteration: Annotated[int, Path(ge=0, le=MAX_SEQ)],
    split: Annotated[Split, Query(description="train, or heldout: the evaluation at that iteration")] = "train",
) -> IterationRollouts:
    """One iteration's rollouts grouped by task, with their rewards: the rollouts behind a curve point."""
    if await asyncio.to_thread(run_detail, state.log.engine, run_id) is None:
        raise NotFound(f"no RL run {run_id}")
    groups = await asyncio.to_thread(iteration_rollouts, state.log.engine, run_id, iteration, split)
    tasks = []
    for g in groups:
        rewards = g.rewards
        tasks.append(TaskGroup(
            task=g.task, mean_reward=sum(rewards) / len(rewards) if rewards else None,
            best_reward=max(rewards) if rewards else None,
            rollouts=[Rollout(session_id=r.session_id, sample=r.sample, reward=r.reward, status=r.status,
                              turns=r.turns, output_tokens=r.output_tokens, created_at=_iso(r.created_at))
                      for r in g.rollouts]))
    return IterationRollouts(run=run_id, iteration=iteration, split=split, tasks=tasks)
