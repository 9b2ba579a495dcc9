"""How far can RL take a start? pass@1 ... pass@k of a checkpoint on a split, and its greedy pass rate.

GRPO mostly turns what a model solves *sometimes* into what it solves *usually*: the RL-trained
model's pass@1 rarely exceeds the start's pass@k for moderate k (Yue et al., 2025, "Does
reinforcement learning really incentivize reasoning capacity in LLMs beyond the base model?").
So the start's pass@k curve is the ceiling to hold an RL bar against (the issue asks for
+25 points of held-out pass@1): a start whose pass@16 is below the bar's target cannot meet it by
sharpening alone. This script measures that curve through the production evaluation
(``rl.rollout.driver.evaluate``: Ray workers, the runtime, the sandbox and the graders; T=1 by
default) and, with ``--greedy``, one greedy rollout per task (T=0) — the start's answer without
sampling noise.

    .venv/bin/python benchmarks/rl_pass_at_k.py --checkpoint START/sft --tasks TASKS.jsonl -k 16 --greedy

Reported: pass@j for j = 1, 2, 4, ... up to k (the unbiased estimator of Chen et al., 2021, from
the same k samples), per family and per difficulty, the greedy pass rate, the behaviour
figures of the sampled rollouts, and what their rejected tool calls were told, by kind
(``malformed_reasons``, the 12 most common: ``rl.behaviour.malformed_reasons``; with
``--malformed-examples N`` also N of them with the model output they came from), and the same
calls by kind and by how their model output ended (``malformed_by_finish``: ``unclosed:length`` is
a call the per-call token limit cut, ``unclosed:stop`` one the model ended itself). Not guaranteed:
the figures of one seed are estimates (32 tasks give a standard error of several points); the limits are the RL run's (``--max-model-calls``,
``--max-tokens``, ``--max-wall-s``), which the caller must keep equal to the run it compares with (until
2026-12-07 the clock was a fixed 120 s, which a loaded machine hit in up to a quarter of the rollouts).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path
from typing import Any

import _common  # noqa: F401  (repo on sys.path)
from _common import write_result


def pass_curve(per_task: dict[str, dict[str, float]], k: int) -> dict[str, float]:
    """``pass@j`` for j = 1, 2, 4, ... <= k (and k), averaged over tasks, from each task's (n, correct)."""
    from rl.rollout.driver import pass_at_k

    js = sorted({j for j in (2 ** i for i in range(k.bit_length())) if j <= k} | {k})
    out = {}
    for j in js:
        vals = [pass_at_k(int(t["n"]), int(t["correct"]), j) for t in per_task.values() if t["n"] >= j]
        out[f"pass@{j}"] = statistics.fmean(vals) if vals else float("nan")
    return out


def by_group(tasks: list[Any], per_task: dict[str, dict[str, float]], key: str) -> dict[str, dict[str, float]]:
    """pass@1 and the count of tasks solved at least once, per family or difficulty."""
    from rl.rollout.driver import group_per_task

    groups = group_per_task(per_task, {t.id: str(getattr(t, key)) for t in tasks})
    return {g: {"tasks": len(v), "pass@1": statistics.fmean(x["pass@1"] for x in v),
                "solved_at_least_once": sum(x["correct"] > 0 for x in v)} for g, v in groups.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", type=Path, required=True)
    ap.add_argument("--tasks", type=Path, required=True)
    ap.add_argument("--split", choices=["train", "heldout", "validation"], default="heldout")
    ap.add_argument("-k", "--k", type=int, default=16, help="samples per task at --temperature")
    ap.add_argument("--max-tasks", type=int, help="a seeded sample of the split (default: all of it)")
    ap.add_argument("--greedy", action="store_true", help="also one greedy (T=0) rollout per task")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--max-model-calls", type=int, default=6, help="the RL run's limit (benchmarks/rl_learning.py)")
    ap.add_argument("--max-tokens", type=int, default=192, help="tokens per model call (the RL run's)")
    ap.add_argument("--max-wall-s", type=float, default=900.0,
                    help="wall clock per rollout (default 900, rl_learning's: high enough that the model-call "
                         "limit binds; a lower one makes the figures depend on the machine's load)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--malformed-examples", type=int, default=0,
                    help="keep this many rejected calls with the model output they came from (`malformed_examples`)")
    ap.add_argument("--name", default="rl_pass_at_k")
    args = ap.parse_args()
    if args.k < 1:
        raise SystemExit("-k must be at least 1")

    from collections import Counter

    import ray

    from agent.events import EVENT_ADAPTER
    from rl.behaviour import malformed_examples, malformed_finishes, malformed_reasons
    from rl.config import LimitsConfig
    from rl.rollout.driver import evaluate, load_split, sample_tasks
    from rl.types import Split
    from tools.workspace import remove_store

    tasks = load_split(args.tasks, Split(args.split))
    if args.max_tasks is not None:
        tasks = sample_tasks(tasks, args.max_tasks, args.seed)
    limits = LimitsConfig(max_model_calls=args.max_model_calls,
                          max_output_tokens=args.max_model_calls * args.max_tokens, max_wall_s=args.max_wall_s).to_limits()
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=200 * 1024 * 1024, log_to_driver=False)
    tmp = tempfile.mkdtemp(prefix="rl-pass-at-k-")
    done = 0
    reasons: Counter[str] = Counter()
    finishes: Counter[str] = Counter()
    examples: list[dict[str, str]] = []

    def tally(r: Any) -> None:
        events = [EVENT_ADAPTER.validate_python(e) for e in r.events]
        reasons.update(malformed_reasons(events))
        finishes.update(malformed_finishes(events))
        if len(examples) < args.malformed_examples:
            examples.extend(malformed_examples(events, args.malformed_examples - len(examples), task=r.task_id))

    def progress(n: int) -> None:
        nonlocal done
        done += n
        print(f"{done} rollouts scored", flush=True)

    try:
        sampled = evaluate(tasks, k=args.k, checkpoint=args.checkpoint, limits=limits, temperature=args.temperature,
                           max_tokens=args.max_tokens, store_root=Path(tmp) / "t", seed=args.seed,
                           progress=progress, on_rollout=tally)
        greedy = None
        if args.greedy:
            greedy = evaluate(tasks, k=1, checkpoint=args.checkpoint, limits=limits, temperature=0.0,
                              max_tokens=args.max_tokens, store_root=Path(tmp) / "g", seed=args.seed,
                              progress=progress)
    finally:
        ray.shutdown()
        remove_store(tmp)
    result: dict[str, Any] = {
        "checkpoint": str(args.checkpoint), "tasks_file": str(args.tasks), "split": args.split, "tasks": sampled.tasks,
        "k": args.k, "temperature": args.temperature,
        "limits": {"max_model_calls": args.max_model_calls, "max_tokens_per_call": args.max_tokens,
                   "max_wall_s": args.max_wall_s},
        "curve": pass_curve(sampled.per_task, args.k),
        "by_family": by_group(tasks, sampled.per_task, "family"),
        "by_difficulty": by_group(tasks, sampled.per_task, "difficulty"),
        "infra_errors": sampled.infra_errors, "behaviour": sampled.behaviour,
        "malformed_reasons": dict(reasons.most_common(12)), "malformed_total": sum(reasons.values()),
        "malformed_by_finish": dict(finishes.most_common()), "malformed_examples": examples,
    }
    if greedy is not None:
        result["greedy_pass_rate"] = greedy.pass_at_1
        result["greedy_behaviour"] = greedy.behaviour
    write_result(args.name, result)


if __name__ == "__main__":
    main()
