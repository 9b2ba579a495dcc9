"""GRPO: advantages, selection, masking, clipping, TIS, zero-variance skip, and a gradient check."""

from __future__ import annotations

import math

import pytest
import torch

from agent.model.transformer import MoETransformer
from rl.config import GRPOConfig
from rl.train.grpo import (
    GRPOTrainer,
    copy_share,
    RoutingReplayUnavailable,
    group_advantages,
    kl_estimate,
    length_terms,
    malformed_call_segments,
    micro_batches,
    pad_share,
    policy_loss,
    route_changed,
    select_rollouts,
    token_advantages,
    token_tensors,
)
from rl.types import Rollout, RolloutStatus
from tests.rl.train.helpers import VOCAB, rollout, tiny_model, with_routes


def test_leave_one_out_advantages_without_std() -> None:
    assert group_advantages([1.0, 0.0, 0.0, 0.0]) == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3])
    assert group_advantages([0.5, 0.5]) == [0.0, 0.0]
    assert sum(group_advantages([0.3, 1.0, 0.1])) == pytest.approx(0.0)


def test_std_normalisation_is_an_option() -> None:
    plain = group_advantages([1.0, 0.0])
    normed = group_advantages([1.0, 0.0], std_normalise=True)
    assert plain == [1.0, -1.0]
    assert normed == pytest.approx([1.0 / (0.5 + 1e-6), -1.0 / (0.5 + 1e-6)])
    with pytest.raises(ValueError, match="at least 2"):
        group_advantages([1.0])


def test_negative_advantages_can_be_scaled_down() -> None:
    assert group_advantages([1.0, 0.0, 0.0, 0.0], neg_scale=0.25) == pytest.approx([1.0, -1 / 12, -1 / 12, -1 / 12])
    assert group_advantages([1.0, 0.0, 0.0], neg_scale=0.0) == [1.0, 0.0, 0.0]
    # applied after std normalisation, to negative advantages only
    normed = group_advantages([1.0, 0.0], std_normalise=True, neg_scale=0.5)
    assert normed == pytest.approx([1.0 / (0.5 + 1e-6), -0.5 / (0.5 + 1e-6)])
    rs = [rollout(None, [1, 2], [[3]], task="a", sample=0, reward=1.0),
          rollout(None, [1, 2], [[4]], task="a", sample=1, reward=0.0)]
    sel = select_rollouts(rs, GRPOConfig(group_size=2, neg_adv_scale=0.5))
    assert [a for _, a in sel.rows] == [1.0, -0.5]
    with pytest.raises(ValueError):
        GRPOConfig(neg_adv_scale=1.5)


@pytest.mark.parametrize(("scale", "rises"), [(1.0, False), (0.25, True)])
def test_long_failures_push_down_a_token_they_share_with_the_success_unless_scaled(scale: float,
                                                                                  rises: bool) -> None:
    """Token 5 (think: tool-call syntax) opens every call. The success makes one call, each of the
    three failures three. At its first position the group's advantages cancel (LOO sums to zero),
    but its later uses in the failures push its shared weights down; a scale of 0.25 outweighs them."""
    model = tiny_model(seed=1)
    prompt = [1, 2, 3]
    rs = [rollout(model, prompt, [[5, 10]], sample=0, reward=1.0)]
    rs += [rollout(model, prompt, [[5, 20 + i], [5, 30 + i], [5, 40 + i]], sample=i + 1, reward=0.0,
                   between=[7, 8])
           for i in range(3)]

    def first_lp() -> float:
        return float(model.logprobs(torch.tensor([prompt + [5]]))[0][-1])

    before = first_lp()
    GRPOTrainer(model, GRPOConfig(group_size=4, norm_tokens=4, neg_adv_scale=scale), pad_id=0, lr=1e-2).step(rs)
    assert (first_lp() > before + 1e-4) if rises else (first_lp() < before - 1e-4)


def test_selection_excludes_infra_errors_and_skips_zero_variance_groups() -> None:
    rs = [rollout(None, [1, 2], [[3]], task="a", sample=0, reward=1.0),
          rollout(None, [1, 2], [[3]], task="a", sample=1, reward=1.0),
          rollout(None, [1, 2], [[3]], task="a", sample=2, reward=0.0, status=RolloutStatus.INFRA_ERROR),
          rollout(None, [1, 2], [[3]], task="b", sample=0, reward=1.0),
          rollout(None, [1, 2], [[4]], task="b", sample=1, reward=0.0)]
    sel = select_rollouts(rs, GRPOConfig(group_size=2))
    # without the infra error task a has no variance: skipped, never trained as a zero
    assert sel.n_infra_excluded == 1
    assert sel.n_groups == 2 and sel.n_groups_zero_std == 1 and sel.frac_reward_zero_std == 0.5
    assert [(r.task_id, r.sample, a) for r, a in sel.rows] == [("b", 0, 1.0), ("b", 1, -1.0)]


