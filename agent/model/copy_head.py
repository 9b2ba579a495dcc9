"""A pointer-sentinel copy head (Merity et al., 2016, "Pointer sentinel mixture models"), for
next-token prediction in a decoder-only model.

Every task the agent is trained on copies text from its context: a path from the request, a
function name from a grep result, a line from a file it read into an ``edit_file`` search. A
transformer learns that with an induction circuit (a previous-token head feeding a head that
attends to "what came after the last time I saw this"), and a small model on a CPU budget grows
it late or not at all (docs/rl/README.md: a ~1,000-step plateau in SFT, and a random `mini`
init that never learned to copy a path in 1,500 steps of drills). This head makes that lookup
one bilinear attention at the top of the network:

* from the final hidden state ``h_t``: a query ``q_t = W_q h_t``, and for every earlier position
  ``j < t`` a key ``k_j = W_k h_j`` whose *value* is the token that followed it, ``x_{j+1}``
  (known for every ``j < t``); plus a learned sentinel key ``s`` and bias ``b``;
* ``a = softmax([q_t·k_0, ..., q_t·k_{t-1}, q_t·s] / sqrt(d) + [0, ..., 0, b])``; the sentinel's weight
  ``g = a_sentinel`` is the share left to the LM head;
* ``p(w) = g · softmax(lm_logits)_w + Σ_{j < t, x_{j+1} = w} a_j``.

Position 0 has only the sentinel (``g = 1``): the LM head alone. The head returns
``log p`` — a normalised log-distribution, so every consumer that takes ``log_softmax`` of the
model's logits (SFT's cross-entropy, GRPO's logprobs, the engine's sampler) gets the mixture
unchanged (``log_softmax`` of log-probabilities is the identity). Keys carry no rotary position:
the match is on content.

Not guaranteed: bit-identical results between the cached and the no-cache forward (they agree
to ~1e-6 in fp32, as the attention does); anything under MXFP8/bf16 beyond "computed in fp32"
(the head's matmuls run in fp32 whatever ``precision`` says).
"""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["CopyHead"]

_TINY = 1e-30  # log(0) guard: a token nothing points at gets -69 from the copy side, never -inf


class CopyHead(nn.Module):
    def __init__(self, d_model: int, max_seq_len: int) -> None:
        super().__init__()
        self.dim, self.max_seq_len = d_model, max_seq_len
        self.wq = nn.Linear(d_model, d_model, bias=False)
        self.wk = nn.Linear(d_model, d_model, bias=False)
        self.sentinel = nn.Parameter(torch.zeros(d_model))
        self.sentinel_bias = nn.Parameter(torch.zeros(()))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Small random query/key maps; the sentinel's bias starts at ``log(max_seq_len)``, so at
        init the LM head keeps at least half the mass at every position (all scores ~0: the
        sentinel weighs as much as ``max_seq_len`` earlier positions together) and a checkpoint
        that gains the head starts close to what it was."""
        nn.init.normal_(self.wq.weight, std=0.02)
        nn.init.normal_(self.wk.weight, std=0.02)
        nn.init.zeros_(self.sentinel)
        with torch.no_grad():
            self.sentinel_bias.fill_(math.log(self.max_seq_len))

    def keys(self, h: torch.Tensor) -> torch.Tensor:
        """``[B, T, d]`` copy keys of hidden states ``h [B, T, d]`` (what the cache stores)."""
        return self.wk(h.float())

    def forward(self, h: torch.Tensor, lm_logits: torch.Tensor, keys: torch.Tensor, successors: torch.Tensor,
                allowed: torch.Tensor) -> torch.Tensor:
        """``log p [B, T, V]`` of the mixture for queries ``h [B, T, d]``.

        ``keys [B, N, d]`` and ``successors [B, N]`` (the token after each key position; any id
        where unknown) are the positions a query may point at; ``allowed [B, T, N]`` says which
        (``j < t`` in absolute positions)."""
        q = self.wq(h.float())
        scale = 1.0 / math.sqrt(self.dim)
        scores = torch.einsum("btd,bnd->btn", q, keys) * scale
        scores = scores.masked_fill(~allowed, float("-inf"))
        sentinel = ((q @ self.sentinel) * scale + self.sentinel_bias)[..., None]  # [B, T, 1]
        attn = torch.softmax(torch.cat([scores, sentinel], dim=-1), dim=-1)
        point, gate = attn[..., :-1], attn[..., -1:]
        b, t, n = point.shape
        p_copy = torch.zeros(b, t, lm_logits.shape[-1], dtype=point.dtype, device=point.device)
        p_copy.scatter_add_(2, successors[:, None, :].expand(b, t, n), point)
        lm = torch.log_softmax(lm_logits.float(), dim=-1) + gate.clamp_min(_TINY).log()
        return torch.logaddexp(lm, p_copy.clamp_min(_TINY).log())
