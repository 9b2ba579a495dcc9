"""Does a checkpoint know where each tool call's parameters end? Teacher-forced, on scripted demonstrations.

The eleventh RL run's most common rejected call was ``invalid call to edit_file: missing required
parameter(s): search, replace``. Two explanations predict it: the model closes an ``edit_file`` call
after its ``path`` as it closes a ``read_file`` call (a structure error), or the path itself derails
(a copy error) and the call ends the way it ends after a multi-line ``replace``. This probe tells them
apart. It records demonstrations of a split's tasks through the production runtime
(``rl.train.demos.record_task_demos``: the scripted policy, the real tools and sandbox), runs the
checkpoint over each once (teacher forcing: every position sees the demonstration's own prefix),
and at every ``</param>`` the policy wrote, reads the probability of what comes next: ``<param`` (another
parameter) or ``</tool_call>`` (the end of the call), grouped by tool, parameter and the true next
token.

    .venv/bin/python benchmarks/call_boundary_probe.py --checkpoint START/sft --tasks TASKS.jsonl

Not guaranteed: what the model does on its *own* prefixes (free-running sampling reaches states
no demonstration has; ``benchmarks/rl_pass_at_k.py --malformed-examples N`` shows those).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

import _common  # noqa: F401  (repo on sys.path)
from _common import recorded_demos, write_result


def boundary_probs(model: Any, tok: Any, examples: list[Any]) -> dict[str, list[tuple[float, float]]]:
    """``"tool/param/next"`` → per occurrence (p(</tool_call>), p(<param)) after that parameter's
    ``</param>`` (and the whitespace token after it, when the demonstration has one)."""
    import torch

    close_call, open_param, close_param = (tok.token_id(t) for t in ("</tool_call>", "<param", "</param>"))
    out: dict[str, list[tuple[float, float]]] = {}
    for segs in examples:
        ids = [i for s in segs for i in s.token_ids]
        sampled = [s.sampled for s in segs for _ in s.token_ids]
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([ids])).logits[0], -1)
        for t, i in enumerate(ids[:-2]):
            if i != close_param or not sampled[t]:
                continue
            before = tok.decode(ids[max(0, t - 80): t + 1])
            call = before[before.rfind("<tool_call"):]
            name = call.split('"')[1] if '"' in call else "?"
            param = call[call.rfind("<param"):].split('"')[1] if "<param" in call else "?"
            # the next decision is after the whitespace the format puts there (if the demonstration has it)
            t2, p_ws = t, 1.0
            if tok.decode([ids[t + 1]]).strip() == "":
                t2, p_ws = t + 1, float(logp[t, ids[t + 1]].exp())
            nxt = ids[t2 + 1]
            label = "param" if nxt == open_param else "close" if nxt == close_call else "other"
            out.setdefault(f"{name}/{param}/next={label}", []).append(
                (p_ws * float(logp[t2, close_call].exp()), p_ws * float(logp[t2, open_param].exp())))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", type=Path, required=True)
    ap.add_argument("--tasks", type=Path, required=True)
    ap.add_argument("--split", choices=["train", "heldout", "validation"], default="heldout")
    ap.add_argument("--max-tasks", type=int, default=24)
    ap.add_argument("--demos-per-task", type=int, default=2)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--name", default="call_boundary_probe")
    args = ap.parse_args()

    model, tok, demos, n_tasks = recorded_demos(args.checkpoint, args.tasks, args.split, max_tasks=args.max_tasks,
                                                seed=args.seed, per_task=args.demos_per_task)
    probs = boundary_probs(model, tok, demos.examples)
    groups = {k: {"n": len(v),
                  "p_close_mean": statistics.fmean(a for a, _ in v), "p_close_max": max(a for a, _ in v),
                  "p_param_mean": statistics.fmean(b for _, b in v), "p_param_min": min(b for _, b in v)}
              for k, v in sorted(probs.items())}
    write_result(args.name, {"checkpoint": str(args.checkpoint), "tasks_file": str(args.tasks), "split": args.split,
                             "tasks": n_tasks, "demonstrations": len(demos.examples), "boundaries": groups})


if __name__ == "__main__":
    main()