def test_a_rollout_with_no_sampled_token_counts_in_the_baseline_but_is_not_trained_on() -> None:
    # the wall-time limit hit during the first model call: scored (a limit), but no token
    cut = rollout(None, [1, 2], [], task="a", sample=2, reward=-0.1, status=RolloutStatus.LIMIT)
    rs = [rollout(None, [1, 2], [[3]], task="a", sample=0, reward=1.0),
          rollout(None, [1, 2], [[4]], task="a", sample=1, reward=0.0), cut]
    sel = select_rollouts(rs, GRPOConfig(group_size=3))
    assert sel.n_no_tokens == 1 and sel.stats()["n_no_tokens"] == 1
    assert [(r.sample, a) for r, a in sel.rows] == [(0, pytest.approx(1.05)), (1, pytest.approx(-0.45))]


def test_compact_filtering_drops_limit_rollouts() -> None:
    rs = [rollout(None, [1], [[3]], task="a", sample=i, reward=float(i % 2),
                  status=RolloutStatus.LIMIT if i == 0 else RolloutStatus.FINISHED) for i in range(3)]
    assert select_rollouts(rs, GRPOConfig()).n_limit_filtered == 0
    sel = select_rollouts(rs, GRPOConfig(compact_filtering=True))
    assert sel.n_limit_filtered == 1 and [r.sample for r, _ in sel.rows] == [1, 2]


def test_masked_tokens_get_no_gradient() -> None:
    r = rollout(None, [1, 2, 3], [[4, 5]], between=[6])
    t = token_tensors([r], 0, max_len=64)
    # positions predict tokens 1..4: only the last two (tokens 4, 5) are sampled
    assert t["mask"].tolist() == [[0.0, 0.0, 1.0, 1.0]]
    cfg = GRPOConfig()
    new = torch.randn(1, 4, requires_grad=True)
    loss, _ = policy_loss(new, new.detach(), torch.zeros(1, 4), t["mask"], torch.tensor([1.0]), cfg, 10.0)
    loss.backward()
    assert new.grad is not None and new.grad[0, :2].abs().sum() == 0 and new.grad[0, 2:].abs().min() > 0
    changed = new.detach().clone()
    changed[0, :2] += 5.0  # a masked token's logprob changes: the loss does not
    loss2, _ = policy_loss(changed, changed, torch.zeros(1, 4), t["mask"], torch.tensor([1.0]), cfg, 10.0)
    old_masked = new.detach().clone()
    loss1, _ = policy_loss(old_masked, old_masked, torch.zeros(1, 4), t["mask"], torch.tensor([1.0]), cfg, 10.0)
    assert float(loss2) == pytest.approx(float(loss1))


def _grad(ratio: float, adv: float, cfg: GRPOConfig) -> float:
    new = torch.tensor([[math.log(ratio)]], requires_grad=True)
    old = torch.zeros(1, 1)
    loss, _ = policy_loss(new, old, old, torch.ones(1, 1), torch.tensor([adv]), cfg, 1.0)
    loss.backward()
    assert new.grad is not None
    return float(new.grad[0, 0])


def test_clip_is_asymmetric_clip_high() -> None:
    cfg = GRPOConfig(eps_low=0.2, eps_high=0.28)
    assert _grad(1.25, 1.0, cfg) < 0  # within 1 + eps_high: still pushed up (a symmetric 0.2 clip would stop it)
    assert _grad(1.30, 1.0, cfg) == 0  # beyond 1 + eps_high with A > 0: clipped
    assert _grad(0.75, -1.0, cfg) == 0  # below 1 - eps_low with A < 0: clipped
    assert _grad(0.75, 1.0, cfg) < 0  # pessimistic min: a low ratio with A > 0 is never clipped
    assert _grad(1.5, -1.0, cfg) > 0  # nor a high ratio with A < 0


def test_tis_weights_cap_the_sampler_trainer_ratio() -> None:
    cfg = GRPOConfig(tis_clip=2.0)
    new = torch.zeros(1, 3, requires_grad=True)
    sampler = torch.tensor([[-math.log(1.5), -math.log(3.0), 0.0]])  # pi_old/pi_sampler = 1.5, 3 (capped), 1
    loss, st = policy_loss(new, new.detach(), sampler, torch.ones(1, 3), torch.tensor([1.0]), cfg, 1.0)
    loss.backward()
    assert new.grad is not None
    assert new.grad[0].tolist() == pytest.approx([-1.5, -2.0, -1.0])
    assert float(st["tis_clipped"]) == 1 and float(st["tis_weight_sum"]) == pytest.approx(4.5)


def test_zero_variance_iteration_takes_no_step() -> None:
    model = tiny_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = GRPOTrainer(model, GRPOConfig(), pad_id=0, lr=1e-2)
    m = trainer.step([rollout(model, [1, 2], [[3, 4]], sample=i, reward=1.0) for i in range(4)])
    assert m["stepped"] == 0 and m["frac_reward_zero_std"] == 1.0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_update_lowers_negative_advantage_tokens_and_raises_positive_ones() -> None:
    model = tiny_model()
    prompt = [1, 2, 3, 7]
    good, bad = [10, 11, 12], [20, 21, 22]
    rs = [rollout(model, prompt, [good], sample=0, reward=1.0), rollout(model, prompt, [bad], sample=1, reward=0.0)]

    def seq_lp(tokens: list[int]) -> float:
        lp = model.logprobs(torch.tensor([prompt + tokens]))[0]
        return float(lp[len(prompt) - 1:].sum())

    good0, bad0 = seq_lp(good), seq_lp(bad)
    trainer = GRPOTrainer(model, GRPOConfig(norm_tokens=4), pad_id=0, lr=1e-2)
    m = trainer.step(rs)
    assert m["stepped"] == 1 and math.isfinite(m["loss"]) and m["grad_norm"] > 0
    assert m["logprob_diff_max"] < 1e-4  # sampler logprobs are the model's own: TIS weights ~1
    assert seq_lp(bad) < bad0 - 1e-3 and seq_lp(good) > good0 + 1e-3


