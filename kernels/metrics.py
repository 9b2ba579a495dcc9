"""Accuracy metrics for low-precision kernels."""

from __future__ import annotations

import math

import torch


def sqnr_db(reference: torch.Tensor, approx: torch.Tensor) -> float:
    """Signal-to-quantisation-noise ratio ``10 log10(sum(ref^2) / sum((ref - approx)^2))`` in dB.

    Computed in float64 over all elements. Returns ``inf`` when the two are
    equal (including both all-zero) and ``-inf`` when the reference is all
    zero but ``approx`` is not; NaN anywhere gives NaN. Shapes must match.
    """
    if reference.shape != approx.shape:
        raise ValueError(f"shape mismatch: {tuple(reference.shape)} vs {tuple(approx.shape)}")
    ref = reference.detach().double()
    noise = float((ref - approx.detach().double()).pow(2).sum())
    signal = float(ref.pow(2).sum())
    if math.isnan(noise) or math.isnan(signal):
        return math.nan
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)
