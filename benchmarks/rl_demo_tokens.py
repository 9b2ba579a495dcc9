"""How far can tokens per solved task fall? The demonstrations' own lengths, per family and style.

``rl_learning``'s bar asks RL to halve the policy-sampled tokens per solved task. A policy
that imitates its demonstrations starts near their mix; the shortest way it has ever been
shown to solve a task is what selecting among its habits alone can reach. This records
demonstrations of RL training tasks through the production runtime (``rl.train.demos``:
the scripted solutions SFT is trained on, same prompt, tools and sandbox), every style for
every task (the ``shell`` style where a task has a one-command form), and counts the
policy-sampled tokens of each with the model's tokenizer — the same count
``tokens_per_solved`` makes (``Rollout.loss_mask``: every sampled token, the end token
included).

Reported per family and style: mean sampled tokens and model calls; the SFT mix's mean
(styles drawn uniformly, then the shell style with probability ``--shell-share`` where it
exists: ``record_task_demos``'s draw) and per task the shortest style; ``ratio_mix_to_shortest``
is how many times fewer tokens per solved task a policy would spend by always using each task's
shortest demonstrated form instead of the mix, and ``ratio_mix_to_shortest_informed`` the same
without the ``blind`` style (an edit written before reading: the scripted solver knows the text it
replaces, a policy has to guess it). Not measured: forms no demonstration shows
(e.g. skipping the tests), which a policy could discover; a ``blind`` demonstration is recorded
without its deliberate failure (``fail_blind=False``).

``--narration N`` (``sft.narration``): every style is recorded twice, without narration and with
0..N sentences before each model call (``rl.train.demos.scripted_outputs``); the mix is then the
narrated one (what such a start imitates) and the shortest forms the plain ones (the floor a policy
reaches by dropping the narration *and* choosing the shortest form), so the ratios say how much room
narration adds. Narrated styles are reported as ``STYLE+narration``.

    .venv/bin/python benchmarks/rl_demo_tokens.py --tasks TASKS.jsonl --tokenizer START/init --per-family 16
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import random
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import _common  # noqa: F401  (repo on sys.path)
from _common import write_result

DEFAULT_SHELL_SHARE = 0.5  # benchmarks/rl_learning.py's recipe since the thirteenth run
UNINFORMED = frozenset({"blind"})
"""Styles whose edit is written before anything was read: the scripted solver knows the file's text,
a policy does not, so the shortest *informed* style is the reachable floor of the two reported."""


def demo_lengths(tasks: list[Any], tokenizer: Any, *, sandbox: Any, store_dir: Path,
                 narration: int = 0) -> list[dict[str, Any]]:
    """One row per (task, style, narration): sampled tokens, model calls and how the turn ended
    (narration 0 always; ``narration`` as well when it is > 0)."""
    from agent.prompt import profile_named
    from rl.tasks.workspaces import materialise
    from rl.train.demos import STYLES, demo_segments, demo_task_from_patch, record_demo, shell_edit_for, tighten
    from tools.workspace import WorkspaceStore, remove_store

    profile = profile_named("compact")
    store = WorkspaceStore(store_dir)
    rows: list[dict[str, Any]] = []
    try:
        for i, task in enumerate(tasks):
            print(f"\r{i + 1}/{len(tasks)} tasks", end="", file=sys.stderr, flush=True)
            try:
                demo_task = demo_task_from_patch(task.id, task.request, task.reference_patch,
                                                 task.grader.agent_command, extra_reads=task.grader.test_files)
            except ValueError:
                continue  # no edit_file form of the patch: record_task_demos skips it too
            demo_task = dataclasses.replace(demo_task, shell_edit=shell_edit_for(task))
            base = materialise(task, store)
            try:
                demo_task = tighten(demo_task, lambda p: base.read_bytes(p).decode())
                styles = [*STYLES, *(["shell"] if demo_task.shell_edit is not None else [])]
                for style, talk in [(st, n) for st in styles for n in sorted({0, narration})]:
                    ws = base.fork()
                    try:
                        demo = asyncio.run(record_demo(demo_task, style, ws, sandbox, profile=profile, seed=i,
                                                       narration=talk))
                    finally:
                        ws.delete()
                    segs = demo_segments(demo, tokenizer)
                    rows.append({"task": task.id, "family": task.family, "style": style, "narration": talk,
                                 "tokens": sum(len(s.token_ids) for s in segs if s.sampled),
                                 "model_calls": len(demo.outputs), "turn_end": demo.turn_end})
            finally:
                base.delete()
    finally:
        print(file=sys.stderr)
        remove_store(store_dir)
    return rows


def summarise(rows: list[dict[str, Any]], shell_share: float) -> dict[str, Any]:
    """Per family: each style's mean tokens and calls, the SFT mix's expected tokens, the mean of
    each task's shortest style, and their ratio; the same over all families (tasks weighted equally)."""
    by_task: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_task.setdefault(r["task"], []).append(r)

    def mix(task_rows: list[dict[str, Any]]) -> float:
        most = max(r.get("narration", 0) for r in task_rows)  # the narrated rows, when recorded
        task_rows = [r for r in task_rows if r.get("narration", 0) == most]
        plain = [r["tokens"] for r in task_rows if r["style"] != "shell"]
        shell = [r["tokens"] for r in task_rows if r["style"] == "shell"]
        expected = statistics.fmean(plain)
        return (1 - shell_share) * expected + shell_share * shell[0] if shell else expected

    def floor(task_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [r for r in task_rows if not r.get("narration", 0)]  # the floor: no narration

    per_task = {t: {"family": rs[0]["family"], "mix": mix(rs), "shortest": min(r["tokens"] for r in floor(rs)),
                    "shortest_style": min(floor(rs), key=lambda r: r["tokens"])["style"],
                    "shortest_informed": min(r["tokens"] for r in floor(rs) if r["style"] not in UNINFORMED)}
                for t, rs in by_task.items()}
    out: dict[str, Any] = {}
    for fam in sorted({p["family"] for p in per_task.values()}) + ["all"]:
        ts = [p for p in per_task.values() if fam in ("all", p["family"])]
        rs = [r | {"style": _label(r)} for r in rows if fam in ("all", r["family"])]
        styles = sorted({r["style"] for r in rs})
        m, s = statistics.fmean(p["mix"] for p in ts), statistics.fmean(p["shortest"] for p in ts)
        si = statistics.fmean(p["shortest_informed"] for p in ts)
        out[fam] = {"tasks": len(ts),
                    "styles": {st: {"tokens": statistics.fmean(r["tokens"] for r in rs if r["style"] == st),
                                    "model_calls": statistics.fmean(r["model_calls"] for r in rs
                                                                    if r["style"] == st),
                                    "n": sum(r["style"] == st for r in rs)} for st in styles},
                    "mix_tokens": m, "shortest_tokens": s, "ratio_mix_to_shortest": m / s,
                    "shortest_informed_tokens": si, "ratio_mix_to_shortest_informed": m / si,
                    "shortest_style_counts": {st: sum(p["shortest_style"] == st for p in ts) for st in styles}}
    return out


def _label(row: dict[str, Any]) -> str:
    return row["style"] + ("+narration" if row.get("narration", 0) else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=Path, required=True, help="a task set (flywheel rl tasks build)")
    ap.add_argument("--tokenizer", type=Path, required=True, help="a checkpoint directory with tokenizer.json")
    ap.add_argument("--per-family", type=int, default=16, help="training tasks drawn per family")
    ap.add_argument("--shell-share", type=float, default=DEFAULT_SHELL_SHARE, help="sft.shell_share of the mix")
    ap.add_argument("--narration", type=int, default=0,
                    help="sft.narration of the mix (0..N sentences before each model call); 0: none")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default="rl_demo_tokens")
    args = ap.parse_args()

    from agent.model.tokenizer import Tokenizer
    from rl.tasks.spec import load_tasks
    from rl.types import Split
    from tools.sandbox import make_sandbox

    tasks = [t for t in load_tasks(args.tasks) if t.split is Split.TRAIN]
    rng = random.Random(args.seed)
    drawn = []
    for fam in sorted({t.family for t in tasks}):
        pool = [t for t in tasks if t.family == fam]
        drawn += rng.sample(pool, min(args.per_family, len(pool)))
    if not drawn:
        raise SystemExit(f"{args.tasks} has no train-split tasks")
    tok = Tokenizer.load(args.tokenizer)
    with tempfile.TemporaryDirectory(prefix="demo-tokens-") as tmp:
        rows = demo_lengths(drawn, tok, sandbox=make_sandbox(), store_dir=Path(tmp) / "store",
                            narration=args.narration)
    if not rows:
        raise SystemExit("no task had a demonstration")
    summary = summarise(rows, args.shell_share)
    for fam, s in summary.items():
        print(f"{fam:15s} mix {s['mix_tokens']:6.1f}  shortest {s['shortest_tokens']:6.1f} "
              f"({s['ratio_mix_to_shortest']:.2f}x)  informed {s['shortest_informed_tokens']:6.1f} "
              f"({s['ratio_mix_to_shortest_informed']:.2f}x)  " + "  ".join(f"{st} {v['tokens']:.0f}"
                                                               for st, v in s["styles"].items()), file=sys.stderr)
    write_result(args.name, {"config": {"tasks": str(args.tasks), "tokenizer": str(args.tokenizer),
                                        "tasks_sha256": hashlib.sha256(args.tasks.read_bytes()).hexdigest(),
                                        "per_family": args.per_family,
                                        "shell_share": args.shell_share, "narration": args.narration,
                                        "seed": args.seed},
                             "summary": summary,
                             "turn_ends": {e: sum(r["turn_end"] == e for r in rows)
                                           for e in sorted({r["turn_end"] for r in rows})}})


if __name__ == "__main__":
    main()
