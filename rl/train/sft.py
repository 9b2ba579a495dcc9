"""SFT warm start: next-token loss on the policy's own tokens of demonstrations
(:mod:`rl.train.demos`), trained until the held-out loss stops improving.

* Loss: mean cross-entropy over the tokens of ``sampled`` segments (the model's outputs
  and their closing ``<|end|>``); prompt, tool results and markers are context only. A
  per-token mean (unlike GRPO's constant normaliser: SFT has no advantage whose scale it
  would distort).
* Early stopping: every ``eval_every`` steps the held-out loss is measured; after
  ``patience`` evaluations without a new best the run stops, and the weights of the best
  evaluation are restored — the honest start RL is measured against. The curve (step,
  train loss, held-out loss) is returned and written by the caller.
* Budget: at most ``max_epochs`` epochs and, when set, ``max_steps`` optimizer steps (the
  last step is always evaluated).
* Data order: shuffled per epoch by ``random.Random(seed + epoch)``, batched by length within
  buckets of 16 batches (less padding: sequences are 0.5-2k tokens), batch order shuffled.

Not guaranteed: that the held-out loss ever improves (a model too small for the data
stops after ``patience`` evaluations with its initial weights restored).
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rl.types import Rollout, RolloutStatus, Segment

if TYPE_CHECKING:
    from agent.model.transformer import MoETransformer
    from rl.config import SFTConfig

__all__ = ["SFTResult", "sft_loss", "train_sft"]


@dataclass
class SFTResult:
    curve: list[dict[str, float]] = field(default_factory=list)  # {"step", "train_loss", "heldout_loss"}
    best_step: int = 0
    best_heldout_loss: float = float("inf")
    steps: int = 0
    stopped_early: bool = False


def _as_rollout(segments: Sequence[Segment]) -> Rollout:
    return Rollout(run_id="sft", iteration=0, task_id="demo", sample=0, status=RolloutStatus.FINISHED,
                   segments=list(segments))


def sft_loss(model: MoETransformer, examples: Sequence[Sequence[Segment]], pad_id: int, *,
             user_id: int | None = None, copy_weight: float = 1.0, exit_weight: float = 1.0,
             format_ids: frozenset[int] = frozenset(), copy_stats: dict[str, float] | None = None) -> Any:
    """Mean next-token cross-entropy over the sampled tokens of ``examples`` (one batch). With
    ``user_id`` (the ``<|user|>`` id) and ``format_ids``, copy tokens (:mod:`rl.train.copy_tokens`) weigh
    ``copy_weight`` times as much in the mean and exits (the token after a copied span)
    ``exit_weight`` times, and ``copy_stats`` (when given) accumulates both kinds' count, summed
    loss and argmax hits (``copy_tokens``, ``copy_nll``, ``copy_correct``, ``exit_*`` alike)."""
    import torch

    from rl.train.grpo import token_tensors

    t = token_tensors([_as_rollout(e) for e in examples], pad_id, max_len=model.cfg.max_seq_len)
    out = model(t["input_ids"])
    logp = torch.log_softmax(out.logits[:, :-1], dim=-1).gather(-1, t["input_ids"][:, 1:, None]).squeeze(-1)
    mask = weights = t["mask"]
    if user_id is not None:
        from rl.train.copy_tokens import copy_flags, exit_flags

        copies = torch.zeros_like(mask)
        exits = torch.zeros_like(mask)
        for i, e in enumerate(examples):
            flags = copy_flags(e, user_id, format_ids)
            n = min(len(flags) - 1, copies.shape[1])  # token_tensors may cut an example at max_len
            copies[i, :n] = torch.tensor(flags[1:n + 1], dtype=mask.dtype)
            exits[i, :n] = torch.tensor(exit_flags(e, flags)[1:n + 1], dtype=mask.dtype)
        weights = mask + (copy_weight - 1.0) * copies + (exit_weight - 1.0) * exits
        if copy_stats is not None:
            hits = (out.logits[:, :-1].argmax(-1) == t["input_ids"][:, 1:]).to(mask.dtype)
            for kind, flags_t in (("copy", copies), ("exit", exits)):
                copy_stats[f"{kind}_tokens"] = copy_stats.get(f"{kind}_tokens", 0.0) + float(flags_t.sum())
                copy_stats[f"{kind}_nll"] = copy_stats.get(f"{kind}_nll", 0.0) - float((logp * flags_t).sum())
                copy_stats[f"{kind}_correct"] = copy_stats.get(f"{kind}_correct", 0.0) + float((hits * flags_t).sum())
    return -(logp * weights).sum() / weights.sum().clamp_min(1.0) + out.aux_loss


_BUCKET = 16  # batches per length bucket


def _batches(examples: Sequence[Sequence[Segment]], size: int, rng: random.Random) -> list[list[int]]:
    """One epoch's batches of indices: shuffled, then sorted by length within buckets of
    ``_BUCKET`` batches (so a batch pads little), then the batches shuffled again."""
    order = list(range(len(examples)))
    rng.shuffle(order)
    length = [sum(len(s.token_ids) for s in e) for e in examples]
    out: list[list[int]] = []
    for b in range(0, len(order), size * _BUCKET):
        chunk = sorted(order[b: b + size * _BUCKET], key=lambda j: length[j])
        out += [chunk[i: i + size] for i in range(0, len(chunk), size)]
    rng.shuffle(out)
    return out


def train_sft(model: MoETransformer, train: Sequence[Sequence[Segment]], heldout: Sequence[Sequence[Segment]],
              cfg: SFTConfig, *, pad_id: int, seed: int = 0, grad_clip: float = 1.0,
              user_id: int | None = None, format_ids: frozenset[int] = frozenset(),
              progress: Callable[[dict[str, float]], None] | None = None) -> SFTResult:
    """Train ``model`` in place on ``train`` with early stopping on ``heldout`` (see the module
    docstring). With ``user_id`` the loss weighs copy tokens ``cfg.copy_weight`` times (train and
    held-out alike: early stopping watches what is trained), and every curve point also has the
    held-out copy tokens' mean loss and argmax accuracy (``heldout_copy_loss``, ``heldout_copy_acc``), and the
    exits' (``heldout_exit_loss``, ``heldout_exit_acc``; weighed ``cfg.exit_weight`` times)."""
    import torch

    if not train or not heldout:
        raise ValueError(f"SFT needs training and held-out demonstrations (got {len(train)} and {len(heldout)})")
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    result = SFTResult()

    kw: dict[str, Any] = {"user_id": user_id, "copy_weight": cfg.copy_weight, "exit_weight": cfg.exit_weight,
                          "format_ids": format_ids}
    copy_point: dict[str, float] = {}

    def evaluate() -> float:
        model.eval()
        stats: dict[str, float] = {}
        with torch.no_grad():
            losses = [float(sft_loss(model, heldout[i: i + cfg.batch], pad_id, copy_stats=stats, **kw))
                      * len(heldout[i: i + cfg.batch]) for i in range(0, len(heldout), cfg.batch)]
        copy_point.clear()
        for kind in ("copy", "exit"):
            if stats.get(f"{kind}_tokens"):
                copy_point.update({f"heldout_{kind}_loss": stats[f"{kind}_nll"] / stats[f"{kind}_tokens"],
                                   f"heldout_{kind}_acc": stats[f"{kind}_correct"] / stats[f"{kind}_tokens"]})
        return sum(losses) / len(heldout)

    best_state = copy.deepcopy(model.state_dict())
    result.best_heldout_loss = evaluate()
    result.curve.append({"step": 0, "train_loss": float("nan"), "heldout_loss": result.best_heldout_loss}
                        | copy_point)
    bad, step, recent = 0, 0, []
    for epoch in range(cfg.max_epochs):
        for batch in _batches(train, cfg.batch, random.Random(seed + epoch)):
            model.train()
            loss = sft_loss(model, [train[j] for j in batch], pad_id, **kw)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            opt.step()
            step += 1
            recent.append(float(loss.detach()))
            last = cfg.max_steps is not None and step >= cfg.max_steps
            if step % cfg.eval_every and not last:
                continue
            held = evaluate()
            point = {"step": float(step), "train_loss": sum(recent) / len(recent),
                     "heldout_loss": held} | copy_point
            recent = []
            result.curve.append(point)
            if progress is not None:
                progress(point)
            if held < result.best_heldout_loss:
                result.best_heldout_loss, result.best_step, bad = held, step, 0
                best_state = copy.deepcopy(model.state_dict())
            else:
                bad += 1
                if bad >= cfg.patience:
                    result.stopped_early = True
                    break
            if last:
                break
        if result.stopped_early or (cfg.max_steps is not None and step >= cfg.max_steps):
            break
    result.steps = step
    model.load_state_dict(best_state)
    model.eval()
    # the JSON-safe curve: no NaN for the step-0 point's missing train loss
    result.curve[0]["train_loss"] = result.curve[1]["train_loss"] if len(result.curve) > 1 else 0.0
    return result
