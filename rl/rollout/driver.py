"""The RL driver: ``flywheel rl train --config FILE`` and ``flywheel rl eval`` end to end.

One iteration of :func:`train` (the loop itself is :func:`rl.train.loop.run_loop`):

1. the loop picks the iteration's tasks (exact-resume task order) and asks
   :class:`RaySource` for ``G`` rollouts of each;
2. the source sends one :class:`rl.rollout.worker.RolloutJob` per sample to the
   rollout workers (Ray actors; each rollout is an ``agent.runtime.build_session``
   session with the production tools, the bwrap sandbox and the checkpoint's
   prompt profile) sampling from ONE inference actor (continuous batching,
   prefix cache);
3. each rollout is graded on the worker, on a fresh fork of its final workspace
   with the task's tests restored (:meth:`TaskEnv.grade` →
   :func:`rl.tasks.grading.grade`); here it is scored (:func:`score`:
   :func:`rl.reward.reward` and :func:`rl.behaviour.behaviour` into
   ``Rollout.metrics``) and persisted through the :class:`RolloutLog`;
4. infrastructure errors — and grades the reward refuses (:class:`UngradedError`)
   — become ``INFRA_ERROR``: excluded from the loss, counted (``status_infra_error``,
   ``n_infra_excluded``, ``ungraded`` in the metrics), never a silent zero;
5. the GRPO update (:mod:`rl.train.grpo`), new weights to the inference actor
   with the next version number (each rollout records the version that sampled
   it; the loop refuses stale ones), metrics JSONL + PNG, a checkpoint; a log
   that keeps runs (``backend/rl_log.py``) gets the run's config, each
   iteration's metrics and the run's final status (finished / stopped / failed).

:func:`evaluate` is pass@1 / pass@k on a split: a checkpoint through the same
Ray workers, or an OpenAI-compatible model (:class:`agent.policies.openai_compat.
OpenAICompatPolicy`) through the same runtime in this process (``build_session``,
same tools, sandbox, grader and reward), so users can compare their models.

Not guaranteed: on a cluster (``rollout.address``) every node needs bubblewrap,
the checkpoint and the task set's sources at the same paths; a rollout in flight
when the driver is killed is lost (its iteration is redone on resume).
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from rl.behaviour import MALFORMED_KINDS
from rl.reward import EFFORT_PER_CALL
from rl.rollout.log import MemoryRolloutLog, RolloutLog, persist
from rl.rollout.taskenv import TaskEnv
from rl.types import Rollout, RolloutStatus, Split

if TYPE_CHECKING:
    from rl.config import RunConfig
    from rl.tasks.spec import Task
    from rl.train.loop import LoopResult

__all__ = ["DriverError", "EvalResult", "RaySource", "TaskEnv", "evaluate", "group_per_task", "load_split", "pass_at_k",
           "run_eval", "run_training", "score", "train"]


class DriverError(ValueError):
    """A run that cannot start (no task set, no checkpoint, a profile mismatch); the message says what to fix."""


def score(rollout: Rollout, *, effort_per_call: float = EFFORT_PER_CALL) -> None:
    """Reward and behaviour metrics of one returned rollout, in place (see the module docstring);
    ``effort_per_call``: the reward's effort rate (``reward.effort_per_call``)."""
    from agent.events import EVENT_ADAPTER
    from rl.behaviour import behaviour
    from rl.reward import UngradedError, reward

    if rollout.status is RolloutStatus.INFRA_ERROR:
        return
    if rollout.grade is None:
        rollout.status, rollout.detail = RolloutStatus.INFRA_ERROR, "not graded (the task has no grader)"
        return
    events = [EVENT_ADAPTER.validate_json(json.dumps(e)) for e in rollout.events]
    rollout.metrics |= behaviour(events).metrics()
    try:
        rollout.reward, rollout.reward_terms = reward(
            events, rollout.grade, changed=bool(rollout.metrics.get("changed")),
            effort_per_call=effort_per_call)
    except UngradedError as exc:
        rollout.status, rollout.detail = RolloutStatus.INFRA_ERROR, str(exc)
        rollout.metrics["ungraded"] = 1.0


