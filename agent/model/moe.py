"""The mixture-of-experts feed-forward layer: router, load balancing, dropless experts.

Router — **sigmoid top-k** (DeepSeek-V3), not softmax. Each expert's affinity
``s_i = sigmoid(x · r_i)`` is independent of the others, so the
auxiliary-loss-free bias (below) shifts one expert's chance of selection
without touching any other expert's score, and the bias lives on the same
0..1 scale as the scores, which makes its step size meaningful. Selection is
top-k of ``s + bias``; the combine weights are the *unbiased* ``s`` of the
selected experts, normalised to sum to 1 when ``top_k > 1`` (DeepSeek-V3).
Departure: with ``top_k == 1`` the weight is the raw ``s`` (Switch
Transformer's choice) — normalising a single weight would make it the
constant 1 and cut the router off from the language-model gradient. The router
matmul always runs in fp32 (also under bf16/mxfp8), so routing decisions do
not depend on the expert numerics.

Load balancing — both mechanisms, each with its own dial (0 disables):

* Auxiliary loss (Switch/GShard), ``cfg.aux_loss_coef``: per layer
  ``E · Σ_i f_i · P_i`` with ``f_i`` the fraction of the k·N routed slots that
  went to expert ``i`` and ``P_i`` the mean over tokens of expert ``i``'s
  normalised affinity ``s_i / Σ_j s_j`` (DeepSeek-V3 normalises sigmoid scores
  this way for its sequence-wise balance loss; we use the whole batch, not each
  sequence). It equals 1 under perfect balance. The model averages it over
  layers and multiplies by the coefficient, so the coefficient does not scale
  with depth.
* Auxiliary-loss-free bias (DeepSeek-V3), ``cfg.router_bias_rate``: after each
  optimizer step the trainer calls :meth:`MoELayer.update_bias` with the
  step's token counts; ``b_i += rate · sign(mean_load − load_i)``, outside
  autograd. The bias is a persistent buffer (saved in checkpoints), so
  sampling and training select experts identically. Departure: the forward
  pass never changes the bias itself (DeepSeek-V3 describes the update "at the
  end of each step"); keeping the forward pure makes it repeatable, which the
  engine's logprob consistency needs.

Experts — dropless (no capacity factor, no token is ever dropped): the N·k
(token, expert) pairs are stable-sorted by expert, the tokens gathered in that
order, and each expert's rows run through SwiGLU with **two** grouped matmuls
(gate and up fused in ``w13 [E, d, 2·d_ff]``, then ``w2 [E, d_ff, d]``) over
the experts' row offsets; an expert that got no tokens is an empty range. The
outputs are gathered back to pair order (inverse permutation) and summed with
the combine weights. An optional shared expert (a dense SwiGLU of the same
width) sees every token and is added unweighted.

:func:`moe_reference` computes the same function with a plain loop over
experts; the tests hold the two together.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from agent.model.config import ModelConfig, Precision
from agent.model.numerics import Linear, fp32_region, require_kernels
from kernels.grouped import grouped_mm


@dataclass(frozen=True)
class Routing:
    """One batch's routing: ``experts``/``weights`` are ``[N, k]``, ``scores`` ``[N, E]`` (fp32)."""

    experts: torch.Tensor
    weights: torch.Tensor
    scores: torch.Tensor