def test_the_trainer_optimises_the_tempered_policy_its_rollouts_were_sampled_from() -> None:
    """Rollouts sampled at T = 0.5 record log_softmax(logits / 0.5): a trainer at 0.5 computes the
    same numbers (TIS weights ~1); one at T = 1 would see a large sampler/trainer gap."""
    prompt, seqs = [1, 2, 3, 7], [[10, 11, 12], [20, 21, 22]]
    deltas = {}
    for t in (0.5, 1.0):
        model = tiny_model()
        rs = [rollout(model, prompt, [s], sample=i, reward=float(i == 0), temperature=0.5) for i, s in enumerate(seqs)]
        deltas[t] = GRPOTrainer(model, GRPOConfig(norm_tokens=4), pad_id=0, lr=1e-2, temperature=t).step(rs)
    assert deltas[0.5]["stepped"] == 1 and deltas[0.5]["logprob_diff_max"] < 1e-4
    assert deltas[1.0]["logprob_diff_max"] > 1e-2
    with pytest.raises(ValueError, match="temperature"):
        GRPOTrainer(tiny_model(), GRPOConfig(), pad_id=0, lr=1e-2, temperature=0.0)


def test_kl_term_is_zero_at_the_start_and_grows_per_token_after_a_step() -> None:
    model = tiny_model()
    rs = [rollout(model, [1, 2], [[3 + i, 4, 9]], sample=i, reward=float(i % 2)) for i in range(4)]
    trainer = GRPOTrainer(model, GRPOConfig(kl_coef=0.1, norm_tokens=4), pad_id=0, lr=5e-2)
    first = trainer.step(rs)
    assert first["kl_ref"] == pytest.approx(0.0, abs=1e-6)  # the reference is the start's weights
    rs = [rollout(model, [1, 2], [[3 + i, 4, 9]], sample=i, reward=float(i % 2)) for i in range(4)]
    second = trainer.step(rs)
    # a per-token mean of a non-negative estimator: positive, and independent of the minibatching
    assert 0.0 < second["kl_ref"] < 10.0
    # the mean is over tokens, the max is one token's: at least the mean, at most the sum
    assert second["kl_ref"] <= second["kl_ref_token_max"] <= second["kl_ref"] * second["policy_tokens"]
    assert "kl_ref" not in GRPOTrainer(tiny_model(), GRPOConfig(), pad_id=0, lr=1e-3).step(rs)


def test_micro_batches_sort_rows_by_length_inside_each_optimizer_step_only() -> None:
    lengths = [9, 2, 8, 3, 7, 1, 6, 5, 4]
    plain = micro_batches(lengths, 2, 2, sort=False)
    # 5 micro-batches over 2 steps: 3 per step (rows 0-5, then 6-8)
    assert plain == [[[0, 1], [2, 3], [4, 5]], [[6, 7], [8]]]
    assert micro_batches(lengths, 2, 2, sort=True) == [[[5, 1], [3, 4], [2, 0]], [[8, 7], [6]]]
    # more steps asked than micro-batches: one micro-batch per step; fewer rows than a micro-batch: one
    assert micro_batches(lengths[:3], 2, 5, sort=True) == [[[1, 0]], [[2]]]
    assert micro_batches(lengths[:1], 4, 4, sort=True) == [[[0]]] and micro_batches([], 4, 4, sort=True) == []
    for n in range(0, 12):
        for size in (1, 2, 3, 4):
            for steps in (1, 2, 3, 4, 5):
                a, b = micro_batches(lengths[:n] + [0] * max(0, n - 9), size, steps, sort=False), \
                    micro_batches(lengths[:n] + [0] * max(0, n - 9), size, steps, sort=True)
                assert [i for st in a for c in st for i in c] == list(range(n))  # index order, every row once
                assert [len(st) for st in a] == [len(st) for st in b] and len(a) <= steps
                for sa, sb in zip(a, b, strict=True):  # the same rows share each optimizer step
                    assert sorted(i for c in sa for i in c) == sorted(i for c in sb for i in c)
    assert pad_share([4, 4], [[[0, 1]]]) == 0.0
    assert pad_share([1, 3], [[[0, 1]]]) == pytest.approx(1 - 4 / 6)
    assert pad_share(lengths, micro_batches(lengths, 2, 2, sort=True)) < pad_share(lengths, plain)