def sample_tasks(tasks: Sequence[Task], n: int, seed: int) -> list[Task]:
    """``n`` of ``tasks`` drawn with ``seed``, in their original order (all when ``n >= len``). The
    same seed gives the same sample, so two models compared with one ``--seed`` see the same tasks."""
    if n >= len(tasks):
        return list(tasks)
    import random

    return [tasks[i] for i in sorted(random.Random(seed).sample(range(len(tasks)), n))]


def load_split(path: Path | None, split: Split | None) -> list[Task]:
    """The task set's tasks of ``split`` (all with None); :class:`DriverError` when there are none."""
    from rl.tasks.spec import load_tasks

    if path is None:
        raise DriverError("no task set: set `tasks:` in the run config (a file from `flywheel rl tasks build`)")
    tasks = [t for t in load_tasks(path) if split is None or t.split is split]
    if not tasks:
        hint = (" (build it with `flywheel rl tasks build --n-validation N`, or rl_learning.py --n-validation N)"
                if split is Split.VALIDATION else "")
        raise DriverError(f"{path} has no {split.value if split else ''} tasks".replace("  ", " ") + hint)
    return tasks


def agent_sandbox_paths(tasks: Sequence[Task], extra: Sequence[Path | str] = ()) -> tuple[str, ...]:
    """What the rollouts' sandbox shows read-only beyond the defaults: ``extra``, plus the
    project's Python (and the installation it links into) when a task is graded with
    ``interpreter: project`` — so the agent can run the tests the grader runs. Not
    guaranteed: that the agent finds that interpreter (its path is not on the sandbox's PATH)."""
    from rl.tasks.grading import GraderConfig

    paths = [str(p) for p in extra]
    if any(t.grader.interpreter == "project" for t in tasks):
        paths += [str(p) for p in GraderConfig().project_ro]
    return tuple(dict.fromkeys(paths))


