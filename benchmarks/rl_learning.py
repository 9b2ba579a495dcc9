"""Does RL help? The SFT start vs after GRPO, on the HELD-OUT split, over seeds, as curves.

1. One task set (``--data-seed``; the four procedural families; train and held-out differ by
   seed AND vocabulary), a byte-level BPE tokenizer and a random model of ``--preset``.
2. SFT warm start on scripted demonstrations of the TRAIN split (``flywheel rl sft``: mixed
   styles, held-out early stopping on demonstration loss; at most ``--sft-steps`` steps).
   Its curve is ``docs/rl/<name>_sft_curve.png``.
3. Per seed (``--seeds``), GRPO from that SFT checkpoint (``rl.rollout.driver.train``: the
   production runtime on Ray), with the held-out split evaluated INSIDE the run every
   ``--eval-every`` iterations (``eval:`` in the run config; iteration 0 = the SFT start;
   ``k`` samples per task at ``--temperature``, default 1, the rollouts' own). Nothing reads
   the held-out numbers back: they are only measured (never tune on the held-out split).

Departure, on purpose: the SFT start is SHARED by the seeds — a seed changes RL's sampling
and task order, not the SFT run — so the spread is RL's, on one honest start, and one SFT
(~20 min on 2 cores for ``mini``) is paid once. Per-seed SFT is ``--sft-per-seed``.

Reported per seed and as mean / spread over seeds: held-out pass@1, tokens per solved task,
the parallel-call share (model calls with >= 2 tool calls), the blind-edit rate and the
malformed-call rate, at the SFT start and after RL; the curves (``docs/rl/<name>.png``);
each run's training metrics (``docs/rl/<name>_seed<S>_metrics.jsonl`` and ``..._curves.png``);
and whether the issue's bars were met (pass@1 +25 points, tokens per solved task halved,
parallel share up, blind-edit rate down) — measured, never assumed.

    .venv/bin/python benchmarks/rl_learning.py --quick     # minutes: 1 seed, tiny preset
    .venv/bin/python benchmarks/rl_learning.py             # the full run (~1.5-2 h on 2 cores)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rl.config import RunConfig

import _common  # noqa: F401  (repo on sys.path)
from _common import write_result

# FLYWHEEL_BENCH_DOCS redirects the curves and copies written beside the result (tests: a temporary dir)
DOCS = Path(os.environ.get("FLYWHEEL_BENCH_DOCS") or Path(__file__).resolve().parent.parent / "docs" / "rl")
FAMILIES = ["fix_bug", "rename", "find_change", "implement_stub"]
CURVE_KEYS = ("pass_at_1", "tokens_per_solved", "tokens_spent_per_solved", "parallel_call_share", "blind_edit_rate",
              "malformed_call_rate", "prose_chars_per_model_call")
"""Held-out figures per evaluation. ``tokens_per_solved`` (the bar's) is what a solved rollout sampled;
``tokens_spent_per_solved`` is what every rollout sampled per solved one (mean sampled tokens per
rollout / success rate): the cost of a solution including the failed attempts, reported beside the
bar, never in its place."""


def curve_point(record: dict[str, Any]) -> dict[str, float]:
    """One evaluation record's held-out figures (:data:`CURVE_KEYS`; NaN where undefined)."""
    point = {"iteration": float(record["iteration"]),
             **{k: record.get(f"heldout_{k}", float("nan")) for k in CURVE_KEYS}}
    tokens, success = record.get("heldout_rollout_sampled_tokens"), record.get("heldout_success_rate")
    point["tokens_spent_per_solved"] = tokens / success if tokens is not None and success else float("nan")
    return point


def build_start(args: argparse.Namespace, root: Path, sft_seed: int) -> dict[str, Any]:
    """Task set, tokenizer, random init and the SFT checkpoint under ``root``."""
    import asyncio

    import torch

    from agent.model.checkpoint import save_checkpoint
    from agent.model.config import ModelConfig
    from agent.model.corpus import build_corpus
    from agent.model.tokenizer import train_tokenizer
    from agent.model.transformer import MoETransformer
    from agent.prompt import COMPACT_PROFILE
    from rl.tasks.build import build_task_set
    from rl.train.cli import _cmd_sft

    t0 = time.perf_counter()
    root.mkdir(parents=True, exist_ok=True)
    tasks_file = root / "tasks.jsonl"
    if args.start is not None and not (root / "sft_done.json").exists():
        adopt_start(args, args.start, root)
    if not tasks_file.exists():
        from tools.sandbox import make_sandbox

        built = asyncio.run(build_task_set(FAMILIES, args.n_train, args.n_heldout, args.data_seed, tasks_file,
                                           sandbox=make_sandbox(), n_validation=args.n_validation))
        (root / "tasks_summary.json").write_text(json.dumps(built.to_json()))
    sft = root / "sft"
    if (root / "sft_done.json").exists():  # a --work-dir from an earlier, interrupted run
        done = json.loads((root / "sft_done.json").read_text())
        return dagger_stage(args, root, sft_seed, {
            "tasks_file": tasks_file, "sft": sft, "sft_curve": done["curve"], "sft_s": done["seconds"],
            "tasks": json.loads((root / "tasks_summary.json").read_text())["written"]})
    if args.pretrain_steps and (root / "init" / "model.safetensors").exists():
        print(f"reusing the pretrained checkpoint in {root / 'init'}", flush=True)
    elif args.pretrain_steps:
        # pretraining on code (+ synthetic tool-call transcripts) before SFT: next-token prediction on
        # code is where a small model learns to copy identifiers from its context (induction), which
        # every task needs and which SFT alone did not teach the mini model (docs/rl/runs.md)
        from agent.model.train import TrainConfig
        from agent.model.train import train as pretrain

        with (root / "pretrain.log").open("w") as log:
            pretrain(TrainConfig(preset=args.preset, steps=args.pretrain_steps, out=root / "init", seq_len=512,
                                 batch=8, seed=sft_seed, corpus_bytes=args.pretrain_mb << 20, eval_every=250,
                                 corpus_sources=tuple(args.pretrain_sources),
                                 log_every=50, prompt_profile="compact",
                                 model_overrides={"max_seq_len": 2048}), log=log)
    else:
        corpus = build_corpus(max_bytes=1 << 20, n_transcripts=24, val_fraction=0.05, prompt_profile="compact",
                              seed=args.data_seed)
        tok = train_tokenizer(corpus.texts("train"), args.vocab)
        torch.manual_seed(sft_seed)
        model = MoETransformer(ModelConfig.preset(args.preset, vocab_size=tok.vocab_size, max_seq_len=2048))
        save_checkpoint(root / "init", model, tok, step=0, profile=COMPACT_PROFILE)
    init = root / "init"
    if args.copy_head:
        init = add_copy_head(init, root / "init_copyhead", sft_seed, args.copy_min_distance,
                             args.copy_successor_keys, args.copy_context_only)
    if args.copy_drill_steps:
        # copy drills between pretraining and SFT (agent.model.copy_drills; benchmarks/copy_probe.py):
        # the pretrained mini model learns to copy a path from its context only from these
        from agent.model.checkpoint import load_checkpoint, load_profile
        from agent.model.copy_drills import train_on_drills

        torch.manual_seed(sft_seed)
        model, tok = load_checkpoint(init)
        with (root / "copy_drills.log").open("w") as log:
            drills = train_on_drills(model, tok, steps=args.copy_drill_steps, seed=sft_seed,
                                     progress=lambda c: print(json.dumps(c), file=log, flush=True))
        init = root / "init_drilled"
        save_checkpoint(init, model, tok, step=args.copy_drill_steps, profile=load_profile(root / "init"))
        (root / "copy_drills.json").write_text(json.dumps(drills))
    (root / "sft.json").write_text(json.dumps({"sft": {
        "lr": args.sft_lr, "batch": 4, "max_epochs": 1000, "max_steps": args.sft_steps, "eval_every": 50,
        "patience": args.sft_patience, "demos_per_task": 1, "renamings": args.sft_renamings,
        "edit_context": args.sft_edit_context, "copy_weight": args.sft_copy_weight,
        "exit_weight": args.sft_exit_weight,
        "shell_share": args.sft_shell_share, "narration": args.sft_narration,
        "narration_quotes": not args.sft_narration_bare}}))
    rc = _cmd_sft(argparse.Namespace(tasks=tasks_file, init=init, out=sft, config=root / "sft.json",
                                     seed=sft_seed))
    if rc != 0:
        raise SystemExit(f"SFT failed (exit {rc})")
    curve = [json.loads(x) for x in (sft / "sft_curve.jsonl").read_text().splitlines()]
    (root / "sft_done.json").write_text(json.dumps({"curve": curve, "seconds": time.perf_counter() - t0}))
    return dagger_stage(args, root, sft_seed, {
        "tasks_file": tasks_file, "sft": sft, "sft_curve": curve, "sft_s": time.perf_counter() - t0,
        "tasks": json.loads((root / "tasks_summary.json").read_text())["written"]})


def add_copy_head(init: Path, dest: Path, seed: int, min_distance: int = 1, successor_keys: bool = False,
                  context_only: bool = False) -> Path:
    """``--copy-head``: ``init`` (pretrained without one, or a random init) with a fresh copy head
    (``agent.model.copy_head``) saved to ``dest``, which SFT starts from. Departure from training the
    head from the first pretraining step: the head is added after pretraining, so one pretrained init
    serves runs with and without it (its init leaves the LM head at least half the mass)."""
    import torch

    from agent.model.checkpoint import load_checkpoint, load_config, load_profile, save_checkpoint
    from agent.model.copy_head import twin_ids

    if (dest / "model.safetensors").exists():
        held = load_config(dest)
        for key, want in (("copy_successor_keys", successor_keys), ("copy_context_only", context_only)):
            if getattr(held, key) != want:
                raise SystemExit(f"{dest} holds a copy head with {key}={not want}; remove it or use another "
                                 "--work-dir")
        return dest
    model, tok = load_checkpoint(init)
    if model.cfg.copy_head:
        return init
    torch.manual_seed(seed)
    save_checkpoint(dest, model.with_copy_head(twin_ids(tok), min_distance, successor_keys=successor_keys,
                                               context_only=context_only), tok,
                    step=0, profile=load_profile(init))
    return dest


START_FILES = ("config.json", "meta.json", "model.safetensors", "tokenizer.json")


def _sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def save_start(args: argparse.Namespace, root: Path, checkpoint: Path, dest: Path) -> None:
    """``--save-start DEST``: the start ``checkpoint`` (after SFT, or after the DAgger rounds when
    there were any: ``dagger_done.json`` comes along), its SFT curve and the
    recipe that rebuilds its task set (``start.json``: sizes, data seed, the task file's sha256) and
    the pretraining log when there was one, without the 2 MB task file or the optimizer state: ~9 MB for ``mini``."""
    from agent.model.checkpoint import load_config

    dest.mkdir(parents=True, exist_ok=True)
    (dest / "sft").mkdir(exist_ok=True)
    for f in START_FILES:
        shutil.copy(checkpoint / f, dest / "sft" / f)
    shutil.copy(root / "sft_done.json", dest / "sft_done.json")
    shutil.copy(root / "tasks_summary.json", dest / "tasks_summary.json")
    (dest / "start.json").write_text(json.dumps({
        "n_train": args.n_train, "n_heldout": args.n_heldout, "n_validation": args.n_validation,
        "data_seed": args.data_seed, "families": FAMILIES,
        "preset": args.preset, "copy_head": args.copy_head, "tasks_sha256": _sha256(root / "tasks.jsonl"),
        "copy_successor_keys": load_config(checkpoint).copy_successor_keys,
        "copy_context_only": load_config(checkpoint).copy_context_only,
        "dagger_rounds": args.dagger_rounds, "sft_shell_share": args.sft_shell_share,
        "sft_narration": args.sft_narration, "sft_exit_weight": args.sft_exit_weight,
        "sft_narration_bare": args.sft_narration_bare,
        "pretrain_sources": list(getattr(args, "pretrain_sources", ["stdlib", "site-packages"])),
        # the pretraining corpus (agent.model.corpus: the stdlib and the installed packages' sources, so
        # another environment's package versions give another corpus under the same seeds); None when
        # the start was not pretrained
        "pretrain_corpus": pretrain_corpus(root)}, indent=2) + "\n")
    if (root / "dagger_done.json").exists():
        shutil.copy(root / "dagger_done.json", dest / "dagger_done.json")
    if (root / "pretrain.log").exists():  # so a rebuilt start can be compared step by step (docs/rl/runs.md, 36th)
        shutil.copy(root / "pretrain.log", dest / "pretrain.log")


def pretrain_corpus(root: Path) -> str | None:
    """The fingerprint of the corpus ``root/init`` was pretrained on (``Corpus.fingerprint``, kept in
    the checkpoint's meta by ``agent.model.train``), or None (no pretrained init there)."""
    from agent.model.checkpoint import load_meta

    return load_meta(root / "init")["extra"].get("corpus") if (root / "init").is_dir() else None


def adopt_start(args: argparse.Namespace, start: Path, root: Path) -> None:
    """``--start DIR`` (a ``--save-start`` directory): rebuild its task set in ``root`` from the
    recorded recipe and refuse a task file that differs from the one the start was trained on
    (its sha256), then use its weights as ``root/sft``: GRPO runs without pretraining or SFT."""
    import asyncio

    from rl.tasks.build import build_task_set
    from tools.sandbox import make_sandbox

    if not (start / "start.json").is_file() or not (start / "sft" / "model.safetensors").is_file():
        raise SystemExit(f"--start {start}: not a --save-start directory (it needs start.json and sft/)")
    recipe = json.loads((start / "start.json").read_text())
    # starts saved before these keys
    defaults = {"copy_head": False, "sft_narration": 0, "sft_exit_weight": 1.0, "sft_narration_bare": False,
                "n_validation": 0}
    for key in ("n_train", "n_heldout", "data_seed", "preset", *defaults):
        if getattr(args, key) != recipe.get(key, defaults.get(key)):
            built = recipe.get(key, defaults.get(key))
            raise SystemExit(f"--start {start}: it was built with {key}={built!r}, this run has "
                             f"{getattr(args, key)!r} (pass the same value)")
    tasks_file = root / "tasks.jsonl"
    if not tasks_file.exists():
        asyncio.run(build_task_set(recipe["families"], recipe["n_train"], recipe["n_heldout"], recipe["data_seed"],
                                   tasks_file, sandbox=make_sandbox(), n_validation=recipe.get("n_validation", 0)))
    if _sha256(tasks_file) != recipe["tasks_sha256"]:
        raise SystemExit(f"--start {start}: the rebuilt task set {tasks_file} differs from the one this start "
                         "was trained on (sha256); the task families changed since")
    shutil.copytree(start / "sft", root / "sft", dirs_exist_ok=True)
    for f in ("sft_done.json", "tasks_summary.json"):
        shutil.copy(start / f, root / f)
    if (start / "dagger_done.json").exists():  # the weights are the DAgger rounds' (save_start)
        shutil.copy(start / "dagger_done.json", root / "dagger_done.json")


def dagger_stage(args: argparse.Namespace, root: Path, sft_seed: int, start: dict[str, Any]) -> dict[str, Any]:
    """``--dagger-rounds`` rounds of DAgger relabelling (rl.train.dagger) after SFT, through
    ``flywheel rl sft`` with ``sft.max_steps: 0`` (no further demonstration-only SFT): the start
    the seeds' GRPO runs from becomes ``ROOT/dagger``. Resumable like SFT (``dagger_done.json``)."""
    from rl.train.cli import _cmd_sft

    out = root / "dagger"
    done_file = root / "dagger_done.json"
    if not args.dagger_rounds:
        # an adopted --start whose weights came out of DAgger rounds: report them with it
        adopted = getattr(args, "start", None) is not None and done_file.exists()
        return start | ({"dagger": json.loads(done_file.read_text())} if adopted else {})
    if not done_file.exists():
        t0 = time.perf_counter()
        (root / "dagger.json").write_text(json.dumps({
            "sft": {"lr": args.sft_lr, "batch": 4, "max_epochs": 1000, "max_steps": 0, "eval_every": 50,
                    "patience": args.sft_patience, "demos_per_task": 1, "renamings": args.sft_renamings,
                    "edit_context": args.sft_edit_context, "copy_weight": args.sft_copy_weight,
                    "exit_weight": args.sft_exit_weight,
                    "shell_share": args.sft_shell_share, "narration": args.sft_narration,
                    "narration_quotes": not args.sft_narration_bare, "dagger_rounds": args.dagger_rounds,
                    "dagger_tasks": args.dagger_tasks, "dagger_heldout_tasks": 64,
                    "dagger_max_steps": args.dagger_steps},
            "limits": {"max_model_calls": args.max_model_calls,
                       "max_output_tokens": args.max_model_calls * args.max_tokens, "max_wall_s": args.max_wall_s},
            "rollout": {"max_tokens_per_call": args.max_tokens}}))
        rc = _cmd_sft(argparse.Namespace(tasks=start["tasks_file"], init=start["sft"], out=out,
                                         config=root / "dagger.json", seed=sft_seed))
        if rc != 0:
            raise SystemExit(f"DAgger failed (exit {rc})")
        rounds = [json.loads(x) for x in (out / "dagger.jsonl").read_text().splitlines()]
        curve = [json.loads(x) for x in (out / "sft_curve.jsonl").read_text().splitlines()]
        done_file.write_text(json.dumps({"rounds": rounds, "curve": curve, "seconds": time.perf_counter() - t0}))
    done = json.loads(done_file.read_text())
    return start | {"sft": out, "dagger": done}


def grpo_config(seed: int, args: argparse.Namespace, start: dict[str, Any], root: Path, name: str) -> RunConfig:
    """The GRPO run config of one seed: every GRPO, reward, limit and rollout flag of ``args``,
    the start's weights and task set, the copy head's options read from the start checkpoint."""
    from agent.model.checkpoint import load_config
    from rl.config import validate_run_config

    sft_cfg = load_config(start["sft"])  # the head's options are the start checkpoint's
    return validate_run_config({
        "name": f"{name}-seed{seed}", "seed": seed, "out_dir": str(root / f"run{seed}"),
        "tasks": str(start["tasks_file"]), "iterations": args.iterations,
        "tasks_per_iteration": args.tasks_per_iteration, "lr": args.lr,
        "model": {"preset": args.preset, "init": str(start["sft"]), "copy_head": args.copy_head,
                  "copy_min_distance": sft_cfg.copy_min_distance,
                  "copy_successor_keys": sft_cfg.copy_successor_keys,
                  "copy_context_only": sft_cfg.copy_context_only},
        "grpo": {"group_size": args.group, "norm_tokens": 256, "micro_batch": 4, "minibatches": args.minibatches,
                 "epochs": args.epochs, "dynamic_sampling": args.dynamic_sampling, "max_draws": args.max_draws, "kl_coef": args.kl_coef,
                 "kl_estimator": args.kl_estimator, "routing_replay": args.routing_replay,
                 "neg_adv_scale": args.neg_adv_scale, "lr_warmup_steps": args.lr_warmup_steps,
                 "no_reinforce_malformed": args.no_reinforce_malformed,
                 "malformed_call_adv": args.malformed_call_adv, "length_coef": args.length_coef,
                 "length_scope": args.length_scope, "replay_tasks": args.replay_tasks,
                 "replay_limit": args.replay_limit},
        "limits": {"max_model_calls": args.max_model_calls,
                   "max_output_tokens": args.max_model_calls * args.max_tokens, "max_wall_s": args.max_wall_s},
        "rollout": {"workers": 1, "max_tokens_per_call": args.max_tokens, "temperature": args.temperature},
        "reward": {"effort_per_call": args.effort_per_call},
        "eval": {"every": args.eval_every, "k": args.k, "temperature": args.temperature},
    })


def run_seed(seed: int, args: argparse.Namespace, start: dict[str, Any], root: Path, name: str) -> dict[str, Any]:
    from rl.rollout.driver import train
    from rl.rollout.log import MemoryRolloutLog

    t0 = time.perf_counter()
    cfg = grpo_config(seed, args, start, root, name)
    train(cfg, log=MemoryRolloutLog(),
          progress=lambda r: print(f"seed {seed} iteration {r['iteration']}: "
                                   + " ".join(f"{k}={r[k]:.3f}" for k in ("success_rate", "mean_reward",
                                                                         "heldout_pass_at_1") if k in r),
                                   flush=True))
    return seed_result(seed, root / f"run{seed}", name) | {"seconds_rl_total": time.perf_counter() - t0}


def _by_family(records: list[dict[str, Any]], prefix: str) -> list[dict[str, Any]]:
    """At each held-out evaluation, the ``prefix<family>`` keys of its record by family name."""
    return [{"iteration": r["iteration"]} | {k.removeprefix(prefix): v for k, v in r.items() if k.startswith(prefix)}
            for r in records if "heldout_pass_at_1" in r]


def seed_result(seed: int, run: Path, name: str) -> dict[str, Any]:
    """One finished (or stopped) seed's result from its run directory; copies its metrics and
    curves into docs/rl/. Used after training and by ``--report-only``."""
    from rl.behaviour import MALFORMED_KINDS

    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    for src in ("metrics.jsonl", "curves.png"):
        shutil.copy(run / src, DOCS / f"{name}_seed{seed}_{src}")
    curve = [curve_point(r) for r in records if "heldout_pass_at_1" in r]
    trained = [r for r in records if r["iteration"] > 0]
    return {"seed": seed, "sft": curve[0], "rl": curve[-1], "curve": curve, "iterations_done": len(trained),
            "iterations_stepped": sum(bool(r.get("stepped")) for r in trained),
            # held-out pass@1 per task family at each evaluation (absent in runs before it)
            "heldout_pass_at_1_by_family": _by_family(records, "heldout_pass_at_1_"),
            # held-out tokens per solved task per family, for families with a solution at that evaluation
            # (absent in runs before it): separates "longer solutions" from "solutions of another family"
            "heldout_tokens_per_solved_by_family": _by_family(records, "heldout_tokens_per_solved_"),
            # held-out solved rollouts that changed files only through run_command (absent in runs before it)
            "heldout_solved_by_command_share": [{"iteration": r["iteration"],
                                                 "share": r.get("heldout_solved_by_command_share")}
                                                for r in records if "heldout_pass_at_1" in r],
            "train_success_rate": [r.get("success_rate") for r in trained],
            "train_mean_reward": [r.get("mean_reward") for r in trained],
            "train_malformed_call_rate": [r.get("malformed_call_rate") for r in trained],
            # malformed calls per rollout by kind (rl.behaviour.MALFORMED_KINDS; absent in runs before it)
            "train_malformed_by_kind": {k: [r.get(f"rollout_malformed_{k}") for r in trained]
                                        for k in MALFORMED_KINDS},
            "train_groups_success_varied": [r.get("groups_success_varied") for r in trained],
            "train_draws": [r.get("draws") for r in trained],
            "seconds": {"per_iteration": statistics.fmean(r.get("time_rollouts_s", 0) + r.get("time_training_s", 0)
                                                          for r in trained) if trained else 0.0,
                        "heldout_eval": sum(r.get("time_heldout_eval_s", 0.0) for r in records)}}


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


def bars(summary: dict[str, dict[str, dict[str, float]]]) -> dict[str, Any]:
    """The issue's bars, from the means over seeds (each with the two numbers it compares)."""
    sft, rl = summary["sft"], summary["rl"]

    def m(d: dict[str, dict[str, float]], k: str) -> float:
        return d[k]["mean"]

    tok_ratio = m(sft, "tokens_per_solved") / m(rl, "tokens_per_solved") if m(rl, "tokens_per_solved") else float("nan")
    return {
        "pass_at_1_gain_points": {"value": 100 * (m(rl, "pass_at_1") - m(sft, "pass_at_1")), "bar": 25.0,
                                  "met": 100 * (m(rl, "pass_at_1") - m(sft, "pass_at_1")) >= 25.0},
        "tokens_per_solved_ratio": {"value": tok_ratio, "bar": 2.0, "met": tok_ratio >= 2.0},
        "parallel_share_up": {"sft": m(sft, "parallel_call_share"), "rl": m(rl, "parallel_call_share"),
                              "met": m(rl, "parallel_call_share") > m(sft, "parallel_call_share")},
        "blind_edit_rate_down": {"sft": m(sft, "blind_edit_rate"), "rl": m(rl, "blind_edit_rate"),
                                 "met": m(rl, "blind_edit_rate") < m(sft, "blind_edit_rate")},
    }


# the sizes of a full run and of --quick, where a flag leaves them unset
FULL: dict[str, Any] = {"seeds": [0, 1, 2], "preset": "mini", "vocab": 2048, "n_train": 600, "n_heldout": 32,
                        "iterations": 30, "eval_every": 10, "tasks_per_iteration": 4, "group": 8, "k": 4, "sft_steps": 1500,
        "pretrain_steps": 1500, "sft_renamings": 8,
        "sft_lr": 2e-3, "max_model_calls": 6, "max_tokens": 192, "max_wall_s": 900.0, "lr": 5e-4, "minibatches": 4}
QUICK: dict[str, Any] = FULL | {"seeds": [0], "preset": "tiny", "n_train": 32, "n_heldout": 8, "iterations": 4, "eval_every": 2,
                "tasks_per_iteration": 2, "group": 4, "k": 2, "sft_steps": 60, "sft_renamings": 1, "sft_lr": 3e-3, "pretrain_steps": 0,
                "max_model_calls": 4, "max_tokens": 96, "max_wall_s": 120.0, "lr": 1e-3, "minibatches": 1}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, with the sizing defaults (full or ``--quick``) filled in where a flag is unset."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1 seed, tiny preset, a few iterations (minutes)")
    ap.add_argument("--seeds", type=int, nargs="+")
    ap.add_argument("--preset")
    ap.add_argument("--n-train", type=int)
    ap.add_argument("--n-heldout", type=int)
    ap.add_argument("--n-validation", type=int, default=0,
                    help="validation tasks in the task set (never trained on; benchmarks/rl_select_start.py "
                    "chooses among starts on them; default 0)")
    ap.add_argument("--iterations", type=int)
    ap.add_argument("--eval-every", type=int)
    ap.add_argument("--sft-steps", type=int)
    ap.add_argument("--k", type=int, help="held-out samples per task (pass@k)")
    ap.add_argument("--tasks-per-iteration", type=int, help="GRPO groups per update (tasks drawn per draw)")
    ap.add_argument("--group", type=int, help="GRPO group size G (rollouts per task)")
    ap.add_argument("--lr", type=float, help="GRPO learning rate")
    ap.add_argument("--minibatches", type=int, help="GRPO optimizer steps per iteration")
    ap.add_argument("--epochs", type=int, default=1,
                    help="grpo.epochs: passes over each iteration's rollouts, --minibatches steps each (default 1)")
    ap.add_argument("--max-model-calls", type=int, help="limits.max_model_calls per rollout (default 6)")
    ap.add_argument("--max-tokens", type=int, help="rollout.max_tokens_per_call (default 192)")
    ap.add_argument("--max-wall-s", type=float,
                    help="limits.max_wall_s per rollout (default 900: high enough that the model-call limit, "
                         "the policy's, binds; a training draw runs 64 rollouts on one shared CPU engine, and "
                         "at the old 120 s most were cut by the clock, i.e. by machine load)")
    ap.add_argument("--dynamic-sampling", choices=["off", "success"], default="off",
                    help="grpo.dynamic_sampling (DAPO): train only on groups whose success varies, drawing more "
                         "tasks (at most --max-draws draws) until --tasks-per-iteration such groups")
    ap.add_argument("--max-draws", type=int, default=4, help="grpo.max_draws")
    ap.add_argument("--replay-tasks", type=int, default=0,
                    help="grpo.replay_tasks (rl.train.replay): up to this many of each draw's tasks are last "
                         "iteration's success-varied tasks, drawn again (0: off)")
    ap.add_argument("--replay-limit", type=int, default=2, help="grpo.replay_limit: replays in a row per task")
    ap.add_argument("--kl-coef", type=float, default=0.0,
                    help="grpo.kl_coef: k3 KL to the start's policy (default 0: none, as DAPO/Dr. GRPO)")
    ap.add_argument("--kl-estimator", choices=("k3", "k2"), default="k3",
                    help="grpo.kl_estimator: the KL term's per-token estimator (default k3; k2: 0.5 * log-ratio^2, "
                         "whose gradient is linear in how far a token fell below the start)")
    ap.add_argument("--routing-replay", action="store_true",
                    help="grpo.routing_replay: train with the experts the sampler chose (recorded per token), so "
                         "no token's experts switch inside an update")
    ap.add_argument("--lr-warmup-steps", type=int, default=0,
                    help="grpo.lr_warmup_steps: linear warmup over the first N optimizer steps (default 0: none)")
    ap.add_argument("--neg-adv-scale", type=float, default=1.0,
                    help="grpo.neg_adv_scale: multiply negative advantages by this (default 1: the papers; "
                         "0: only better-than-baseline rollouts are trained on)")
    ap.add_argument("--no-reinforce-malformed", action="store_true",
                    help="grpo.no_reinforce_malformed: leave model calls that made a malformed tool call out of "
                         "positive-advantage rollouts' loss (default off: the papers)")
    ap.add_argument("--malformed-call-adv", type=float, default=0.0,
                    help="grpo.malformed_call_adv: > 0 gives a malformed call's tokens the advantage min(A, -this) "
                         "in every trained rollout (per-call credit; default 0: off)")
    ap.add_argument("--length-coef", type=float, default=0.0,
                    help="grpo.length_coef: Kimi k1.5's group-relative length reward times this (default 0: off; "
                         "at most 0.2)")
    ap.add_argument("--effort-per-call", type=float, default=0.01,
                    help="reward.effort_per_call: taken from a solved rollout's reward per model call beyond the "
                         "first, at most 0.2 in all (rl.reward; default 0.01)")
    ap.add_argument("--length-scope", choices=("group", "solved"), default="group",
                    help="grpo.length_scope: whose lengths rank a solved rollout — 'group' (Kimi: every rollout of "
                         "the group) or 'solved' (the group's solutions only; failures keep Kimi's term)")
    ap.add_argument("--temperature", type=float, default=1.0,
                    help="sampling temperature of the training rollouts AND of the held-out evaluations (the start "
                         "and every later one, so the comparison is at one temperature); the trainer optimises "
                         "softmax(logits / T) (default 1)")
    ap.add_argument("--copy-head", action="store_true",
                    help="give the policy a copy head (agent.model.copy_head) before SFT: copying a path or a line "
                         "from the context becomes one attention lookup")
    ap.add_argument("--copy-min-distance", type=int, default=8,
                    help="with --copy-head: the pointer's minimum distance (ModelConfig.copy_min_distance; "
                         "1 lets it copy its own last copy, which loops)")
    ap.add_argument("--copy-successor-keys", action="store_true",
                    help="with --copy-head: every pointer entry's score also sees the token it would emit "
                         "(ModelConfig.copy_successor_keys); a start built with it keeps it (its checkpoint config)")
    ap.add_argument("--copy-context-only", action="store_true",
                    help="with --copy-head: the pointer may not copy from the model output it is writing "
                         "(ModelConfig.copy_context_only); a start built with it keeps it (its checkpoint config)")
    ap.add_argument("--sft-per-seed", action="store_true", help="a fresh SFT per seed (default: one, shared)")
    ap.add_argument("--pretrain-steps", type=int, help="pretrain on code this many steps before SFT (0: random init)")
    ap.add_argument("--copy-drill-steps", type=int, default=0,
                    help="train on copy drills this many steps between pretraining and SFT (agent.model.copy_drills)")
    ap.add_argument("--sft-renamings", type=int,
                    help="renamed copies of each SFT training demonstration (rl.train.rename; 0: none)")
    ap.add_argument("--sft-edit-context", choices=["minimal", "hunk"], default="minimal",
                    help="demonstrations' edit_file search text: changed lines + unique context, or whole hunks")
    ap.add_argument("--sft-patience", type=int, default=10,
                    help="SFT evaluations (every 50 steps) without a new best before stopping; the copying "
                         "plateau lasts ~1,000 steps (docs/rl/runs.md, sixth run), so 4 stopped inside it")
    ap.add_argument("--sft-copy-weight", type=float, default=1.0, help="sft.copy_weight (rl.train.copy_tokens)")
    ap.add_argument("--sft-exit-weight", type=float, default=1.0,
                    help="sft.exit_weight: weight of the token after a copied span (rl.train.copy_tokens.exit_flags)")
    ap.add_argument("--sft-shell-share", type=float, default=0.0,
                    help="sft.shell_share: the share of rename demonstrations done with one sed command "
                         "(rl.train.demos, the shell style) instead of one edit_file per file")
    ap.add_argument("--sft-narration", type=int, default=0,
                    help="sft.narration: at most this many sentences of narration before each demonstrated "
                         "model call (rl.train.demos), the waste RL can learn to drop")
    ap.add_argument("--sft-narration-bare", action="store_true",
                    help="sft.narration_quotes: false: the narration names identifiers bare, not in backticks "
                         "(a name copied from the request then ends before its closing backtick)")
    ap.add_argument("--dagger-rounds", type=int, default=0,
                    help="DAgger rounds after SFT: the SFT model's own rollouts relabelled by the scripted solver")
    ap.add_argument("--dagger-tasks", type=int, default=400, help="SFT-train tasks per DAgger round")
    ap.add_argument("--dagger-steps", type=int, default=800, help="SFT steps per DAgger round (at most)")
    ap.add_argument("--pretrain-mb", type=int, default=16, help="code corpus size for pretraining (MiB)")
    ap.add_argument("--pretrain-sources", nargs="+", choices=["stdlib", "site-packages"],
                    default=["stdlib", "site-packages"],
                    help="code the pretraining corpus is drawn from; stdlib alone makes the start independent of "
                         "the installed packages' versions (agent.model.corpus.code_roots)")
    ap.add_argument("--data-seed", type=int, default=0, help="the task set's seed (fixed across RL seeds)")
    ap.add_argument("--work-dir", type=Path, help="keep the task set, checkpoints and runs here (default: a temp dir)")
    ap.add_argument("--name", help="result name (default rl_learning or rl_learning_quick)")
    ap.add_argument("--save-start", type=Path, metavar="DIR",
                    help="after SFT, keep the start (weights, SFT curve, task-set recipe; ~9 MB for mini) in DIR")
    ap.add_argument("--start", type=Path, metavar="DIR",
                    help="a --save-start directory: rebuild its task set (checked by sha256) and run GRPO from it")
    ap.add_argument("--start-only", action="store_true",
                    help="build the start, then stop (no GRPO, no report); needs --save-start DIR or --work-dir DIR to keep it")
    ap.add_argument("--report-only", action="store_true",
                    help="train nothing: report the seeds whose runs exist in --work-dir (a stopped run)")
    args = ap.parse_args(argv)
    sizing = QUICK if args.quick else FULL
    for k, v in sizing.items():
        if getattr(args, k, None) is None:
            setattr(args, k, v)
    return args


