"""Metrics per iteration: one JSON object per line in ``OUT/metrics.jsonl`` and PNG plots.

:func:`rollout_metrics` aggregates one iteration's rollouts:

* outcome — ``success_rate`` (graded rollouts whose grader passed, over the
  rollouts that were not infra errors), ``mean_reward``, ``tokens_per_solved``
  (policy-sampled tokens of solved rollouts / solved rollouts), status counts;
  ``solved_by_command_share`` (solved rollouts that made no ``edit_file``/``write_file`` call,
  so their change came from ``run_command``, e.g. one ``sed -i``; over the solved rollouts whose
  producer recorded ``file_writes``);
* behaviour — every numeric key of ``Rollout.metrics`` (written per rollout by
  ``rl/behaviour.py``) as its mean over the rollouts that have it, ``rollout_<key>``;
  and, when those keys exist, the ratios the issue names: ``tool_calls_per_model_call``
  (``tool_calls`` / ``model_calls``), ``parallel_call_share`` (``parallel_steps`` /
  ``model_calls``: model calls with two or more tool calls), ``blind_edit_rate``
  (``blind_edits`` / ``edits``), ``malformed_call_rate`` (``malformed_calls`` /
  ``tool_calls``) — ratios of sums, not means of ratios, so a long rollout weighs
  by its calls; ``rollout_malformed_<kind>`` (``rl.behaviour.MALFORMED_KINDS``) splits the
  malformed calls per rollout by what was wrong with them, and ``rollout_malformed_truncated``
  counts those the per-call token limit cut;
* ``rollout_wall_s_p50/p90/max`` from ``Rollout.metrics["wall_s"]``;
* ``rollout_limit_max_steps`` / ``_max_tokens`` / ``_timeout``: the share of rollouts each
  limit ended (the worker writes 0/1 per rollout), so a clock that binds before the policy's
  own call budget — load, not behaviour — shows as a rising ``timeout`` share.

Trainer metrics (loss, entropy, grad norm, sampler/trainer Δ, TIS clipping,
expert balance: :class:`rl.train.grpo.GRPOTrainer`) and the time split
— wall clock per iteration: ``time_rollouts_s`` (all draws), ``time_training_s``,
``time_weight_sync_s``, ``time_heldout_eval_s``; and ``time_generation_s``, ``time_tools_s``,
``time_grading_s``, each *summed over the rollouts*, which run concurrently (so they add up to
many times the wall clock and are plotted on a panel of their own) — are merged in by the loop.

Not guaranteed: that a behaviour key exists (a producer that does not record
``blind_edits`` gives no ``blind_edit_rate``; the plot then omits that panel).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rl.behaviour import MALFORMED_KINDS
from rl.types import Rollout, RolloutStatus

__all__ = ["PLOTS", "SFT_PLOTS", "append_metrics", "percentile", "plot_metrics", "read_metrics", "rollout_metrics",
           "wide_range"]

_RATIOS = {  # name: (numerator key, denominator key) of Rollout.metrics
    "tool_calls_per_model_call": ("tool_calls", "model_calls"),
    "parallel_call_share": ("parallel_steps", "model_calls"),
    "blind_edit_rate": ("blind_edits", "edits"),
    "malformed_call_rate": ("malformed_calls", "tool_calls"),
    "prose_chars_per_model_call": ("prose_chars", "model_calls"),
}

PLOTS: tuple[tuple[str, tuple[str, ...]], ...] = (  # panel title: metric keys drawn on it
    ("success rate", ("success_rate", "heldout_success_rate")),
    ("held-out pass@1", ("heldout_pass_at_1",)),
    ("held-out pass@1 by task family", ("heldout_pass_at_1_*",)),  # whichever families the split has
    ("training success by task family", ("success_rate_*",)),
    ("mean reward", ("mean_reward",)),
    ("groups with success varied; replayed tasks (dynamic sampling, frontier replay)",
     ("groups_success_varied", "replayed_tasks", "replayed_varied")),
    ("tokens per solved task", ("tokens_per_solved", "heldout_tokens_per_solved")),
    ("held-out tokens per solved task by family", ("heldout_tokens_per_solved_*",)),  # families with a solution
    ("share of solved rollouts solved by a command (no edit_file)", ("solved_by_command_share",
                                                                     "heldout_solved_by_command_share")),
    ("tool calls per model call", ("tool_calls_per_model_call", "heldout_tool_calls_per_model_call")),
    ("prose characters per model call (narration)", ("prose_chars_per_model_call",
                                                    "heldout_prose_chars_per_model_call")),
    ("share of model calls with >= 2 parallel calls", ("parallel_call_share", "heldout_parallel_call_share")),
    ("blind-edit rate", ("blind_edit_rate", "heldout_blind_edit_rate")),
    ("malformed-call rate", ("malformed_call_rate", "heldout_malformed_call_rate")),
    ("malformed calls per rollout, by kind", (*(f"rollout_malformed_{k}" for k in MALFORMED_KINDS),
                                              "rollout_malformed_truncated")),
    ("share of reinforced tokens in malformed calls", ("positive_malformed_token_frac",)),
    ("length term, mean over grouped rollouts (length_coef > 0)", ("length_bonus_mean",)),
    ("share of mixed groups whose longest rollout failed (length_coef > 0)", ("length_longest_failed_share",)),
    ("held-out malformed calls per rollout, by kind", (*(f"heldout_rollout_malformed_{k}" for k in MALFORMED_KINDS),
                                                       "heldout_rollout_malformed_truncated")),
    ("model calls per rollout", ("rollout_model_calls",)),
    ("share of rollouts ended by a limit", ("rollout_limit_max_steps", "rollout_limit_max_tokens",
                                           "rollout_limit_timeout")),
    ("rollout wall time (s)", ("rollout_wall_s_p50", "rollout_wall_s_p90", "rollout_wall_s_max")),
    ("iteration wall time split (s)", ("time_rollouts_s", "time_training_s", "time_weight_sync_s",
                                       "time_heldout_eval_s")),
    ("rollout time summed over concurrent rollouts (s)", ("time_generation_s", "time_tools_s", "time_grading_s")),
    ("sampler/trainer |Δ logprob|", ("logprob_diff_mean", "logprob_diff_max", "kl_sampler_trainer")),
    ("importance weights clipped", ("tis_clipped_frac", "ppo_clipped_frac")),
    ("expert load balance (max/mean)", ("expert_balance",)),
    ("KL to the start, per policy token (kl_coef > 0)", ("kl_ref",)),
    ("largest single-token KL to the start (kl_coef > 0)", ("kl_ref_token_max",)),
    ("largest |Δ logprob| of a sampled token within one update", ("policy_move_max",)),
    ("pointer's share of a sampled token's probability (copy head): all, moved > 3 nats, the largest mover",
     ("copy_share", "moved_copy_share", "policy_move_max_copy_share")),
    ("sampled tokens moved > 3 nats within one update (copy head)", ("moved_tokens",)),
    ("share of tokens whose experts changed after a step: all, moved > 3 nats", ("route_changed_share",
                                                                                "moved_route_changed_share")),
    ("learning rate (last step of the update)", ("lr",)),
    ("entropy", ("entropy",)),
    ("grad norm", ("grad_norm",)),
)


SFT_PLOTS: tuple[tuple[str, tuple[str, ...]], ...] = (  # `flywheel rl sft`'s curve (x: the optimizer step)
    ("SFT loss", ("train_loss", "heldout_loss")),
    ("SFT held-out copy tokens: loss", ("heldout_copy_loss",)),
    ("SFT held-out copy tokens: accuracy", ("heldout_copy_acc",)),
    ("SFT held-out exits (the token after a copied span): accuracy", ("heldout_exit_acc",)),
)


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (``q`` in 0..100) of a non-empty sequence."""
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def rollout_metrics(rollouts: Sequence[Rollout], *, prefix: str = "",
                    families: Mapping[str, str] | None = None) -> dict[str, float]:
    """One iteration's rollout aggregates (see the module docstring); keys get ``prefix``. With
    ``families`` (task id -> family) also ``success_rate_<family>`` over the scored rollouts of each
    family drawn (a task missing from it counts as ``unknown``); a family with no rollout this
    iteration has no key, so its curve has gaps, not zeros."""
    out: dict[str, float] = {"rollouts": float(len(rollouts))}
    for status in RolloutStatus:
        out[f"status_{status.value}"] = float(sum(r.status is status for r in rollouts))
    scored = [r for r in rollouts if r.status is not RolloutStatus.INFRA_ERROR]
    if scored:
        solved = [r for r in scored if r.grade is not None and r.grade.passed]
        out["success_rate"] = len(solved) / len(scored)
        if families is not None:
            by_family: dict[str, list[bool]] = {}
            for r in scored:
                by_family.setdefault(families.get(r.task_id, "unknown"), []).append(
                    r.grade is not None and r.grade.passed)
            out |= {f"success_rate_{f}": sum(v) / len(v) for f, v in sorted(by_family.items())}
        rewards = [r.reward for r in scored if r.reward is not None]
        if rewards:
            out["mean_reward"] = sum(rewards) / len(rewards)
        if solved:
            out["tokens_per_solved"] = sum(sum(r.loss_mask) for r in solved) / len(solved)
            # which form solved them: no edit_file/write_file at all means the change came from a command
            writes = [r.metrics["file_writes"] for r in solved if "file_writes" in r.metrics]
            if writes:
                out["solved_by_command_share"] = sum(w == 0 for w in writes) / len(writes)
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for r in scored:
        for k, v in r.metrics.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                sums[k] = sums.get(k, 0.0) + float(v)
                counts[k] = counts.get(k, 0) + 1
    for k in sorted(sums):
        out[f"rollout_{k}"] = sums[k] / counts[k]
    for name, (num, den) in _RATIOS.items():
        if num in sums and den in sums and sums[den] > 0:
            out[name] = sums[num] / sums[den]
    walls = [float(r.metrics["wall_s"]) for r in scored if isinstance(r.metrics.get("wall_s"), (int, float))]
    if walls:
        out |= {"rollout_wall_s_p50": percentile(walls, 50), "rollout_wall_s_p90": percentile(walls, 90),
                "rollout_wall_s_max": max(walls)}
    return {prefix + k: v for k, v in out.items()}