def test_sorted_micro_batches_train_the_same_policy_with_less_padding() -> None:
    """Without the MoE auxiliary loss (which sees each forward's row mix) the update is the same."""
    rs = [rollout(None, [1, 2], [[3 + i % 5] * (1 + 7 * (i % 3)), [4, 9]], sample=i, reward=float(i % 2))
          for i in range(8)]
    out = {}
    for sort in (False, True):
        model = tiny_model()
        trainer = GRPOTrainer(model, GRPOConfig(minibatches=2, micro_batch=2, sort_micro_batches=sort,
                                                aux_loss_coef=0.0), pad_id=0, lr=1e-2)
        grads: list[torch.Tensor] = []
        step = trainer.optimizer.step

        def record(*a, step=step, grads=grads, model=model, **k):
            grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
            return step(*a, **k)

        trainer.optimizer.step = record
        out[sort] = (trainer.step(rs), grads)
    (m_plain, g_plain), (m_sorted, g_sorted) = out[False], out[True]
    assert m_sorted["pad_share"] < m_plain["pad_share"] == m_plain["pad_share_unsorted"]
    assert m_sorted["pad_share_unsorted"] == m_plain["pad_share"]
    # each optimizer step's gradient is the same up to float summation order (compare gradients, not
    # weights: Adam turns a 1e-9 float difference in a ~0 gradient into a step of ~lr)
    assert len(g_plain) == len(g_sorted) == 2
    for a, b in zip(g_plain, g_sorted, strict=True):
        scale = float(a.abs().max())
        assert scale > 1e-6 and torch.allclose(a, b, rtol=1e-4, atol=1e-4 * scale)
    assert m_sorted["loss"] == pytest.approx(m_plain["loss"], abs=1e-6)


def test_the_reference_scores_each_batch_once_however_many_passes() -> None:
    model = tiny_model()
    # rows of different lengths: a cached reference row used for another row would not even fit
    rs = [rollout(model, [1, 2], [[3 + i, 4, 9][: 1 + i % 3] + [7] * i], sample=i, reward=float(i % 2))
          for i in range(4)]
    cfg = GRPOConfig(kl_coef=0.1, minibatches=2, micro_batch=1, epochs=2, sort_micro_batches=False)
    trainer = GRPOTrainer(model, cfg, pad_id=0, lr=5e-2)
    calls = []
    forward = trainer.reference.forward
    trainer.reference.forward = lambda *a, **k: calls.append(a[0].shape) or forward(*a, **k)
    m = trainer.step(rs)
    assert len(calls) == 4  # four micro-batches, two passes: one forward each
    assert sorted(calls) == sorted(torch.Size([1, len(r.token_ids)]) for r in rs)
    # reused, not stale: scored after the first steps, the policy has left the reference
    assert trainer.optimizer_steps == 4 and 0.0 < m["kl_ref"] <= m["kl_ref_token_max"]


def test_the_router_bias_moves_by_each_optimizer_steps_own_expert_counts() -> None:
    rs = [rollout(None, [1, 2], [[3 + i, 4, 9]], sample=i, reward=float(i % 2)) for i in range(4)]
    seen = []
    model = tiny_model(router_bias_rate=0.01)
    model.update_router_bias = lambda counts: seen.append(counts.clone())
    GRPOTrainer(model, GRPOConfig(minibatches=2, micro_batch=1), pad_id=0, lr=1e-2).step(rs)
    assert len(seen) == 2
    # each step forwards two 5-token rows through top-k routing: its own counts, not a running total
    per_step = 2 * len(rs[0].token_ids) * model.cfg.top_k
    assert [float(c[0].sum()) for c in seen] == [per_step, per_step]


def test_k2_kl_pulls_a_fallen_token_back_linearly_where_k3_pulls_exponentially() -> None:
    ref = torch.tensor([-1.0, -1.0, -1.0])
    new = torch.tensor([-1.0, -2.0, -10.0], requires_grad=True)  # a token 0, 1 and 9 nats below the start
    grads = {}
    for est in ("k3", "k2"):
        (g,) = torch.autograd.grad(kl_estimate(ref - new, est).sum(), new)
        grads[est] = g
    assert grads["k3"] == pytest.approx([0.0, 1 - math.e, 1 - math.exp(9)], rel=1e-5)
    assert grads["k2"] == pytest.approx([0.0, -1.0, -9.0], rel=1e-5)  # gradient = -(log ref - log new)
    assert float(kl_estimate(torch.tensor([0.0]), "k2")) == 0.0
    with pytest.raises(ValueError, match="k4"):
        kl_estimate(ref, "k4")  # type: ignore[arg-type]
    model = tiny_model()
    rs = [rollout(model, [1, 2], [[3 + i, 4, 9]], sample=i, reward=float(i % 2)) for i in range(4)]
    trainer = GRPOTrainer(model, GRPOConfig(kl_coef=0.1, kl_estimator="k2", norm_tokens=4), pad_id=0, lr=5e-2)
    assert trainer.step(rs)["kl_ref"] == pytest.approx(0.0, abs=1e-9)
    rs = [rollout(model, [1, 2], [[3 + i, 4, 9]], sample=i, reward=float(i % 2)) for i in range(4)]
    assert trainer.step(rs)["kl_ref"] > 0.0