class RaySource:
    """The production :class:`rl.train.loop.RolloutSource`: one inference actor, ``workers``
    rollout workers, scoring and persistence here. ``close()`` kills the actors."""

    def __init__(self, checkpoint: Path, tasks: Sequence[Task], *, run_id: str, store_root: Path, log: RolloutLog,
                 limits: Any, workers: int = 1, max_tokens: int = 256, temperature: float = 1.0,
                 seed: int = 0, inference_cpus: float = 1.0, worker_cpus: float = 0.5,
                 on_rollout: Callable[[Rollout], None] | None = None,
                 sandbox_extra_ro: Sequence[Path | str] = (), effort_per_call: float = EFFORT_PER_CALL) -> None:
        from rl.rollout.inference import start_inference
        from rl.rollout.worker import WorkerConfig, start_workers

        self.envs = {t.id: TaskEnv(t) for t in tasks}
        self.run_id, self.log, self.seed, self.on_rollout = run_id, log, seed, on_rollout
        self.effort_per_call = effort_per_call
        self.inference = start_inference(checkpoint, num_cpus=inference_cpus, max_slots=32, threads=1)
        config = WorkerConfig(store_root=str(store_root), limits=limits, max_tokens=max_tokens,
                              temperature=temperature,
                              sandbox_extra_ro=agent_sandbox_paths(tasks, sandbox_extra_ro))
        self.workers = start_workers(workers, config, self.inference, num_cpus=worker_cpus)
        self.last_timings: dict[str, float] = {}  # seconds summed over the iteration's rollouts
        self.last_counts: dict[str, float] = {}  # merged into the iteration's metrics record as they are
        self.version = 0

    def publish(self, state_dict: dict[str, Any], version: int) -> None:
        import ray

        ray.get(self.inference.load_weights.remote(state_dict, version))
        self.version = version

    def collect(self, task_ids: Sequence[str], *, iteration: int, group_size: int, run_id: str | None = None,
                temperature: float | None = None, seed_offset: int = 0) -> list[Rollout]:
        """``group_size`` scored, persisted rollouts of each task. ``run_id``/``temperature``
        override the source's for these rollouts (held-out evaluation is logged under its own
        run id); ``seed_offset`` separates their sampling seeds from training's."""
        from rl.rollout.worker import RolloutJob, run_rollouts

        unknown = [t for t in task_ids if t not in self.envs]
        if unknown:
            raise DriverError(f"tasks {unknown[:3]} are not in this run's task set")
        jobs = [RolloutJob(self.envs[t], run_id or self.run_id, iteration, g,
                           seed=(self.seed * 1_000_003 + iteration * 10_007 + i * 101 + g + seed_offset) % 2**31,
                           temperature=temperature)
                for i, t in enumerate(task_ids) for g in range(group_size)]
        rollouts = asyncio.run(run_rollouts(self.workers, jobs))
        for r in rollouts:
            score(r, effort_per_call=self.effort_per_call)
            persist(self.log, r, r.events)
            if self.on_rollout is not None:
                self.on_rollout(r)
        self.last_timings = {k: sum(float(r.metrics.get(f"{k}_s", 0.0)) for r in rollouts)
                             for k in ("generation", "tools", "grading")}
        self.last_counts = {"ungraded": float(sum(r.metrics.get("ungraded", 0.0) for r in rollouts))}
        return rollouts

    def close(self) -> None:
        """Let the workers delete their workspaces and unmount (synchronously), then kill the actors."""
        import ray

        try:
            ray.get([w.close.remote() for w in self.workers], timeout=120)
        except Exception:  # noqa: BLE001 - a worker that died or hangs is killed below anyway
            pass
        for actor in (*self.workers, self.inference):
            ray.kill(actor)


def _checkpoint_and_profile(cfg: RunConfig) -> tuple[Any, Any, Any]:
    from agent.model.checkpoint import load_checkpoint, load_profile
    from agent.model.config import ModelConfig
    from rl.train.checkpoints import check_architecture

    init = cfg.model.init
    if init is None:
        raise DriverError("model.init: a checkpoint to start from is required (the output of `flywheel rl sft` "
                          "or `flywheel model train`): the sampler serves that checkpoint and its prompt profile")
    model, tok = load_checkpoint(init, precision=cfg.model.precision)
    want = ModelConfig.preset(cfg.model.preset, vocab_size=model.cfg.vocab_size, max_seq_len=model.cfg.max_seq_len,
                              copy_head=cfg.model.copy_head,
                              copy_min_distance=cfg.model.copy_min_distance,
                              copy_successor_keys=cfg.model.copy_successor_keys,
                              copy_context_only=cfg.model.copy_context_only)
    check_architecture(want, model.cfg, where=str(init))
    profile = load_profile(init)
    if cfg.model.prompt_profile is not None and cfg.model.prompt_profile != profile.name:
        raise DriverError(f"model.prompt_profile is {cfg.model.prompt_profile!r} but {init} is served with "
                          f"{profile.name!r}: RL must render the prompt serving renders; drop the key or "
                          "use a checkpoint saved with that profile")
    return model, tok, profile


def _open(log: RolloutLog | Callable[[], RolloutLog] | None) -> RolloutLog:
    if log is None:
        return MemoryRolloutLog()
    return log() if callable(log) else log


