"""GRPO on the MoE policy, as the strongest recent recipes run it.

What one update does, and where it departs from the papers (each departure is
also noted where it happens below):

* **Groups.** ``G`` rollouts of one task form a group (``Rollout.task_id``
  within one call). ``INFRA_ERROR`` rollouts are dropped first and counted
  (``n_infra_excluded``): our side failed, the model did not, so they are
  never a silent zero. With ``compact_filtering`` (DeepSWE) rollouts that hit
  a limit (``LIMIT``) are dropped from the loss too (``n_limit_filtered``);
  they still count in the success metrics, which are computed elsewhere.
* **Advantage** — leave-one-out baseline (RLOO, as in DeepSWE / Dr. GRPO's
  unbiased form): ``A_i = r_i - mean_{j != i} r_j``. Departure from GRPO:
  no division by the group's std by default (Dr. GRPO shows it biases toward
  easy and hard prompts); ``std_normalise=True`` divides by the group's
  (population) std + 1e-6. Departure from Dr. GRPO: LOO instead of the group
  mean including ``r_i`` — LOO is ``G/(G-1)`` times Dr. GRPO's advantage, the
  same direction, an unbiased baseline.
* **Negative advantages** — ``neg_adv_scale`` (default 1: the papers) multiplies
  every negative advantage after the baseline. Departure, off by default: with
  token-sum aggregation a group's failures push down every token they share with
  its successes (tool-call syntax included) in proportion to their length, and
  failures that run to the call limit are the longest rows. For a token every
  row uses at the same rate the net push is ``sum_i A_i * n_i`` (``n_i``: row
  ``i``'s policy tokens), negative when ``neg_adv_scale * sum_failures |A_j| n_j
  > sum_successes A_i n_i``; LOO advantages sum to zero within a group, so at
  scale 1 that is whenever the failures are the longer rows. A scale below 1
  keeps the push on shared tokens positive for longer failures; 0 is
  rejection-sampling fine-tuning on the better-than-baseline rollouts with
  GRPO's clip and TIS (cf. asymmetric REINFORCE, Arnal et al. 2025, which lowers
  the baseline for the same reason).
* **Malformed calls in reinforced rollouts** — ``no_reinforce_malformed`` (default off:
  the papers credit every sampled token of a rollout with its advantage). Departure, on:
  in a row with a *positive* advantage, the tokens of each model call that made a tool
  call the parser or the schema rejected (``tool_call_started`` with ``valid: false``)
  get no loss. Why: the reward already charges a malformed call
  (:mod:`rl.reward`), but a solved rollout that recovered from one still scores far
  above its group's failures, so rollout-level credit *reinforces* the broken call's
  tokens with the rest — the measured runs' malformed-call rate rose under GRPO in
  several seeds although every broken call costs reward. Rows with a negative
  advantage keep every token (pushing a broken call down is right). The k-th sampled
  segment is the k-th model call (:class:`agent.policies.tito.TokenInTokenOutPolicy`
  appends one per call) and is matched to the k-th ``assistant_message`` event; a row
  whose counts differ is trained unmasked and counted (``n_credit_unaligned``).
  ``positive_malformed_token_frac`` (always measured) is the share of positive-advantage
  tokens that belong to such calls: what the option takes out of the update.
  ``malformed_call_adv`` ``c`` > 0 goes one step further (a per-call credit, departure
  from every paper's rollout-level credit): the tokens of such a call get the advantage
  ``min(A, -c)`` in every trained row, positive or negative — the parser's verdict is
  about that call alone, so that call alone is pushed down, at least by ``c``. With it,
  ``no_reinforce_malformed`` has no further effect (nothing is masked; the call is
  pushed down instead).
* **Length term** — ``length_coef`` ``w`` (default 0: off, the papers above have none). Kimi
  k1.5's length reward (Kimi Team 2025, sec. 2.3.3), group-relative: with ``L_i`` rollout
  ``i``'s policy-sampled tokens and ``L_min``/``L_max`` its group's, ``lam_i = 0.5 - (L_i -
  L_min) / (L_max - L_min)``; a solved rollout (reward term ``success`` 1) gets ``w * lam_i``
  added to its reward, an unsolved one ``w * min(0, lam_i)`` (long failures pay, short ones
  earn nothing), before the advantages; nothing when all lengths are equal. Why: the rollout
  reward's ``effort`` term counts model calls, so tokens spent *inside* a call (narration, long
  edits) are free, and the tokens-per-solved-task objective has no signal. Departures from
  Kimi: it is added here, per group, not in :mod:`rl.reward` (it needs the group; a rollout's
  own reward stays what the session log records), and there is no warm-up schedule (Kimi
  found it slows early training and enables it late; our runs are 3-6 updates long). With
  ``w <= 0.2`` a solved rollout still scores above every failure in its group (the smallest
  success is > 0.3 above the largest failure, :mod:`rl.reward`). A third departure: only groups
  with at least one solved rollout get the term — in a group where nothing was solved it would
  give the failures different rewards by length alone and so make a group that teaches nothing
  about solving trainable (Kimi applies it to every group); rollouts that sampled no token take no
  part (0 tokens would set ``L_min``). ``length_bonus_mean`` records the mean term over the
  rollouts of every group it was computed for (those without a success count as zeros).
  ``length_scope="solved"`` (a fourth departure, off by default) takes a solved rollout's ``L_min``
  and ``L_max`` over the group's *solved* rollouts only (failures keep Kimi's term). Why: our
  failures are often the longest rollouts of a group (a policy looping until the call limit), so
  with Kimi's scope ``L_max`` is a failure's and the solutions all sit near the short end with
  nearly equal terms — in a group of solutions of 300 and 400 tokens and failures of 50 and 800,
  the two solutions' terms differ by ``0.13 w``; over the solved ones alone by ``w``. A lone
  solution (or solutions of one length) then gets no term. A solved rollout still scores above
  every failure (its term is at least ``-w/2``, a failure's at most 0).
* **Zero-variance groups** (all rewards equal) have zero advantage everywhere;
  they are skipped before any forward (``frac_reward_zero_std``), as DAPO's
  dynamic sampling does. Departure from DAPO: we do not resample to refill the
  batch; the iteration trains on fewer groups.
* **Objective per token** ``t`` of a policy-sampled segment
  (``Segment.sampled``; prompts, tool results and template markers have mask
  0 and give no gradient)::

      ratio_t = pi_theta / pi_old                      (PPO ratio, trainer vs trainer)
      w_t     = min(pi_old / pi_sampler, tis_clip)     (TIS, trainer vs inference engine; no gradient)
      l_t     = -w_t * min(ratio_t * A, clip(ratio_t, 1 - eps_low, 1 + eps_high) * A)

  The two ratios are different things (verl's docs conflate them): ``ratio``
  measures how far the *trainer* has moved since the batch was sampled and
  is what the PPO clip bounds; ``w`` corrects for the *inference engine*
  computing slightly different probabilities from the same weights (kernels,
  precision), per Yao et al., "Your efficient RL framework secretly brings you
  off-policy RL training" (2025). ``pi_old`` is the trainer's own logprob of
  the sampled token under the weights that sampled it (the weights at the
  start of this update). With ``minibatches == 1`` there is one optimizer step
  and ``pi_old == pi_theta`` in value, so we reuse the forward's detached
  logprobs instead of a second forward (ratio is 1, the clip inactive, the
  gradient that of the unclipped surrogate — exactly PPO's first step).
* **Clip-high** (DAPO): ``eps_high`` (0.28) > ``eps_low`` (0.2), so
  low-probability tokens with positive advantage can grow.
* **No KL term** by default (DAPO, Dr. GRPO, DeepSWE). ``kl_coef > 0`` adds
  the k3 estimator to a frozen copy of the initial weights. ``kl_estimator="k2"``
  uses ``0.5 * (log pi_ref - log pi_theta)^2`` instead (verl's ``"mse"``). Why it is
  there: k3's gradient in a token's logprob is ``1 - pi_ref / pi_theta``, exponential
  in how far the token has fallen below the start; our twenty-third run measured single
  tokens 8-9 nats below the start inside one update (``kl_ref_token_max`` ~8,000,
  ``policy_move_max`` ~8), whose k3 gradient then set the whole clipped step
  (``grad_norm`` 19 against a usual 0.03). k2's gradient is the log-ratio itself. Both
  are reported as ``kl_ref`` in their own units (k2 is not an unbiased KL estimate).
* **Which tokens move** (measurement only, a model with a copy head): per update,
  ``moved_tokens`` (sampled tokens whose logprob one update shifted by more than
  :data:`MOVED_NATS`), ``moved_copy_share`` (the pointer's share of those tokens'
  probability before the update, :func:`copy_share`) against ``copy_share`` (the same
  over all policy tokens), and the largest mover's signed shift, row advantage, logprob
  before the update (at the training temperature), pointer share, token id and the
  entropy at its position after the move (``policy_move_max_*``; not before it). A
  pointer share near 1 means the token was copied, so its probability hangs on which
  earlier position the pointer picks. With
  ``minibatches > 1`` (any model): ``route_changed_share`` (policy tokens scored after an
  optimizer step whose position now routes to other experts, :func:`route_changed`) against
  ``moved_route_changed_share`` (the same among the moved tokens) — a discrete switch of
  experts is the other way one small step can move a token far.
* **Epochs** — ``epochs`` (default 1, as verl's ``ppo_epochs`` and DeepSeekMath's GRPO in
  practice) passes over the update's rollouts, each split into the same ``minibatches`` (PPO's
  K epochs of minibatch steps): ``epochs * minibatches`` optimizer steps from one iteration's
  samples, every one after the first off-policy and bounded by the PPO clip against ``pi_old``
  (the weights that sampled the batch). Why: on this machine sampling is ~90% of an iteration
  and the trainer's step ~10%, so a second pass costs little and doubles what each rollout
  teaches. Departures: the minibatches keep their order in every pass (verl reshuffles; here no
  random state is drawn, so resume stays exact and the passes are comparable), and there is no
  early stop on a KL target (PPO2's ``target_kl``). The reference's token logprobs (``kl_coef``)
  are computed once per micro-batch and reused by every pass (the reference does not train). Per-token metrics (``entropy``,
  ``logprob_diff_*``, ``kl_ref``, the clip fractions, ``loss``, ``moved_tokens``) are means over
  the passes; ``policy_move_max`` and ``grad_norm`` are maxima over all of them.
* **Micro-batches** — ``micro_batch`` rows per forward, right-padded to the longest. The
  rows are cut into micro-batches in index order (group by group), and ``ceil(n_micro /
  minibatches)`` micro-batches make each optimizer step (:func:`micro_batches`; so there may be
  fewer steps than ``minibatches``, the last one smaller). With ``sort_micro_batches`` (default
  on) each step's rows are sorted by length before they are cut, so a micro-batch pads little
  (HF's ``group_by_length`` and verl's ``balance_batch`` serve the same end). The rows sharing
  an optimizer step, and so the policy gradient, are unchanged up to float summation order.
  What does change: the MoE auxiliary loss, computed per forward, sees other row mixes, and the
  expert counts include padding positions, so ``expert_balance`` and the router-bias update
  (``router_bias_rate > 0``) count less padding. ``pad_share`` reports the padded share of the
  positions the forwards computed, ``pad_share_unsorted`` what index order would have padded.
* **Aggregation** — Dr. GRPO's constant normaliser: the token sum over the
  batch divided by ``n_rows * norm_tokens`` (``n_rows``: rollouts trained on
  in this update, ``norm_tokens``: a config constant, default 1024, the
  generation budget's order). Not per-sequence mean (GRPO: biases toward
  short correct and long wrong answers), not a per-batch token mean (DAPO:
  the normaliser then depends on the batch's lengths).
* **Warmup** — ``lr_warmup_steps`` (default 0, as verl and TRL) scales the learning
  rate of optimizer step ``n`` (counted by the optimizer's own state, so a resumed
  run continues the ramp exactly) by ``min(1, n / lr_warmup_steps)``. Why it is
  there: Adam's bias-corrected first steps are ~``lr * sign(grad)`` in every
  coordinate, so a fresh optimizer moves every weight of the SFT start by ~lr at
  once, however small and noisy the few groups' gradient is.
* **MoE** — the load-balancing auxiliary loss (``ModelOutput.aux_loss`` at
  ``aux_loss_coef``) is added, weighted by each micro-batch's share of rows;
  the auxiliary-loss-free router-bias step runs after each optimizer step.
  ``routing_replay`` trains with the experts the sampler chose
  (``Segment.routes``), which needs ``MoETransformer.forward(routes=...)``. The KL
  reference is never replayed: it routes by its own router, so ``kl_ref`` is the distance
  to the model the run started from, routing drift included (scored on the sampler's
  experts it would compare two models on one set of experts).

Not guaranteed: bit-identical results across thread counts or machines
(float reduction order); that every token of a rollout fits the model's
context (a longer rollout is an error, never truncated).
"""

