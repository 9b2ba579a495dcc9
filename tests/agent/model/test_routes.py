"""Routing capture and replay: ``MoETransformer.forward(return_routes=, routes=)``."""

from __future__ import annotations

import pytest
import torch

from agent.model.config import ModelConfig
from agent.model.transformer import MoETransformer


@pytest.fixture(scope="module")
def model() -> MoETransformer:
    torch.manual_seed(0)
    return MoETransformer(ModelConfig.preset("tiny", vocab_size=300, max_seq_len=64)).eval()


def test_replaying_captured_routes_gives_the_same_logits(model: MoETransformer) -> None:
    ids = torch.randint(0, 300, (2, 12))
    with torch.no_grad():
        out = model(ids, return_routes=True)
        assert out.routes is not None
        assert out.routes.shape == (2, 12, model.cfg.n_layers, model.cfg.top_k)
        replay = model(ids, routes=out.routes)
    assert torch.equal(out.logits, replay.logits)


def test_forced_routes_change_the_experts_used_and_keep_the_router_gradient(model: MoETransformer) -> None:
    ids = torch.randint(0, 300, (1, 8))
    with torch.no_grad():
        routes = model(ids, return_routes=True).routes
    assert routes is not None
    forced = (routes + 1) % model.cfg.n_experts  # every token to other experts
    model.zero_grad()
    out = model(ids, routes=forced, return_routes=True)
    assert out.routes is not None and torch.equal(out.routes, forced)
    out.logits.sum().backward()
    assert model.blocks[0].moe.router.weight.grad is not None
    assert model.blocks[0].moe.router.weight.grad.abs().sum() > 0
    model.zero_grad()


def test_negative_routes_route_normally(model: MoETransformer) -> None:
    ids = torch.randint(0, 300, (1, 6))
    with torch.no_grad():
        free = model(ids, return_routes=True)
        partial = free.routes.clone()  # type: ignore[union-attr]
        partial[:, 3:] = -1  # replay only the first three tokens
        again = model(ids, routes=partial, return_routes=True)
    assert torch.equal(again.routes, free.routes)
    assert torch.equal(again.logits, free.logits)


def test_bad_routes_are_refused_with_the_expected_shape(model: MoETransformer) -> None:
    ids = torch.randint(0, 300, (1, 4))
    with pytest.raises(ValueError, match=r"routes must be \[B, T, n_moe_layers, top_k\]"):
        model(ids, routes=torch.zeros(1, 4, 1, 1, dtype=torch.long))
    bad = torch.full((1, 4, model.cfg.n_layers, model.cfg.top_k), model.cfg.n_experts)
    with pytest.raises(ValueError, match="n_experts"):
        model(ids, routes=bad)
