"""The RL training loop: sample tasks → rollouts → (graded, rewarded) → GRPO update → new
weights to the inference side, with a version number → metrics → checkpoint.

The loop does not run sessions itself. A :class:`RolloutSource` does: the production
one is ``rl.rollout``'s (Ray rollout workers running ``agent.runtime.build_session``
sessions against an inference actor, graders on fresh forks); tests pass a small
in-process source. Whatever the source, it returns graded, rewarded
:class:`rl.types.Rollout` objects, each stamped with the ``weights_version`` that
produced it, and receives every new version through :meth:`RolloutSource.publish`.

Task order: each epoch is the task set's ids shuffled by ``random.Random(seed + epoch)``;
an iteration takes the next ``tasks_per_iteration`` of them (wrapping into the next
epoch). The order and the position are part of the checkpoint, so a resumed run samples
exactly the tasks the uninterrupted run would have.

Dynamic sampling (``grpo.dynamic_sampling: success``, DAPO's): when fewer than
``tasks_per_iteration`` of the drawn groups hold both a solved and an unsolved rollout, the loop
draws the next ``tasks_per_iteration`` tasks of the same order, up to ``grpo.max_draws`` draws,
and the update trains on the first ``tasks_per_iteration`` such groups only. Why: with a start
that solves a few percent of tasks, most groups differ only in the shaping terms (a malformed
call, a limit), and an update over all of them is mostly that noise; the groups where success
varies carry the signal the run is for. Departure from DAPO: it resamples until the batch is
full (``max_num_gen_batches`` caps it in verl); we cap by ``max_draws`` and train on what we
have, so an iteration may train on fewer groups (``groups_success_varied`` says how many) or on
none. Every drawn rollout is logged and counted in the iteration's success metrics.

Frontier replay (``grpo.replay_tasks`` > 0, :mod:`rl.train.replay`): each draw takes up to that
many tasks whose last group was success-varied before any fresh ones; fresh ones skip the tasks
already drawn in the iteration (they still use up their place in the order).

Resume: with ``resume=True`` the loop continues from ``OUT/checkpoints/latest``
(weights, optimizer, RNG, iteration, weights version, task order); a run killed between
iterations and resumed gives the same next iteration as one that was not
(``tests/rl/train/test_loop.py``). Not guaranteed: the same after a kill *during* an
iteration — that iteration is redone from the last checkpoint, with the same RNG, but
rollouts whose sources are not deterministic (real wall-clock limits) may differ.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from rl.config import RunConfig
from rl.train.metrics import append_metrics, plot_metrics, read_metrics, rollout_metrics
from rl.train.replay import FrontierReplay
from rl.types import Rollout

__all__ = ["LoopResult", "RolloutSource", "next_tasks", "run_loop", "success_varied_groups"]


class RolloutSource(Protocol):
    """Where rollouts come from (see the module docstring)."""

    def publish(self, state_dict: dict[str, Any], version: int) -> None:
        """Make these weights (``model.state_dict()``, CPU tensors) the sampler's, as ``version``."""
        ...

    def collect(self, task_ids: Sequence[str], *, iteration: int, group_size: int,
                seed_offset: int = 0) -> list[Rollout]:
        """``group_size`` graded, rewarded rollouts of each task (infra failures as ``INFRA_ERROR``);
        ``seed_offset`` separates the sampling seeds of a second draw in one iteration from the first's."""
        ...


@dataclass
class LoopResult:
    iterations_done: int
    weights_version: int
    records: list[dict[str, Any]]
    out_dir: Path


def next_tasks(task_ids: Sequence[str], n: int, *, seed: int, order: list[str], pos: int, epoch: int,
               exclude: Collection[str] = ()) -> tuple[list[str], list[str], int, int]:
    """The next ``n`` tasks and the new ``(order, pos, epoch)`` (see the module docstring).
    ``exclude``: ids passed over (they still use up their place in the order); when fewer than
    ``n`` other ids exist, fewer are returned rather than any twice."""
    if not task_ids:
        raise ValueError("the task set is empty: nothing to train on")
    if exclude:
        n = min(n, len(set(task_ids) - set(exclude)))
    picked: list[str] = []
    while len(picked) < n:
        if not order or pos >= len(order):
            if order:
                epoch += 1
            order = sorted(task_ids)
            random.Random(seed + epoch).shuffle(order)
            pos = 0
        if exclude:
            if order[pos] not in exclude and order[pos] not in picked:
                picked.append(order[pos])
            pos += 1
            continue
        take = min(n - len(picked), len(order) - pos)
        picked += order[pos: pos + take]
        pos += take
    return picked, order, pos, epoch