from __future__ import annotations

import copy
import inspect
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rl.types import Rollout, RolloutStatus

MOVED_NATS = 3.0
"""A sampled token counts as *moved* (metric ``moved_tokens``) when one update has shifted its
logprob by more than this many nats (a factor of ~20 in probability)."""

if TYPE_CHECKING:
    import torch

    from agent.model.transformer import ModelOutput, MoETransformer
    from rl.config import GRPOConfig, KLEstimator, LengthScope

__all__ = ["BatchSelection", "GRPOTrainer", "RoutingReplayUnavailable", "copy_share", "group_advantages",
           "kl_estimate", "length_terms", "malformed_call_segments", "policy_loss", "route_changed", "select_rollouts",
           "token_advantages", "token_tensors"]


class RoutingReplayUnavailable(RuntimeError):
    """Routing replay was asked for but the model or the rollouts cannot provide it."""


def group_advantages(rewards: Sequence[float], *, std_normalise: bool = False, neg_scale: float = 1.0,
                     eps: float = 1e-6) -> list[float]:
    """Leave-one-out advantages ``r_i - mean_{j != i} r_j`` of one group, negative ones multiplied
    by ``neg_scale`` (see the module docstring)."""
    g = len(rewards)
    if g < 2:
        raise ValueError(f"a group needs at least 2 rollouts for a baseline, got {g}")
    total = sum(rewards)
    adv = [r - (total - r) / (g - 1) for r in rewards]
    if std_normalise:
        mean = total / g
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / g)
        adv = [a / (std + eps) for a in adv]
    if neg_scale != 1.0:
        adv = [a * neg_scale if a < 0 else a for a in adv]
    return adv