def main() -> None:
    args = parse_args()
    sizing = QUICK if args.quick else FULL
    name = args.name or ("rl_learning_quick" if args.quick else "rl_learning")
    if args.start_only and args.save_start is None and args.work_dir is None:
        raise SystemExit("--start-only keeps nothing without --save-start DIR or --work-dir DIR")
    if args.start_only and (args.report_only or args.start is not None):
        raise SystemExit("--start-only builds a start: not with --report-only or --start")
    DOCS.mkdir(parents=True, exist_ok=True)
    import ray

    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=200 * 1024 * 1024, log_to_driver=False)
    tmp = args.work_dir or Path(tempfile.mkdtemp(prefix="rl-learning-"))
    if args.report_only and args.work_dir is None:
        raise SystemExit("--report-only needs --work-dir")
    seeds: list[dict[str, Any]] = []
    starts: dict[int, dict[str, Any]] = {}
    try:
        for s in args.seeds:
            key = s if args.sft_per_seed else args.seeds[0]
            if args.report_only:
                done = tmp / f"start{key}" / "sft_done.json"
                if not (tmp / f"run{s}" / "metrics.jsonl").exists() or not done.exists():
                    continue
                d = json.loads(done.read_text())
                dagger = tmp / f"start{key}" / "dagger_done.json"
                starts.setdefault(key, {"tasks": json.loads((tmp / f"start{key}" / "tasks_summary.json").read_text())
                                        ["written"], "sft_s": d["seconds"], "sft_curve": d["curve"]}
                                  | ({"dagger": json.loads(dagger.read_text())} if dagger.exists() else {}))
                seeds.append(seed_result(s, tmp / f"run{s}", name) | {"sft_from": key})
                continue
            if key not in starts:
                starts[key] = build_start(args, tmp / f"start{key}", key)
                if args.save_start is not None:
                    save_start(args, tmp / f"start{key}", starts[key]["sft"], args.save_start)
                if (starts[key]["sft"] / "sft_curve.png").exists():  # not kept by --save-start
                    shutil.copy(starts[key]["sft"] / "sft_curve.png", DOCS / f"{name}_sft{key}_curve.png")
            if args.start_only:
                continue
            seeds.append(run_seed(s, args, starts[key], tmp, name) | {"sft_from": key})
            report(args, sizing, name, seeds, starts)  # after every seed: a stopped run keeps what it measured
    finally:
        ray.shutdown()
        if args.work_dir is None:
            shutil.rmtree(tmp, ignore_errors=True)
    if args.start_only:
        print(f"start built in {tmp}" + (f", saved to {args.save_start}" if args.save_start else ""), flush=True)
        return
    if not seeds:
        raise SystemExit("no finished seed to report")
    report(args, sizing, name, seeds, starts)


