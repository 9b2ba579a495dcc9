"""``flywheel rl sft``, ``flywheel rl train --config FILE`` and ``flywheel rl eval``.

Registered by ``backend/rl_cli.py`` (the entry point); this module imports only argparse at
import time, the handlers import torch and the rest.

* ``rl sft`` — demonstrations of the task set's TRAIN split (every style of
  :mod:`rl.train.demos`, blind edits failing on every other task), recorded through the
  real runtime, then SFT from ``--init`` with held-out early stopping; writes a serving
  checkpoint, ``sft_curve.jsonl`` and ``sft_curve.png``.
* ``rl train`` — the GRPO loop (:mod:`rl.train.loop`) over ``rl.rollout``'s Ray source.
* ``rl eval`` — pass@1/pass@k over a split through the same rollout source.

``rl train`` and ``rl eval`` run :mod:`rl.rollout.driver`. Every rollout is persisted
through the :class:`rl.rollout.log.RolloutLog` that ``make_log`` (given by the entry point,
``backend/rl_cli.py``: rl/ may not import backend/) opens. Bad input (a config with unknown
keys, a task file with a bad field, a checkpoint of another architecture) exits 2 with a
message naming it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
from pathlib import Path
from collections.abc import Callable
from typing import Any

__all__ = ["add_commands"]


def add_commands(sub: argparse._SubParsersAction, *, make_log: Callable[[], Any] | None = None) -> None:
    """Add ``sft``/``train``/``eval``; ``make_log()`` opens the RolloutLog train/eval persist to
    (None: an in-memory log, with a warning that rollouts are not kept)."""
    s = sub.add_parser("sft", help="SFT warm start on scripted demonstrations of the training tasks")
    s.add_argument("--tasks", type=Path, required=True, help="task set (JSONL from `flywheel rl tasks build`)")
    s.add_argument("--init", type=Path, required=True, help="checkpoint to start from (e.g. `flywheel model train`)")
    s.add_argument("--out", type=Path, required=True, help="checkpoint directory to write")
    s.add_argument("--config", type=Path, help="run config whose `sft:` section sets the training (optional)")
    s.add_argument("--seed", type=int, default=0)
    s.set_defaults(func=_cmd_sft)
    t = sub.add_parser("train", help="GRPO training from a run config")
    t.add_argument("--config", type=Path, required=True, help="run config (YAML, TOML or JSON)")
    t.add_argument("--no-resume", action="store_true", help="start afresh even if OUT has a checkpoint")
    t.add_argument("--address", help="join this Ray cluster (overrides rollout.address; default: ray.init() locally)")
    t.set_defaults(func=_cmd_train, make_log=make_log)
    e = sub.add_parser("eval", help="pass@1 / pass@k of a checkpoint or an OpenAI-compatible model on a split")
    e.add_argument("checkpoint", nargs="?", type=Path, help="checkpoint directory (or use --policy openai)")
    e.add_argument("--policy", choices=["local", "openai"], default="local")
    e.add_argument("--base-url")
    e.add_argument("--model")
    e.add_argument("--tasks", type=Path, required=True)
    e.add_argument("--split", choices=["train", "heldout", "validation"], default="heldout")
    e.add_argument("-k", "--k", type=int, default=4, help="samples per task (pass@k)")
    e.add_argument("--api", choices=["chat", "completions"], default="chat",
                   help="--policy openai: chat (any server) or completions (the runtime's own rendered text)")
    e.add_argument("--temperature", type=float, default=1.0)
    e.add_argument("--max-tokens", type=int, default=256, help="per model call")
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--max-tasks", type=int, metavar="N",
                   help="evaluate N tasks of the split, drawn with --seed (file order kept; default: all)")
    e.add_argument("--address", help="join this Ray cluster (default: ray.init() locally)")
    e.add_argument("--config", type=Path,
                   help="a run config whose `limits:` (model calls, output tokens, wall time) and "
                        "`rollout.sandbox_extra_ro` the evaluation uses (default: the config defaults)")
    e.set_defaults(func=_cmd_eval, make_log=make_log)


def _fail(cmd: str, msg: str) -> int:
    print(f"flywheel rl {cmd}: {msg}", file=sys.stderr)
    return 2


def _print_point(p: dict[str, float]) -> None:
    copies = f" copy-token acc {p['heldout_copy_acc']:.3f}" if "heldout_copy_acc" in p else ""
    copies += f" exit acc {p['heldout_exit_acc']:.3f}" if "heldout_exit_acc" in p else ""
    print(f"step {int(p['step'])}: train {p['train_loss']:.4f} held-out {p['heldout_loss']:.4f}{copies}",
          file=sys.stderr)


def _cmd_sft(args: argparse.Namespace) -> int:
    import torch
    from tqdm import tqdm

    from agent.model.checkpoint import CheckpointError, load_checkpoint, load_profile, save_checkpoint
    from rl.config import ConfigError, SFTConfig, load_run_config
    from rl.tasks.spec import TaskFileError, load_tasks
    from rl.train.demos import record_task_demos
    from rl.train.metrics import append_metrics
    from rl.train.copy_tokens import format_token_ids, user_marker_id
    from rl.train.sft import SFTResult, train_sft
    from rl.types import Split
    from tools.sandbox import SandboxUnavailable, make_sandbox
    from tools.workspace import WorkspaceStore, remove_store

    try:
        run_cfg = load_run_config(args.config) if args.config else None
        sft_cfg = run_cfg.sft if run_cfg is not None else SFTConfig()
        tasks = [t for t in load_tasks(args.tasks) if t.split is Split.TRAIN]
        profile = load_profile(args.init)
        model, tok = load_checkpoint(args.init)
        if run_cfg is not None and run_cfg.model.copy_head and not model.cfg.copy_head:
            print(f"adding a copy head to {args.init} (model.copy_head: true)", file=sys.stderr)
            from agent.model.copy_head import twin_ids

            model = model.with_copy_head(twin_ids(tok), min_distance=run_cfg.model.copy_min_distance,
                                         successor_keys=run_cfg.model.copy_successor_keys,
                                         context_only=run_cfg.model.copy_context_only)
        sandbox = make_sandbox()
    except (ConfigError, TaskFileError, CheckpointError, SandboxUnavailable, OSError, ValueError) as exc:
        return _fail("sft", str(exc))
    if not tasks:
        return _fail("sft", f"{args.tasks} has no train-split tasks")
    # split by TASK before recording, so no task has demonstrations on both sides of early stopping
    tasks = list(tasks)
    random.Random(args.seed).shuffle(tasks)
    n_held = max(1, int(len(tasks) * sft_cfg.heldout_fraction))
    if len(tasks) - n_held < 1:
        return _fail("sft", f"{args.tasks} has {len(tasks)} train-split task(s): SFT needs at least 2")
    store_dir = args.out.parent / (args.out.name + ".workspaces")
    store = WorkspaceStore(store_dir)
    bar = tqdm(total=len(tasks), desc="recording demonstrations", unit="task", file=sys.stderr)
    try:
        sets = [record_task_demos(part, tok, profile=profile, sandbox=sandbox, store=store,
                                  max_len=model.cfg.max_seq_len, per_task=sft_cfg.demos_per_task, seed=args.seed,
                                  renamings=renamings, tight=sft_cfg.edit_context == "minimal",
                                  shell_share=sft_cfg.shell_share, narration=sft_cfg.narration,
                                  narration_quotes=sft_cfg.narration_quotes,
                                  progress=lambda: bar.update(1))
                for part, renamings in ((tasks[n_held:], sft_cfg.renamings), (tasks[:n_held], 0))]
    finally:
        bar.close()
        remove_store(store_dir)
    train_demos, held_demos = sets
    skipped = train_demos.skipped + held_demos.skipped
    if not train_demos.examples or not held_demos.examples:
        return _fail("sft", f"{len(train_demos.examples)} training and {len(held_demos.examples)} held-out "
                            f"demonstrations fit the model's context ({skipped} skipped: "
                            f"{train_demos.no_patch + held_demos.no_patch} without an editable patch, "
                            f"{train_demos.too_long + held_demos.too_long} too long)")
    examples = train_demos.examples + held_demos.examples
    digests = {"train": train_demos.digest(), "heldout": held_demos.digest()}  # what SFT trained on, comparably
    print(f"demonstrations: {len(train_demos.examples)} training, {len(held_demos.examples)} held-out; styles "
          f"{dict(sorted(train_demos.styles.items()))}; {skipped} skipped "
          f"({train_demos.too_long + held_demos.too_long} longer than the context); {train_demos.renamed} renamed copies "
          f"({train_demos.rename_refused} tasks not renamable)", file=sys.stderr)
    torch.manual_seed(args.seed)
    curve_path = args.out / "sft_curve.jsonl"
    args.out.mkdir(parents=True, exist_ok=True)
    curve_path.write_text("")
    if sft_cfg.max_steps == 0:  # a checkpoint continued by DAgger rounds only (the config checks there are some)
        res = SFTResult()
    else:
        res = train_sft(model, train_demos.examples, held_demos.examples, sft_cfg, pad_id=tok.pad_id,
                        seed=args.seed, user_id=user_marker_id(tok), format_ids=format_token_ids(tok),
                        progress=_print_point)
    for point in res.curve:
        append_metrics(curve_path, point)
    rounds: list[dict[str, float]] = []
    if sft_cfg.dagger_rounds:
        from rl.train.dagger import run_dagger

        res, rounds = run_dagger(model, tok, profile, tasks[n_held:], tasks[:n_held], train_demos.examples,
                                 held_demos.examples, run_cfg, out=args.out, seed=args.seed, first=res,
                                 curve_path=curve_path)
    from rl.train.metrics import SFT_PLOTS, plot_metrics

    curve = [json.loads(x) for x in curve_path.read_text().splitlines()]  # with the DAgger rounds', if any
    plot_metrics(curve, args.out / "sft_curve.png", x_key="step", plots=SFT_PLOTS,
                 title="SFT" + (" + DAgger" if rounds else ""))
    save_checkpoint(args.out, model, tok, step=res.steps, profile=profile,
                    extra={"sft": {"best_step": res.best_step, "best_heldout_loss": res.best_heldout_loss,
                                   "demonstrations": len(examples), "skipped": skipped,
                                   "demonstrations_sha256": digests}})
    summary = {"demonstrations": len(examples), "skipped": skipped, "demonstrations_sha256": digests,
               "too_long": train_demos.too_long + held_demos.too_long, "steps": res.steps, "best_step": res.best_step,
               "best_heldout_loss": res.best_heldout_loss, "stopped_early": res.stopped_early, "out": str(args.out)}
    if rounds:
        summary["dagger"] = rounds
    print(json.dumps(summary))
    return 0


def _open_log(args: argparse.Namespace, cmd: str) -> Callable[[], Any]:
    """A factory for the run's RolloutLog (the driver opens it once the inputs are valid)."""
    make_log = getattr(args, "make_log", None)
    if make_log is not None:
        return make_log  # type: ignore[no-any-return]

    def memory() -> Any:
        from rl.rollout.log import MemoryRolloutLog

        print(f"flywheel rl {cmd}: no session log configured: rollouts are kept in memory only", file=sys.stderr)
        return MemoryRolloutLog()

    return memory


