"""What successor-aware copy keys (``cfg.copy_successor_keys``, ``agent/model/copy_head.py``) cost.

The model is the CPU RL experiment's (``mini`` with the copy head, ``copy_min_distance`` 8; random
weights, the successor keys drawn non-zero: the time does not depend on the values). Two arms from
one seed, the same but for the option, timed alternately in every round so both see the same
machine load:

* ``decode`` — one batched decode step of 32 rows whose slots each hold ``--context`` cached
  tokens (the RL driver's batch; ``benchmarks/decode_step.py``'s ``full`` layout); the slots'
  lengths are put back after each step, so every step attends over the same positions;
* ``train`` — one forward and backward of a ``[4, --seq]`` batch without a cache (an SFT/GRPO
  micro-batch).

Reported per phase: median ``without_ms`` and ``with_ms`` and ``ratio`` (with / without, from the
same run). Single-threaded by default, as the RL driver's engine runs (``--threads``). Not
measured: memory (the option adds a ``[vocab, d_model]`` table, 1 MB for ``mini``, and one
``[B, T, 2N]`` score tensor the head already builds once for its keys).

Usage: python benchmarks/copy_successor_cost.py [--quick] [--context N] [--seq N] [--rounds N] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import time

from _common import write_result

import torch

from agent.model.config import ModelConfig
from agent.model.transformer import KVCache, MoETransformer

SLOTS = 32


def _models() -> dict[str, MoETransformer]:
    out = {}
    for arm, keys in (("without", False), ("with", True)):
        torch.manual_seed(0)
        model = MoETransformer(ModelConfig.preset("mini", copy_head=True, copy_min_distance=8,
                                                  copy_successor_keys=keys))
        if model.copy is not None and model.copy.successor_keys is not None:
            with torch.no_grad():
                model.copy.successor_keys.normal_(0, 0.02)
        out[arm] = model
    return out


def _decode_ms(model: MoETransformer, cache: KVCache, tokens: torch.Tensor) -> float:
    slots = torch.arange(SLOTS)
    t0 = time.perf_counter()
    with torch.inference_mode():
        model(tokens, cache=cache, slots=slots)
    dt = time.perf_counter() - t0
    cache.lengths[slots] -= 1
    return dt * 1e3


def _train_ms(model: MoETransformer, ids: torch.Tensor) -> float:
    t0 = time.perf_counter()
    out = model(ids)
    loss = torch.log_softmax(out.logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).mean() + out.aux_loss
    loss.backward()
    dt = time.perf_counter() - t0
    model.zero_grad(set_to_none=True)
    return dt * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="200 cached tokens, 256-token batch, 2 rounds (a smoke run)")
    ap.add_argument("--context", type=int, default=900, help="cached tokens per decode slot (default 900)")
    ap.add_argument("--seq", type=int, default=1024, help="tokens per training row (default 1024)")
    ap.add_argument("--rounds", type=int, default=8, help="rounds of (without, with) per phase")
    ap.add_argument("--steps", type=int, default=3, help="steps per arm per round")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the RL driver's engine uses 1)")
    args = ap.parse_args()
    context, seq, rounds = (200, 256, 2) if args.quick else (args.context, args.seq, args.rounds)
    torch.set_num_threads(args.threads)
    models = _models()
    cfg = models["with"].cfg
    rng = torch.Generator().manual_seed(0)
    caches = {arm: KVCache(m.cfg, SLOTS, context + 8) for arm, m in models.items()}
    prompts = [torch.randint(0, cfg.vocab_size, (1, context), generator=rng) for _ in range(SLOTS)]
    with torch.inference_mode():
        for arm, model in models.items():
            model.eval()
            for slot, ids in enumerate(prompts):
                model(ids, cache=caches[arm], slots=torch.tensor([slot]))
    tokens = torch.randint(0, cfg.vocab_size, (SLOTS, 1), generator=rng)
    batch = torch.randint(0, cfg.vocab_size, (4, seq), generator=rng)
    phases = {"decode": lambda arm: _decode_ms(models[arm], caches[arm], tokens),
              "train": lambda arm: _train_ms(models[arm].train(), batch)}
    report = {}
    for phase, run in phases.items():
        for arm in models:
            run(arm)  # warm-up
        times: dict[str, list[float]] = {arm: [] for arm in models}
        for _ in range(rounds):
            for arm in models:
                times[arm] += [run(arm) for _ in range(args.steps)]
        off, on = statistics.median(times["without"]), statistics.median(times["with"])
        report[phase] = {"without_ms": round(off, 2), "with_ms": round(on, 2), "ratio": round(on / off, 3)}
        print(f"{phase:>6}: without {off:.1f} ms, with {on:.1f} ms, x{on / off:.3f}", flush=True)
    write_result("copy_successor_cost", {
        "quick": args.quick, "preset": "mini", "slots": SLOTS, "context": context, "train_batch": [4, seq],
        "rounds": rounds, "steps_per_round": args.steps, "torch_threads": args.threads, "phases": report,
    })


if __name__ == "__main__":
    main()
