"""Does RL help? SFT start vs after GRPO, on the HELD-OUT split, per seed, as curves.

Per seed: build a task set (the four procedural families; train and held-out differ by
seed and vocabulary), train a tokenizer and a random model of ``--preset``, warm-start it
with SFT on scripted demonstrations of the TRAIN split (``flywheel rl sft``: held-out
early stopping on demonstration loss, not on task success), then run GRPO
(``rl.rollout.driver.train``: the production runtime on Ray) and evaluate the held-out
split every ``--eval-every`` iterations (``rl.rollout.driver.evaluate``, ``k`` samples per
task). Nothing is tuned on the held-out split: it is only measured.

Reported per seed and as mean / spread over seeds: held-out pass@1, tokens per solved task,
the parallel-call share (model calls with >= 2 tool calls) and the blind-edit rate, at the
SFT start and after RL, plus the curves (``docs/rl/rl_learning[_quick].png``) and each run's
training metrics (``docs/rl/rl_learning[_quick]_seed<S>_metrics.jsonl`` and ``..._curves.png``).

    .venv/bin/python benchmarks/rl_learning.py --quick          # minutes: 1 seed, tiny preset
    .venv/bin/python benchmarks/rl_learning.py                  # the full run (below)

Full run sizing (not run yet; for a later session): 3 seeds (``--seeds 0 1 2``), ``small``
preset, 64 train / 32 held-out tasks, SFT up to 20 epochs (early stopping), 50 GRPO
iterations of 4 tasks x G=8 (32 rollouts, <= 6 model calls of <= 192 tokens each), held-out
eval every 10 iterations with k=4. Estimate for this 2-core machine, from measurements, not
from a full run: ``benchmarks/results/rl_learning_sizing_small.json`` (``--quick --preset small
--n-train 8 --n-heldout 4 --iterations 2 --eval-every 2 --sft-epochs 10 --name
rl_learning_sizing_small``) took 8.7 s per iteration for 8 rollouts of ~50 sampled tokens
(rollouts 2.7-4.1 s, GRPO step 1.6-2.8 s, the rest actor start-up) and ~2.5 s per SFT step
of 4 demonstrations. Scaled to 32 rollouts of up to ~400 sampled tokens (the engine batches
them, so sub-linearly) that is ~60-120 s per iteration, i.e. 50-100 min of GRPO, plus
<= 13 min of SFT (320 steps) and ~6 held-out evaluations of 128 rollouts: ~1.5-2.3 h per
seed, at the edge of the issue's 2 h. Run ``--seeds 0 --iterations 2`` first and scale
``--iterations`` to the measured time per iteration; run the seeds one after another if a
session is shorter. The issue's bars (pass@1 +25 points, tokens per solved task / 2) are for
that run; the quick run only shows the pipeline end to end and is far too small to meet them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import _common  # noqa: F401  (repo on sys.path)
from _common import write_result

DOCS = Path(__file__).resolve().parent.parent / "docs" / "rl"
FAMILIES = ["fix_bug", "rename", "find_change", "implement_stub"]
CURVE_KEYS = ("pass_at_1", "tokens_per_solved", "parallel_call_share", "blind_edit_rate")


def _point(iteration: int, res: Any) -> dict[str, float]:
    b = res.behaviour
    return {"iteration": float(iteration), "pass_at_1": res.pass_at_1, f"pass_at_{res.k}": res.pass_at_k,
            "tokens_per_solved": b.get("tokens_per_solved", float("nan")),
            "parallel_call_share": b.get("parallel_call_share", 0.0),
            "blind_edit_rate": b.get("blind_edit_rate", 0.0), "infra_errors": float(res.infra_errors)}


def run_seed(seed: int, args: argparse.Namespace, tmp: Path, name: str) -> dict[str, Any]:
    import torch

    from agent.model.checkpoint import save_checkpoint
    from agent.model.corpus import build_corpus
    from agent.model.config import ModelConfig
    from agent.model.tokenizer import train_tokenizer
    from agent.model.transformer import MoETransformer
    from agent.prompt import COMPACT_PROFILE
    from rl.config import validate_run_config
    from rl.rollout.driver import evaluate, train
    from rl.rollout.log import MemoryRolloutLog
    from rl.tasks.build import build_task_set
    from rl.tasks.spec import load_tasks
    from rl.train.checkpoints import latest_checkpoint
    from rl.train.cli import _cmd_sft
    from rl.types import Split
    from tools.sandbox import make_sandbox

    t0 = time.perf_counter()
    root = tmp / f"seed{seed}"
    root.mkdir()
    tasks_file = root / "tasks.jsonl"
    built = asyncio.run(build_task_set(FAMILIES, args.n_train, args.n_heldout, seed, tasks_file,
                                       sandbox=make_sandbox()))
    heldout = [t for t in load_tasks(tasks_file) if t.split is Split.HELDOUT]
    corpus = build_corpus(max_bytes=1 << 20, n_transcripts=24, val_fraction=0.05, prompt_profile="compact",
                          seed=seed)
    tok = train_tokenizer(corpus.texts("train"), 1024)
    torch.manual_seed(seed)
    model = MoETransformer(ModelConfig.preset(args.preset, vocab_size=tok.vocab_size, max_seq_len=2048))
    save_checkpoint(root / "init", model, tok, step=0, profile=COMPACT_PROFILE)
    (root / "sft.json").write_text(json.dumps({"sft": {"lr": 3e-3, "batch": 4, "max_epochs": args.sft_epochs,
                                                        "eval_every": 4, "patience": 3}}))
    sft = root / "sft"
    rc = _cmd_sft(argparse.Namespace(tasks=tasks_file, init=root / "init", out=sft, config=root / "sft.json",
                                     seed=seed))
    if rc != 0:
        raise SystemExit(f"seed {seed}: SFT failed (exit {rc})")
    t_sft = time.perf_counter()

    def heldout_eval(ckpt: Path, iteration: int) -> dict[str, float]:
        res = evaluate(heldout, k=args.k, checkpoint=ckpt, store_root=root / f"eval{iteration}", seed=seed,
                       temperature=1.0, max_tokens=args.max_tokens, limits=_limits(args))
        return _point(iteration, res)

    curve = [heldout_eval(sft, 0)]
    cfg = validate_run_config({
        "name": f"{name}-seed{seed}", "seed": seed, "out_dir": str(root / "run"), "tasks": str(tasks_file),
        "iterations": args.iterations, "tasks_per_iteration": args.tasks_per_iteration, "lr": args.lr,
        "model": {"preset": args.preset, "init": str(sft)},
        "grpo": {"group_size": args.group, "norm_tokens": 256},
        "limits": {"max_model_calls": args.max_model_calls, "max_output_tokens": args.max_model_calls *
                   args.max_tokens, "max_wall_s": 120},
        "rollout": {"workers": 1, "max_tokens_per_call": args.max_tokens},
    })
    t_rl = 0.0
    while True:
        t = time.perf_counter()
        res = train(cfg, log=MemoryRolloutLog(), stop_after=args.eval_every)
        t_rl += time.perf_counter() - t
        ckpt = latest_checkpoint(root / "run")
        assert ckpt is not None
        curve.append(heldout_eval(ckpt, res.iterations_done))
        if res.iterations_done >= args.iterations:
            break
    for src, dst in (("metrics.jsonl", "metrics.jsonl"), ("curves.png", "curves.png")):
        if (root / "run" / src).exists():
            shutil.copy(root / "run" / src, DOCS / f"{name}_seed{seed}_{dst}")
    if (sft / "sft_curve.png").exists():
        shutil.copy(sft / "sft_curve.png", DOCS / f"{name}_seed{seed}_sft_curve.png")
    records = [json.loads(x) for x in (root / "run" / "metrics.jsonl").read_text().splitlines()]
    return {"seed": seed, "tasks": built.to_json()["written"], "sft": curve[0], "rl": curve[-1], "curve": curve,
            "iterations_stepped": sum(bool(r.get("stepped")) for r in records),
            "train_success_rate": [r.get("success_rate") for r in records],
            "seconds": {"total": time.perf_counter() - t0, "sft": t_sft - t0, "rl": t_rl,
                        "per_iteration": t_rl / max(1, args.iterations)}}


def _limits(args: argparse.Namespace) -> Any:
    from agent.session import Limits

    return Limits(max_steps=args.max_model_calls, max_output_tokens=args.max_model_calls * args.max_tokens,
                  max_wall_s=120)


def _spread(seeds: list[dict[str, Any]], when: str, key: str) -> dict[str, float]:
    vals = [s[when][key] for s in seeds if s[when][key] == s[when][key]]  # drop NaN (nothing solved)
    if not vals:
        return {"mean": float("nan"), "std": float("nan"), "n": 0}
    return {"mean": statistics.fmean(vals), "std": statistics.pstdev(vals), "n": len(vals)}


def plot(seeds: list[dict[str, Any]], out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(CURVE_KEYS), figsize=(4 * len(CURVE_KEYS), 3.2))
    for ax, key in zip(axes, CURVE_KEYS, strict=True):
        for s in seeds:
            xs = [p["iteration"] for p in s["curve"]]
            ax.plot(xs, [p[key] for p in s["curve"]], marker="o", label=f"seed {s['seed']}")
        ax.set_title(f"held-out {key.replace('_', ' ')}")
        ax.set_xlabel("RL iteration (0 = SFT start)")
    axes[0].legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1 seed, tiny preset, a few iterations (minutes)")
    ap.add_argument("--seeds", type=int, nargs="+")
    ap.add_argument("--preset")
    ap.add_argument("--n-train", type=int)
    ap.add_argument("--n-heldout", type=int)
    ap.add_argument("--iterations", type=int)
    ap.add_argument("--eval-every", type=int)
    ap.add_argument("--sft-epochs", type=int)
    ap.add_argument("--name", help="result name (default rl_learning or rl_learning_quick)")
    args = ap.parse_args()
    full = {"seeds": [0, 1, 2], "preset": "small", "n_train": 64, "n_heldout": 32, "iterations": 50,
            "eval_every": 10, "tasks_per_iteration": 4, "group": 8, "k": 4, "sft_epochs": 20,
            "max_model_calls": 6, "max_tokens": 192, "lr": 1e-4}
    quick = full | {"seeds": [0], "preset": "tiny", "n_train": 32, "n_heldout": 8, "iterations": 6, "eval_every": 2,
                    "tasks_per_iteration": 2, "group": 4, "k": 2, "sft_epochs": 60, "max_model_calls": 4,
                    "max_tokens": 96, "lr": 1e-3}
    sizing = quick if args.quick else full
    for k, v in sizing.items():
        if getattr(args, k, None) is None:
            setattr(args, k, v)
    name = args.name or ("rl_learning_quick" if args.quick else "rl_learning")
    DOCS.mkdir(parents=True, exist_ok=True)
    import ray

    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=200 * 1024 * 1024, log_to_driver=False)
    tmp = Path(tempfile.mkdtemp(prefix="rl-learning-"))
    try:
        seeds = [run_seed(s, args, tmp, name) for s in args.seeds]
    finally:
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    plot(seeds, DOCS / f"{name}.png", f"{name}: held-out split, SFT start (iteration 0) and during GRPO")
    summary = {when: {key: _spread(seeds, when, key) for key in CURVE_KEYS} for when in ("sft", "rl")}
    (DOCS / f"{name}.json").write_text(json.dumps({"config": sizing | {"seeds": args.seeds}, "summary": summary,
                                                    "seeds": seeds}, indent=2) + "\n")
    write_result(name, {"config": {k: getattr(args, k) for k in sizing}, "summary": summary, "seeds": seeds})


if __name__ == "__main__":
    main()
