"""``flywheel rl ...``: the RL flywheel's subcommands.

Only ``backend/cli.py`` imports this module (it is an entry point, so it may
import ``rl``). Each subcommand is a function that adds itself to the ``rl``
subparsers; :data:`COMMANDS` lists them, so adding ``rl sft``/``rl train``/
``rl eval`` is one function and one entry. ``rl`` modules are imported inside
the handlers: ``flywheel --help`` stays fast.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable
from pathlib import Path

__all__ = ["COMMANDS", "add_parser", "open_rollout_log"]


def _add_tasks(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tasks", help="task sets: build (and validate) procedural tasks")
    tsub = p.add_subparsers(dest="rl_tasks_command", metavar="ACTION", required=True)
    b = tsub.add_parser(
        "build", help="generate a task set, validate every task, write JSONL",
        description="Generate procedural tasks for the train and held-out splits (disjoint seeds and vocabularies), "
        "validate each (its grader fails on the start and passes with the reference patch, in the sandbox), "
        "drop and count the ones that do not, and write the rest to --out atomically.",
    )
    b.add_argument("--families", default="fix_bug,rename,find_change,implement_stub",
                   help="comma-separated families (default: the four procedural ones; 'realcode' takes --sdists)")
    b.add_argument("--sdists", default="",
                   help="realcode: comma-separated NAME==VERSION[@sha256:HEX] sdists that ship their tests")
    b.add_argument("--cache-dir", type=Path, default=None,
                   help="realcode: where downloaded sdists are cached (default ~/.cache/flywheel/sdists, "
                   "where rollout workers look)")
    b.add_argument("--n-train", type=int, default=32, help="training tasks to generate (default 32)")
    b.add_argument("--n-heldout", type=int, default=16, help="held-out tasks to generate (default 16)")
    b.add_argument("--n-validation", type=int, default=0,
                   help="validation tasks (own vocabulary, never trained on: for choosing a start or a "
                   "temperature without reading the held-out split; default 0)")
    b.add_argument("--seed", type=int, default=0, help="task-set seed (default 0)")
    b.add_argument("--out", type=Path, required=True, help="JSONL file to write")
    b.add_argument("--unsafe-no-sandbox", action="store_true",
                   help="validate WITHOUT isolation if bubblewrap is missing (dangerous)")
    b.set_defaults(func=_cmd_tasks_build)


def _cmd_tasks_build(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from backend.settings import LocalSettings, SettingsError, load_settings
    from rl.tasks.build import build_task_set, plan
    from rl.tasks.grading import grader_sandbox
    from rl.tasks.realcode import REALCODE
    from rl.tasks.workspaces import default_sdist_cache
    from tools.sandbox import SandboxUnavailable

    families = [f.strip() for f in args.families.split(",") if f.strip()]
    if min(args.n_train, args.n_heldout, args.n_validation) < 0:
        print("flywheel rl tasks build: --n-train, --n-heldout and --n-validation must be >= 0", file=sys.stderr)
        return 2
    try:
        sdists = [s.strip() for s in args.sdists.split(",") if s.strip()]
        total = len(plan(families, args.n_train, args.n_heldout, args.seed, sdists=sdists,
                         n_validation=args.n_validation))
        local = load_settings(LocalSettings, unsafe_no_sandbox=args.unsafe_no_sandbox or None)
        # realcode graders run the project's pytest: the sandbox must see this interpreter (read-only)
        sandbox = grader_sandbox(project=REALCODE in families, allow_unsandboxed=local.unsafe_no_sandbox)
        cache_dir = args.cache_dir or default_sdist_cache()
    except (ValueError, SettingsError, SandboxUnavailable) as exc:
        print(f"flywheel rl tasks build: {exc}", file=sys.stderr)
        return 2
    bar = tqdm(total=total, desc="validating tasks", unit="task", file=sys.stderr)

    def progress(_task: object, why: str | None) -> None:
        bar.update(1)

    try:
        summary = asyncio.run(build_task_set(families, args.n_train, args.n_heldout, args.seed, args.out,
                                             sandbox=sandbox, progress=progress, sdists=sdists,
                                             cache_dir=cache_dir, n_validation=args.n_validation))
    finally:
        bar.close()
    written = sum(summary.written.values())
    per_split = ", ".join(f"{s} {summary.written.get(s, 0)}" for s in ("train", "heldout", "validation")
                          if s != "validation" or args.n_validation)
    print(f"wrote {written} tasks to {args.out} ({per_split}); dropped {len(summary.dropped)} that failed "
          "validation")
    for task_id, why in summary.dropped[:20]:
        print(f"  dropped {task_id}: {why[:200]}")
    print(json.dumps(summary.to_json()))
    return 0


def open_rollout_log() -> object:
    """The RolloutLog ``rl train``/``rl eval`` persist every rollout through: the production
    session log (``backend/rl_log.py``'s ``open_rollout_log()``) when this version has it,
    else ``rl.rollout.log.MemoryRolloutLog`` with a warning that rollouts are not kept."""
    try:
        from backend import rl_log
    except ModuleNotFoundError as exc:
        if exc.name != "backend.rl_log":
            raise
        rl_log = None
    opener = getattr(rl_log, "open_rollout_log", None)
    if opener is not None:
        return opener()
    from rl.rollout.log import MemoryRolloutLog

    print("flywheel rl: this version has no session log for rollouts (backend.rl_log.open_rollout_log): "
          "rollouts are kept in memory only", file=sys.stderr)
    return MemoryRolloutLog()


def _add_training(sub: argparse._SubParsersAction) -> None:
    """``rl sft``, ``rl train``, ``rl eval`` (rl/train/cli.py: argparse only at import)."""
    from rl.train.cli import add_commands

    add_commands(sub, make_log=open_rollout_log)


COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [_add_tasks, _add_training]


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``rl`` and every subcommand in :data:`COMMANDS` to ``flywheel``'s subparsers."""
    p = sub.add_parser("rl", help="the RL flywheel: task sets, training, evaluation")
    rsub = p.add_subparsers(dest="rl_command", metavar="ACTION", required=True)
    for add in COMMANDS:
        add(rsub)
