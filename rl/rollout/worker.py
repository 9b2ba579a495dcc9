"""Rollout workers: Ray actors that run rollouts as production sessions.

A rollout *is* a session: the worker forks the task's starting workspace
(``Workspace.fork``), builds the session with
:func:`agent.runtime.build_session` from ``SessionParts(fork, make_sandbox())``
— the production tool set, sandbox and the checkpoint's prompt profile — and
drives one turn with the task's request through the token-in/token-out policy
(:class:`agent.policies.tito.TokenInTokenOutPolicy`) over the inference actor.
Many rollouts of one worker run concurrently (``asyncio.gather``).

Each rollout ends with an explicit :class:`rl.types.RolloutStatus`:

* ``FINISHED`` — the model ended its turn; ``LIMIT`` — model calls
  (``Limits.max_steps``), output tokens or wall time ran out;
* ``POLICY_ERROR`` — the policy failed (the context is full, the prompt was
  not an extension of the previous one);
* ``INFRA_ERROR`` — our side failed (workspace fork, sandbox, the inference
  actor, an internal error in the loop): excluded from the loss and counted.

Rollouts come back with their events (JSON) for the driver to persist
(:func:`rl.rollout.log.persist`). Grading is the task's business: a task with
an async ``grade(workspace, sandbox) -> (GradeResult, changed)`` method (the
driver's :class:`rl.rollout.taskenv.TaskEnv`) is graded here, on the final
workspace before its fork is deleted (on a cluster that workspace exists only
on the worker's node); ``Rollout.grade`` and ``metrics["changed"]`` /
``metrics["grading_s"]`` record it. Rewards are the driver's.

Not guaranteed: a bound on the worker's memory (each live rollout holds its
events and token sequence), or ordering between rollouts.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from rl.reward import LIMIT_REASONS, limit_shares
from rl.types import Rollout, RolloutStatus, Segment

if TYPE_CHECKING:
    from agent.session import Limits
    from tools.protocols import Workspace
    from tools.workspace import WorkspaceStore


class RolloutTask(Protocol):
    """What a worker needs from a task (``rl.tasks`` provides the real one)."""

    task_id: str
    request: str

    def start_workspace(self, store: WorkspaceStore) -> Workspace:
        """The task's starting workspace in ``store`` (forked per rollout, never edited)."""
        ...


@dataclass(frozen=True, slots=True)
class DirTask:
    """A task whose starting workspace is a directory on the worker's machine."""

    task_id: str
    request: str
    source_dir: str

    def start_workspace(self, store: WorkspaceStore) -> Workspace:
        return store.from_dir(self.source_dir)


@dataclass(frozen=True, slots=True)
class RolloutJob:
    task: Any  # a RolloutTask (picklable: it crosses Ray's object store)
    run_id: str
    iteration: int
    sample: int
    seed: int | None = None
    temperature: float | None = None  # None: the worker's (held-out evaluation may sample differently)


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    store_root: str  # the worker's WorkspaceStore directory
    limits: Limits | None = None  # per rollout: model calls, output tokens, wall time (None: Limits())
    max_tokens: int = 256  # per model call
    temperature: float = 1.0
    return_routes: bool = True
    sandbox_extra_ro: tuple[str, ...] = ()
    sandboxed: bool = True  # False: no run_command tool (tests of tasks that need no commands)