def test_warmup_ramps_the_first_steps_and_resumes_from_the_optimizer_state() -> None:
    def moved(warmup: int) -> tuple[float, GRPOTrainer]:
        model = tiny_model()
        before = {k: v.clone() for k, v in model.state_dict().items()}
        rs = [rollout(model, [1, 2], [[3 + i, 4]], sample=i, reward=float(i % 2)) for i in range(4)]
        trainer = GRPOTrainer(model, GRPOConfig(lr_warmup_steps=warmup), pad_id=0, lr=1e-2)
        m = trainer.step(rs)
        assert m["lr"] == pytest.approx(1e-2 / max(warmup, 1))
        return max(float((v - before[k]).abs().max()) for k, v in model.state_dict().items()), trainer

    full, _ = moved(0)
    ramped, trainer = moved(4)
    # Adam's first step is ~lr per coordinate whatever the gradient: a quarter of the rate, a quarter of the move
    assert full == pytest.approx(1e-2, rel=0.05) and ramped == pytest.approx(full / 4, rel=0.05)
    assert trainer.optimizer_steps == 1
    resumed = GRPOTrainer(trainer.model, GRPOConfig(lr_warmup_steps=4), pad_id=0, lr=1e-2)
    resumed.optimizer.load_state_dict(trainer.optimizer.state_dict())
    rs = [rollout(trainer.model, [1, 2], [[3 + i, 4]], sample=i, reward=float(i % 2)) for i in range(4)]
    assert resumed.step(rs)["lr"] == pytest.approx(1e-2 * 2 / 4)  # the ramp goes on where it was


def test_minibatches_compute_old_logprobs_and_train() -> None:
    model = tiny_model()
    rs = [rollout(model, [1, 2], [[3 + i, 4]], sample=i, reward=float(i % 2)) for i in range(4)]
    m = GRPOTrainer(model, GRPOConfig(minibatches=2, micro_batch=1), pad_id=0, lr=1e-2).step(rs)
    assert m["stepped"] == 1 and m["n_trained"] == 4 and math.isfinite(m["loss"])
    # the second minibatch is scored after the first's optimizer step: its tokens have moved
    assert m["policy_move_max"] > 0.0
    one = GRPOTrainer(tiny_model(), GRPOConfig(minibatches=1), pad_id=0, lr=1e-2).step(rs)
    assert one["policy_move_max"] == 0.0  # one optimizer step: nothing is scored after it


def test_epochs_take_more_off_policy_steps_from_the_same_rollouts_and_report_per_pass_means() -> None:
    rs = [rollout(tiny_model(), [1, 2], [[3 + i, 4]], sample=i, reward=float(i % 2)) for i in range(4)]
    one = GRPOTrainer(tiny_model(), GRPOConfig(minibatches=2, micro_batch=1), pad_id=0, lr=1e-2)
    two = GRPOTrainer(tiny_model(), GRPOConfig(minibatches=2, micro_batch=1, epochs=2), pad_id=0, lr=1e-2)
    m1, m2 = one.step(rs), two.step(rs)
    assert (one.optimizer_steps, two.optimizer_steps) == (2, 4)
    assert m2["policy_tokens"] == m1["policy_tokens"]
    # sums over the passes are divided back: a per-token mean, not twice one
    assert m2["entropy"] == pytest.approx(m1["entropy"], rel=0.05)
    assert m2["loss"] == pytest.approx(m1["loss"], rel=0.5, abs=1e-3)
    # the second pass is scored against pi_old (the sampling weights) after two more steps: it has moved further
    assert m2["policy_move_max"] > m1["policy_move_max"] > 0.0
    # one minibatch, two passes: pi_old gets its own forward, so the second pass sees how far the first moved
    m3 = GRPOTrainer(tiny_model(), GRPOConfig(minibatches=1, epochs=2), pad_id=0, lr=1e-2).step(rs)
    assert m3["policy_move_max"] > 0.0
    with pytest.raises(ValueError, match="epochs"):
        GRPOConfig(epochs=0)


def test_an_update_reports_which_tokens_moved_and_how_much_of_them_the_pointer_gave() -> None:
    model = tiny_model(copy_head=True)
    # prompts that repeat, so the pointer has something to point at
    rs = [rollout(model, [7, 8, 9, 10, 11, 12, 13, 14, 15, 7, 8, 9], [[10, 11, 12, 3 + i]], sample=i,
                  reward=float(i % 2)) for i in range(4)]
    m = GRPOTrainer(model, GRPOConfig(minibatches=2, micro_batch=1), pad_id=0, lr=5e-2).step(rs)
    assert 0.0 < m["copy_share"] < 1.0 and 0.0 <= m["policy_move_max_copy_share"] <= 1.0
    assert abs(m["policy_move_max_signed"]) == pytest.approx(m["policy_move_max"]) and m["policy_move_max"] > 0
    advs = group_advantages([0.0, 1.0, 0.0, 1.0])
    assert any(m["policy_move_max_adv"] == pytest.approx(a) for a in advs)  # the moved token's row's
    assert m["policy_move_max_old_logprob"] < 0.0
    assert m["policy_move_max_token"] in {10.0, 11.0, 12.0, 3.0, 4.0, 5.0, 6.0}  # a sampled token, never the prompt's
    assert 0.0 < m["policy_move_max_entropy"] <= math.log(VOCAB) + 1e-4
    assert m["moved_tokens"] >= 0 and ("moved_copy_share" in m) == (m["moved_tokens"] > 0)
    plain = GRPOTrainer(tiny_model(), GRPOConfig(minibatches=2, micro_batch=1), pad_id=0, lr=5e-2).step(
        [rollout(tiny_model(), [1, 2], [[3 + i, 4]], sample=i, reward=float(i % 2)) for i in range(4)])
    assert "copy_share" not in plain and "moved_tokens" not in plain  # no pointer: nothing to attribute