def route(x: torch.Tensor, router_weight: torch.Tensor, bias: torch.Tensor, top_k: int,
          forced: torch.Tensor | None = None) -> Routing:
    """Sigmoid top-k routing of ``x [N, d]``; ``bias`` changes which experts are picked, never the weights.

    ``forced`` (routing replay): ``LongTensor [N, k]`` of expert ids to use instead
    of the top-k; a row whose first entry is negative is routed normally. The
    combine weights are still the (normalised) scores of the experts used, so
    the router keeps its gradient. Not checked: that a forced row names ``k``
    distinct experts (a duplicate is used twice, as given).
    """
    dtype = torch.promote_types(x.dtype, torch.float32)  # fp32, or fp64 under gradcheck
    with fp32_region(x.device.type):
        scores = torch.sigmoid(F.linear(x.to(dtype), router_weight.to(dtype)))
    _, experts = torch.topk(scores + bias.to(dtype), top_k, dim=-1)
    if forced is not None:
        if forced.shape != experts.shape:
            raise ValueError(f"forced routes must be [N, top_k] = {tuple(experts.shape)}, got {tuple(forced.shape)}")
        forced = forced.to(experts.device, torch.long)
        if forced.numel() and int(forced.max()) >= scores.shape[-1]:
            raise ValueError(f"forced routes name an expert >= n_experts ({scores.shape[-1]})")
        experts = torch.where((forced[:, :1] >= 0).expand_as(forced), forced, experts)
    weights = scores.gather(-1, experts)
    if top_k > 1:
        weights = weights / weights.sum(-1, keepdim=True)
    return Routing(experts, weights, scores)


def load_balance_loss(routing: Routing, n_experts: int) -> torch.Tensor:
    """Switch/GShard auxiliary loss, ``E · Σ f_i P_i`` (1 when perfectly balanced); see the module docstring."""
    n, k = routing.experts.shape
    counts = torch.bincount(routing.experts.reshape(-1), minlength=n_experts)
    f = counts.float() / (n * k)  # no gradient: the fraction dispatched
    p = (routing.scores / routing.scores.sum(-1, keepdim=True)).mean(0)  # carries the gradient
    return n_experts * (f * p).sum()


def permute(x: torch.Tensor, experts: torch.Tensor, n_experts: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gather each token once per chosen expert, grouped by expert.

    Returns ``(x_sorted [N·k, d], order [N·k], offsets [E+1])``: row ``j`` of
    ``x_sorted`` is token ``order[j] // k``; expert ``e``'s rows are
    ``offsets[e]:offsets[e+1]``. The sort is stable, so within an expert tokens
    keep their order (deterministic, and independent of the other tokens'
    choices).
    """
    k = experts.shape[1]
    flat = experts.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=n_experts)
    offsets = torch.zeros(n_experts + 1, dtype=torch.long, device=x.device)
    offsets[1:] = torch.cumsum(counts, 0)
    return x[order // k], order, offsets


def unpermute(y_sorted: torch.Tensor, order: torch.Tensor, k: int) -> torch.Tensor:
    """Inverse of :func:`permute`'s ordering: ``[N·k, d]`` in expert order → ``[N, k, d]`` in pair order."""
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=order.device)
    return y_sorted.index_select(0, inverse).view(-1, k, y_sorted.shape[-1])


def swiglu(h: torch.Tensor) -> torch.Tensor:
    gate, up = h.chunk(2, dim=-1)
    return F.silu(gate) * up


class SharedExpert(nn.Module):
    """A dense SwiGLU every token goes through (DeepSeekMoE's shared expert)."""

    def __init__(self, d_model: int, d_ff: int, precision: Precision) -> None:
        super().__init__()
        self.w13 = Linear(d_model, 2 * d_ff, precision=precision)
        self.w2 = Linear(d_ff, d_model, precision=precision)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(swiglu(self.w13(x)))


@dataclass
class MoEOutput:
    y: torch.Tensor  # [..., d]
    aux_loss: torch.Tensor  # scalar, E·Σ f_i P_i (unscaled by the coefficient)
    counts: torch.Tensor  # [E] tokens routed to each expert
    experts: torch.Tensor | None = None  # [..., k] expert ids each token used (long)


class MoELayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        require_kernels(cfg.precision)
        if cfg.precision == "mxfp8" and (cfg.d_model % 32 or cfg.d_ff % 32):
            raise ValueError("mxfp8 quantises in blocks of 32: d_model and d_ff must be multiples of 32")
        self.n_experts, self.top_k, self.precision = cfg.n_experts, cfg.top_k, cfg.precision
        self.bias_rate = cfg.router_bias_rate
        d, f, e = cfg.d_model, cfg.d_ff, cfg.n_experts
        self.router = nn.Linear(d, e, bias=False)
        self.register_buffer("router_bias", torch.zeros(e))
        self.w13 = nn.Parameter(torch.empty(e, d, 2 * f))
        self.w2 = nn.Parameter(torch.empty(e, f, d))
        self.shared = SharedExpert(d, f, cfg.dense_precision) if cfg.shared_expert else None
        self.reset_parameters(out_std=0.02)

    def reset_parameters(self, out_std: float) -> None:
        nn.init.normal_(self.router.weight, std=0.02)
        nn.init.normal_(self.w13, std=0.02)
        nn.init.normal_(self.w2, std=out_std)
        if self.shared is not None:
            nn.init.normal_(self.shared.w13.weight, std=0.02)
            nn.init.normal_(self.shared.w2.weight, std=out_std)

    def forward(self, x: torch.Tensor, routes: torch.Tensor | None = None) -> MoEOutput:
        """``routes``: ``[..., k]`` expert ids to force (see :func:`route`; negative rows route normally)."""
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        forced = routes.reshape(-1, self.top_k) if routes is not None else None
        routing = route(x2, self.router.weight, self.router_bias, self.top_k, forced)
        x_sorted, order, offsets = permute(x2, routing.experts, self.n_experts)
        h = grouped_mm(x_sorted, self.w13, offsets, precision=self.precision)
        y_sorted = grouped_mm(swiglu(h), self.w2, offsets, precision=self.precision)
        y_pairs = unpermute(y_sorted, order, self.top_k)
        y = (y_pairs * routing.weights.unsqueeze(-1)).sum(1)  # combine in fp32 (or fp64)
        if self.shared is not None:
            y = y + self.shared(x2)
        counts = (offsets[1:] - offsets[:-1]).detach()
        experts = routing.experts.view(*shape[:-1], self.top_k)
        return MoEOutput(y.view(shape), load_balance_loss(routing, self.n_experts), counts, experts)

    @torch.no_grad()
    def update_bias(self, counts: torch.Tensor) -> None:
        """Auxiliary-loss-free balancing: nudge under-loaded experts up, over-loaded down."""
        if self.bias_rate <= 0:
            return
        load = counts.to(self.router_bias.device, torch.float32)
        self.router_bias += self.bias_rate * torch.sign(load.mean() - load)


def moe_reference(layer: MoELayer, x: torch.Tensor) -> torch.Tensor:
    """The definition: same routing math, then a plain Python loop over experts (fp32/fp64)."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    scores = torch.sigmoid(x2 @ layer.router.weight.T.to(x2.dtype))
    _, experts = torch.topk(scores + layer.router_bias.to(scores.dtype), layer.top_k, dim=-1)
    weights = scores.gather(-1, experts)
    if layer.top_k > 1:
        weights = weights / weights.sum(-1, keepdim=True)
    y = torch.zeros_like(x2)
    for e in range(layer.n_experts):
        token, slot = (experts == e).nonzero(as_tuple=True)
        if token.numel() == 0:
            continue
        gate, up = (x2[token] @ layer.w13[e]).chunk(2, dim=-1)
        out = (F.silu(gate) * up) @ layer.w2[e]
        y = y.index_add(0, token, out * weights[token, slot, None])
    if layer.shared is not None:
        s = layer.shared
        gate, up = (x2 @ s.w13.weight.T).chunk(2, dim=-1)
        y = y + (F.silu(gate) * up) @ s.w2.weight.T
    return y.view(shape)


def expert_balance(counts: torch.Tensor) -> float:
    """Max load over mean load, averaged over layers (1.0 = perfectly balanced); ``counts [L, E]``."""
    c = counts.float()
    mean = c.mean(-1).clamp_min(1e-9)
    return float((c.max(-1).values / mean).mean())
