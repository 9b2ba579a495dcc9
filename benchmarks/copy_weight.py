"""Does weighting copy tokens in the SFT loss teach a small model to copy names from its context?

Two SFT continuations of one checkpoint (``--init``, an SFT start), run side by side (one
thread each, so the machine's noise hits both alike): ``sft.copy_weight: 1`` (the plain
per-token mean) and ``--weight`` (copy tokens, :mod:`rl.train.copy_tokens`, weigh that many
times more). Same demonstrations (same seed: the same split into SFT-train and SFT-held-out
tasks), same steps, same learning rate. Reported per evaluation: the held-out demonstrations'
plain loss, copy-token loss and copy-token argmax accuracy; the curves go to
``docs/rl/copy_weight.png``.

Held-out here is the SFT split of the RL TRAIN tasks (what ``flywheel rl sft`` early-stops on);
the RL held-out split is not touched.

    .venv/bin/python benchmarks/copy_weight.py --tasks TASKS.jsonl --init SFT_CHECKPOINT --steps 600
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _common  # noqa: F401  (repo on sys.path)
from _common import write_result

DOCS = Path(__file__).resolve().parent.parent / "docs" / "rl"
ROOT = Path(__file__).resolve().parent.parent


def run_one(args: argparse.Namespace, weight: float, out: Path) -> subprocess.Popen[bytes]:
    cfg = out.parent / f"{out.name}.json"
    cfg.write_text(json.dumps({"sft": {
        "lr": args.lr, "batch": 4, "max_epochs": 1000, "max_steps": args.steps, "eval_every": args.eval_every,
        "patience": 1000, "demos_per_task": 1, "renamings": args.renamings, "copy_weight": weight}}))
    env = os.environ | {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    code = ("import torch, sys; torch.set_num_threads(1); from backend.cli import main; "
            "sys.exit(main(sys.argv[1:]))")
    log = (out.parent / f"{out.name}.log").open("w")
    return subprocess.Popen([sys.executable, "-c", code, "rl", "sft", "--tasks", str(args.tasks), "--init",
                             str(args.init), "--out", str(out), "--config", str(cfg), "--seed", str(args.seed)],
                            env=env, stdout=log, stderr=subprocess.STDOUT)


def plot(curves: dict[str, list[dict[str, float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for ax, key, title in zip(axes, ("heldout_loss", "heldout_copy_loss", "heldout_copy_acc"),
                              ("held-out loss (as trained)", "held-out copy-token loss",
                               "held-out copy-token accuracy"),
                              strict=True):
        for name, curve in curves.items():
            ax.plot([p["step"] for p in curve], [p.get(key, float("nan")) for p in curve], marker=".", label=name)
        ax.set_title(title)
        ax.set_xlabel("SFT step (continued)")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=Path, required=True)
    ap.add_argument("--init", type=Path, required=True, help="the SFT checkpoint to continue")
    ap.add_argument("--weight", type=float, default=5.0)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--renamings", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work-dir", type=Path)
    ap.add_argument("--name", default="copy_weight")
    ap.add_argument("--plot-dir", type=Path, default=DOCS, help="where NAME.png goes (default docs/rl)")
    args = ap.parse_args()
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="copy_weight_"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    runs = {f"copy_weight {w:g}": (w, work / f"w{w:g}") for w in (1.0, args.weight)}
    procs = {name: run_one(args, w, out) for name, (w, out) in runs.items()}
    for name, p in procs.items():
        if p.wait() != 0:
            raise SystemExit(f"{name} failed: see {runs[name][1]}.log")
    curves = {name: [json.loads(x) for x in (out / "sft_curve.jsonl").read_text().splitlines()]
              for name, (_, out) in runs.items()}
    args.plot_dir.mkdir(parents=True, exist_ok=True)
    plot(curves, args.plot_dir / f"{args.name}.png")
    last = {name: c[-1] for name, c in curves.items()}
    base, weighted = last[f"copy_weight {1.0:g}"], last[f"copy_weight {args.weight:g}"]
    result = {
        "init": str(args.init), "steps": args.steps, "weight": args.weight, "lr": args.lr, "seed": args.seed,
        "seconds": time.perf_counter() - t0,
        "start": {k: curves[f"copy_weight {1.0:g}"][0].get(k) for k in ("heldout_loss", "heldout_copy_loss",
                                                                          "heldout_copy_acc")},
        "end": {name: {k: p.get(k) for k in ("heldout_loss", "heldout_copy_loss", "heldout_copy_acc")}
                for name, p in last.items()},
        "copy_acc_gain_points": 100 * ((weighted.get("heldout_copy_acc") or 0.0)
                                       - (base.get("heldout_copy_acc") or 0.0)),
        "curves": curves,
    }
    write_result(args.name, result)


if __name__ == "__main__":
    main()
