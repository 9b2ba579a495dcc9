"""Which start, at which temperature, should GRPO run from? Free-running success on the VALIDATION split.

Rebuilding one recipe gives starts that differ more than any GRPO run has changed them
(docs/rl/runs.md, fifteenth run: malformed-call rate 0.29 vs 0.42, call-limit endings 30% vs
70%, one family solved at ~8% vs ~1%), and GRPO can only reinforce what the start already does
now and then. So build a few starts of one recipe (``rl_learning.py --start-only --save-start
DIR`` with other ``--seeds``) and keep the one that solves most of the tasks GRPO will train on.

Each candidate (a ``--save-start`` directory) samples ``k`` rollouts of the same ``--max-tasks``
tasks of ``--split`` (drawn with ``--seed``) through ``rl.rollout.driver.evaluate`` — the
production runtime, the evaluation ``flywheel rl eval`` runs — with the run's limits. The held-out
split is never read: choosing a start by held-out success would be tuning on it. Candidates are
ranked by pass@1, ties by the lower malformed-call rate.

Which split: ``validation`` (the default; build the starts' task set with ``rl_learning.py
--n-validation N``) holds tasks no candidate was trained on, named from a vocabulary of their own,
so it asks what the held-out split asks — can the start copy names it never saw — without
reading it. ``train`` was the first choice and could not tell starts apart: the train tasks were
SFT's, and a start that breaks on new names still solves the names it was taught
(docs/rl/runs.md, thirty-second run: 0.130 vs 0.135 on train, 0.168 vs 0.129 held-out).

``--temperature`` takes several values: every (candidate, temperature) pair is evaluated on the
same tasks with the same sampling seeds and ranked together, so one start can be given alone to
choose the temperature its GRPO run samples (and is evaluated) at (``rl_learning.py
--temperature``). Why that is a choice at all: a small policy sampled at temperature 1 spends
many rollouts on low-probability tokens that derail a copied path; sampling sharper raises the
success GRPO's groups can reinforce — chosen here, on train tasks, never on held-out ones.

Not guaranteed: the ranking is a sample (the standard error of one candidate's pass@1 is about
sqrt(p(1-p)/(tasks*k)); the result reports it); that validation success ranks starts as held-out
success would (the validation split is a sample of other names, and small); that the start with
the highest pass@1 is the one GRPO takes furthest (docs/rl/runs.md, thirty-fourth run: of two starts of one
command and task set, the lower on validation, 0.141 against 0.223, ended higher after 3 GRPO iterations,
0.336 against 0.273 held-out — pass@1 says where a start is, not where GRPO takes it).

    .venv/bin/python benchmarks/rl_select_start.py /work/runs/startA /work/runs/startB \\
        --tasks /work/runs/wA/start0/tasks.jsonl -k 4 --name rl_select_start_validation
    .venv/bin/python benchmarks/rl_select_start.py /work/runs/start22 --temperature 1.0 0.7 0.4 \\
        --tasks /work/runs/w22/start0/tasks.jsonl --split train --max-tasks 48 -k 2 --name rl_select_start_temperature
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import tempfile
import time
from pathlib import Path
from typing import Any

import _common  # noqa: F401  (repo on sys.path)
from _common import write_result

BEHAVIOUR_KEYS = ("malformed_call_rate", "parallel_call_share", "blind_edit_rate", "tokens_per_solved",
                  "solved_by_command_share", "rollout_limit_max_steps")


class CandidateError(ValueError):
    """A candidate that is not a ``--save-start`` directory of the given task set."""


def check_candidates(candidates: list[Path], tasks: Path) -> dict[Path, dict[str, Any]]:
    """Each candidate's ``start.json`` recipe; :class:`CandidateError` naming the first candidate that
    is no ``--save-start`` directory, or was trained on another task set than ``tasks`` (sha256)."""
    sha = hashlib.sha256(tasks.read_bytes()).hexdigest()
    recipes: dict[Path, dict[str, Any]] = {}
    for c in candidates:
        if not (c / "start.json").is_file() or not (c / "sft" / "model.safetensors").is_file():
            raise CandidateError(f"{c}: not a --save-start directory (it needs start.json and sft/)")
        recipe = json.loads((c / "start.json").read_text())
        if recipe.get("tasks_sha256") != sha:
            raise CandidateError(f"{c}: trained on another task set than {tasks} (sha256 "
                                 f"{str(recipe.get('tasks_sha256'))[:12]}… vs {sha[:12]}…)")
        recipes[c] = recipe
    if len(set(recipes)) != len(candidates):
        raise CandidateError("a candidate is given twice")
    return recipes


def rank(scores: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``scores`` (each with ``pass_at_1`` and ``malformed_call_rate``) best first: higher pass@1,
    then the lower malformed-call rate (NaN last), then the order given."""
    def key(i_s: tuple[int, dict[str, Any]]) -> tuple[float, float, int]:
        i, s = i_s
        mal = s.get("malformed_call_rate", float("nan"))
        return (-s["pass_at_1"], math.inf if mal != mal else mal, i)

    return [s for _, s in sorted(enumerate(scores), key=key)]


