"""Grouped matmul for mixture-of-experts: one call over every expert's rows.

``x`` holds the tokens already permuted so that each expert's rows are
contiguous; ``offsets[e]:offsets[e+1]`` are expert ``e``'s rows (an expert
may have none). ``w[e]`` is expert ``e``'s ``[K, N]`` weight.

Precision ``fp32`` and ``bf16`` are plain PyTorch here; ``mxfp8`` quantises
along K in the forward and re-quantises along the axes each backward product
needs (see ``kernels/mx.py``).
"""

from __future__ import annotations

from typing import Literal

import torch

Precision = Literal["fp32", "bf16", "mxfp8"]


def _check(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> None:
    if x.dim() != 2 or w.dim() != 3 or x.shape[1] != w.shape[1]:
        raise ValueError(f"grouped_mm wants x [T, K] and w [E, K, N]; got {tuple(x.shape)} and {tuple(w.shape)}")
    if offsets.shape != (w.shape[0] + 1,):
        raise ValueError(f"offsets must have E+1 = {w.shape[0] + 1} entries, got {tuple(offsets.shape)}")


def grouped_mm_reference(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """The definition: a plain loop over experts (fp32 or the inputs' dtype)."""
    _check(x, w, offsets)
    out = x.new_zeros(x.shape[0], w.shape[2])
    bounds = offsets.tolist()
    for e in range(w.shape[0]):
        lo, hi = bounds[e], bounds[e + 1]
        if hi > lo:
            out[lo:hi] = x[lo:hi] @ w[e]
    return out


def grouped_mm(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, *, precision: Precision = "fp32") -> torch.Tensor:
    """``out[offsets[e]:offsets[e+1]] = x[offsets[e]:offsets[e+1]] @ w[e]`` for every expert; autograd-aware."""
    _check(x, w, offsets)
    if precision == "fp32":
        return grouped_mm_reference(x, w, offsets)
    if precision == "bf16":
        return grouped_mm_reference(x.bfloat16(), w.bfloat16(), offsets).to(x.dtype)
    if precision == "mxfp8":
        raise NotImplementedError("mxfp8 grouped_mm: kernels/mx.py is being written")
    raise ValueError(f"unknown precision {precision!r}")
