"""Can the CPU-scale policy learn to copy a name from its context into a tool call, and how fast?

The RL experiment's SFT start never copies a path from the request or a tool result into a
call (docs/rl/runs.md: it writes plausible, invented paths). This probe isolates that skill:
next-token training on *copy drills* only (``agent.model.copy_drills``: a user message naming
a path made of random letters, nothing to memorise, answered by a ``read_file`` call on that
path, several drills per training window) and measures, on drills with fresh names, the share of paths the model
reproduces exactly (teacher-forced: every path token is the argmax). Chance is 0.

It compares a random init with ``--init`` (a pretrained checkpoint, e.g. the RL experiment's
``start0/init``), same tokenizer, same drills, same steps, so the figure says whether copy
drills in pretraining are a cheap fix (a few hundred steps) or not.

    .venv/bin/python benchmarks/copy_probe.py --init /tmp/rlwork3/start0/init   # ~10 min on 2 cores
    .venv/bin/python benchmarks/copy_probe.py --quick --init CKPT                  # a minute

Not guaranteed: that copying in drills transfers to copying inside real task conversations
(longer contexts, several candidate names); that is what the next RL experiment measures.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import _common  # noqa: F401  (repo on sys.path)
from _common import write_result


def run(init: Path | None, tok: Any, args: argparse.Namespace, label: str) -> dict[str, Any]:
    import torch

    from agent.model.checkpoint import load_checkpoint
    from agent.model.config import ModelConfig
    from agent.model.copy_drills import train_on_drills
    from agent.model.transformer import MoETransformer

    torch.manual_seed(args.seed)
    if init is not None:
        model, _ = load_checkpoint(init)
    else:
        model = MoETransformer(ModelConfig.preset(args.preset, vocab_size=tok.vocab_size, max_seq_len=2048))
    curve = train_on_drills(model, tok, steps=args.steps, seed=args.seed, batch=args.batch, seq_len=args.seq_len,
                            lr=args.lr, eval_every=args.eval_every, eval_windows=args.eval_windows,
                            progress=lambda c: print(f"{label} step {c['step']}: copy accuracy "
                                                     f"{c['copy_accuracy']:.3f}", flush=True))
    return {"start": label, "curve": curve, "final_copy_accuracy": curve[-1]["copy_accuracy"],
            "steps_to_half": next((c["step"] for c in curve if c["copy_accuracy"] >= 0.5), None)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--init", type=Path, help="a pretrained checkpoint (its tokenizer is used for both starts)")
    ap.add_argument("--preset", default="mini")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--eval-windows", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="60 steps (the pipeline only)")
    args = ap.parse_args()
    if args.quick:
        args.steps, args.eval_every, args.eval_windows = 60, 30, 4
    import torch

    from agent.model.checkpoint import load_checkpoint
    from agent.model.corpus import build_corpus
    from agent.model.tokenizer import train_tokenizer

    torch.set_num_threads(1)  # steady on a shared machine; the model is small
    if args.init is not None:
        _, tok = load_checkpoint(args.init)
    else:
        tok = train_tokenizer(build_corpus(max_bytes=1 << 20, n_transcripts=24).texts("train"), 2048)
    starts = [run(None, tok, args, "random init")]
    if args.init is not None:
        starts.append(run(args.init, tok, args, f"pretrained ({args.init.name})"))
    write_result("copy_probe", {"config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                                "starts": starts})


if __name__ == "__main__":
    main()