@dataclass
class BatchSelection:
    """Which rollouts an update trains on, with their advantages, and what was left out."""

    rows: list[tuple[Rollout, float]]
    n_rollouts: int = 0
    n_infra_excluded: int = 0
    n_limit_filtered: int = 0
    n_unscored: int = 0  # no reward although graded-status: a producer bug, excluded and counted
    n_groups: int = 0
    n_groups_zero_std: int = 0
    n_groups_too_small: int = 0  # fewer than 2 usable rollouts left: no baseline
    # scored, in the group's baseline, but nothing sampled to train on (a limit hit before the first token)
    n_no_tokens: int = 0
    # the length term of every grouped rollout (length_coef > 0)
    length_terms: list[float] = field(default_factory=list)
    # per group with a solved and an unsolved rollout (length_coef > 0): is its longest rollout unsolved?
    longest_failed: list[bool] = field(default_factory=list)

    @property
    def frac_reward_zero_std(self) -> float:
        return self.n_groups_zero_std / self.n_groups if self.n_groups else 0.0

    def stats(self) -> dict[str, float]:
        return {"n_rollouts": self.n_rollouts, "n_infra_excluded": self.n_infra_excluded,
                "n_limit_filtered": self.n_limit_filtered, "n_unscored": self.n_unscored,
                "n_groups": self.n_groups, "n_groups_zero_std": self.n_groups_zero_std,
                "n_groups_too_small": self.n_groups_too_small,
                "frac_reward_zero_std": self.frac_reward_zero_std, "n_no_tokens": self.n_no_tokens,
                "n_trained": len(self.rows)} | (
                    {"length_bonus_mean": sum(self.length_terms) / len(self.length_terms)}
                    if self.length_terms else {}) | (
                    {"length_longest_failed_share": sum(self.longest_failed) / len(self.longest_failed)}
                    if self.longest_failed else {})


