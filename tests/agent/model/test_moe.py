"""The MoE layer against the per-expert loop, permutation round-trips, gradients, balancing."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch.func import functional_call

from agent.model.config import ModelConfig
from agent.model.moe import MoELayer, load_balance_loss, moe_reference, permute, route, unpermute

BASE = ModelConfig(d_model=32, d_ff=48, n_experts=6, top_k=2, n_heads=4, n_kv_heads=2, vocab_size=64)


def layer(seed: int = 0, **overrides: object) -> MoELayer:
    torch.manual_seed(seed)
    moe = MoELayer(replace(BASE, **overrides))
    with torch.no_grad():  # larger weights than the init so differences are not hidden by tiny outputs
        for p in moe.parameters():
            p.normal_(0, 0.3)
    return moe


@pytest.mark.parametrize("top_k", [1, 2])
@pytest.mark.parametrize("shared", [False, True])
def test_layer_equals_reference_loop(top_k: int, shared: bool) -> None:
    moe = layer(top_k=top_k, shared_expert=shared)
    x = torch.randn(3, 17, 32)
    out = moe(x)
    torch.testing.assert_close(out.y, moe_reference(moe, x), rtol=1e-5, atol=1e-5)
    assert int(out.counts.sum()) == 3 * 17 * top_k


def test_experts_with_zero_tokens() -> None:
    moe = layer(top_k=2)
    with torch.no_grad():  # experts 0, 3 and 5 can never win the top-2
        moe.router_bias.copy_(torch.tensor([-100.0, 0.0, 0.0, -100.0, 0.0, -100.0]))
    x = torch.randn(2, 9, 32, requires_grad=True)
    out = moe(x)
    assert out.counts.tolist()[0] == 0 and out.counts[3] == 0 and out.counts[5] == 0
    torch.testing.assert_close(out.y, moe_reference(moe, x), rtol=1e-5, atol=1e-5)
    out.y.sum().backward()
    assert moe.w13.grad is not None
    assert torch.all(moe.w13.grad[[0, 3, 5]] == 0) and moe.w13.grad[1].abs().sum() > 0


def test_single_token_and_all_to_one_expert() -> None:
    moe = layer(top_k=1)
    with torch.no_grad():
        moe.router_bias.copy_(torch.tensor([0.0, 0, 0, 0, 100.0, 0]))  # every token picks expert 4
    for n in (1, 5):
        x = torch.randn(n, 32)
        out = moe(x)
        assert out.counts.tolist() == [0, 0, 0, 0, n, 0]
        torch.testing.assert_close(out.y, moe_reference(moe, x), rtol=1e-5, atol=1e-5)


def test_permute_unpermute_round_trip() -> None:
    torch.manual_seed(1)
    n, k, e = 23, 3, 5
    x = torch.randn(n, 8)
    experts = torch.stack([torch.randperm(e)[:k] for _ in range(n)])
    x_sorted, order, offsets = permute(x, experts, e)
    # grouped: every row in expert e's range belongs to a token that chose e, stable (token order kept)
    for j in range(e):
        rows = order[offsets[j]:offsets[j + 1]]
        assert torch.all(experts.reshape(-1)[rows] == j)
        assert torch.all(rows[1:] > rows[:-1])
    assert int(offsets[-1]) == n * k
    back = unpermute(x_sorted, order, k)
    torch.testing.assert_close(back, x.unsqueeze(1).expand(n, k, 8), rtol=0, atol=0)


def test_gradcheck_float64() -> None:
    moe = layer(top_k=2, shared_expert=True, d_model=8, d_ff=6, n_experts=4, n_heads=2, n_kv_heads=2).double()
    names = [n for n, _ in moe.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_(True) for p in moe.parameters())
    x = torch.randn(5, 8, dtype=torch.float64, requires_grad=True)

    def f(x: torch.Tensor, *ps: torch.Tensor) -> torch.Tensor:
        return functional_call(moe, dict(zip(names, ps, strict=True)), (x,)).y

    assert torch.autograd.gradcheck(f, (x, *params), eps=1e-6, atol=1e-5)


@pytest.mark.parametrize("top_k", [1, 2])
def test_gradients_match_reference(top_k: int) -> None:
    moe = layer(top_k=top_k, shared_expert=True)
    x = torch.randn(4, 11, 32, requires_grad=True)
    g = torch.randn(4, 11, 32)
    grads = torch.autograd.grad((moe(x).y * g).sum(), [x, *moe.parameters()])
    ref = torch.autograd.grad((moe_reference(moe, x) * g).sum(), [x, *moe.parameters()])
    for a, b in zip(grads, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_bias_selects_but_does_not_weight() -> None:
    moe = layer(top_k=2)
    x = torch.randn(10, 32)
    plain = route(x, moe.router.weight, torch.zeros(6), 2)
    bias = torch.zeros(6)
    bias[5] = 10.0  # expert 5 is always chosen
    biased = route(x, moe.router.weight, bias, 2)
    assert torch.all((biased.experts == 5).any(-1))
    torch.testing.assert_close(biased.scores, plain.scores)  # scores unbiased
    expect = plain.scores.gather(-1, biased.experts)
    torch.testing.assert_close(biased.weights, expect / expect.sum(-1, keepdim=True))


def test_aux_loss_is_one_when_balanced_and_grows_with_imbalance() -> None:
    n, e = 60, 6
    uniform = route(torch.zeros(n, 4), torch.zeros(e, 4), torch.zeros(e), 1)  # all scores equal
    # force a perfectly balanced selection with equal scores
    balanced = type(uniform)(torch.arange(n).remainder(e)[:, None], uniform.weights, uniform.scores)
    assert float(load_balance_loss(balanced, e)) == pytest.approx(1.0)
    skewed_scores = torch.full((n, e), 0.1)
    skewed_scores[:, 0] = 0.9
    skewed = type(uniform)(torch.zeros(n, 1, dtype=torch.long), uniform.weights, skewed_scores)
    assert float(load_balance_loss(skewed, e)) > 2.0


def test_aux_loss_gradient_moves_toward_balance() -> None:
    moe = layer(top_k=2, aux_loss_coef=1.0)
    with torch.no_grad():
        moe.router.weight[0] += 0.1  # expert 0 overloaded on positive inputs
    x = torch.randn(256, 32).abs()
    before = moe(x)
    opt = torch.optim.SGD([moe.router.weight], lr=0.5)
    for _ in range(20):
        opt.zero_grad()
        moe(x).aux_loss.backward()
        opt.step()
    after = moe(x)
    assert after.aux_loss.item() < before.aux_loss.item()
    assert after.counts[0] < before.counts[0]
    assert float(after.counts.max() - after.counts.min()) < 0.25 * float(before.counts.max() - before.counts.min())


def test_router_bias_update_moves_toward_balance() -> None:
    moe = layer(top_k=2, router_bias_rate=0.01)
    with torch.no_grad():
        moe.router.weight[0] += 1.0  # skew: expert 0 takes most tokens
    x = torch.randn(512, 32).abs()
    first = moe(x).counts
    spread = lambda c: float(c.max() - c.min())  # noqa: E731
    weights_before = moe.router.weight.detach().clone()
    for _ in range(300):
        counts = moe(x).counts
        moe.update_bias(counts)
    last = moe(x).counts
    assert moe.router_bias[0] < 0  # the overloaded expert was pushed down
    assert spread(last) < 0.25 * spread(first)
    assert torch.equal(moe.router.weight, weights_before)  # outside autograd: no weight touched


def test_bias_rate_zero_is_a_no_op() -> None:
    moe = layer(router_bias_rate=0.0)
    moe.update_bias(torch.tensor([100, 0, 0, 0, 0, 0]))
    assert torch.all(moe.router_bias == 0)