def standard_error(p: float, n: int) -> float:
    """The binomial standard error of a rate ``p`` measured on ``n`` samples."""
    return math.sqrt(p * (1 - p) / n) if n else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("candidates", nargs="+", type=Path, help="--save-start directories of one recipe")
    ap.add_argument("--tasks", type=Path, required=True, help="the task set the candidates were trained on")
    ap.add_argument("--split", choices=["validation", "train"], default="validation",
                    help="which tasks to rank on (default validation; never the held-out split)")
    ap.add_argument("--max-tasks", type=int, default=48, help="tasks of --split to sample (drawn with --seed)")
    ap.add_argument("-k", "--k", type=int, default=2, help="rollouts per task")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--temperature", type=float, nargs="+", default=[1.0],
                    help="sampling temperature(s); several: every candidate at each, ranked together")
    ap.add_argument("--max-tokens", type=int, default=192, help="per model call (rl_learning's default)")
    ap.add_argument("--max-model-calls", type=int, default=6)
    ap.add_argument("--max-wall-s", type=float, default=900.0)
    ap.add_argument("--name", default="rl_select_start")
    args = ap.parse_args()
    if len(set(args.temperature)) != len(args.temperature) or min(args.temperature) <= 0:
        raise SystemExit("rl_select_start: --temperature values must be distinct and > 0 "
                         f"(got {args.temperature}); GRPO samples, so greedy (0) is no candidate")
    if len(args.candidates) * len(args.temperature) < 2:
        raise SystemExit("rl_select_start: give at least two candidates, or one with several --temperature values")
    try:
        recipes = check_candidates(args.candidates, args.tasks)
    except CandidateError as exc:
        raise SystemExit(f"rl_select_start: {exc}") from None

    import ray

    from rl.config import LimitsConfig
    from rl.rollout.driver import DriverError, evaluate, load_split, sample_tasks
    from rl.tasks.spec import Split
    from tools.workspace import remove_store

    try:
        tasks = sample_tasks(load_split(args.tasks, Split(args.split)), args.max_tasks, args.seed)
    except DriverError as exc:
        raise SystemExit(f"rl_select_start: {exc}") from None
    limits = LimitsConfig(max_model_calls=args.max_model_calls,
                          max_output_tokens=args.max_model_calls * args.max_tokens,
                          max_wall_s=args.max_wall_s).to_limits()
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=200 * 1024 * 1024, log_to_driver=False)
    scores: list[dict[str, Any]] = []
    try:
        for c, temperature in ((c, t) for c in args.candidates for t in args.temperature):
            t0 = time.perf_counter()
            tmp = tempfile.mkdtemp(prefix="flywheel-select-")
            try:
                res = evaluate(tasks, k=args.k, checkpoint=c / "sft", limits=limits, temperature=temperature,
                               max_tokens=args.max_tokens, store_root=Path(tmp), seed=args.seed, run_id="select")
            finally:
                remove_store(tmp)
            n = res.tasks * res.k
            sft = json.loads((c / "sft_done.json").read_text())
            scores.append({
                "candidate": str(c), "temperature": temperature,
                "pass_at_1": res.pass_at_1, "pass_at_1_se": standard_error(res.pass_at_1, n),
                f"pass_at_{res.k}": res.pass_at_k, "infra_errors": res.infra_errors,
                "per_family": {f: v["pass@1"] for f, v in res.per_family.items()},
                **{k: res.behaviour.get(k, float("nan")) for k in BEHAVIOUR_KEYS},
                "sft_best_heldout_loss": min((p["heldout_loss"] for p in sft["curve"]), default=float("nan")),
                "pretrain_corpus": recipes[c].get("pretrain_corpus"),
                "seconds": round(time.perf_counter() - t0, 1)})
            print(f"{c} at T={temperature}: pass@1 {res.pass_at_1:.3f} ± {scores[-1]['pass_at_1_se']:.3f} "
                  f"({res.tasks} {args.split} tasks × {res.k})", flush=True)
    finally:
        ray.shutdown()
    ranking = rank(scores)
    write_result(args.name, {"split": args.split, "tasks": len(tasks), "k": args.k, "seed": args.seed,
                             "temperatures": args.temperature, "max_tokens": args.max_tokens,
                             "max_model_calls": args.max_model_calls, "best": ranking[0]["candidate"],
                             "best_temperature": ranking[0]["temperature"],
                             "ranking": ranking})


if __name__ == "__main__":
    main()
