"""One batched decode step of the RL policy model: the cache read as a view vs gathered.

The model is the CPU RL experiment's (``mini`` with the copy head, ``copy_min_distance`` 8;
random weights: the time does not depend on them). Every cache slot holds ``--context``
tokens; one decode step (T = 1, one row per busy slot) is timed with the rows' slots read as a
view of the cache (``agent.model.slot_rows``, the default) and with them gathered
(``model.slot_view_spread = 0``, how the cache was read before the view existed; the copy
head's scoring is the current one in both arms), alternating the two in
each round so both see the same machine load. After every step the slots' lengths are set
back, so every step attends over the same ``--context`` positions. Layouts:

* ``full`` — every slot busy, rows in slot order (the RL driver's batch of 32 while its queue
  is non-empty): a view, nothing spread;
* ``fragmented`` — 24 of the 32 slots busy, scattered (some conversations are waiting on their
  tools): a view with 8 spare rows;
* ``sparse`` — 6 of 32 busy, scattered: a range over 2 × the rows, so both arms gather (the
  control: its ratio should be ~1).

Reported per layout: median ``gather_ms`` and ``view_ms`` per step and ``speedup``
(gather / view, both from the same run), and ``max_abs_logit_diff`` between the two on the
same inputs (fp32; the paths differ only in rounding). Single-threaded by default, as the RL
driver's engine runs (``--threads``).

Usage: python benchmarks/decode_step.py [--quick] [--context N] [--rounds N] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import time

from _common import write_result

import torch

from agent.model.config import ModelConfig
from agent.model.slot_rows import SlotRows
from agent.model.transformer import KVCache, MoETransformer

SLOTS = 32


def layouts(rng: torch.Generator) -> dict[str, list[int]]:
    order = torch.randperm(SLOTS, generator=rng).tolist()
    return {"full": list(range(SLOTS)), "fragmented": sorted(order[:24]), "sparse": sorted(order[:6])}


def step(model: MoETransformer, cache: KVCache, slots: torch.Tensor, tokens: torch.Tensor,
         spread: float) -> tuple[float, torch.Tensor]:
    """Seconds for one decode step over ``slots``, and its logits; the slots' lengths are put back."""
    model.slot_view_spread = spread
    t0 = time.perf_counter()
    logits = model(tokens, cache=cache, slots=slots).logits
    dt = time.perf_counter() - t0
    cache.lengths[slots] -= 1
    return dt, logits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="200 cached tokens, 3 rounds (a smoke run)")
    ap.add_argument("--context", type=int, default=900, help="cached tokens per slot (default 900)")
    ap.add_argument("--rounds", type=int, default=15, help="rounds of (gather, view) steps per layout")
    ap.add_argument("--steps", type=int, default=4, help="steps per arm per round")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the RL driver's engine uses 1)")
    args = ap.parse_args()
    context, rounds = (200, 3) if args.quick else (args.context, args.rounds)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = ModelConfig.preset("mini", copy_head=True, copy_min_distance=8)
    model = MoETransformer(cfg).eval()
    cache = KVCache(cfg, SLOTS, context + 8)
    rng = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for slot in range(SLOTS):  # every slot holds `context` tokens, prefilled in one forward each
            ids = torch.randint(0, cfg.vocab_size, (1, context), generator=rng)
            model(ids, cache=cache, slots=torch.tensor([slot]))
        report = {}
        for name, ids in layouts(rng).items():
            slots = torch.tensor(ids)
            tokens = torch.randint(0, cfg.vocab_size, (len(ids), 1), generator=rng)
            _, a = step(model, cache, slots, tokens, 0.0)
            _, b = step(model, cache, slots, tokens, 2.0)
            times: dict[str, list[float]] = {"gather": [], "view": []}
            for _ in range(rounds):
                for arm, spread in (("gather", 0.0), ("view", 2.0)):
                    times[arm] += [step(model, cache, slots, tokens, spread)[0] for _ in range(args.steps)]
            g, v = statistics.median(times["gather"]), statistics.median(times["view"])
            rows = SlotRows.of(slots)
            report[name] = {
                "rows": len(ids), "view_width": rows.width if rows.span is not None else None,
                "gather_ms": round(g * 1e3, 2), "view_ms": round(v * 1e3, 2), "speedup": round(g / v, 2),
                "max_abs_logit_diff": float((a - b).abs().max()),
            }
            print(f"{name:>10}: {len(ids)} rows, gather {g * 1e3:.1f} ms, view {v * 1e3:.1f} ms, "
                  f"x{g / v:.2f}", flush=True)
    write_result("decode_step", {
        "quick": args.quick, "preset": "mini", "copy_head": True, "slots": SLOTS, "context": context,
        "rounds": rounds, "steps_per_round": args.steps, "torch_threads": args.threads, "layouts": report,
    })


if __name__ == "__main__":
    main()