def test_copy_share_is_one_minus_the_lm_sides_share_of_the_sampled_token() -> None:
    model = tiny_model(copy_head=True)
    ids = torch.tensor([[7, 8, 9, 10, 11, 12, 13, 14, 15, 7, 8, 9, 10]])
    with torch.no_grad():
        out = model(ids)
    cs = copy_share(out, ids)
    assert cs is not None and cs.shape == (1, 12)
    p = out.logits[0, :-1].exp().gather(-1, ids[0, 1:, None]).squeeze(-1)
    p_lm = out.lm_side[0, :-1].exp().gather(-1, ids[0, 1:, None]).squeeze(-1)  # type: ignore[union-attr]
    torch.testing.assert_close(cs[0], 1 - p_lm / p)
    assert float(cs[0, :8].abs().max()) < 1e-6  # nothing to point at that far back: all the LM head's
    with torch.no_grad():
        assert copy_share(tiny_model()(ids), ids) is None


def test_too_long_rollout_is_an_error_naming_it() -> None:
    model = tiny_model()
    rs = [rollout(None, list(range(1, 70)), [[3]], task="long", sample=i, reward=float(i)) for i in range(2)]
    with pytest.raises(ValueError, match=r"rollout long#0 .* more than the model's context 64"):
        GRPOTrainer(model, GRPOConfig(), pad_id=0, lr=1e-3).step(rs)


def test_routing_replay_trains_with_the_sampler_routes() -> None:
    model = tiny_model()
    rs = with_routes(model, [rollout(model, [1, 2, 3], [[4 + i, 5]], sample=i, reward=float(i)) for i in range(2)])
    m = GRPOTrainer(model, GRPOConfig(routing_replay=True), pad_id=0, lr=1e-2).step(rs)
    assert m["stepped"] == 1 and math.isfinite(m["loss"])
    rs[0].segments[0].routes = None
    with pytest.raises(RoutingReplayUnavailable, match="without recorded routes"):
        GRPOTrainer(model, GRPOConfig(routing_replay=True), pad_id=0, lr=1e-2).step(rs)


def test_under_replay_the_reference_routes_by_its_own_router() -> None:
    model = tiny_model()
    n_experts = model.cfg.n_experts
    rs = with_routes(model, [rollout(model, [1, 2, 3], [[4 + i, 5, 9]], sample=i, reward=float(i % 2))
                              for i in range(4)])
    cfg = GRPOConfig(routing_replay=True, kl_coef=0.1, norm_tokens=4)
    own = GRPOTrainer(model, cfg, pad_id=0, lr=1e-2).step(rs)
    assert own["kl_ref"] == pytest.approx(0.0, abs=1e-6)  # sampler's experts = the reference's own
    model = tiny_model()
    for r in rs:  # the sampler chose other experts than the reference's router would
        for seg in r.segments:
            seg.routes = [[[(e + 1) % n_experts for e in layer] for layer in pos] for pos in seg.routes or []]
    forged = GRPOTrainer(model, cfg, pad_id=0, lr=1e-2).step(rs)
    # same weights, other experts: a positive distance (a reference pinned to the same routes scores 0)
    assert forged["kl_ref"] > 1e-4


def test_route_changed_compares_expert_sets_in_every_layer() -> None:
    before = torch.tensor([[[[0, 1], [2, 3]], [[0, 1], [2, 3]]]])  # [B=1, T=2, layers=2, top_k=2]
    after = torch.tensor([[[[1, 0], [3, 2]], [[0, 1], [2, 4]]]])  # position 0 reordered, position 1 a new expert
    assert route_changed(before, after).tolist() == [[False, True]]


def test_flipped_routes_are_counted_after_a_step_and_replay_pins_them() -> None:
    def rows(model: MoETransformer) -> list[Rollout]:
        return with_routes(model, [rollout(model, [1, 2, 3, 7, 8], [[4 + i, 5, 9, 10]], sample=i,
                                            reward=float(i % 2)) for i in range(4)])

    cfg = {"minibatches": 2, "micro_batch": 1}
    model = tiny_model()
    # a large step: some positions must now route elsewhere
    free = GRPOTrainer(model, GRPOConfig(**cfg), pad_id=0, lr=0.3).step(rows(model))
    assert 0.0 < free["route_changed_share"] <= 1.0
    model = tiny_model()
    pinned = GRPOTrainer(model, GRPOConfig(routing_replay=True, **cfg), pad_id=0, lr=0.3).step(rows(model))
    assert pinned["route_changed_share"] == 0.0  # the sampler's experts, whatever the weights now prefer
    one = GRPOTrainer(tiny_model(), GRPOConfig(), pad_id=0, lr=0.3).step(rows(tiny_model()))
    assert "route_changed_share" not in one  # one optimizer step: nothing is scored after it


