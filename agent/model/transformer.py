"""The policy model: a decoder-only transformer whose feed-forward layers are
mixtures of experts (``agent.model.moe``).

Pre-norm blocks ``x + attn(norm(x))``, ``x + moe(norm(x))``; RMSNorm with a
learned scale; rotary position embeddings (rotate-half form, as in Llama);
grouped-query attention through ``scaled_dot_product_attention``; untied
embedding and LM head (untied tensors also keep the safetensors file free of
shared storage). Numerics follow ``cfg.precision`` (``agent.model.numerics``).

The KV cache is what the generation engine decodes with: a fixed block of
``max_slots`` sequences × ``max_len`` positions per layer. A forward with a
cache continues each row's slot at that slot's cached length, so rows with
different lengths share one call; the causal mask over the cached keys is built
per row; rows whose slots lie close together read them as a view of the cache
instead of a gathered copy (``agent.model.slot_rows``). The cached forward
computes the same function as the no-cache forward (the tests hold them within
1e-5 in fp32), which is how the engine's logprobs
equal training logprobs. With ``cfg.copy_head`` the logits are the log-probabilities
of the copy head's mixture (``agent.model.copy_head``), whose keys and token ids
the cache holds too. Not guaranteed: bit-identity between the two paths
(the attention kernels reduce in different orders), or anything about slots
whose cached length plus T would exceed ``max_len`` (that raises).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from agent.model.config import ModelConfig
from agent.model.copy_head import CopyHead, context_end
from agent.model.moe import MoELayer, MoEOutput
from agent.model.numerics import Linear, autocast_for, require_kernels
from agent.model.slot_rows import SlotRows


class KVCache:
    """Keys and values for ``max_slots`` sequences of up to ``max_len`` tokens.

    ``k``/``v``: ``[n_layers, max_slots, n_kv_heads, max_len, head_dim]``;
    ``lengths[slot]``: tokens cached in that slot. Positions at or beyond a
    slot's length hold stale data and are never attended to.
    """

    def __init__(self, cfg: ModelConfig, max_slots: int, max_len: int, *,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> None:
        if max_len > cfg.max_seq_len:
            raise ValueError(f"max_len {max_len} exceeds the model's max_seq_len {cfg.max_seq_len}")
        shape = (cfg.n_layers, max_slots, cfg.n_kv_heads, max_len, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.lengths = torch.zeros(max_slots, dtype=torch.long, device=device)
        # the copy head's keys (fp32) and every cached position's token id (its successor is what
        # a later query copies); only for a model with cfg.copy_head
        self.copy_keys = self.ids = None
        if cfg.copy_head:
            self.copy_keys = torch.zeros(max_slots, max_len, 2 * cfg.d_model, dtype=torch.float32, device=device)
            self.ids = torch.zeros(max_slots, max_len, dtype=torch.long, device=device)
        self.max_slots, self.max_len = max_slots, max_len

    def reset(self, slot: int) -> None:
        """Forget a slot's tokens (its stale keys stay but are masked out)."""
        self.lengths[slot] = 0

    def keep_prefix(self, slot: int, n: int, source: int | None = None) -> None:
        """Make ``slot`` hold ``n`` cached positions: its own first ``n`` (``source``
        None), or a copy of ``source``'s first ``n`` (prefix reuse across sequences)."""
        if source is not None and source != slot:
            self.k[:, slot, :, :n] = self.k[:, source, :, :n]
            self.v[:, slot, :, :n] = self.v[:, source, :, :n]
            if self.copy_keys is not None and self.ids is not None:
                self.copy_keys[slot, :n] = self.copy_keys[source, :n]
                self.ids[slot, :n] = self.ids[source, :n]
        self.lengths[slot] = n


@dataclass
class ModelOutput:
    logits: torch.Tensor  # [B, T, V], fp32; with cfg.copy_head the mixture's log-probabilities (normalised)
    aux_loss: torch.Tensor  # scalar: aux_loss_coef × mean over layers of E·Σ f_i P_i; 0 when the coefficient is 0
    expert_counts: torch.Tensor  # [n_layers, n_experts] tokens routed (long)
    routes: torch.Tensor | None = None  # [B, T, n_moe_layers, top_k] expert ids (long), with return_routes=True
    # with cfg.copy_head: the LM head's part of ``logits``, log(g · softmax(lm_logits)) [B, T, V]
    # (agent.model.copy_head.CopyHead.mixture); None without a copy head
    lm_side: torch.Tensor | None = None