def run_loop(cfg: RunConfig, *, model: Any, tokenizer: Any, profile: Any, task_ids: Sequence[str],
             source: RolloutSource, resume: bool = True, stop_after: int | None = None,
             progress: Callable[[dict[str, Any]], None] | None = None,
             evaluate: Callable[[int], dict[str, float]] | None = None,
             families: Mapping[str, str] | None = None) -> LoopResult:
    """Train ``model`` for ``cfg.iterations`` iterations (or stop after ``stop_after`` more).

    ``progress`` is called with each iteration's record (the CLI draws its bar from it).
    Metrics go to ``OUT/metrics.jsonl`` and ``OUT/curves.png`` (both rewritten after every
    iteration, so a killed run keeps its curves); checkpoints to
    ``OUT/checkpoints`` every ``cfg.checkpoint_every`` iterations and after the last.

    ``evaluate(iteration)`` (held-out metrics of the weights just published, keys
    ``heldout_*``) runs when ``cfg.eval.every`` > 0: before the first iteration of a fresh run
    (a record of its own, ``iteration`` 0) and after every ``cfg.eval.every``-th iteration and
    the last, merged into that iteration's record. Its results never feed the update.
    ``families`` (task id -> family) adds each iteration's training success per family
    (:func:`rl.train.metrics.rollout_metrics`); measured only, like the rest of the record.
    """
    import numpy as np
    import torch

    from rl.train.checkpoints import RunState, latest_checkpoint, load_run_state, save_run_state
    from rl.train.grpo import GRPOTrainer

    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    trainer = GRPOTrainer(model, cfg.grpo, pad_id=tokenizer.pad_id, lr=cfg.lr, weight_decay=cfg.weight_decay,
                          grad_clip=cfg.grad_clip, temperature=cfg.rollout.temperature)
    latest = latest_checkpoint(out) if resume else None
    if latest is not None:
        state = load_run_state(latest, model, trainer.optimizer)
    else:
        state = RunState(iteration=0, weights_version=0)
        torch.manual_seed(cfg.seed)
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
    metrics_path = out / "metrics.jsonl"
    if metrics_path.exists():  # drop records of iterations after the checkpoint (a kill mid-run)
        kept = [r for r in read_metrics(metrics_path) if r.get("iteration", 0) <= state.iteration]
        metrics_path.write_text("")
        for r in kept:
            append_metrics(metrics_path, r)
    t = time.perf_counter()
    source.publish(_cpu_state(model), state.weights_version)
    sync_s = time.perf_counter() - t
    records: list[dict[str, Any]] = []
    done_now = 0
    evaluating = evaluate is not None and cfg.eval.every > 0
    fresh = not metrics_path.exists() or not any(r.get("iteration") == 0 for r in read_metrics(metrics_path))
    if evaluating and state.iteration == 0 and fresh:
        assert evaluate is not None
        t = time.perf_counter()
        start = {"iteration": 0, "weights_version": state.weights_version, **evaluate(0),
                 "time_heldout_eval_s": time.perf_counter() - t}
        append_metrics(metrics_path, start)
        records.append(start)
        if progress is not None:
            progress(start)
    replay = FrontierReplay.from_state(state.extra.get("replay"), limit=cfg.grpo.replay_limit)

    def draw(drawn: list[str]) -> tuple[list[str], list[str]]:
        """The next draw's tasks (replayed first, then fresh ones from the order) and the replayed."""
        again = replay.take(cfg.grpo.replay_tasks, exclude=drawn) if cfg.grpo.replay_tasks else []
        fresh, state.task_order, state.task_pos, state.epoch = next_tasks(
            task_ids, cfg.tasks_per_iteration - len(again), seed=cfg.seed, order=state.task_order,
            pos=state.task_pos, epoch=state.epoch, exclude=[*drawn, *again] if cfg.grpo.replay_tasks else ())
        return again + fresh, again

    while state.iteration < cfg.iterations and (stop_after is None or done_now < stop_after):
        tasks, replayed = draw([])
        t0 = time.perf_counter()
        rollouts = source.collect(tasks, iteration=state.iteration, group_size=cfg.grpo.group_size)
        train_on, draws, varied = rollouts, 1, []
        if cfg.grpo.dynamic_sampling == "success":
            while len(success_varied_groups(rollouts)) < cfg.tasks_per_iteration and draws < cfg.grpo.max_draws:
                more, again = draw(tasks)
                if not more:
                    break
                rollouts = rollouts + source.collect(more, iteration=state.iteration, group_size=cfg.grpo.group_size,
                                                     seed_offset=draws * 1_000)
                tasks += more
                replayed += again
                draws += 1
            varied = success_varied_groups(rollouts)
            kept = set(varied[: cfg.tasks_per_iteration])
            train_on = [r for r in rollouts if r.task_id in kept]
        if cfg.grpo.replay_tasks:
            now_varied = set(varied) if cfg.grpo.dynamic_sampling == "success" else set(success_varied_groups(rollouts))
            replay.update(tasks, now_varied)
            state.extra["replay"] = replay.to_state()
        t1 = time.perf_counter()
        stale = [r for r in rollouts if r.weights_version != state.weights_version]
        if stale:
            raise RuntimeError(f"{len(stale)} rollouts were sampled with weights version "
                               f"{stale[0].weights_version}, not the published {state.weights_version}: "
                               "the source did not apply publish()")
        train_m = trainer.step(train_on)
        if cfg.grpo.dynamic_sampling != "off":
            train_m |= {"draws": float(draws), "groups_success_varied": float(len(varied))}
        if cfg.grpo.replay_tasks:
            train_m |= {"replayed_tasks": float(len(replayed)),
                        "replayed_varied": float(sum(t in now_varied for t in replayed)),
                        "replay_buffer": float(len(replay.entries))}
        t2 = time.perf_counter()
        state.iteration += 1
        done_now += 1
        if train_m.get("stepped"):
            state.weights_version += 1
            source.publish(_cpu_state(model), state.weights_version)
        t3 = time.perf_counter()
        timing = _source_timings(source) | _source_counts(source)
        held: dict[str, float] = {}
        if evaluating and (state.iteration % cfg.eval.every == 0 or state.iteration == cfg.iterations):
            assert evaluate is not None
            t = time.perf_counter()
            held = {**evaluate(state.iteration), "time_heldout_eval_s": time.perf_counter() - t}
        record = {"iteration": state.iteration, "weights_version": state.weights_version, "tasks": len(tasks),
                  **rollout_metrics(rollouts, families=families), **train_m,
                  "time_rollouts_s": t1 - t0, "time_training_s": t2 - t1, "time_weight_sync_s": (t3 - t2) + sync_s,
                  **timing, **held}
        sync_s = 0.0
        append_metrics(metrics_path, record)
        records.append(record)
        if state.iteration % cfg.checkpoint_every == 0 or state.iteration == cfg.iterations:
            save_run_state(out, model, tokenizer, trainer.optimizer, state, profile=profile,
                           temperature=cfg.rollout.temperature)
        plot_metrics(read_metrics(metrics_path), out / "curves.png", title=cfg.name)  # per iteration
        if progress is not None:
            progress(record)
    return LoopResult(state.iteration, state.weights_version, records, out)