def select_rollouts(rollouts: Sequence[Rollout], cfg: GRPOConfig) -> BatchSelection:
    """Group by task, drop infra errors (and limit hits under compact filtering), skip
    zero-variance groups, and attach each remaining rollout's advantage. A scored rollout with no
    sampled token (the wall-time limit hit during its first model call) counts in its group's
    baseline but is not a row (``n_no_tokens``)."""
    sel = BatchSelection(rows=[], n_rollouts=len(rollouts))
    groups: dict[str, list[Rollout]] = defaultdict(list)
    for r in rollouts:
        if r.status is RolloutStatus.INFRA_ERROR:
            sel.n_infra_excluded += 1
        elif cfg.compact_filtering and r.status is RolloutStatus.LIMIT:
            sel.n_limit_filtered += 1
        elif r.reward is None:
            sel.n_unscored += 1
        else:
            groups[r.task_id].append(r)
    for task_id in sorted(groups):
        group = sorted(groups[task_id], key=lambda r: r.sample)
        sel.n_groups += 1
        if len(group) < 2:
            sel.n_groups_too_small += 1
            continue
        rewards = [float(r.reward) for r in group]  # type: ignore[arg-type]
        if cfg.length_coef > 0:
            bonus = length_terms(group, cfg.length_coef, cfg.length_scope)
            ok = [_solved(r) for r in group]
            if any(ok) and not all(ok):
                lengths = [_sampled_tokens(r) for r in group]
                sel.longest_failed.append(not ok[lengths.index(max(lengths))])
            rewards = [r + x for r, x in zip(rewards, bonus, strict=True)]
            sel.length_terms += bonus
        if max(rewards) - min(rewards) == 0.0:
            sel.n_groups_zero_std += 1
            continue
        advs = group_advantages(rewards, std_normalise=cfg.std_normalise, neg_scale=cfg.neg_adv_scale)
        for r, adv in zip(group, advs, strict=True):
            if any(s.sampled and s.token_ids for s in r.segments):
                sel.rows.append((r, adv))
            else:  # its reward still counts in the baseline above; it has no token to take a gradient on
                sel.n_no_tokens += 1
    return sel


def micro_batches(lengths: Sequence[int], size: int, minibatches: int, *, sort: bool) -> list[list[list[int]]]:
    """Row indices per micro-batch, grouped per optimizer step, in training order: the rows are
    cut into micro-batches of ``size`` in index order, and ``ceil(n_micro / minibatches)`` of them
    make one step (so there may be fewer steps than ``minibatches``, the last one smaller). With
    ``sort`` each step's rows are re-cut sorted by ``lengths`` (stable: ties keep index order). A
    step's set of rows and its number of micro-batches do not depend on ``sort``."""
    n = len(lengths)
    n_micro = math.ceil(n / size)
    per_step = math.ceil(n_micro / minibatches) * size if n_micro else size
    steps: list[list[list[int]]] = []
    for lo in range(0, n, per_step):
        block = list(range(lo, min(lo + per_step, n)))
        if sort:
            block.sort(key=lambda i: lengths[i])
        steps.append([block[i:i + size] for i in range(0, len(block), size)])
    return steps


def pad_share(lengths: Sequence[int], steps: Sequence[Sequence[Sequence[int]]]) -> float:
    """The share of the positions the forwards over ``steps`` (:func:`micro_batches`) compute, each
    micro-batch right-padded to its longest row, that are padding."""
    computed = sum(len(c) * max(lengths[i] for i in c) for step in steps for c in step)
    return 1.0 - sum(lengths) / computed if computed else 0.0


def _sampled_tokens(r: Rollout) -> int:
    """How many tokens the policy sampled in ``r`` (its length for the length term)."""
    return sum(len(s.token_ids) for s in r.segments if s.sampled)


def _solved(r: Rollout) -> bool:
    """Whether ``r`` solved its task (reward term ``success`` 1; without that term: unsolved)."""
    return r.reward_terms.get("success", 0.0) >= 1.0


def kl_estimate(log_r: torch.Tensor, estimator: KLEstimator) -> torch.Tensor:
    """Per-token estimate of KL(pi_theta || pi_ref) from ``log_r = log pi_ref - log pi_theta`` of
    tokens sampled from (about) ``pi_theta``: ``"k3"`` ``exp(log_r) - log_r - 1`` (unbiased, its
    gradient exponential in ``log_r``) or ``"k2"`` ``0.5 * log_r ** 2`` (biased, gradient linear)."""
    import torch

    if estimator == "k3":
        return torch.exp(log_r) - log_r - 1
    if estimator == "k2":
        return 0.5 * log_r ** 2
    raise ValueError(f"unknown KL estimator {estimator!r}: 'k3' or 'k2'")


def length_terms(group: Sequence[Rollout], coef: float, scope: LengthScope = "group") -> list[float]:
    """Kimi k1.5's group-relative length reward of each rollout of one group, times ``coef`` (see
    "Length term" in the module docstring): ``coef * lam`` for a solved rollout (reward term
    ``success`` 1; a rollout without that term counts as unsolved), ``coef * min(0, lam)`` for an
    unsolved one. All zeros when no rollout of the group is solved, or when every rollout that
    sampled a token sampled as many; a rollout that sampled none gets 0 and does not set the
    group's shortest length. ``scope="solved"``: a solved rollout's ``lam`` is taken over the
    group's solved rollouts' lengths (0 when they are all one length); an unsolved one's as before."""
    lengths = [_sampled_tokens(r) for r in group]
    solved = [_solved(r) for r in group]
    counted = [n for n in lengths if n > 0]
    if not any(solved) or not counted or min(counted) == max(counted):
        return [0.0] * len(group)

    def lam(n: int, among: Sequence[int]) -> float:
        lo, hi = min(among), max(among)
        return 0.0 if lo == hi else 0.5 - (n - lo) / (hi - lo)

    wins = [n for n, ok in zip(lengths, solved, strict=True) if ok and n > 0] if scope == "solved" else counted
    return [0.0 if n == 0 else coef * (lam(n, wins) if ok else min(0.0, lam(n, counted)))
            for n, ok in zip(lengths, solved, strict=True)]


