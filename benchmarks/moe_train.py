"""MoE training throughput on this CPU, and MXFP8-vs-fp32 loss parity.

1. Throughput: optimizer steps (forward + backward + AdamW) of the ``tiny`` and
   ``small`` presets on random tokens, fp32 and mxfp8 (emulated on the CPU:
   dequantise → fp32 matmul); tokens/s from the median and the fastest of 8
   timed steps (the fastest is the better estimate on a shared CPU).
2. Loss parity: the same MoE (same init, same batches from the real corpus)
   trained in fp32 and in mxfp8 for the same steps; training loss every
   ``--every`` steps, the mean of the last 10 training losses and the final
   validation loss. Target: both within 1% (relative) of fp32.

The CPU may be shared; ``load_avg`` records how busy it was. Usage:
``python benchmarks/moe_train.py [--quick] [--parity-steps N] [--parity-preset small|tiny]`` (about 4
minutes on 2 idle cores).
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import write_result

import torch
import torch.nn.functional as F

from agent.model.config import ModelConfig
from agent.model.corpus import build_corpus
from agent.model.numerics import KernelsUnavailable, require_kernels
from agent.model.tokenizer import train_tokenizer
from agent.model.train import DEFAULT_LR, TrainConfig, train
from agent.model.transformer import MoETransformer


def mxfp8_available() -> str | None:
    """None when the mxfp8 paths can run, else why not."""
    try:
        require_kernels("mxfp8")
    except KernelsUnavailable as exc:
        return str(exc)
    return None


def throughput(preset: str, precision: str, batch: int, seq: int, steps: int, warmup: int = 2) -> dict[str, Any]:
    torch.manual_seed(0)
    cfg = ModelConfig.preset(preset, precision=precision)
    model = MoETransformer(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq + 1))
    times = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        out = model(ids[:, :-1])
        loss = F.cross_entropy(out.logits.flatten(0, 1), ids[:, 1:].flatten()) + out.aux_loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    step_s = statistics.median(times)
    return {"preset": preset, "precision": precision, "batch": batch, "seq_len": seq,
            "params_m": round(model.num_params() / 1e6, 2), "active_params_m": round(model.num_params(active=True) / 1e6, 2),
            "step_ms_median": round(step_s * 1e3, 1), "step_ms_min": round(min(times) * 1e3, 1),
            "tokens_per_s": round(batch * seq / step_s, 1), "tokens_per_s_best": round(batch * seq / min(times), 1)}


def parity(preset: str, steps: int, every: int, batch: int, seq: int, corpus_mb: int, vocab: int) -> dict[str, Any]:
    # transcripts rendered with the profile the preset's checkpoints are served with (train() checks)
    corpus = build_corpus(max_bytes=corpus_mb << 20, seed=0, prompt_profile=TrainConfig(preset=preset).profile.name)
    t0 = time.perf_counter()

    def sample(budget: int = 4 << 20):
        for text in corpus.texts("train"):
            if budget <= 0:
                return
            budget -= len(text)
            yield text

    tok = train_tokenizer(sample(), vocab)
    runs: dict[str, Any] = {"tokenizer_s": round(time.perf_counter() - t0, 1)}
    with tempfile.TemporaryDirectory() as tmp:
        for precision in ("fp32", "mxfp8"):
            tc = TrainConfig(preset=preset, steps=steps, precision=precision, out=Path(tmp) / precision,
                             seq_len=seq, batch=batch, seed=0, eval_batches=8, log_every=10**9)
            t0 = time.perf_counter()
            r = train(tc, corpus=corpus, tokenizer=tok, log=io.StringIO(), save=False)
            losses = [loss for _, loss in r.losses]
            runs[precision] = {
                "curve": [[s, round(loss, 4)] for s, loss in r.losses if s % every == 0 or s == 1],
                "final_train_loss_last10": round(statistics.fmean(losses[-10:]), 4),
                "final_val_loss": None if r.val_loss is None else round(r.val_loss, 4),
                "tokens_per_s": round(r.tokens_per_s, 1), "wall_s": round(time.perf_counter() - t0, 1),
            }
    a, b = runs["fp32"], runs["mxfp8"]
    rel_train = abs(b["final_train_loss_last10"] - a["final_train_loss_last10"]) / a["final_train_loss_last10"]
    rel_val = (abs(b["final_val_loss"] - a["final_val_loss"]) / a["final_val_loss"]
               if a["final_val_loss"] and b["final_val_loss"] else None)
    curve_rel = [abs(y - x) / x for (_, x), (_, y) in zip(a["curve"], b["curve"], strict=True)]
    runs.update({
        "preset": preset, "steps": steps, "batch": batch, "seq_len": seq, "vocab_size": tok.vocab_size,
        "lr": DEFAULT_LR[preset],
        "corpus": corpus.summary(),
        "rel_diff_train_loss_last10": round(rel_train, 5),
        "rel_diff_val_loss": None if rel_val is None else round(rel_val, 5),
        "max_rel_diff_on_curve": round(max(curve_rel), 5),
        "target_rel_diff": 0.01,
        "pass": rel_train <= 0.01 and (rel_val is None or rel_val <= 0.01),
    })
    return runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a few steps of everything (smoke test)")
    ap.add_argument("--parity-preset", default="small", choices=["tiny", "small"])
    ap.add_argument("--parity-steps", type=int, default=150)
    ap.add_argument("--every", type=int, default=10, help="loss-curve resolution in steps")
    args = ap.parse_args()
    quick = args.quick
    why_not = mxfp8_available()
    precisions = ["fp32"] + ([] if why_not else ["mxfp8"])
    t0 = time.perf_counter()
    rows = []
    for preset in ("tiny",) if quick else ("tiny", "small"):
        for precision in precisions:
            rows.append(throughput(preset, precision, batch=8, seq=128 if not quick else 32,
                                   steps=8 if not quick else 1, warmup=3 if not quick else 1))
            print(rows[-1], flush=True)
    result: dict[str, Any] = {"throughput": rows, "torch_threads": torch.get_num_threads(),
                              "load_avg": [round(x, 2) for x in os.getloadavg()]}
    if why_not:
        result["mxfp8"] = f"skipped: {why_not}"
        result["pass"] = None
    else:
        preset = "tiny" if quick else args.parity_preset
        p = parity(preset, steps=6 if quick else args.parity_steps, every=2 if quick else args.every,
                   batch=8, seq=32 if quick else 128, corpus_mb=2 if quick else 16,
                   vocab=512 if quick else ModelConfig.preset(preset).vocab_size)
        result["parity"] = p
        result["pass"] = p["pass"] if not quick else None  # a 6-step run proves nothing about parity
    result["quick"] = quick
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    result["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    write_result("moe_train", result)


if __name__ == "__main__":
    main()