def rope_tables(cfg: ModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin ``[max_seq_len, head_dim/2]``, computed in float64 then stored as fp32."""
    half = cfg.head_dim // 2
    inv_freq = cfg.rope_theta ** (-torch.arange(half, dtype=torch.float64) / half)
    angles = torch.outer(torch.arange(cfg.max_seq_len, dtype=torch.float64), inv_freq)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [B, H, T, hd]`` by position; ``cos``/``sin`` broadcast as ``[B|1, 1, T, hd/2]``."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).type_as(x)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer, self.n_heads, self.n_kv_heads, self.head_dim = layer, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        p = cfg.dense_precision
        self.wq = Linear(cfg.d_model, cfg.n_heads * cfg.head_dim, precision=p)
        self.wk = Linear(cfg.d_model, cfg.n_kv_heads * cfg.head_dim, precision=p)
        self.wv = Linear(cfg.d_model, cfg.n_kv_heads * cfg.head_dim, precision=p)
        self.wo = Linear(cfg.n_heads * cfg.head_dim, cfg.d_model, precision=p)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache: KVCache | None, rows: SlotRows | None, pos: torch.Tensor | None) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            assert rows is not None and pos is not None
            ck, cv = cache.k[self.layer], cache.v[self.layer]  # [S, Hkv, L, hd]
            slots = rows.slots
            # Advanced indices (slot, position) around a slice put their dims first: [B, T, Hkv, hd].
            ck[slots[:, None], :, pos] = k.transpose(1, 2).to(ck.dtype)
            cv[slots[:, None], :, pos] = v.transpose(1, 2).to(cv.dtype)
            n_kv = int(pos[:, -1].max()) + 1
            # the rows' slots as a view of the cache where they are close together, else gathered
            keys = rows.take(ck)[:, :, :n_kv].to(q.dtype)
            values = rows.take(cv)[:, :, :n_kv].to(q.dtype)
            # Query at absolute position p sees keys 0..p of its own slot; the rest is padding. A spare
            # row of the view (no query) sits at position 0: it sees key 0 only and is dropped.
            mask = torch.arange(n_kv, device=x.device)[None, None, :] <= rows.spread(pos)[:, :, None]
            y = F.scaled_dot_product_attention(rows.spread(q), keys, values, attn_mask=mask[:, None],
                                               enable_gqa=True)
            y = rows.pick(y)
        return self.wo(y.transpose(1, 2).reshape(b, t, -1))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg, layer)
        self.moe_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.moe = MoELayer(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache | None,
                rows: SlotRows | None, pos: torch.Tensor | None,
                routes: torch.Tensor | None = None) -> tuple[torch.Tensor, MoEOutput]:
        x = x + self.attn(self.attn_norm(x), cos, sin, cache, rows, pos)
        moe = self.moe(self.moe_norm(x), routes)
        return x + moe.y, moe


class MoETransformer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        require_kernels(cfg.precision)
        if cfg.head_dim % 2:
            raise ValueError("head_dim must be even for rotary embeddings")
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.copy = (CopyHead(cfg.d_model, cfg.max_seq_len, cfg.vocab_size, successor_keys=cfg.copy_successor_keys)
                     if cfg.copy_head else None)
        cos, sin = rope_tables(cfg)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        # a cached forward reads its rows' slots as a view of the cache when their range is at most
        # this many times the rows, else gathers them (agent.model.slot_rows; 0: always gather)
        self.slot_view_spread = 2.0
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """GPT-2 init: N(0, 0.02), residual output projections scaled by 1/sqrt(2·n_layers)."""
        out_std = 0.02 / (2 * self.cfg.n_layers) ** 0.5
        nn.init.normal_(self.embed.weight, std=0.02)
        nn.init.normal_(self.lm_head.weight, std=0.02)
        for block in self.blocks:
            for lin in (block.attn.wq, block.attn.wk, block.attn.wv):
                nn.init.normal_(lin.weight, std=0.02)
            nn.init.normal_(block.attn.wo.weight, std=out_std)
            block.moe.reset_parameters(out_std=out_std)
        if self.copy is not None:
            self.copy.reset_parameters()

    def forward(self, input_ids: torch.Tensor, *, cache: KVCache | None = None,
                slots: torch.Tensor | None = None, return_routes: bool = False,
                routes: torch.Tensor | None = None) -> ModelOutput:
        """Logits for ``input_ids [B, T]``; with ``cache``, rows continue their ``slots``.

        Routing capture and replay (every block's feed-forward is an MoE layer,
        so ``n_moe_layers == n_layers``): ``return_routes=True`` fills
        ``ModelOutput.routes`` with the expert ids each token was sent to,
        ``LongTensor [B, T, n_moe_layers, top_k]``. ``routes`` of that shape
        forces those experts instead of the router's top-k (the trainer
        replays the sampler's routing); a token whose entry for a layer starts
        with a negative id is routed normally in that layer. Forced routing
        changes which experts run, not how they are weighted: the combine
        weights are the router's scores of the forced experts, so the router
        still gets a gradient. Not guaranteed: that replayed routes reproduce
        the sampler's logits exactly (the attention path and reductions may
        still differ by rounding).
        """
        b, t = input_ids.shape
        if routes is not None and routes.shape != (b, t, self.cfg.n_layers, self.cfg.top_k):
            raise ValueError(
                f"routes must be [B, T, n_moe_layers, top_k] = {(b, t, self.cfg.n_layers, self.cfg.top_k)}, "
                f"got {tuple(routes.shape)}"
            )
        device = input_ids.device
        pos = rows = None
        if cache is None:
            if t > self.cfg.max_seq_len:
                raise ValueError(f"sequence of {t} tokens exceeds max_seq_len {self.cfg.max_seq_len}")
            cos, sin = self.rope_cos[:t][None, None], self.rope_sin[:t][None, None]
        else:
            if slots is None or slots.shape != (b,):
                raise ValueError("a cached forward needs slots: LongTensor[B], one slot per row")
            slots = slots.to(cache.lengths.device)
            if b and (int(slots.min()) < 0 or int(slots.max()) >= cache.max_slots):
                raise ValueError(f"slots must be in 0..{cache.max_slots - 1}, got {slots.tolist()}")
            if slots.unique().numel() != b:
                raise ValueError("each row must continue a different slot")
            start = cache.lengths[slots]
            if int(start.max()) + t > cache.max_len:
                raise ValueError(f"slot overflow: {int(start.max())} cached + {t} new > max_len {cache.max_len}")
            pos = start[:, None] + torch.arange(t, device=start.device)
            cos, sin = self.rope_cos[pos][:, None], self.rope_sin[pos][:, None]
            rows = SlotRows.of(slots, max_spread=self.slot_view_spread)
        with autocast_for(self.cfg.precision, device.type):
            x = self.embed(input_ids)
            aux, counts, used = [], [], []
            for i, block in enumerate(self.blocks):
                x, moe = block(x, cos, sin, cache, rows, pos, routes[:, :, i] if routes is not None else None)
                aux.append(moe.aux_loss)
                counts.append(moe.counts)
                used.append(moe.experts)
            h = self.norm(x)
            logits = self.lm_head(h).float()
        lm_side = None
        if self.copy is not None:
            logits, lm_side = self._copy_mix(h, logits, input_ids, cache, rows, pos)
        if cache is not None:
            cache.lengths[slots] += t
        coef = self.cfg.aux_loss_coef
        aux_loss = coef * torch.stack(aux).mean() if coef > 0 else torch.zeros((), device=device)
        out_routes = torch.stack(used, dim=2) if return_routes else None
        return ModelOutput(logits=logits, aux_loss=aux_loss, expert_counts=torch.stack(counts), routes=out_routes,
                           lm_side=lm_side)

    def _copy_mix(self, h: torch.Tensor, logits: torch.Tensor, input_ids: torch.Tensor, cache: KVCache | None,
                  rows: SlotRows | None, pos: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The copy head's mixture (``agent.model.copy_head``) as log-probabilities, and its LM side;
        with a cache the rows' keys and ids are stored first, so a query sees every earlier position
        of its slot."""
        assert self.copy is not None
        keys = self.copy.keys(h)
        gap = self.cfg.copy_min_distance
        if cache is None:
            b, t = input_ids.shape
            allowed = torch.ones(t, t, dtype=torch.bool, device=h.device).tril(-gap)[None].expand(b, t, t)
            if self.cfg.copy_context_only:
                allowed = allowed & (torch.arange(t, device=h.device)[None, None, :] < context_end(input_ids)[:, :, None])
            return self.copy.mixture(h, logits, keys, input_ids, input_ids, allowed)
        assert rows is not None and pos is not None and cache.copy_keys is not None and cache.ids is not None
        slots = rows.slots
        cache.copy_keys[slots[:, None], pos] = keys
        cache.ids[slots[:, None], pos] = input_ids.to(cache.ids.device)
        n = int(pos[:, -1].max()) + 1
        all_keys, ids = rows.take(cache.copy_keys)[:, :n], cache.ids[slots, :n]
        entries = torch.arange(n, device=h.device)[None, None, :]
        allowed = entries <= pos[:, :, None] - gap
        if self.cfg.copy_context_only:
            # from the slot's whole id history, so a cached query gets the bound a full forward gives it
            allowed = allowed & (entries < context_end(ids).gather(1, pos.to(ids.device))[:, :, None])
        return self.copy.mixture(h, logits, all_keys, ids, input_ids, allowed, rows=rows)

    @torch.no_grad()
    def logprobs(self, input_ids: torch.Tensor) -> torch.Tensor:
        """``[B, T-1]``: log p(token t+1 | tokens ≤ t) under a no-cache forward (fp32)."""
        logits = self(input_ids).logits[:, :-1]
        return torch.log_softmax(logits, dim=-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)

    @torch.no_grad()
    def update_router_bias(self, expert_counts: torch.Tensor) -> None:
        """Auxiliary-loss-free balancing step from ``ModelOutput.expert_counts`` (no-op at rate 0)."""
        for block, counts in zip(self.blocks, expert_counts, strict=True):
            block.moe.update_bias(counts)

    def with_copy_head(self, twin: torch.Tensor | None = None, min_distance: int = 1, *,
                       successor_keys: bool = False, context_only: bool = False) -> MoETransformer:
        """A new model with these weights and a fresh copy head (``cfg.copy_head``; its init keeps
        the LM head's distribution mostly as it was, see :class:`CopyHead`). ``twin`` is
        :func:`agent.model.copy_head.twin_ids` of the model's tokenizer (None: no twin entries);
        ``min_distance`` becomes ``cfg.copy_min_distance``, ``successor_keys``
        ``cfg.copy_successor_keys`` and ``context_only`` ``cfg.copy_context_only``. Raises ``ValueError`` if this model
        has one already."""
        from dataclasses import replace

        if self.copy is not None:
            raise ValueError("this model already has a copy head")
        model = MoETransformer(replace(self.cfg, copy_head=True, copy_min_distance=min_distance,
                                       copy_successor_keys=successor_keys, copy_context_only=context_only))
        missing, unexpected = model.load_state_dict(self.state_dict(), strict=False)
        assert not unexpected and all(k.startswith("copy.") for k in missing), (missing, unexpected)
        if twin is not None:
            assert model.copy is not None
            model.copy.set_twins(twin)
        return model.train(self.training)

    def num_params(self, *, active: bool = False) -> int:
        """All parameters, or those one token uses (top_k of n_experts routed experts)."""
        total = sum(p.numel() for p in self.parameters())
        if not active:
            return total
        idle = self.cfg.n_experts - self.cfg.top_k
        per_expert = sum(p[0].numel() for b in self.blocks for p in (b.moe.w13, b.moe.w2))
        return total - idle * per_expert