def _with_calls(r: Rollout, valid_by_call: list[bool | None]) -> Rollout:
    """``r`` with session events: one ``assistant_message`` per model call; a call whose entry is
    not None made one tool call, well-formed or not."""
    events: list[dict[str, object]] = []
    for step, valid in enumerate(valid_by_call):
        events.append({"type": "assistant_message", "turn": 0, "step": step, "text": ""})
        if valid is not None:
            events.append({"type": "tool_call_started", "turn": 0, "step": step, "index": 0, "valid": valid})
    r.events = events
    return r


def test_malformed_call_segments_match_calls_to_sampled_segments() -> None:
    r = _with_calls(rollout(None, [1, 2], [[3], [4, 4], [5]]), [True, False, None])
    # segments: prompt, call 0, result, call 1, result, call 2
    assert malformed_call_segments(r) == {3}
    assert malformed_call_segments(_with_calls(rollout(None, [1], [[3], [4]]), [True, True])) == set()
    # two model calls recorded but three sampled segments: cannot be matched
    assert malformed_call_segments(_with_calls(rollout(None, [1], [[3], [4], [5]]), [True, False])) is None


def test_token_tensors_drop_leaves_the_named_segments_out_of_the_mask() -> None:
    r = rollout(None, [1, 2], [[3, 3], [4, 4]])
    full = token_tensors([r], 0, max_len=64)["mask"][0].tolist()
    dropped = token_tensors([r], 0, max_len=64, drop=[{3}])["mask"][0].tolist()
    # ids: 1 2 | 3 3 | 5 6 | 4 4 ; position t predicts token t+1
    assert full == [0, 1, 1, 0, 0, 1, 1]
    assert dropped == [0, 1, 1, 0, 0, 0, 0]


@pytest.mark.parametrize("masked", [False, True])
def test_no_reinforce_malformed_keeps_a_solved_rollouts_broken_call_from_rising(masked: bool) -> None:
    """The solved rollout's second call (token 11) was malformed. Rollout-level credit (the
    papers) raises it with the rest of the solution; with ``no_reinforce_malformed`` it gets no
    positive gradient of its own and rises far less, while the solution's good call still rises."""
    prompt = [1, 2, 3]

    def run(mask: bool) -> tuple[float, float, dict[str, float]]:
        model = tiny_model(seed=3)
        win = _with_calls(rollout(model, prompt, [[10], [11]], sample=0, reward=1.0, between=[7]), [True, False])
        lose = [_with_calls(rollout(model, prompt, [[20 + i]], sample=i + 1, reward=0.0), [True]) for i in range(3)]

        def lps() -> tuple[float, float]:
            out = model.logprobs(torch.tensor([prompt + [10, 7, 11]]))[0].tolist()
            return out[2], out[4]  # log p(10 | prompt), log p(11 | prompt 10 7)

        good0, bad0 = lps()
        m = GRPOTrainer(model, GRPOConfig(group_size=4, norm_tokens=4, no_reinforce_malformed=mask),
                        pad_id=0, lr=1e-2).step([win, *lose])
        good1, bad1 = lps()
        return good1 - good0, bad1 - bad0, m

    good, bad, m = run(masked)
    assert good > 1e-3
    assert m["positive_malformed_token_frac"] == pytest.approx(0.5)
    assert m["n_credit_unaligned"] == 0.0
    if masked:
        assert m["malformed_tokens_unreinforced"] == 1.0
        _, bad_unmasked, _ = run(False)
        assert bad < bad_unmasked / 2
    else:
        assert m["malformed_tokens_unreinforced"] == 0.0
        assert bad > 1e-3


def test_token_advantages_give_malformed_calls_their_own_negative_credit() -> None:
    r = rollout(None, [1, 2], [[3, 3], [4, 4]])  # ids 1 2 | 3 3 | 5 6 | 4 4
    adv = token_advantages([(r, 0.5)], [{3}], 0.2, 7)[0].tolist()
    assert adv == pytest.approx([0.5, 0.5, 0.5, 0.5, 0.5, -0.2, -0.2])  # positions 5, 6 predict the 4s
    # a negative row keeps its own advantage where it is already below -c
    assert token_advantages([(r, -0.5)], [{3}], 0.2, 7)[0].tolist() == pytest.approx([-0.5] * 7)


def test_malformed_call_adv_pushes_a_solved_rollouts_broken_call_down() -> None:
    prompt = [1, 2, 3]
    model = tiny_model(seed=3)
    win = _with_calls(rollout(model, prompt, [[10], [11]], sample=0, reward=1.0, between=[7]), [True, False])
    lose = [_with_calls(rollout(model, prompt, [[20 + i]], sample=i + 1, reward=0.0), [True]) for i in range(3)]

    def lps() -> tuple[float, float]:
        out = model.logprobs(torch.tensor([prompt + [10, 7, 11]]))[0].tolist()
        return out[2], out[4]

    good0, bad0 = lps()
    GRPOTrainer(model, GRPOConfig(group_size=4, norm_tokens=4, malformed_call_adv=0.5), pad_id=0, lr=1e-2).step(
        [win, *lose])
    good1, bad1 = lps()
    assert good1 > good0 + 1e-3
    assert bad1 < bad0 - 1e-3
    with pytest.raises(ValueError):
        GRPOConfig(malformed_call_adv=-0.1)


