"""Does a checkpoint know where a copied name ENDS? Teacher-forced, on scripted demonstrations.

Free-running rollouts of rename and find-and-change tasks derail in one way (docs/rl/runs.md,
twenty-ninth run): the model copies a name from the request — `` `expand_console` `` — and then
keeps copying the request past its end (the closing backtick), after which the narration the
demonstrations taught ("`X` should show me where it lives and who uses it.") takes over, inside
a ``pattern`` parameter or a ``sed`` command. The copy-token accuracy (``rl.train.copy_tokens``)
cannot see this: the token after a copied span is not a copy. This probe reads it directly. It
records demonstrations of a split's tasks through the production runtime (the scripted policy, the
real tools and sandbox; the start's recipe: ``--shell-share``, ``--narration``), runs the
checkpoint over each once (teacher forcing), and at every EXIT — a sampled token that is not a
copy right after one that is — reads

* ``p_exit``: the probability of the demonstration's own next token (``/`` in a ``sed``, ``</param>``
  after a pattern, the rest of a sentence), and
* ``p_continue``: the probability of the token that followed the copied span where it was copied
  from (its source's continuation: the request's closing backtick), when that token differs from
  the exit,

grouped by where the exit is (the tool call's parameter, or ``prose``). A model that stops copying
puts ``p_exit`` near 1; one that derails puts its mass on ``p_continue``.

    .venv/bin/python benchmarks/copy_exit_probe.py --checkpoint START/sft --tasks TASKS.jsonl

Not guaranteed: what the model does on its own prefixes (a free-running rollout reaches an exit
after its own earlier choices); the source of a span is its trigram's last occurrence in the
context, which can be the wrong one when a trigram repeats.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import _common  # noqa: F401  (repo on sys.path)
from _common import recorded_demos, write_result


def exit_positions(ids: Sequence[int], sampled: Sequence[bool], copies: Sequence[bool]) -> list[tuple[int, int | None]]:
    """``(t, source_next)`` for every sampled, non-copy token ``t`` whose predecessor is a copy;
    ``source_next`` is the token after the last earlier occurrence of the trigram ending at
    ``t - 1`` (None when it has none, or when that occurrence ends just before ``t``)."""
    out: list[tuple[int, int | None]] = []
    for t in range(3, len(ids)):
        if not (sampled[t] and not copies[t] and copies[t - 1]):
            continue
        tri = tuple(ids[t - 3: t])
        source_next = None
        for j in range(t - 2, 2, -1):  # the source ends at j - 1 < t - 1
            if tuple(ids[j - 3: j]) == tri and j < t - 1:
                source_next = ids[j]
                break
        out.append((t, source_next))
    return out


def where(tok: Any, ids: Sequence[int], t: int) -> str:
    """The parameter of the tool call the token ``t`` is in (``tool/param``), or ``prose``."""
    before = tok.decode(list(ids[max(0, t - 120): t]))
    call = before.rfind("<tool_call")
    if call < 0 or before.rfind("</tool_call>") > call:
        return "prose"
    text = before[call:]
    name = text.split('"')[1] if '"' in text else "?"
    if "<param" not in text or text.rfind("</param>") > text.rfind("<param"):
        return f"{name}/between"
    return f"{name}/{text[text.rfind('<param'):].split(chr(34))[1]}"


def exit_probs(model: Any, tok: Any, examples: list[Any], user_id: int,
               format_ids: frozenset[int]) -> dict[str, list[tuple[float, float | None]]]:
    """Place → per exit ``(p_exit, p_continue or None)`` (see the module docstring)."""
    import torch

    from rl.train.copy_tokens import copy_flags

    out: dict[str, list[tuple[float, float | None]]] = {}
    for segs in examples:
        ids = [i for s in segs for i in s.token_ids]
        sampled = [s.sampled for s in segs for _ in s.token_ids]
        copies = copy_flags(segs, user_id, format_ids)
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([ids])).logits[0], -1)
        for t, source_next in exit_positions(ids, sampled, copies):
            p_exit = float(logp[t - 1, ids[t]].exp())
            p_cont = float(logp[t - 1, source_next].exp()) if source_next is not None and source_next != ids[t] else None
            out.setdefault(where(tok, ids, t), []).append((p_exit, p_cont))
    return out


def summarise(probs: dict[str, list[tuple[float, float | None]]]) -> dict[str, dict[str, float]]:
    groups: dict[str, dict[str, float]] = {}
    every = [p for v in probs.values() for p in v]
    for key, v in [("all", every), *sorted(probs.items())]:
        conts = [c for _, c in v if c is not None]
        groups[key] = {"n": len(v), "p_exit_mean": statistics.fmean(e for e, _ in v),
                       "p_exit_below_0_9": sum(e < 0.9 for e, _ in v) / len(v),
                       "p_exit_min": min(e for e, _ in v),
                       "n_continue": len(conts),
                       "p_continue_mean": statistics.fmean(conts) if conts else 0.0,
                       "p_continue_max": max(conts) if conts else 0.0}
    return groups


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", type=Path, required=True)
    ap.add_argument("--tasks", type=Path, required=True)
    ap.add_argument("--split", choices=["train", "heldout", "validation"], default="heldout")
    ap.add_argument("--families", nargs="*", default=None, help="only these task families (default: all)")
    ap.add_argument("--max-tasks", type=int, default=24)
    ap.add_argument("--shell-share", type=float, default=0.5, help="the start's sft.shell_share")
    ap.add_argument("--narration", type=int, default=3, help="the start's sft.narration")
    ap.add_argument("--narration-bare", action="store_true", help="the start's sft.narration_quotes was false")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--name", default="copy_exit_probe")
    args = ap.parse_args()

    from rl.train.copy_tokens import format_token_ids, user_marker_id

    model, tok, demos, n_tasks = recorded_demos(args.checkpoint, args.tasks, args.split, max_tasks=args.max_tasks,
                                                seed=args.seed, families=args.families,
                                                shell_share=args.shell_share, narration=args.narration,
                                                narration_quotes=not args.narration_bare)
    probs = exit_probs(model, tok, demos.examples, user_marker_id(tok), format_token_ids(tok))
    if not probs:
        raise SystemExit("no exits from a copied span in these demonstrations")
    write_result(args.name, {"checkpoint": str(args.checkpoint), "tasks_file": str(args.tasks), "split": args.split,
                             "families": args.families, "tasks": n_tasks, "demonstrations": len(demos.examples),
                             "shell_share": args.shell_share, "narration": args.narration,
                             "narration_quotes": not args.narration_bare,
                             "exits": summarise(probs)})


if __name__ == "__main__":
    main()