def success_varied_groups(rollouts: Sequence[Rollout]) -> list[str]:
    """Task ids, in first-seen order, whose scored rollouts include both a solved and an unsolved
    one (the ``success`` reward term; infrastructure errors and unscored rollouts left out)."""
    from rl.types import RolloutStatus

    seen: dict[str, set[bool]] = {}
    for r in rollouts:
        if r.status is RolloutStatus.INFRA_ERROR or r.reward is None:
            continue
        seen.setdefault(r.task_id, set()).add(bool(r.reward_terms.get("success")))
    return [t for t, outcomes in seen.items() if len(outcomes) == 2]


def _cpu_state(model: Any) -> dict[str, Any]:
    return {k: v.detach().to("cpu").clone() for k, v in model.state_dict().items()}


def _source_counts(source: RolloutSource) -> dict[str, float]:
    """Counts the source reports for the last ``collect`` (an optional ``last_counts`` attribute:
    ``ungraded``, rollouts whose grade was an infrastructure error), merged in as they are."""
    counts = getattr(source, "last_counts", None)
    if not isinstance(counts, dict):
        return {}
    return {str(k): float(v) for k, v in counts.items() if isinstance(v, (int, float))}


def _source_timings(source: RolloutSource) -> dict[str, float]:
    """``time_generation_s``/``time_tools_s``/``time_grading_s`` when the source reports them
    (an optional ``last_timings`` attribute: the split happens inside the rollout workers)."""
    timings = getattr(source, "last_timings", None)
    if not isinstance(timings, dict):
        return {}
    return {f"time_{k}_s": float(v) for k, v in timings.items() if isinstance(v, (int, float))}