def malformed_call_segments(rollout: Rollout) -> set[int] | None:
    """Indices into ``rollout.segments`` of the sampled segments whose model call made at least
    one malformed tool call (``tool_call_started`` with ``valid: false`` in ``rollout.events``).
    ``None`` when the sampled segments and the ``assistant_message`` events differ in number, so
    that calls cannot be matched to segments (a session that raised mid-call, say)."""
    steps = [(e.get("turn", 0), e.get("step")) for e in rollout.events if e.get("type") == "assistant_message"]
    sampled = [i for i, s in enumerate(rollout.segments) if s.sampled]
    if len(steps) != len(sampled):
        return None
    bad = {(e.get("turn", 0), e.get("step")) for e in rollout.events
           if e.get("type") == "tool_call_started" and not e.get("valid", True)}
    return {i for i, step in zip(sampled, steps, strict=True) if step in bad}


def token_tensors(rows: Sequence[Rollout], pad_id: int, *, max_len: int, with_routes: bool = False,
                  drop: Sequence[set[int]] | None = None) -> dict[str, torch.Tensor]:
    """Right-padded tensors for ``rows``: ``input_ids [B, T]``; per predicted position
    (``T-1``, position ``t`` predicts token ``t+1``): ``mask``, ``sampler_logprobs``;
    and ``routes [B, T, L, k]`` when asked. ``drop[i]``: indices into row ``i``'s segments
    whose tokens get mask 0 although sampled. Raises ``ValueError`` naming the rollout
    whose data is inconsistent or too long."""
    import torch

    seqs = []
    for n_row, r in enumerate(rows):
        ids, mask, lps = r.token_ids, r.loss_mask, r.sampler_logprobs
        if drop is not None and drop[n_row]:
            mask = [int(s.sampled and k not in drop[n_row]) for k, s in enumerate(r.segments) for _ in s.token_ids]
        name = f"rollout {r.task_id}#{r.sample} (iteration {r.iteration})"
        if not ids:
            raise ValueError(f"{name} has no tokens")
        if len(ids) > max_len:
            raise ValueError(f"{name} has {len(ids)} tokens, more than the model's context {max_len}")
        if mask[0]:
            raise ValueError(f"{name} starts with a sampled token: nothing precedes it to predict it from")
        for s in r.segments:
            if s.sampled and len(s.logprobs) != len(s.token_ids):
                raise ValueError(f"{name}: a sampled segment has {len(s.token_ids)} tokens but "
                                 f"{len(s.logprobs)} logprobs")
        seqs.append((ids, mask, lps))
    t = max(len(s[0]) for s in seqs)
    b = len(seqs)
    input_ids = torch.full((b, t), pad_id, dtype=torch.long)
    mask = torch.zeros(b, t - 1)
    sampler = torch.zeros(b, t - 1)
    for i, (ids, m, lp) in enumerate(seqs):
        n = len(ids)
        input_ids[i, :n] = torch.tensor(ids)
        mask[i, : n - 1] = torch.tensor(m[1:], dtype=torch.float32)
        sampler[i, : n - 1] = torch.tensor(lp[1:], dtype=torch.float32)
    out = {"input_ids": input_ids, "mask": mask, "sampler_logprobs": sampler}
    if with_routes:
        out["routes"] = _routes_tensor(rows, t)
    return out


def _routes_tensor(rows: Sequence[Rollout], t: int) -> torch.Tensor:
    import torch

    per_row = []
    for r in rows:
        routes: list[list[list[int]]] = []
        for s in r.segments:
            if s.routes is None or len(s.routes) != len(s.token_ids):
                raise RoutingReplayUnavailable(
                    f"routing replay: rollout {r.task_id}#{r.sample} has a segment without recorded routes "
                    "(the sampler must record the experts of every token, prompt and tool results included)")
            routes += s.routes
        per_row.append(routes)
    n_layers, k = len(per_row[0][0]), len(per_row[0][0][0])
    # padding positions route to experts 0..k-1: any valid choice, their outputs are masked
    out = torch.arange(k).expand(len(rows), t, n_layers, k).clone()
    for i, routes in enumerate(per_row):
        out[i, : len(routes)] = torch.tensor(routes, dtype=torch.long)
    return out


def supports_routing_replay(model: MoETransformer) -> bool:
    return "routes" in inspect.signature(model.forward).parameters