def append_metrics(path: str | Path, record: dict[str, Any]) -> None:
    """Append one iteration's record as a JSON line (flushed, so a killed run keeps it)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with p.open("a", encoding="utf-8") as f:
        f.write(json.dumps(record, sort_keys=True, allow_nan=False) + "\n")
        f.flush()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def wide_range(series: Sequence[Sequence[float]], ratio: float = 100.0) -> bool:
    """Whether a panel's series differ in size so much that a linear axis flattens the small ones:
    all values >= 0, the largest series maximum more than ``ratio`` times the smallest nonzero
    one (series that are all 0 do not count) and above 1 (the symlog axis it gets is linear below 1,
    so it would only change the tick labels)."""
    maxima = [max(ys) for ys in series if ys]
    if not maxima or min(min(ys) for ys in series if ys) < 0:
        return False
    nonzero = [m for m in maxima if m > 0]
    return len(nonzero) >= 2 and max(nonzero) > max(1.0, ratio * min(nonzero))


def plot_panels(records: Sequence[dict[str, Any]],
                plots: Sequence[tuple[str, Sequence[str]]] = PLOTS) -> list[tuple[str, list[str]]]:
    """The panels of ``plots`` that ``records`` have data for, each with its keys that do; a key
    ending in ``*`` stands for every recorded key with that prefix (sorted)."""
    present = {k for r in records for k in r}

    def expand(key: str) -> list[str]:
        if key.endswith("*"):
            return sorted(k for k in present if k.startswith(key[:-1]))
        return [key] if key in present else []

    panels = [(t, [k for key in keys for k in expand(key)]) for t, keys in plots]
    return [(t, ks) for t, ks in panels if ks]


def plot_metrics(records: Iterable[dict[str, Any]], out_png: str | Path, *, x_key: str = "iteration",
                 title: str = "", plots: Sequence[tuple[str, Sequence[str]]] = PLOTS) -> Path:
    """One PNG with a panel per metric group of ``plots`` (default :data:`PLOTS`) that has data
    (Agg backend). ``ValueError`` when no group has any: a blank figure is never written."""
    recs = list(records)
    panels = plot_panels(recs, plots)
    if not panels:
        raise ValueError(f"nothing to plot in {out_png}: no record has any of the keys of {[t for t, _ in plots]}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(panels)
    cols = 3
    rows = math.ceil(n / cols)
    # constrained layout keeps the suptitle clear of the first row's titles (tight_layout did not)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.2 * rows), squeeze=False, layout="constrained")
    for ax, (t, keys) in zip(axes.flat, panels, strict=False):
        series = {k: [(r[x_key], r[k]) for r in recs if k in r and x_key in r] for k in keys}
        for k, pts in series.items():
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", markersize=3, label=k)
        if wide_range([[y for _, y in pts] for pts in series.values()]):
            ax.set_yscale("symlog", linthresh=1.0)  # e.g. generation time summed over rollouts vs grading time
        ax.set_title(t, fontsize=9)
        ax.set_xlabel(x_key, fontsize=8)
        if len(keys) > 1:
            ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    if title:
        fig.suptitle(title)
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return out
