"""Rollouts of an OpenAI-compatible model (``flywheel rl eval --policy openai``), in this process.

The same runtime as training and serving: each sample forks the task's starting
workspace, builds its session with :func:`agent.runtime.build_session` from
``SessionParts(fork, make_sandbox())`` (the production tools and sandbox) driven
by :class:`agent.policies.openai_compat.OpenAICompatPolicy`, and is graded by
:meth:`rl.rollout.driver.TaskEnv.grade` on a fresh fork with the tests restored.
No Ray: the model runs elsewhere, so the only work here is tools and graders.

Statuses as :mod:`rl.rollout.worker` gives them (finished / limit / policy error
/ infrastructure error). Not recorded: token ids, logprobs or routes (an
evaluation trains on nothing); ``model_calls`` counts ``assistant_message``
events. Not guaranteed: the server's own sampling settings beyond ``temperature``
and ``max_tokens``; at most ``concurrency`` sessions run at once.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rl.reward import LIMIT_REASONS, limit_shares
from rl.types import Rollout, RolloutStatus

if TYPE_CHECKING:
    from rl.tasks.spec import Task

__all__ = ["run_policy_rollouts"]


async def run_policy_rollouts(tasks: Sequence[Task], k: int, openai: Any, *, limits: Any, store_root: Path,
                              run_id: str = "eval", concurrency: int = 4) -> list[Rollout]:
    """``k`` graded rollouts of each task (in task, sample order) with the model ``openai`` names."""
    from rl.rollout.taskenv import TaskEnv
    from tools.sandbox import make_sandbox
    from tools.workspace import WorkspaceStore

    store = WorkspaceStore(store_root)
    sandbox = make_sandbox()
    gate = asyncio.Semaphore(concurrency)
    out: list[Rollout] = []
    for task in tasks:
        env = TaskEnv(task)
        base = await asyncio.to_thread(env.start_workspace, store)
        try:
            async def one(g: int, env: TaskEnv = env, base: Any = base) -> Rollout:
                async with gate:
                    return await _one(env, base, g, openai, limits, sandbox, run_id, str(store.blobs.root))

            out += await asyncio.gather(*(one(g) for g in range(k)))
        finally:
            await asyncio.to_thread(base.delete)
    return out


async def _one(env: Any, base: Any, sample: int, openai: Any, limits: Any, sandbox: Any, run_id: str,
               blob_root: str) -> Rollout:
    from agent.events import ErrorEvent, ListSink
    from agent.policies.openai_compat import OpenAICompatPolicy
    from agent.runtime import SessionParts, build_session

    session_id = "rl" + uuid.uuid4().hex[:30]  # 32 characters, as rl.rollout.worker's (the log's column)
    rollout = Rollout(run_id, 0, env.task_id, sample, RolloutStatus.INFRA_ERROR, session_id=session_id)
    t0 = time.perf_counter()
    try:
        fork = await asyncio.to_thread(base.fork)
    except Exception as exc:  # noqa: BLE001 - ours: an infrastructure error
        rollout.detail = f"workspace fork failed: {type(exc).__name__}: {exc}"
        return rollout
    rollout.base_snapshot, rollout.blob_root = fork.base.to_json().decode(), blob_root  # for replay
    sink = ListSink()
    policy = None
    try:
        policy = OpenAICompatPolicy(openai)
        session = build_session(SessionParts(fork, sandbox), policy=policy, limits=limits, sink=sink,
                                session_id=session_id, profile=policy.prompt_profile)
        outcome = await session.run_turn(env.request)
        # which limit ended it, as rl.rollout.worker records it (0/1 each)
        rollout.metrics |= limit_shares(outcome.reason)
        errors = sink.of_type(ErrorEvent)
        if outcome.reason == "completed":
            rollout.status = RolloutStatus.FINISHED
        elif outcome.reason in LIMIT_REASONS:
            rollout.status = RolloutStatus.LIMIT
        elif errors and all(e.source == "policy" for e in errors):
            rollout.status = RolloutStatus.POLICY_ERROR
        rollout.detail = "; ".join(e.message for e in errors) or ("" if outcome.reason == "completed"
                                                                  else outcome.reason)
        wall = time.perf_counter() - t0
        if rollout.status is not RolloutStatus.INFRA_ERROR:
            g0 = time.perf_counter()
            try:
                rollout.grade, changed = await env.grade(fork, sandbox)
            except Exception as exc:  # noqa: BLE001 - ours
                rollout.status, rollout.detail = RolloutStatus.INFRA_ERROR, f"grading failed: {exc}"
                changed = False
            rollout.metrics |= {"changed": float(changed), "grading_s": time.perf_counter() - g0}
        rollout.metrics["wall_s"] = wall
    except Exception as exc:  # noqa: BLE001 - a bug of ours, never a silent zero
        rollout.status, rollout.detail = RolloutStatus.INFRA_ERROR, f"{type(exc).__name__}: {exc}"
    finally:
        if policy is not None:
            await policy.aclose()
        await asyncio.to_thread(fork.delete)
    rollout.events = [e.model_dump(mode="json") for e in sink.events]
    return rollout
