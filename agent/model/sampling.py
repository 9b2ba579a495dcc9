"""Sampling and streamed detokenisation for the generation engine.

Two pieces, both independent of the model:

* :func:`sample` turns one step's logits (a row per sequence) into tokens with
  per-row temperature and top-p, and reports each token's log-probability
  under the model's own distribution (temperature 1, no top-p) or, per row,
  under the tempered one (see there).
* :class:`TextStream` turns a sequence's tokens into text pieces that are safe
  to show: complete UTF-8 characters only, and never any part of a stop
  sequence (a stop that spans several tokens is held back until it either
  completes — then the sequence ends before it — or cannot complete).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch


def sample(
    logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor, uniform: torch.Tensor,
    processed: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row; return ``(tokens [B], logprobs [B])``.

    ``logits`` is ``[B, V]``; ``temperature``, ``top_p`` and ``uniform`` are
    ``[B]``. Temperature 0 is greedy (argmax). ``uniform`` holds one draw in
    [0, 1) per row, taken from the row's own seeded generator, so a request's
    samples do not depend on which other requests share the batch.

    The logprob reported is ``log_softmax(logits)[token]`` of the *unscaled*
    logits: the model's distribution, exactly what the training forward
    computes at temperature 1 (``model.logprobs``). At temperature 1 and
    top_p 1 this is also the distribution the token was drawn from; with any
    other temperature or top-p it is not (the sampler's distribution is the
    tempered, truncated one).

    ``processed`` (``[B]`` bool, optional) changes that per row: a row marked
    reports ``log_softmax(logits / temperature)[token]``, the tempered
    distribution it was drawn from (a greedy row: the model's own). RL
    rollouts ask for it so that the recorded behaviour logprobs are what a
    trainer that optimises the tempered policy (logits / T, as verl's actor
    does) computes. Not applied: top-p truncation (an RL sampler keeps top_p 1).
    """
    logits = logits.float()
    logp = torch.log_softmax(logits, dim=-1)
    report = logp
    if processed is not None and bool((processed & (temperature > 0) & (temperature != 1)).any()):
        t = torch.where(processed & (temperature > 0), temperature, torch.ones_like(temperature)).float()
        report = torch.log_softmax(logits / t[:, None], dim=-1)
    greedy = temperature <= 0
    tokens = logits.argmax(dim=-1)
    if not bool(greedy.all()):
        if bool((temperature == 1).all()):
            probs = logp.exp()  # the common RL case: the model's own distribution
        else:
            t = torch.where(greedy, torch.ones_like(temperature), temperature).float()
            probs = torch.softmax(logits / t[:, None], dim=-1)
        order = None  # inverse-CDF sampling works in any order: sort only for top-p
        if bool((top_p < 1).any()):
            probs, order = probs.sort(dim=-1, descending=True)
            # keep the smallest prefix whose mass reaches top_p (always >= 1 token)
            keep = (probs.cumsum(dim=-1) - probs) < top_p[:, None].float()
            probs = probs * keep
        cdf = probs.cumsum(dim=-1)
        target = uniform.float()[:, None] * cdf[:, -1:]
        pick = torch.searchsorted(cdf, target, right=True).squeeze(1)
        # rounding can put the target at or past the end: take the last token with mass
        last = (probs > 0).long().cumsum(dim=-1).argmax(dim=-1)
        pick = torch.minimum(pick, last)
        drawn = order.gather(1, pick[:, None]).squeeze(1) if order is not None else pick
        tokens = torch.where(greedy, tokens, drawn)
    return tokens, report.gather(1, tokens[:, None]).squeeze(1)


class TextStream:
    """Incremental detokeniser with stop-sequence handling for one sequence.

    ``push(token)`` returns ``(text, stopped)``: the text that became safe to
    emit, and whether a stop sequence completed (the returned text then ends
    right before it and the sequence is over). ``end(marker)`` closes a
    sequence that sampled an end token, ``flush()`` one that ended for another
    reason (length); both return the text still held back.

    UTF-8: byte-level BPE tokens can split a character; ``decode`` of such a
    window ends with U+FFFD, so text is held until the character completes
    (the window technique of text-generation-inference). Bytes that never
    form a valid character come out as U+FFFD, as ``decode`` would give them.
    Not guaranteed: that a stop sequence is matched if ``decode`` would not
    produce it literally (for example a special token that decode skips).
    """

    def __init__(self, decode: Callable[[list[int]], str], stops: Sequence[str] = ()):
        self._decode = decode
        self._stops = [s for s in stops if s]
        self._ids: list[int] = []
        self._prefix = 0  # window start: the tokens before it are settled text
        self._read = 0  # tokens up to here are in self.text
        self.text = ""  # complete-character text decoded so far
        self._emitted = 0  # characters of self.text handed out

    def push(self, token: int) -> tuple[str, bool]:
        self._ids.append(token)
        settled = self._decode(self._ids[self._prefix : self._read])
        window = self._decode(self._ids[self._prefix :])
        if len(window) > len(settled) and not window.endswith("\ufffd"):
            self.text += window[len(settled) :]
            self._prefix, self._read = self._read, len(self._ids)
        return self._release(final=False)

    def flush(self) -> str:
        """The held-back text (partial characters as U+FFFD, unfinished stop prefixes)."""
        self.flush_pending()
        return self._release(final=True)[0]

    def end(self, marker: str) -> str:
        """The sequence ended with an end token whose text is ``marker`` (not emitted):
        the rest of the text, cut where a stop sequence that completes with the marker
        begins — so a stop ``"\\n<|end|>"`` drops the newline the chat template puts
        before the end marker."""
        pending = self.flush_pending()
        probe = pending + marker
        hits = [i for i in (probe.find(s) for s in self._stops) if 0 <= i < len(pending)]
        out = pending[: min(hits)] if hits else pending
        self._emitted += len(out)
        return out

    def flush_pending(self) -> str:
        """Decode whatever tokens are still undecoded; return the text not yet emitted."""
        settled = self._decode(self._ids[self._prefix : self._read])
        window = self._decode(self._ids[self._prefix :])
        self.text += window[len(settled) :]
        self._prefix = self._read = len(self._ids)
        return self.text[self._emitted :]

    def _release(self, *, final: bool) -> tuple[str, bool]:
        pending = self.text[self._emitted :]
        hits = [i for i in (pending.find(s) for s in self._stops) if i >= 0]
        if hits:
            out = pending[: min(hits)]
            self._emitted += len(out)
            return out, True
        hold = 0 if final else self._stop_prefix_len(pending)
        out = pending[: len(pending) - hold]
        self._emitted += len(out)
        return out, False

    def _stop_prefix_len(self, pending: str) -> int:
        """Length of the longest suffix of ``pending`` that starts some stop sequence."""
        best = 0
        for s in self._stops:
            if s[0] not in pending[-(len(s) - 1):] if len(s) > 1 else True:
                continue  # no suffix can start this stop (the common case: a cheap scan)
            for k in range(min(len(s) - 1, len(pending)), best, -1):
                if pending.endswith(s[:k]):
                    best = k
                    break
        return best
