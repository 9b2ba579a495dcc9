"""A pointer-sentinel copy head (Merity et al., 2016, "Pointer sentinel mixture models"), for
next-token prediction in a decoder-only model.

Every task the agent is trained on copies text from its context: a path from the request, a
function name from a grep result, a line from a file it read into an ``edit_file`` search. A
transformer learns that with an induction circuit (a previous-token head feeding a head that
attends to "what came after the last time I saw this"), and a small model on a CPU budget grows
it late or not at all (docs/rl/runs.md: a ~1,000-step plateau in SFT, and a random `mini`
init that never learned to copy a path in 1,500 steps of drills). This head makes that lookup
one bilinear attention at the top of the network:

* from the final hidden state ``h_t``: a query ``q_t = W_q h_t``, and for every earlier position
  ``j < t`` a key ``k_j = W_k h_j`` whose *value* is the token that followed it, ``x_{j+1}``
  (known for every ``j < t``); plus a learned sentinel key ``s`` and bias ``b``;
* ``a = softmax([q_t·k_0, ..., q_t·k_{t-1}, q_t·s] / sqrt(d) + [0, ..., 0, b])``; the sentinel's weight
  ``g = a_sentinel`` is the share left to the LM head;
* ``p(w) = g · softmax(lm_logits)_w + Σ_{j < t, x_{j+1} = w} a_j``.

Three refinements, all from the eighth run's free-running failures (docs/rl/runs.md):

* **Twin successors.** Byte-level BPE merges a name with the character before it: `` nebula`` in a
  request and ``nebula`` after ``<param name="path">`` start with different ids (`` ne``, ``ne``), so a pointer that can only
  emit the token that followed could not write the first piece of a name in a new context. Every
  position therefore offers its successor twice: as it was, and as its *twin*, the same text
  without its leading space/punctuation character (``twin [V]``, a buffer computed from the
  tokenizer by :func:`twin_ids`; a token without one is its own twin and that entry is masked).
  The twin entry has its own key map (``W_k'``), so the model learns when a context calls for the
  stripped form.
* **A same-token bonus.** Having written ``nebula`` (bare), the next lookup must find the position
  of `` nebula`` (spaced) in the request to copy what followed it; the hidden states of two
  different ids need not match. Every score gets ``β · [twin(x_t) = twin(x_j)]`` (``match_bias``,
  one learned ``β`` for successor entries, one for twin entries; 0 at init), the induction step as
  one scalar instead of a map from every bare id to its spaced form.
* **A minimum pointer distance** (``cfg.copy_min_distance``, in the transformer): a query at ``t``
  may point only at ``j <= t - d``. With ``d = 1`` a copied token's own position answers the next
  query and the pointer loops (``PRAIERIIIIII``); a larger ``d`` makes every loop shorter than ``d``
  impossible for the pointer, at the price of copying from the last ``d - 1`` tokens (the LM head
  still can).

One option (``cfg.copy_successor_keys``, off by default), from the twenty-ninth run's finding that
a copied name does not stop (docs/rl/runs.md): ``h_j`` is computed before ``x_{j+1}`` exists, so
a key cannot say what its entry would emit, and after copying `` nebula`` from "rename `` `nebula` ``"
the pointer could not tell that the next entry emits the closing backtick. With the option every
entry's score gains ``q_t · e[w]``, ``e [V, d]`` a learned key per emitted token ``w`` (the
successor for successor entries, the twin for twin entries): "in this context, do not copy a
backtick". ``e`` starts at zero, so a head that gains it scores exactly as before.

**Context only** (``cfg.copy_context_only``, off by default), from the thirty-first run's finding that
most unclosed calls are loops the per-call token limit cut (``sed -i 's/zephyr_jasper/helium_nebula/
helium_nebula/helium_nebula/...``): having written ``/``, the pointer finds the ``/`` it wrote a few
tokens earlier and copies what followed it — its own output — and a run longer than the minimum
distance sustains itself. With the option a query inside a model output (the latest role or end
marker at or before it is ``<|assistant|>``) may point only at entries before that output's
``<|assistant|>`` marker (:func:`context_end`): it copies from the request, the files and the
tool results, never from what it is writing; the LM head still can repeat. The bound is a function
of the token ids alone, so the cached and the full forward agree; prefill positions of other
messages keep the plain rule.

Measured (docs/rl/runs.md, thirty-second run): against a sibling start from the same
pretraining, a start trained with it makes 4× the invalid calls and its held-out pass@1 is 0.129
against 0.168 — the demonstrations copy from the output they write (an edit's ``replace`` from its
``search``), and with those entries gone the pointer copies from the wrong place. Kept for
reproducing that run, not recommended.

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

from agent.model.slot_rows import SlotRows
from agent.model.tokenizer import SPECIAL_TOKENS, TOOL_TOKENS, Tokenizer

__all__ = ["CopyHead", "context_end", "twin_ids"]

_TINY = 1e-30  # log(0) guard: a token nothing points at gets -69 from the copy side, never -inf


# the role markers and the end marker (ids 2..6 by the tokenizer's convention), and <|assistant|>
_FIRST_MARKER, _LAST_MARKER = SPECIAL_TOKENS.index("<|system|>"), SPECIAL_TOKENS.index("<|end|>")
_ASSISTANT = SPECIAL_TOKENS.index("<|assistant|>")


def context_end(ids: torch.Tensor) -> torch.Tensor:
    """``[B, N] -> [B, N]``: for each position ``t``, the first entry a context-only pointer may
    not use — the position of the latest ``<|assistant|>`` marker when ``t`` lies in a model
    output (the latest role or end marker at or before ``t`` is ``<|assistant|>``), else ``N``
    (no bound beyond causality). The marker's own entry (which emits the output's first token)
    is excluded with the output. Not guaranteed: anything about a sequence that does not
    follow the chat template (a model output with no marker before it is not recognised)."""
    n = ids.shape[1]
    idx = torch.arange(n, device=ids.device)[None, :].expand_as(ids)
    marker = (ids >= _FIRST_MARKER) & (ids <= _LAST_MARKER)
    last = torch.where(marker, idx, torch.full_like(idx, -1)).cummax(dim=1).values
    in_output = (last >= 0) & (ids.gather(1, last.clamp(min=0)) == _ASSISTANT)
    return torch.where(in_output, last, torch.full_like(last, n))


def twin_ids(tokenizer: Tokenizer) -> torch.Tensor:
    """``[V]`` long: for each id, the id of its text without the first character when that character
    is a space or punctuation and the rest is one token of the vocabulary (`` self`` -> ``self``,
    ``_name`` -> ``name``); else the id itself. Special and tool tokens are their own twins."""
    n = tokenizer.vocab_size
    twin = torch.arange(n)
    reserved = set(tokenizer.special_ids.values()) | {tokenizer.token_id(t) for t in TOOL_TOKENS}
    for i in range(n):
        if i in reserved:
            continue
        text = tokenizer.decode([i])
        if len(text) < 2 or text[0].isalnum() or text[0] in "\n\r\ufffd" or not text[1].isalnum():
            continue
        ids = tokenizer.encode(text[1:])
        if len(ids) == 1:
            twin[i] = ids[0]
    return twin


class CopyHead(nn.Module):
    def __init__(self, d_model: int, max_seq_len: int, vocab_size: int, *, successor_keys: bool = False) -> None:
        super().__init__()
        self.dim, self.max_seq_len = d_model, max_seq_len
        self.wq = nn.Linear(d_model, d_model, bias=False)
        self.wk = nn.Linear(d_model, d_model, bias=False)
        self.wk_twin = nn.Linear(d_model, d_model, bias=False)
        self.sentinel = nn.Parameter(torch.zeros(d_model))
        self.sentinel_bias = nn.Parameter(torch.zeros(()))
        self.match_bias = nn.Parameter(torch.zeros(2))  # successor and twin entries' same-token bonus
        # successor-aware keys: a learned key per token an entry would emit, added to every entry's key
        # (zero at init, so a head that gains them scores as it did); None without cfg.copy_successor_keys
        self.successor_keys = nn.Parameter(torch.zeros(vocab_size, d_model)) if successor_keys else None
        # saved with the weights (a checkpoint is self-contained); identity until set_twins
        self.register_buffer("twin", torch.arange(vocab_size))
        self.reset_parameters()

    def set_twins(self, twin: torch.Tensor) -> None:
        """Install :func:`twin_ids` of the model's tokenizer (``[V]``)."""
        if twin.shape != self.twin.shape:
            raise ValueError(f"twin ids must be [{self.twin.shape[0]}], got {list(twin.shape)}")
        self.twin.copy_(twin)

    def reset_parameters(self) -> None:
        """Small random query/key maps; the sentinel's bias starts at ``log(2·max_seq_len)``, so at
        init the LM head keeps at least half the mass at every position (all scores ~0: the
        sentinel weighs as much as the ``2·max_seq_len`` successor and twin entries together) and a checkpoint
        that gains the head starts close to what it was."""
        nn.init.normal_(self.wq.weight, std=0.02)
        nn.init.normal_(self.wk.weight, std=0.02)
        nn.init.normal_(self.wk_twin.weight, std=0.02)
        nn.init.zeros_(self.sentinel)
        nn.init.zeros_(self.match_bias)
        if self.successor_keys is not None:
            nn.init.zeros_(self.successor_keys)
        with torch.no_grad():
            self.sentinel_bias.fill_(math.log(2 * self.max_seq_len))

    def keys(self, h: torch.Tensor) -> torch.Tensor:
        """``[B, T, 2d]`` copy keys of hidden states ``h [B, T, d]`` (what the cache stores): the
        successor's key, then its twin's."""
        h = h.float()
        return torch.cat([self.wk(h), self.wk_twin(h)], dim=-1)

    def forward(self, h: torch.Tensor, lm_logits: torch.Tensor, keys: torch.Tensor, key_ids: torch.Tensor,
                query_ids: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        """``log p [B, T, V]`` of the mixture for queries ``h [B, T, d]`` at tokens ``query_ids [B, T]``.

        ``keys [B, N, 2d]`` (:meth:`keys`) and ``key_ids [B, N]`` (the token at each position; the
        last one's successor is unknown and it must not be allowed) are the positions a query may
        point at; ``allowed [B, T, N]`` says which (``j <= t - copy_min_distance`` in absolute
        positions)."""
        return self.mixture(h, lm_logits, keys, key_ids, query_ids, allowed)[0]

    def mixture(self, h: torch.Tensor, lm_logits: torch.Tensor, keys: torch.Tensor, key_ids: torch.Tensor,
                query_ids: torch.Tensor, allowed: torch.Tensor,
                rows: SlotRows | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`forward`'s ``log p`` and its LM side ``log(g · softmax(lm_logits)) [B, T, V]``
        (``exp(lm side) / p`` is the share of a token's probability the LM head gives; the rest
        is the pointer's). Same arguments as :meth:`forward`, except that with ``rows`` (a cached
        forward, ``agent.model.slot_rows``) ``keys`` are ``rows.take`` of the cache's keys,
        ``[rows.width, N, 2d]``, which may hold rows no query uses."""
        q = self.wq(h.float())
        scale = 1.0 / math.sqrt(self.dim)
        # both entry kinds' raw scores in one batched matmul over the keys as stored ([W, N, 2d] ->
        # [W, 2N, d], no copy even for a strided view of the cache): [B, T, 2, N] (successor, twin);
        # faster on the CPU than two einsums over the split halves, the same values
        w, n = keys.shape[0], keys.shape[1]
        qw = q if rows is None else rows.spread(q)
        raw = (keys.reshape(w, 2 * n, self.dim) @ qw.transpose(1, 2)).view(w, n, 2, -1).permute(0, 3, 2, 1)
        raw = raw if rows is None else rows.pick(raw)
        successors = torch.cat([key_ids[:, 1:], torch.zeros_like(key_ids[:, :1])], dim=1)  # [B, N]
        twins = self.twin[successors]  # [B, N]
        if self.successor_keys is not None:
            # q_t · e[w] for the token w each entry emits: the pointer sees WHAT it would copy, which
            # h_j (computed before x_{j+1} arrived) cannot tell it. Few queries (decoding): scored once
            # per vocabulary token ([B, T, V]) and gathered per entry, since gathering a [B, 2N, d] key
            # table made a decode step 1.9x slower; many (training, prefill): the table, whose matmul
            # and backward are cheaper there (benchmarks/copy_successor_cost.py). The same values.
            emitted = torch.cat([successors, twins], dim=1)  # [B, 2N]
            if q.shape[1] <= self.dim:
                by_token = q @ self.successor_keys.T  # [B, T, V]
                per_entry = by_token.gather(2, emitted[:, None, :].expand(-1, q.shape[1], -1))  # [B, T, 2N]
            else:
                per_entry = q @ self.successor_keys[emitted].transpose(1, 2)  # [B, T, 2N]
            raw = raw + per_entry.view(raw.shape[0], raw.shape[1], 2, -1)
        raw = raw * scale
        # the same token (up to its twin) at the query and the key: the induction step "I just wrote
        # x; where was x; copy what came after it", one learned bonus per entry kind
        same = (self.twin[query_ids][:, :, None] == self.twin[key_ids][:, None, :]).float()  # [B, T, N]
        scores = raw[:, :, 0] + self.match_bias[0] * same
        scores = scores.masked_fill(~allowed, float("-inf"))
        twin_scores = raw[:, :, 1] + self.match_bias[1] * same
        twin_scores = twin_scores.masked_fill(~(allowed & (twins != successors)[:, None, :]), float("-inf"))
        sentinel = ((q @ self.sentinel) * scale + self.sentinel_bias)[..., None]  # [B, T, 1]
        attn = torch.softmax(torch.cat([scores, twin_scores, sentinel], dim=-1), dim=-1)
        point, gate = attn[..., :-1], attn[..., -1:]
        b, t, n = point.shape
        p_copy = torch.zeros(b, t, lm_logits.shape[-1], dtype=point.dtype, device=point.device)
        p_copy.scatter_add_(2, torch.cat([successors, twins], dim=1)[:, None, :].expand(b, t, n), point)
        lm = torch.log_softmax(lm_logits.float(), dim=-1) + gate.clamp_min(_TINY).log()
        return torch.logaddexp(lm, p_copy.clamp_min(_TINY).log()), lm