def _bad_input() -> tuple[type[Exception], ...]:
    """What a user can fix: each names the file, key or checkpoint that is wrong."""
    from agent.model.checkpoint import CheckpointError
    from rl.config import ConfigError
    from rl.rollout.driver import DriverError
    from rl.tasks.spec import TaskFileError
    from rl.tasks.workspaces import TaskSourceError

    return (ConfigError, TaskFileError, TaskSourceError, DriverError, CheckpointError, FileNotFoundError)


def _cmd_train(args: argparse.Namespace) -> int:
    from rl.config import ConfigError, load_run_config
    from rl.rollout import driver

    try:
        cfg = load_run_config(args.config)
    except ConfigError as exc:
        return _fail("train", str(exc))
    if args.address:
        cfg = cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={"address": args.address})})
    try:
        return driver.run_training(cfg, resume=not args.no_resume, log=_open_log(args, "train"))
    except _bad_input() as exc:
        return _fail("train", str(exc))


def _cmd_eval(args: argparse.Namespace) -> int:
    if args.policy == "local" and args.checkpoint is None:
        return _fail("eval", "give a CHECKPOINT directory, or --policy openai --base-url URL --model M")
    if args.policy == "openai" and not (args.base_url and args.model):
        return _fail("eval", "--policy openai needs --base-url and --model")
    if args.k < 1:
        return _fail("eval", f"-k must be >= 1, got {args.k}")
    if args.max_tasks is not None and args.max_tasks < 1:
        return _fail("eval", f"--max-tasks must be >= 1, got {args.max_tasks}")
    from rl.rollout import driver

    try:
        return driver.run_eval(args, log=_open_log(args, "eval"))
    except _bad_input() as exc:
        return _fail("eval", str(exc))