def policy_loss(new_lp: torch.Tensor, old_lp: torch.Tensor, sampler_lp: torch.Tensor, mask: torch.Tensor,
                adv: torch.Tensor, cfg: GRPOConfig, normaliser: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The clipped, TIS-weighted token loss summed over ``mask`` and divided by ``normaliser``
    (see the module docstring). ``adv`` is ``[B]`` (one per row) or ``[B, T]`` (per token,
    :func:`token_advantages`); the others ``[B, T]``. Returns the loss
    and detached per-token sums for metrics (clip counts, TIS weights)."""
    import torch

    ratio = torch.exp(new_lp - old_lp)
    raw_w = torch.exp(old_lp - sampler_lp).detach()
    w = raw_w.clamp(max=cfg.tis_clip)
    a = adv[:, None] if adv.dim() == 1 else adv
    clipped = ratio.clamp(1.0 - cfg.eps_low, 1.0 + cfg.eps_high)
    surr = torch.minimum(ratio * a, clipped * a)
    loss = -(w * surr * mask).sum() / normaliser
    with torch.no_grad():
        ppo_clipped = ((ratio * a > clipped * a) & (mask > 0)).sum()
        stats = {"tis_clipped": ((raw_w > cfg.tis_clip) & (mask > 0)).sum(), "ppo_clipped": ppo_clipped,
                 "tis_weight_sum": (w * mask).sum()}
    return loss, stats


class GRPOTrainer:
    """Owns the model's optimisation: ``step(rollouts)`` is one GRPO update.

    The optimizer is AdamW (``lr``, ``weight_decay``) with gradient-norm clipping;
    ``optimizer`` is public so a checkpoint can save and restore it exactly.

    ``temperature`` is the rollouts' sampling temperature ``T``: the policy trained is the
    tempered one, ``softmax(logits / T)`` — every logprob here (new, old, reference, entropy)
    divides the logits by ``T``, as verl's actor does — and the rollouts' recorded behaviour
    logprobs must be of that distribution (``GenerationRequest.logprobs_mode="processed"``,
    which the rollout workers ask for). At ``T = 1`` nothing changes. Not guaranteed: that a
    checkpoint trained at ``T < 1`` does as well when served at another temperature.
    """

    def __init__(self, model: MoETransformer, cfg: GRPOConfig, *, pad_id: int, lr: float,
                 weight_decay: float = 0.0, grad_clip: float = 1.0, temperature: float = 1.0) -> None:
        from dataclasses import replace

        import torch

        if not temperature > 0:
            raise ValueError(f"the sampling temperature the policy is trained at must be > 0, not {temperature}")
        self.model, self.cfg, self.pad_id, self.grad_clip, self.lr = model, cfg, pad_id, grad_clip, lr
        self.temperature = temperature
        # the run's coefficient replaces the checkpoint's (it is saved with the next checkpoint)
        model.cfg = replace(model.cfg, aux_loss_coef=cfg.aux_loss_coef)
        if cfg.routing_replay and not supports_routing_replay(model):
            raise RoutingReplayUnavailable(
                "routing replay is not available yet: MoETransformer.forward has no routes= argument "
                "(the rollout work adds it); run with grpo.routing_replay: false")
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay,
                                           betas=(0.9, 0.95))
        self.reference = None
        if cfg.kl_coef > 0:
            self.reference = copy.deepcopy(model).eval().requires_grad_(False)

    @property
    def optimizer_steps(self) -> int:
        """Optimizer steps taken so far (from the optimizer's state: restored with it on resume)."""
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                st = self.optimizer.state.get(p)
                if st and "step" in st:
                    return int(st["step"])
        return 0

    def _warmup(self) -> float:
        """Set the learning rate of the optimizer step about to be taken; returns it."""
        n = self.optimizer_steps + 1
        lr = self.lr * (min(1.0, n / self.cfg.lr_warmup_steps) if self.cfg.lr_warmup_steps else 1.0)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def _forward(self, model: MoETransformer, batch: dict[str, torch.Tensor], *, return_routes: bool = False) -> Any:
        routes = batch["routes"] if self.cfg.routing_replay else None
        return model(batch["input_ids"], routes=routes, return_routes=return_routes)

    def step(self, rollouts: Sequence[Rollout]) -> dict[str, float]:
        """One update on ``rollouts`` (one iteration's). Returns its metrics; with nothing to
        train on (every group zero-variance, say) no optimizer step is taken (``stepped: 0``)."""
        import torch

        from agent.model.moe import expert_balance

        sel = select_rollouts(rollouts, self.cfg)
        metrics: dict[str, float] = dict(sel.stats())
        if not sel.rows:
            return metrics | {"stepped": 0.0}
        model, cfg = self.model, self.cfg
        model.train()
        n_rows = len(sel.rows)
        normaliser = float(n_rows * cfg.norm_tokens)
        penalise = cfg.malformed_call_adv > 0
        bad_segs, drop, credit = _malformed_credit(sel.rows,
                                                   mask_positive=cfg.no_reinforce_malformed and not penalise)
        metrics |= credit
        lengths = [len(r.token_ids) for r, _ in sel.rows]
        cut = micro_batches(lengths, cfg.micro_batch, cfg.minibatches, sort=cfg.sort_micro_batches)
        metrics |= {"pad_share": pad_share(lengths, cut), "pad_share_unsorted":
                    pad_share(lengths, micro_batches(lengths, cfg.micro_batch, cfg.minibatches, sort=False))}
        # each optimizer step's micro-batches, as positions in ``batches``
        step_batches, n_batches = [], 0
        for step_rows in cut:
            step_batches.append(range(n_batches, n_batches + len(step_rows)))
            n_batches += len(step_rows)
        batches = []
        for c in (c for step_rows in cut for c in step_rows):
            b = token_tensors([sel.rows[i][0] for i in c], self.pad_id, max_len=model.cfg.max_seq_len,
                              with_routes=cfg.routing_replay, drop=[drop[i] for i in c])
            b["adv"] = torch.tensor([sel.rows[i][1] for i in c])
            if penalise:
                b["adv"] = token_advantages([sel.rows[i] for i in c], [bad_segs[i] for i in c],
                                            cfg.malformed_call_adv, b["mask"].shape[1])
            batches.append(b)
        old: list[torch.Tensor | None] = [None] * len(batches)
        old_copy: list[torch.Tensor | None] = [None] * len(batches)  # copy share under pi_old
        old_routes: list[torch.Tensor | None] = [None] * len(batches)  # experts chosen under pi_old
        ref: list[torch.Tensor | None] = [None] * len(batches)  # token logprobs under the reference
        if cfg.minibatches > 1 or cfg.epochs > 1:  # off-policy after the first step: pi_old needs its own forward
            with torch.no_grad():
                for j, b in enumerate(batches):
                    o = self._forward(model, b, return_routes=True)
                    old[j] = _token_logprobs(o.logits / self.temperature, b["input_ids"])
                    old_copy[j], old_routes[j] = copy_share(o, b["input_ids"]), o.routes
        acc: dict[str, float] = defaultdict(float)
        n_tok = float(sum(b["mask"].sum() for b in batches))
        counts = None  # expert counts over the whole update (the metric)
        steps = [(e, m, js) for e in range(cfg.epochs) for m, js in enumerate(step_batches)]
        for epoch, m, js in steps:
            self.optimizer.zero_grad(set_to_none=True)
            step_counts = None  # this optimizer step's (the router-bias update)
            for j in js:
                b = batches[j]
                out = self._forward(model, b, return_routes=old_routes[j] is not None)
                logp_all = torch.log_softmax(out.logits[:, :-1] / self.temperature, dim=-1)
                new_lp = logp_all.gather(-1, b["input_ids"][:, 1:, None]).squeeze(-1)
                # minibatches == 1: pi_old equals pi_theta in value; its detached copy saves a forward
                old_lp = new_lp.detach() if old[j] is None else old[j]
                loss, st = policy_loss(new_lp, old_lp, b["sampler_logprobs"], b["mask"], b["adv"], cfg,
                                       normaliser)
                share = b["adv"].shape[0] / n_rows
                total = loss + share * out.aux_loss
                if self.reference is not None:
                    if ref[j] is None:  # the reference does not train: one forward per batch, every pass reuses it
                        with torch.no_grad():
                            # the reference routes by its own router, replay or not: pinning it to the
                            # sampler's experts would score a model nobody sampled from, and hide the
                            # policy's routing drift from the KL term
                            ref[j] = _token_logprobs(self.reference(b["input_ids"]).logits / self.temperature,
                                                     b["input_ids"])
                    log_r = ref[j] - new_lp
                    kl_tok = kl_estimate(log_r, cfg.kl_estimator) * b["mask"]
                    kl_sum = kl_tok.sum()
                    total = total + cfg.kl_coef * kl_sum / normaliser
                    acc["kl_ref_sum"] += float(kl_sum.detach())
                    acc["kl_ref_token_max"] = max(acc["kl_ref_token_max"], float(kl_tok.detach().max()))
                total.backward()
                mask = b["mask"]
                with torch.no_grad():
                    ent = -(logp_all.exp() * logp_all).sum(-1)
                    # log pi_sampler - log pi_old on policy tokens (where, not a product: a masked
                    # position's -inf logprob would make inf * 0 = NaN, and max() would hide it)
                    delta = torch.where(mask > 0, b["sampler_logprobs"] - old_lp, 0.0)
                    r = torch.exp(-delta)
                    acc["entropy_sum"] += float((ent * mask).sum())
                    acc["abs_delta_sum"] += float(delta.abs().sum())
                    acc["max_abs_delta"] = max(acc["max_abs_delta"], float(delta.abs().max()))
                    # how far this update has already moved a sampled token's logprob (0 in the first minibatch)
                    signed = torch.where(mask > 0, new_lp.detach() - old_lp, 0.0)
                    moved = signed.abs()
                    cs = old_copy[j] if old_copy[j] is not None else copy_share(out, b["input_ids"])
                    top = int(moved.argmax())
                    if float(moved.flatten()[top]) > acc["policy_move_max"]:
                        row, col = divmod(top, moved.shape[1])
                        adv = b["adv"][row] if b["adv"].dim() == 1 else b["adv"][row, col]
                        acc |= {"policy_move_max": float(moved[row, col]), "policy_move_max_signed":
                                float(signed[row, col]), "policy_move_max_adv": float(adv),
                                "policy_move_max_old_logprob": float(old_lp[row, col]),
                                # the token itself (decode with the run's tokenizer) and the entropy at
                                # its position as this forward (after the move) scores it
                                "policy_move_max_token": float(b["input_ids"][row, col + 1]),
                                "policy_move_max_entropy": float(ent[row, col]),
                                "policy_move_max_copy_share": float(cs[row, col]) if cs is not None else 0.0}
                    far = (moved > MOVED_NATS).float()
                    if (m > 0 or epoch > 0) and old_routes[j] is not None and out.routes is not None:
                        # after an optimizer step: did the position's experts change (any layer)?
                        changed = route_changed(old_routes[j], out.routes)[:, :-1].float()
                        acc["scored_after_step"] += float(mask.sum())
                        acc["route_changed"] += float((changed * mask).sum())
                        acc["moved_after_step"] += float(far.sum())
                        acc["moved_route_changed"] += float((changed * far).sum())
                    if cs is not None:
                        acc["copy_share_sum"] += float((cs * mask).sum())
                        acc["moved_tokens"] += float(far.sum())
                        acc["moved_copy_share_sum"] += float((cs * far).sum())
                    acc["kl_sampler_sum"] += float(((r - 1 + delta) * mask).sum())  # k3 of KL(sampler||trainer)
                    acc["loss"] += float(loss.detach())
                    acc["aux_loss"] += share * float(out.aux_loss.detach())
                    for k, v in st.items():
                        acc[k] += float(v)
                    c = out.expert_counts.detach()
                    counts = c if counts is None else counts + c
                    step_counts = c if step_counts is None else step_counts + c
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), self.grad_clip)
            acc["grad_norm"] = max(acc["grad_norm"], float(grad_norm))
            acc["lr"] = self._warmup()
            self.optimizer.step()
            if step_counts is not None:
                model.update_router_bias(step_counts)
        model.eval()
        if cfg.epochs > 1:  # sums over every pass: per-pass means (maxima stay maxima)
            for k in ("loss", "aux_loss", "entropy_sum", "abs_delta_sum", "kl_sampler_sum", "kl_ref_sum",
                      "copy_share_sum", "moved_tokens", "moved_copy_share_sum", "tis_clipped", "ppo_clipped",
                      "tis_weight_sum"):
                acc[k] /= cfg.epochs
        metrics |= {
            "stepped": 1.0, "lr": acc["lr"], "loss": acc["loss"], "aux_loss": acc["aux_loss"],
            "grad_norm": acc["grad_norm"],
            "policy_tokens": n_tok, "entropy": acc["entropy_sum"] / max(n_tok, 1.0),
            "logprob_diff_mean": acc["abs_delta_sum"] / max(n_tok, 1.0),
            "logprob_diff_max": acc["max_abs_delta"], "kl_sampler_trainer": acc["kl_sampler_sum"] / max(n_tok, 1.0),
            "tis_clipped_frac": acc["tis_clipped"] / max(n_tok, 1.0),
            "tis_weight_mean": acc["tis_weight_sum"] / max(n_tok, 1.0),
            "ppo_clipped_frac": acc["ppo_clipped"] / max(n_tok, 1.0),
            "policy_move_max": acc["policy_move_max"], "policy_move_max_signed": acc["policy_move_max_signed"],
            "policy_move_max_adv": acc["policy_move_max_adv"], "policy_move_max_old_logprob":
            acc["policy_move_max_old_logprob"], "policy_move_max_token": acc["policy_move_max_token"],
            "policy_move_max_entropy": acc["policy_move_max_entropy"],
            "expert_balance": expert_balance(counts) if counts is not None else 1.0,
        }
        if acc["scored_after_step"]:
            # MoE routing flips: the share of policy tokens scored after an optimizer step whose position
            # now routes to other experts, against that share among the tokens that moved > MOVED_NATS
            metrics["route_changed_share"] = acc["route_changed"] / acc["scored_after_step"]
            if acc["moved_after_step"]:
                metrics["moved_route_changed_share"] = acc["moved_route_changed"] / acc["moved_after_step"]
        if model.copy is not None:
            # which tokens move: the pointer's share of their probability before the update, against
            # that share over all policy tokens (the base rate)
            metrics |= {"copy_share": acc["copy_share_sum"] / max(n_tok, 1.0), "moved_tokens": acc["moved_tokens"],
                        "policy_move_max_copy_share": acc["policy_move_max_copy_share"]}
            if acc["moved_tokens"]:
                metrics["moved_copy_share"] = acc["moved_copy_share_sum"] / acc["moved_tokens"]
        if self.reference is not None:
            # per policy token (the loss term is this times policy_tokens / (rows * norm_tokens))
            metrics["kl_ref"] = acc["kl_ref_sum"] / max(n_tok, 1.0)
            # the largest single token's k3: a mean of several units is a few tokens far off, or many a little
            metrics["kl_ref_token_max"] = acc["kl_ref_token_max"]
        return metrics


