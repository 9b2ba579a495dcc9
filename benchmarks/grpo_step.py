"""One GRPO update (``GRPOTrainer.step``) with micro-batches cut in index order vs sorted by length.

The model is the CPU RL experiment's (``mini`` with the copy head, ``copy_min_distance`` 8,
context 2,048; random weights: the time does not depend on them) and the trainer is configured
as the RL runs are (``micro_batch`` 4, ``minibatches`` 4, ``norm_tokens`` 256, a k2 KL term
against a reference, ``--epochs`` passes). The rollouts are synthetic, seeded, and shaped like
the RL runs' (their lengths, not their tokens, set the cost): ``--tasks`` groups of
``--group`` rollouts; a task's prompt is 350-650 tokens, shared by its group; a rollout makes
1-6 model calls of 30-192 sampled tokens each, with a 20-200-token tool result between two
calls; each group's rewards are mixed, so every rollout is a row (``--quick``: the tiny preset,
every length a tenth). Sorting moves rows only when an optimizer step spans two or more
micro-batches, i.e. more than 16 rows. Not measured here: how
padded a real run's micro-batches are — the trainer reports that itself (``pad_share`` and
``pad_share_unsorted`` in the run's metrics).

The two arms train copies of one model on the same rollouts. Each arm first takes one
untimed update (the process's first-call costs), then the arms alternate A B, B A, ... so
neither always goes first. Reported: seconds per update per arm (median over ``--rounds``),
``speedup`` (index order / sorted), each round's ratio (``round_ratios``: the pair within a
round saw about the same machine load; their spread is the noise), and both arms'
``pad_share`` (the padded share of the positions the forwards computed; ``1 -
pad_share`` ratios bound what sorting can save when the cost is per position).

Usage: python benchmarks/grpo_step.py [--quick] [--tasks N] [--group N] [--epochs N] [--rounds N] [--threads N]
"""

from __future__ import annotations

import argparse
import copy
import random
import statistics
import time

from _common import write_result

import torch

from agent.model.config import ModelConfig
from agent.model.transformer import MoETransformer
from rl.config import GRPOConfig
from rl.train.grpo import GRPOTrainer
from rl.types import Rollout, RolloutStatus, Segment

MAX_LEN = 2048  # the model's context, as in the RL runs


def rollouts(n_tasks: int, group: int, vocab: int, seed: int, scale: float = 1.0) -> list[Rollout]:
    """Synthetic rollouts shaped like the RL runs' (see the module docstring); ``scale`` shrinks
    every length (the smoke test's)."""
    rng = random.Random(seed)

    def toks(n: int) -> list[int]:
        return [rng.randrange(3, vocab) for _ in range(max(1, round(n * scale)))]

    out = []
    for t in range(n_tasks):
        prompt = toks(rng.randint(350, 650))
        for g in range(group):
            segments = [Segment(prompt, sampled=False)]
            for c in range(rng.randint(1, 6)):
                result, ids = toks(rng.randint(20, 200)) if c else [], toks(rng.randint(30, 192))
                if sum(len(s.token_ids) for s in segments) + len(result) + len(ids) > MAX_LEN:
                    break  # the context is full: the session would have stopped
                if result:
                    segments.append(Segment(result, sampled=False))
                segments.append(Segment(ids, sampled=True, logprobs=[-1.0] * len(ids)))
            out.append(Rollout(run_id="bench", iteration=0, task_id=f"t{t}", sample=g,
                               status=RolloutStatus.FINISHED, segments=segments, reward=float(g % 2)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="seconds: tiny sizes (smoke test)")
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2, help="torch threads (the RL driver uses the default: cores)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.quick:  # 24 rows: 6 micro-batches, 2 per optimizer step, so the sort has rows to move
        args.tasks, args.group, args.rounds = 3, 8, 1
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    cfg = ModelConfig.preset("tiny" if args.quick else "mini", max_seq_len=MAX_LEN, copy_head=True,
                             copy_min_distance=8)
    base = MoETransformer(cfg)
    rows = rollouts(args.tasks, args.group, cfg.vocab_size, args.seed, scale=0.1 if args.quick else 1.0)
    arms = {}
    for name, sort in (("index_order", False), ("sorted", True)):
        grpo = GRPOConfig(group_size=args.group, micro_batch=4, minibatches=4, norm_tokens=256, epochs=args.epochs,
                          kl_coef=0.05, kl_estimator="k2", sort_micro_batches=sort)
        arms[name] = GRPOTrainer(copy.deepcopy(base), grpo, pad_id=0, lr=5e-4)
    times: dict[str, list[float]] = {name: [] for name in arms}
    pads = {name: trainer.step(rows)["pad_share"] for name, trainer in arms.items()}  # warm-up, untimed
    for r in range(args.rounds):
        for name in (list(arms) if r % 2 == 0 else list(arms)[::-1]):
            t0 = time.perf_counter()
            arms[name].step(rows)
            times[name].append(time.perf_counter() - t0)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    lengths = [len(r.token_ids) for r in rows]
    write_result("grpo_step_quick" if args.quick else "grpo_step", {
        "config": {"preset": "tiny" if args.quick else "mini", "copy_head": True, "tasks": args.tasks,
                   "warmup_updates_per_arm": 1,
                   "group": args.group, "rows": len(rows), "epochs": args.epochs, "micro_batch": 4, "minibatches": 4,
                   "kl": "k2 0.05", "rounds": args.rounds, "threads": args.threads, "seed": args.seed},
        "row_tokens": {"min": min(lengths), "median": statistics.median(lengths), "max": max(lengths)},
        "seconds_per_update": {name: round(v, 3) for name, v in med.items()},
        "all_seconds": {name: [round(t, 3) for t in ts] for name, ts in times.items()},
        "pad_share": {name: round(v, 4) for name, v in pads.items()},
        "speedup": round(med["index_order"] / med["sorted"], 3),
        "round_ratios": [round(a / b, 3) for a, b in zip(times["index_order"], times["sorted"], strict=True)],
    })


if __name__ == "__main__":
    main()