def train(cfg: RunConfig, *, resume: bool = True, log: RolloutLog | Callable[[], RolloutLog] | None = None,
          stop_after: int | None = None, progress: Callable[[dict[str, Any]], None] | None = None,
          on_rollout: Callable[[Rollout], None] | None = None) -> LoopResult:
    """Run (or resume) the GRPO run ``cfg`` on Ray; see the module docstring. Joins
    ``cfg.rollout.address`` or starts a local Ray (shut down again if this call started it).
    ``log`` may be a factory, called only once the task set and checkpoint are valid (a bad
    config leaves no log behind)."""
    import ray

    from rl.rollout.cluster import init_ray
    from rl.train.loop import run_loop

    tasks = load_split(cfg.tasks, Split.TRAIN)
    heldout = load_split(cfg.tasks, Split.HELDOUT)[: cfg.eval.max_tasks] if cfg.eval.every > 0 else []
    model, tok, profile = _checkpoint_and_profile(cfg)
    log = _open(log)
    _run_started(log, cfg)
    started = not ray.is_initialized()
    init_ray(cfg.rollout.address)
    source = RaySource(Path(cfg.model.init or ""), [*tasks, *heldout], run_id=cfg.name,
                       store_root=Path(cfg.out_dir) / "workspaces",
                       log=log, limits=cfg.limits.to_limits(), workers=cfg.rollout.workers,
                       max_tokens=cfg.rollout.max_tokens_per_call, temperature=cfg.rollout.temperature,
                       seed=cfg.seed, on_rollout=on_rollout, sandbox_extra_ro=cfg.rollout.sandbox_extra_ro,
                       effort_per_call=cfg.reward.effort_per_call)

    def on_iteration(record: dict[str, Any]) -> None:
        if hasattr(log, "record_iteration"):
            log.record_iteration(cfg.name, int(record["iteration"]), _finite(record))
        if progress is not None:
            progress(record)

    def evaluate_heldout(iteration: int) -> dict[str, float]:
        return heldout_metrics(source, [t.id for t in heldout], iteration=iteration, k=cfg.eval.k,
                               temperature=cfg.eval.temperature, run_id=f"{cfg.name}/heldout",
                               families={t.id: t.family for t in heldout})

    status = "failed"
    try:
        res = run_loop(cfg, model=model, tokenizer=tok, profile=profile, task_ids=[t.id for t in tasks],
                       source=source, resume=resume, stop_after=stop_after, progress=on_iteration,
                       evaluate=evaluate_heldout if heldout else None, families={t.id: t.family for t in tasks})
        status = "finished" if res.iterations_done >= cfg.iterations else "stopped"
        return res
    finally:
        if hasattr(log, "set_run_status"):
            log.set_run_status(cfg.name, status)
        source.close()
        if started:
            ray.shutdown()


HELDOUT_KEYS = ("success_rate", "tokens_per_solved", "solved_by_command_share", "parallel_call_share",
                "blind_edit_rate", "malformed_call_rate",
                "tool_calls_per_model_call", "prose_chars_per_model_call", "rollout_model_calls", "rollout_sampled_tokens", "status_infra_error",
                "rollout_limit_max_steps", "rollout_limit_timeout",
                *(f"rollout_malformed_{kind}" for kind in MALFORMED_KINDS), "rollout_malformed_truncated")