def _solved(r: Rollout, solved: bool) -> Rollout:
    r.reward_terms = {"success": 1.0 if solved else 0.0}
    return r


def test_length_terms_are_kimis_group_relative_length_reward() -> None:
    # sampled lengths 2, 4, 6 (solved, solved, failed) and 4 (failed): lam = 0.5, 0, -0.5, 0
    group = [_solved(rollout(None, [1], [[3, 3]], sample=0, reward=1.0), True),
             _solved(rollout(None, [1], [[3], [3, 3, 3]], sample=1, reward=1.0), True),
             _solved(rollout(None, [1], [[3] * 6], sample=2, reward=0.0), False),
             _solved(rollout(None, [1], [[3] * 4], sample=3, reward=0.0), False)]
    assert length_terms(group, 0.2) == pytest.approx([0.1, 0.0, -0.1, 0.0])
    # a short failure earns nothing: only successes are paid for being short
    short_fail = [_solved(rollout(None, [1], [[3]], sample=0, reward=0.0), False),
                  _solved(rollout(None, [1], [[3] * 5], sample=1, reward=1.0), True)]
    assert length_terms(short_fail, 0.2) == pytest.approx([0.0, -0.1])
    assert length_terms(group[:1] * 2, 0.2) == [0.0, 0.0]  # equal lengths: no term



def test_length_terms_leave_groups_without_a_solution_and_empty_rollouts_alone() -> None:
    fails = [_solved(rollout(None, [1], [[3] * n], task="a", sample=i, reward=0.0), False) for i, n in enumerate([2, 9])]
    assert length_terms(fails, 0.2) == [0.0, 0.0]  # nothing solved: length alone must not rank failures
    sel = select_rollouts(fails, GRPOConfig(group_size=2, length_coef=0.2))
    assert sel.rows == [] and sel.n_groups_zero_std == 1  # so the group is still skipped
    # a rollout that sampled nothing gets no term and does not set the shortest length
    empty = _solved(rollout(None, [1], [[]], sample=2, reward=0.0), False)
    ok = [_solved(rollout(None, [1], [[3] * n], sample=i, reward=1.0), True) for i, n in enumerate([2, 6])]
    assert length_terms([*ok, empty], 0.2) == pytest.approx([0.1, -0.1, 0.0])


def test_solved_length_scope_ranks_solutions_among_themselves_and_leaves_failures_as_kimi() -> None:
    # solutions of 30 and 40 tokens, failures of 5 and 80: Kimi's scope puts both solutions near the short end
    group = [_solved(rollout(None, [1], [[3] * n], sample=i, reward=float(ok)), ok)
             for i, (n, ok) in enumerate([(30, True), (40, True), (5, False), (80, False)])]
    kimi = length_terms(group, 0.2)
    solved = length_terms(group, 0.2, "solved")
    assert kimi[0] - kimi[1] == pytest.approx(0.2 * 10 / 75)  # 0.027: the solutions nearly tie
    assert solved[:2] == pytest.approx([0.1, -0.1])  # over the solutions alone: the full spread
    assert solved[2:] == kimi[2:] and kimi[2:] == pytest.approx([0.0, -0.1])  # failures: Kimi's term
    # a lone solution, or solutions of one length, get no term; the failures still pay
    lone = length_terms(group[:1] + group[2:], 0.2, "solved")
    assert lone[0] == 0.0 and lone[2] == pytest.approx(-0.1)
    # still bounded: the longest solution scores above every failure
    sel = select_rollouts(group, GRPOConfig(group_size=4, length_coef=0.2, length_scope="solved"))
    adv = dict((r.sample, a) for r, a in sel.rows)
    assert adv[0] > adv[1] > 0 > max(adv[2], adv[3])
    assert sel.stats()["length_longest_failed_share"] == 1.0  # the 80-token failure is the longest
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="length_scope"):
        GRPOConfig(length_scope="failed")


def test_length_coef_ranks_the_shorter_solution_above_the_longer_one() -> None:
    rs = [_solved(rollout(None, [1], [[3] * n], task="a", sample=i, reward=r), r > 0)
          for i, (n, r) in enumerate([(2, 1.0), (8, 1.0), (5, 0.0), (5, 0.0)])]
    plain = dict((r.sample, a) for r, a in select_rollouts(rs, GRPOConfig(group_size=4)).rows)
    assert plain[0] == pytest.approx(plain[1])  # the reward alone cannot tell the two solutions apart
    sel = select_rollouts(rs, GRPOConfig(group_size=4, length_coef=0.2))
    adv = dict((r.sample, a) for r, a in sel.rows)
    assert adv[0] > adv[1] > 0 > max(adv[2], adv[3])  # shorter solution first; every solution above every failure
    assert sel.stats()["length_bonus_mean"] == pytest.approx((0.1 - 0.1 + 0 + 0) / 4)
    assert sel.stats()["length_longest_failed_share"] == 0.0  # the 8-token solution is the longest here
    assert "length_bonus_mean" not in select_rollouts(rs, GRPOConfig(group_size=4)).stats()


def test_length_coef_is_bounded_so_a_solution_stays_above_every_failure() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="length_coef"):
        GRPOConfig(length_coef=0.5)
    with pytest.raises(ValidationError, match="length_coef"):
        GRPOConfig(length_coef=-0.1)