def report(args: argparse.Namespace, sizing: dict[str, Any], name: str, seeds: list[dict[str, Any]],
           starts: dict[int, dict[str, Any]]) -> None:
    plot(seeds, DOCS / f"{name}.png", f"{name}: held-out split, SFT start (iteration 0) and during GRPO")
    summary = {when: {key: _spread(seeds, when, key) for key in CURVE_KEYS} for when in ("sft", "rl")}
    sft_info = {k: {"tasks": v["tasks"], "seconds": v["sft_s"], "curve": v["sft_curve"]}
                | ({"dagger": v["dagger"]} if "dagger" in v else {}) for k, v in starts.items()}
    result = {"config": {k: getattr(args, k) for k in sizing} | {"sft_per_seed": args.sft_per_seed,
                                                                 "data_seed": args.data_seed,
                                                                 "copy_drill_steps": args.copy_drill_steps,
                                                                 "sft_edit_context": args.sft_edit_context,
                                                                 "sft_patience": args.sft_patience,
                                                                 "sft_copy_weight": args.sft_copy_weight,
                                                                 "sft_shell_share": args.sft_shell_share,
                                                                 "sft_narration": args.sft_narration,
                                                                 "sft_narration_bare": args.sft_narration_bare,
                                                                 "sft_exit_weight": args.sft_exit_weight,
                                                                 "dagger_rounds": args.dagger_rounds,
                                                                 "dagger_tasks": args.dagger_tasks,
                                                                 "dagger_steps": args.dagger_steps,
                                                                 "copy_head": args.copy_head,
                                                                 "pretrain_sources": args.pretrain_sources,
                                                                 "copy_min_distance": args.copy_min_distance,
                                                                 "copy_successor_keys": args.copy_successor_keys,
                                                                 "copy_context_only": args.copy_context_only,
                                                                 "dynamic_sampling": args.dynamic_sampling,
                                                                 "max_draws": args.max_draws,
                                                                 "kl_coef": args.kl_coef,
                                                                 "kl_estimator": args.kl_estimator, "routing_replay": args.routing_replay,
                                                                 "epochs": args.epochs,
                                                                 "neg_adv_scale": args.neg_adv_scale,
                                                                 "lr_warmup_steps": args.lr_warmup_steps,
                                                                 "no_reinforce_malformed":
                                                                     args.no_reinforce_malformed,
                                                                 "malformed_call_adv": args.malformed_call_adv,
                                                                 "length_coef": args.length_coef,
                                                                 "length_scope": args.length_scope,
                                                                 "effort_per_call": args.effort_per_call,
                                                                 "replay_tasks": args.replay_tasks,
                                                                 "replay_limit": args.replay_limit,
                                                                 "temperature": args.temperature},
              # --start: the recipe the adopted start was built with (its DAgger rounds, shell share, ...)
              "start_recipe": json.loads((args.start / "start.json").read_text())
              if getattr(args, "start", None) is not None and (args.start / "start.json").exists() else None,
              "seeds_done": [s["seed"] for s in seeds], "seeds_planned": args.seeds,
              "summary": summary, "bars": bars(summary), "sft": sft_info, "seeds": seeds}
    (DOCS / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    write_result(name, result)


if __name__ == "__main__":
    main()