def heldout_metrics(source: RaySource, task_ids: Sequence[str], *, iteration: int, k: int, temperature: float,
                    run_id: str, batch_rollouts: int = 32,
                    families: Mapping[str, str] | None = None) -> dict[str, float]:
    """Held-out pass@1/pass@k and behaviour of the source's current weights, as ``heldout_*``
    keys (the loop merges them into the iteration's record), and with ``families`` (task id ->
    family) pass@1 per family as ``heldout_pass_at_1_<family>`` and, for a family with a solved
    rollout, ``heldout_tokens_per_solved_<family>``. Sampling seeds are disjoint from
    training's; the rollouts are persisted under ``run_id``."""
    rollouts: list[Rollout] = []
    per = max(1, batch_rollouts // k)
    for i in range(0, len(task_ids), per):
        rollouts += source.collect(task_ids[i: i + per], iteration=iteration, group_size=k, run_id=run_id,
                                   temperature=temperature, seed_offset=7_777_777 + i)
    res = summarise(rollouts, k, "heldout", families)
    out = {"heldout_pass_at_1": res.pass_at_1, f"heldout_pass_at_{k}": res.pass_at_k,
           "heldout_tasks": float(res.tasks)}
    out |= {f"heldout_pass_at_1_{fam}": v["pass@1"] for fam, v in res.per_family.items()}
    out |= {f"heldout_tokens_per_solved_{fam}": v["tokens_per_solved"] for fam, v in res.per_family.items()
            if "tokens_per_solved" in v}
    out |= {f"heldout_{key}": float(res.behaviour[key]) for key in HELDOUT_KEYS if key in res.behaviour}
    return out


def _run_started(log: Any, cfg: RunConfig) -> None:
    """Record the run (its config) in a log that keeps runs (``backend/rl_log.py``'s does:
    optional ``get_run``/``record_run``/``record_iteration``/``set_run_status``); a resumed
    run keeps its row and is marked running again."""
    if not (hasattr(log, "record_run") and hasattr(log, "get_run")):
        return
    if log.get_run(cfg.name) is None:
        log.record_run(cfg.model_dump(mode="json"), run_id=cfg.name)
    elif hasattr(log, "set_run_status"):
        log.set_run_status(cfg.name, "running")


def _finite(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` without NaN/inf values (JSON cannot hold them; a missing key means 'not measured')."""
    return {k: v for k, v in record.items() if not (isinstance(v, float) and not math.isfinite(v))}


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimator (Chen et al. 2021) from ``n`` samples with ``c`` correct."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


@dataclass
class EvalResult:
    split: str
    k: int
    tasks: int
    pass_at_1: float
    pass_at_k: float
    infra_errors: int  # rollouts excluded (and tasks left with fewer than k scored samples: `tasks_short`)
    tasks_short: int
    per_task: dict[str, dict[str, float]] = field(default_factory=dict)
    behaviour: dict[str, float] = field(default_factory=dict)  # rl.train.metrics.rollout_metrics
    per_family: dict[str, dict[str, float]] = field(default_factory=dict)  # family: tasks, pass@1, pass@k

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items()}


_T = TypeVar("_T")


def group_per_task(per_task: Mapping[str, _T], group_of: Mapping[str, str]) -> dict[str, list[_T]]:
    """``per_task`` values keyed by task id (:attr:`EvalResult.per_task`'s results, or a task's
    rollouts) grouped by ``group_of[task id]`` (a family, a difficulty), groups sorted; a task
    missing from ``group_of`` goes to ``"unknown"``."""
    grouped: dict[str, list[_T]] = {}
    for task_id, t in per_task.items():
        grouped.setdefault(group_of.get(task_id, "unknown"), []).append(t)
    return dict(sorted(grouped.items()))


def summarise(rollouts: Sequence[Rollout], k: int, split: str,
              families: Mapping[str, str] | None = None) -> EvalResult:
    """pass@1 / pass@k over tasks (INFRA_ERROR samples excluded and counted; a task left with
    fewer than ``k`` scored samples is estimated from what it has and counted in ``tasks_short``).
    With ``families`` (task id -> family) also the mean per family (``per_family``), and the
    family's ``tokens_per_solved`` when it has a solved rollout with sampled tokens (absent, not 0,
    when it has none, or when the policy records no tokens, as an OpenAI-compatible one does);
    a task missing from it counts under ``"unknown"``. Each family's mean is over its own tasks
    only: with a few tasks a family its standard error is large (not reported here)."""
    from rl.train.metrics import rollout_metrics

    by_task: dict[str, list[Rollout]] = {}
    for r in rollouts:
        by_task.setdefault(r.task_id, []).append(r)
    per_task: dict[str, dict[str, float]] = {}
    short = 0
    for task_id, rs in sorted(by_task.items()):
        scored = [r for r in rs if r.status is not RolloutStatus.INFRA_ERROR]
        c = sum(bool(r.reward_terms.get("success")) for r in scored)
        short += len(scored) < k
        n = len(scored)
        per_task[task_id] = {"n": float(n), "correct": float(c), "pass@1": pass_at_k(n, c, 1) if n else 0.0,
                             f"pass@{k}": pass_at_k(n, c, min(k, n)) if n else 0.0}
    p1 = sum(t["pass@1"] for t in per_task.values()) / max(1, len(per_task))
    pk = sum(t[f"pass@{k}"] for t in per_task.values()) / max(1, len(per_task))
    per_family = {fam: {"tasks": float(len(ts)), "pass@1": sum(t["pass@1"] for t in ts) / len(ts),
                        f"pass@{k}": sum(t[f"pass@{k}"] for t in ts) / len(ts)}
                  for fam, ts in group_per_task(per_task, families).items()} if families is not None else {}
    if families is not None:  # what a solution costs in each family, by rollout_metrics' own definition
        for fam, task_rollouts in group_per_task(by_task, families).items():
            cost = rollout_metrics([r for rs in task_rollouts for r in rs]).get("tokens_per_solved")
            if cost:  # None: nothing solved; 0: a policy that records no sampled tokens (OpenAI-compatible text)
                per_family[fam]["tokens_per_solved"] = cost
    return EvalResult(split, k, len(per_task), p1, pk,
                      sum(r.status is RolloutStatus.INFRA_ERROR for r in rollouts), short, per_task,
                      rollout_metrics(rollouts), per_family)


def evaluate(tasks: Sequence[Task], *, k: int, checkpoint: Path | None = None, openai: Any = None,
             log: RolloutLog | Callable[[], RolloutLog] | None = None, limits: Any = None, temperature: float = 1.0, max_tokens: int = 256,
             store_root: Path, seed: int = 0, run_id: str = "eval", address: str | None = None,
             on_rollout: Callable[[Rollout], None] | None = None,
             progress: Callable[[int], None] | None = None,
             sandbox_extra_ro: Sequence[Path | str] = ()) -> EvalResult:
    """pass@1/pass@k of ``checkpoint`` (Ray workers) or ``openai`` (an ``OpenAIConfig``; in process).
    ``progress(n)`` is called as each batch of ``n`` rollouts is scored (a checkpoint's rollouts
    run ~16 at a time, so the bar moves; an OpenAI model's all at once)."""
    from rl.config import LimitsConfig

    if (checkpoint is None) == (openai is None):
        raise DriverError("evaluate: give exactly one of a checkpoint or an OpenAI-compatible model")
    lim = limits or LimitsConfig().to_limits()
    log = _open(log)
    split = tasks[0].split.value if tasks else "none"
    if openai is not None:
        from rl.rollout.policy_eval import run_policy_rollouts

        rollouts = asyncio.run(run_policy_rollouts(tasks, k, openai, limits=lim, store_root=store_root,
                                                   run_id=run_id))
        for r in rollouts:
            score(r)
            persist(log, r, r.events)
            if on_rollout is not None:
                on_rollout(r)
        if progress is not None:
            progress(len(rollouts))
        return summarise(rollouts, k, split, {t.id: t.family for t in tasks})
    import ray

    from rl.rollout.cluster import init_ray

    started = not ray.is_initialized()
    init_ray(address)
    assert checkpoint is not None
    source = RaySource(checkpoint, tasks, run_id=run_id, store_root=store_root, log=log, limits=lim,
                       max_tokens=max_tokens, temperature=temperature, seed=seed, on_rollout=on_rollout,
                       sandbox_extra_ro=sandbox_extra_ro)
    rollouts = []
    per_batch = max(1, 16 // k)
    try:
        for i in range(0, len(tasks), per_batch):
            batch = source.collect([t.id for t in tasks[i: i + per_batch]], iteration=0, group_size=k)
            rollouts += batch
            if progress is not None:
                progress(len(batch))
    finally:
        source.close()
        if started:
            ray.shutdown()
    return summarise(rollouts, k, split, {t.id: t.family for t in tasks})


def run_training(cfg: RunConfig, *, resume: bool = True,
                 log: RolloutLog | Callable[[], RolloutLog] | None = None) -> int:
    """``flywheel rl train``: :func:`train` with a progress bar and a summary; exit status."""
    from tqdm import tqdm

    bar = tqdm(total=cfg.iterations, desc=f"rl train {cfg.name}", unit="iter", file=sys.stderr)

    def progress(rec: dict[str, Any]) -> None:
        bar.n = int(rec["iteration"])
        bar.set_postfix(reward=f"{rec.get('mean_reward', float('nan')):.3f}",
                        success=f"{rec.get('success_rate', float('nan')):.2f}", v=rec["weights_version"])
        bar.refresh()

    try:
        res = train(cfg, resume=resume, log=log, progress=progress)
    finally:
        bar.close()
    last = res.records[-1] if res.records else {}
    summary = {"run": cfg.name, "iterations_done": res.iterations_done, "weights_version": res.weights_version,
               "out_dir": str(res.out_dir), "metrics": str(res.out_dir / "metrics.jsonl"),
               "last": {k: last[k] for k in ("success_rate", "mean_reward", "loss", "grad_norm",
                                             "status_infra_error", "n_groups_zero_std") if k in last}}
    print(f"trained {res.iterations_done}/{cfg.iterations} iterations; weights version {res.weights_version}; "
          f"checkpoints in {res.out_dir / 'checkpoints'}", file=sys.stderr)
    print(json.dumps(summary))
    return 0


def run_eval(args: Any, *, log: RolloutLog | Callable[[], RolloutLog] | None = None) -> int:
    """``flywheel rl eval`` (``args`` from :func:`rl.train.cli.add_commands`); prints the result JSON."""
    import tempfile

    from rl.config import LimitsConfig

    tasks = load_split(args.tasks, Split(args.split))
    if getattr(args, "max_tasks", None) is not None:
        tasks = sample_tasks(tasks, args.max_tasks, args.seed)
    limits_cfg, extra_ro = LimitsConfig(), []
    if getattr(args, "config", None) is not None:
        from rl.config import load_run_config

        run_cfg = load_run_config(args.config)
        limits_cfg, extra_ro = run_cfg.limits, run_cfg.rollout.sandbox_extra_ro
    openai = None
    if args.policy == "openai":
        from agent.policies.openai_compat import OpenAIConfig

        openai = OpenAIConfig(base_url=args.base_url, model=args.model, temperature=args.temperature,
                              max_tokens=args.max_tokens, api=args.api)
    from tqdm import tqdm

    bar = tqdm(total=len(tasks) * args.k, desc=f"rl eval {args.split}", unit="rollout", file=sys.stderr)
    from tools.workspace import remove_store

    tmp = tempfile.mkdtemp(prefix="flywheel-eval-")
    try:
        res = evaluate(tasks, k=args.k, checkpoint=args.checkpoint if openai is None else None, openai=openai,
                       log=log, limits=limits_cfg.to_limits(), temperature=args.temperature,
                       sandbox_extra_ro=extra_ro,
                       max_tokens=args.max_tokens, store_root=Path(tmp), seed=args.seed,
                       address=getattr(args, "address", None), progress=bar.update)
    finally:
        remove_store(tmp)  # unmounts first what killed workers may have left mounted
    bar.close()
    print(f"{res.split}: {res.tasks} tasks, k={res.k}: pass@1 {res.pass_at_1:.3f}, pass@{res.k} "
          f"{res.pass_at_k:.3f} ({res.infra_errors} infrastructure errors excluded)", file=sys.stderr)
    print(json.dumps(res.to_json()))
    return 0