@dataclass(slots=True)
class _Timed:
    """A completer that adds up the time spent waiting for generations."""

    inner: Any
    seconds: float = 0.0
    calls: list[float] = field(default_factory=list)

    async def complete(self, request: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return await self.inner.complete(request)
        finally:
            self.seconds += time.perf_counter() - t0


class RolloutRunner:
    """Runs rollouts in this process (the body of :class:`RolloutWorker`; usable without Ray)."""

    def __init__(self, config: WorkerConfig, completer: Any, tokenizer: Any, profile: Any) -> None:
        from tools.sandbox import make_sandbox
        from tools.workspace import WorkspaceStore

        self.config = config
        self.completer = completer
        self.tokenizer, self.profile = tokenizer, profile
        self.store = WorkspaceStore(Path(config.store_root))
        extra = [Path(p) for p in config.sandbox_extra_ro]
        self.sandbox = make_sandbox(extra_ro=extra) if config.sandboxed else None
        self._bases: dict[str, Workspace] = {}

    def _base(self, task: Any) -> Workspace:
        base = self._bases.get(task.task_id)
        if base is None:
            base = self._bases[task.task_id] = task.start_workspace(self.store)
        return base

    async def run(self, jobs: list[RolloutJob]) -> list[Rollout]:
        return list(await asyncio.gather(*(self.run_one(j) for j in jobs)))

    def close(self) -> None:
        """Delete the cached task bases and unmount whatever this store still has mounted, now
        (not at exit: a worker that is then killed leaves nothing for its reaper)."""
        bases, self._bases = list(self._bases.values()), {}
        for base in bases:
            try:
                base.delete()
            except Exception:  # noqa: BLE001 - the unmount below still runs; the store is the run's own
                pass
        self.store.unmount_all()

    async def run_one(self, job: RolloutJob) -> Rollout:
        from agent.events import ErrorEvent, ListSink, ToolCallStarted, ToolResultEvent
        from agent.policies.tito import TokenInTokenOutPolicy
        from agent.runtime import SessionParts, build_session
        from agent.session import Limits

        # 32 characters, like every session id of the log (sessions.id is VARCHAR(32)); the
        # run, iteration, task and sample are tags on the session (backend/rl_log.py)
        session_id = "rl" + uuid.uuid4().hex[:30]
        rollout = Rollout(job.run_id, job.iteration, job.task.task_id, job.sample, RolloutStatus.INFRA_ERROR,
                          session_id=session_id)
        t0 = time.perf_counter()
        fork = None
        try:
            fork = self._base(job.task).fork()
        except Exception as exc:  # the workspace is ours: an infrastructure error, never a silent zero
            rollout.detail = f"workspace fork failed: {type(exc).__name__}: {exc}"
            return rollout
        rollout.base_snapshot, rollout.blob_root = fork.base.to_json().decode(), str(self.store.blobs.root)
        timed = _Timed(self.completer)
        policy = TokenInTokenOutPolicy(
            timed, self.tokenizer, prompt_profile=self.profile, max_tokens=self.config.max_tokens,
            temperature=self.config.temperature if job.temperature is None else job.temperature, seed=job.seed,
            return_routes=self.config.return_routes,
            # behaviour logprobs of the distribution each token was drawn from (the tempered one; at
            # temperature 1 the same numbers as "raw"): what the trainer's logits / T computes
            logprobs_mode="processed",
        )
        sink = ListSink()
        ended = ""  # the turn's end reason (empty when the session itself raised)
        try:
            session = build_session(SessionParts(fork, self.sandbox), policy=policy,
                                    limits=self.config.limits or Limits(), sink=sink, session_id=session_id)
            outcome = await session.run_turn(job.task.request)
            ended = outcome.reason
            errors = sink.of_type(ErrorEvent)
            if outcome.reason == "completed":
                rollout.status = RolloutStatus.FINISHED
            elif outcome.reason in LIMIT_REASONS:
                rollout.status = RolloutStatus.LIMIT
            elif errors and all(e.source == "policy" for e in errors) and not _infra(errors):
                rollout.status = RolloutStatus.POLICY_ERROR
            else:
                rollout.status = RolloutStatus.INFRA_ERROR
            rollout.detail = "" if rollout.status is RolloutStatus.FINISHED else (
                "; ".join(e.message for e in errors) or outcome.reason
            )
        except Exception as exc:
            rollout.status, rollout.detail = RolloutStatus.INFRA_ERROR, f"{type(exc).__name__}: {exc}"
        finally:
            graded: tuple[Any, bool, float] | None = None
            try:  # grading needs the final workspace, which lives here: before the fork is deleted
                if rollout.status is not RolloutStatus.INFRA_ERROR and hasattr(job.task, "grade"):
                    graded = await _grade(job.task, fork, self.sandbox)
            finally:
                fork.delete()
        rollout.segments = [Segment(s.token_ids, s.sampled, s.logprobs, s.routes) for s in policy.routed_segments()]
        rollout.weights_version = min(policy.weights_versions, default=0)
        rollout.events = [e.model_dump(mode="json") for e in sink.events]
        calls = sink.of_type(ToolCallStarted)
        per_step: dict[int, int] = {}
        for c in calls:
            per_step[c.step] = per_step.get(c.step, 0) + 1
        rollout.metrics = {
            "model_calls": float(policy.model_calls),
            "tool_calls": float(len(calls)),
            "malformed_calls": float(sum(not c.valid for c in calls)),
            "parallel_steps": float(sum(n >= 2 for n in per_step.values())),
            "sampled_tokens": float(sum(len(s.token_ids) for s in rollout.segments if s.sampled)),
            "wall_s": time.perf_counter() - t0,
            "generation_s": timed.seconds,
            "tools_s": sum(r.duration_ms or 0.0 for r in sink.of_type(ToolResultEvent)) / 1000,
            "marker_fixups": float(policy.marker_fixups),
            # which limit ended it (0/1 each; averaged: the share of rollouts cut by that limit). A
            # `timeout` share that grows with the batch says the clock, i.e. machine load, is cutting
            # rollouts rather than the policy's own call/token budget
            **limit_shares(ended),
        }
        if graded is not None:
            rollout.grade = graded[0]
            rollout.metrics |= {"changed": float(graded[1]), "grading_s": graded[2],
                                "wall_s": rollout.metrics["wall_s"] - graded[2]}
        return rollout


async def _grade(task: Any, fork: Workspace, sandbox: Any) -> tuple[Any, bool, float]:
    """``task.grade(fork, sandbox)`` -> (GradeResult, changed); a task whose grader itself
    crashes gets an ``error`` grade (an infrastructure error the driver excludes), never a fail."""
    from rl.types import GradeResult

    t0 = time.perf_counter()
    try:
        result, changed = await task.grade(fork, sandbox)
    except Exception as exc:  # noqa: BLE001 - ours, not the rollout's
        result, changed = GradeResult(False, "", 0.0, error=f"grading failed: {type(exc).__name__}: {exc}"), False
    return result, bool(changed), time.perf_counter() - t0


def _infra(errors: list[Any]) -> bool:
    """A policy-side error that is really ours: the inference actor died or could not be reached."""
    return any("RayActorError" in e.message or "ActorDiedError" in e.message for e in errors)


class RolloutWorker:
    """The Ray actor (``ray.remote(RolloutWorker)``; see :func:`start_workers`)."""

    def __init__(self, config: WorkerConfig, inference: Any) -> None:
        import ray

        from rl.rollout.inference import ActorCompleter

        tokenizer, profile = ray.get(inference.tokenizer_and_profile.remote())
        self.runner = RolloutRunner(config, ActorCompleter(inference), tokenizer, profile)

    async def run(self, jobs: list[RolloutJob]) -> list[Rollout]:
        return await self.runner.run(jobs)

    def close(self) -> None:
        """:meth:`RolloutRunner.close` (the driver calls it before it kills the actor)."""
        self.runner.close()

    def peak_rss_mb(self) -> float:
        """This worker process's peak resident memory (Linux ``ru_maxrss``)."""
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def start_workers(n: int, config: WorkerConfig, inference: Any, *, num_cpus: float = 0.5) -> list[Any]:
    """``n`` rollout worker actors sharing one inference actor; each gets its own store subdirectory."""
    import dataclasses

    import ray

    actor = ray.remote(num_cpus=num_cpus, max_concurrency=1000)(RolloutWorker)
    return [
        actor.remote(dataclasses.replace(config, store_root=str(Path(config.store_root) / f"worker{i}")), inference)
        for i in range(n)
    ]


async def run_rollouts(workers: list[Any], jobs: list[RolloutJob]) -> list[Rollout]:
    """Spread ``jobs`` over ``workers`` (round robin, one call per worker) and gather the rollouts,
    in job order. One ``ray`` call per worker, awaited together (no ``ray.get`` in a loop)."""
    shares: list[list[tuple[int, RolloutJob]]] = [[] for _ in workers]
    for i, job in enumerate(jobs):
        shares[i % len(workers)].append((i, job))
    results = await asyncio.gather(*(w.run.remote([j for _, j in share]) for w, share in zip(workers, shares,
                                                                                           strict=True) if share))
    out: list[Rollout | None] = [None] * len(jobs)
    for share, rollouts in zip([s for s in shares if s], results, strict=True):
        for (i, _), r in zip(share, rollouts, strict=True):
            out[i] = r
    return [r for r in out if r is not None]
