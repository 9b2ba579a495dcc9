"""How a cached forward's rows reach their slots' rows of the KV cache without copying them.

A batched decode step (``agent.model.engine``) runs one row per busy slot, and every layer's
attention (and the copy head) needs each row's cached positions ``cache[slot, ..., :n]``.
Gathering them by slot id (``cache[slots]``) copies B × n positions per layer per step; at 32
rows × 900 cached tokens that copy costs more than the attention that reads it. When the rows'
slots lie in a narrow range ``lo .. hi``, ``cache[lo : hi + 1]`` is a view (no copy): the
queries are spread into the range's rows (zeros in the rows no query uses), attention runs over
the view, and each query's row is picked back out. Rows that are exactly ``lo, lo + 1, ...``
in order — every slot busy, the usual case while the RL driver decodes a full batch — need no
spreading at all.

:meth:`SlotRows.of` picks per forward: the view when the range is at most ``max_spread`` times
the number of rows (default 2: the spare rows' reads then cost no more than the gather's copy
would), else the gather. The caller masks each spare row to one key (position 0, which every
slot has), so no softmax row is all ``-inf``; what the spare rows compute is discarded.

Not guaranteed: bit-identical outputs between the view and the gather (the attention kernel
sees different batch shapes and strides; they agree to rounding); no copy at all when the cache's
dtype differs from the computation's (an fp32 cache under bf16 autocast is cast, spare rows
included — still less than gathering and casting); any speed-up on devices where the gather is
cheap next to the attention.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["SlotRows"]


@dataclass(frozen=True)
class SlotRows:
    """Rows ``slots [B]`` of a cached forward, as a view of the slot range ``span`` (with row i
    at ``index[i]`` of it, or at i when ``index`` is None) or, with ``span`` None, by gathering."""

    slots: torch.Tensor
    span: slice | None
    index: torch.Tensor | None

    @classmethod
    def of(cls, slots: torch.Tensor, *, max_spread: float = 2.0) -> SlotRows:
        """How to reach ``slots`` (distinct slot ids, any order): a view of their range when it is
        at most ``max_spread`` × ``len(slots)`` wide, else a gather (``max_spread=0``: always)."""
        ids = slots.tolist()
        lo, hi = min(ids), max(ids)
        if hi - lo + 1 > max_spread * len(ids):
            return cls(slots, None, None)
        span = slice(lo, hi + 1)
        if ids == list(range(lo, hi + 1)):
            return cls(slots, span, None)
        return cls(slots, span, slots - lo)

    @property
    def width(self) -> int:
        """Rows of what :meth:`take` returns (and :meth:`spread` makes)."""
        return self.span.stop - self.span.start if self.span is not None else len(self.slots)

    def take(self, per_slot: torch.Tensor) -> torch.Tensor:
        """``per_slot [S, ...]`` (a cache tensor, one row per slot) -> ``[width, ...]``: the range
        as a view, or the rows' slots gathered (a copy)."""
        return per_slot[self.span] if self.span is not None else per_slot[self.slots]

    def spread(self, x: torch.Tensor) -> torch.Tensor:
        """``x [B, ...]`` (one row per query row) -> ``[width, ...]`` aligned with :meth:`take`;
        the spare rows are zeros."""
        if self.index is None:
            return x
        out = x.new_zeros((self.width, *x.shape[1:]))
        out[self.index] = x
        return out

    def pick(self, y: torch.Tensor) -> torch.Tensor:
        """``y [width, ...]`` computed over :meth:`take`'s rows -> ``[B, ...]``, the query rows'."""
        return y if self.index is None else y[self.index]