def token_advantages(rows: Sequence[tuple[Rollout, float]], bad: Sequence[set[int]], c: float,
                     width: int) -> torch.Tensor:
    """``[B, width]`` per predicted position (position ``t`` predicts token ``t+1``): each row's
    advantage, and ``min(A, -c)`` where the predicted token belongs to a segment in ``bad[i]``
    (the malformed calls, :func:`malformed_call_segments`)."""
    import torch

    out = torch.zeros(len(rows), width)
    for i, ((r, adv), segs) in enumerate(zip(rows, bad, strict=True)):
        out[i] = adv
        pos = 0
        for k, s in enumerate(r.segments):
            n = len(s.token_ids)
            if k in segs and n:
                out[i, max(pos - 1, 0): pos - 1 + n] = min(adv, -c)
            pos += n
    return out


def _malformed_credit(rows: Sequence[tuple[Rollout, float]], *, mask_positive: bool
                      ) -> tuple[list[set[int]], list[set[int]], dict[str, float]]:
    """Per row, its malformed calls' segments (:func:`malformed_call_segments`; empty when
    unmatched) and the segments to leave out of the loss (those of positive-advantage rows, when
    ``mask_positive``); and the measurements: ``positive_malformed_token_frac`` (share of
    positive-advantage sampled tokens in malformed calls), ``malformed_tokens_unreinforced``
    (tokens actually masked) and ``n_credit_unaligned`` (rows whose calls could not be matched)."""
    bad_segs: list[set[int]] = []
    drop: list[set[int]] = []
    pos_tokens = pos_bad = masked = 0
    unaligned = 0
    for r, adv in rows:
        segs = malformed_call_segments(r)
        if segs is None:
            unaligned += 1
            segs = set()
        bad_segs.append(segs)
        if adv > 0:
            pos_tokens += _sampled_tokens(r)
            bad = sum(len(r.segments[k].token_ids) for k in segs)
            pos_bad += bad
            if mask_positive:
                masked += bad
                drop.append(segs)
                continue
        drop.append(set())
    return bad_segs, drop, {"positive_malformed_token_frac": pos_bad / pos_tokens if pos_tokens else 0.0,
                  "malformed_tokens_unreinforced": float(masked), "n_credit_unaligned": float(unaligned)}


def route_changed(before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` bool: whether a position's experts differ between two forwards' routes
    (``[B, T, n_moe_layers, top_k]`` expert ids) in any layer, as sets (top-k order ignored)."""
    return (before.sort(dim=-1).values != after.sort(dim=-1).values).flatten(2).any(-1)


def copy_share(out: ModelOutput, input_ids: torch.Tensor) -> torch.Tensor | None:
    """``[B, T-1]``: the share of each next token's probability that the copy head's pointer gives
    (1 - the LM side's share, ``agent.model.copy_head``), at temperature 1; None for a model
    without a copy head. Not a gradient path (callers use it under ``no_grad``)."""
    import torch

    if out.lm_side is None:
        return None
    ids = input_ids[:, 1:, None]
    mix = out.logits[:, :-1].gather(-1, ids).squeeze(-1)
    lm = out.lm_side[:, :-1].gather(-1, ids).squeeze(-1)
    return (1.0 - torch.exp(lm - mix)).clamp(0.0, 1.0)


def _token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    import torch

    return torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)
