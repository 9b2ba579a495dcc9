"""Grouped matmul for mixture-of-experts: one call over every expert's rows.

``x`` holds the tokens already permuted so that each expert's rows are
contiguous; ``offsets[e]:offsets[e+1]`` are expert ``e``'s rows (an expert
may have none). ``w[e]`` is expert ``e``'s ``[K, N]`` weight.
``grouped_mm_reference`` (a plain loop) is the definition; rows outside
``offsets[0]:offsets[-1]`` get zeros.

* ``fp32`` / ``bf16``: ``torch._grouped_mm`` when it applies (CPU; CUDA
  bfloat16 on compute capability >= 9 with 16-byte-aligned rows), else the
  loop. Equal to the reference up to float summation order (bf16: both round
  their output to bfloat16).
* ``mxfp8``: an autograd Function. Forward quantises ``x`` along K (per token
  row) and ``w`` along K (per expert). Backward re-quantises from the saved
  high-precision tensors: ``grad_x = grad_out @ w[e].T`` with ``grad_out``
  and ``w`` along N; ``grad_w[e] = x_e.T @ grad_out_e`` with both along the
  token axis, each expert's group zero-padded to a multiple of 32 so that no
  block spans two experts. An expert with no tokens gets a zero gradient.
  Products are emulated (exact dequantisation, float32 matmul) except on a
  GPU with MX block-scaled matmul, where each expert runs through
  ``kernels.linear.mx_mm``'s hardware path (not run here: no such GPU).

Not guaranteed: ``offsets`` are validated for shape only (they must be
non-decreasing and within [0, T]); every call reads them on the host.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch

from kernels.linear import fake_quantize, hardware_mx_available, mx_mm
from kernels.mx import BLOCK

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


def _fast_path_ok(x: torch.Tensor, w: torch.Tensor, bounds: list[int]) -> bool:
    if not hasattr(torch, "_grouped_mm") or bounds[0] != 0 or bounds[-1] != x.shape[0]:
        return False
    if x.dtype != w.dtype or x.dtype not in (torch.float32, torch.bfloat16) or not _aligned(x, x.shape[1], w.shape[2]):
        return False
    if x.device.type == "cpu":
        return True
    return x.is_cuda and x.dtype == torch.bfloat16 and torch.cuda.get_device_capability(x.device)[0] >= 9


def _aligned(t: torch.Tensor, *dims: int) -> bool:
    """``torch._grouped_mm`` wants every row stride to be a multiple of 16 bytes."""
    per_16 = 16 // t.element_size()
    return all(d % per_16 == 0 for d in dims)


class _GroupedMM(torch.autograd.Function):
    """``torch._grouped_mm`` with an explicit backward (its own rejects expanded gradients)."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor, w: torch.Tensor,
                ends: torch.Tensor) -> torch.Tensor:  # fmt: skip
        ctx.save_for_backward(x, w, ends)
        return torch._grouped_mm(x, w, offs=ends)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx,
                 grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # fmt: skip
        x, w, ends = ctx.saved_tensors
        grad = grad.contiguous()
        gx = gw = None
        if ctx.needs_input_grad[0]:
            gx = torch._grouped_mm(grad, w.transpose(1, 2).contiguous(), offs=ends)
        if ctx.needs_input_grad[1]:
            # pad the token axis to 16 bytes (the zero rows lie past every group);
            # an expert with no rows gets a zero slice
            pad = (-x.shape[0]) % (16 // x.element_size())
            xt = torch.nn.functional.pad(x, (0, 0, 0, pad)).t().contiguous()
            gw = torch._grouped_mm(xt, torch.nn.functional.pad(grad, (0, 0, 0, pad)), offs=ends)
        return gx, gw, None


def _plain(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    bounds = offsets.tolist()
    if _fast_path_ok(x, w, bounds):
        ends = offsets[1:].to(device=x.device, dtype=torch.int32)
        return _GroupedMM.apply(x.contiguous(), w.contiguous(), ends)
    return grouped_mm_reference(x, w, offsets)


def pad_groups(t: torch.Tensor, offsets: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
    """Copy each group's rows of ``t`` to a start that is a multiple of 32, zero-filling the gaps.

    Returns the padded tensor and the padded group starts (E+1 entries).
    Rows outside ``offsets[0]:offsets[-1]`` are dropped.
    """
    bounds = offsets.tolist()
    counts = [hi - lo for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]
    starts = [0]
    for c in counts:
        starts.append(starts[-1] + -(-c // BLOCK) * BLOCK)
    out = t.new_zeros(starts[-1], *t.shape[1:])
    if sum(counts):
        dev = t.device
        src = torch.cat([torch.arange(lo, hi, device=dev) for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)])
        dst = torch.cat([torch.arange(s, s + c, device=dev) for s, c in zip(starts[:-1], counts, strict=True)])
        out[dst] = t[src]
    return out, starts


class _MXFP8GroupedMM(torch.autograd.Function):
    """The ``mxfp8`` branch of ``grouped_mm`` (see the module docstring)."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor, w: torch.Tensor,
                offsets: torch.Tensor) -> torch.Tensor:  # fmt: skip
        ctx.save_for_backward(x, w, offsets)
        if hardware_mx_available(x.device):  # pragma: no cover - needs a Blackwell GPU
            out = _per_expert(x, w, offsets, mx_mm, w.shape[2])
        else:
            out = _plain(fake_quantize(x, axis=1), fake_quantize(w, axis=1), offsets)
        return out.to(x.dtype)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx,
                 grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # fmt: skip
        x, w, offsets = ctx.saved_tensors
        gx = gw = None
        hardware = hardware_mx_available(x.device)
        if ctx.needs_input_grad[0]:
            wt = w.transpose(1, 2)  # [E, N, K]: contraction over N
            if hardware:  # pragma: no cover - needs a Blackwell GPU
                gx = _per_expert(grad, wt, offsets, mx_mm, w.shape[1])
            else:
                gx = _plain(fake_quantize(grad, axis=1), fake_quantize(wt, axis=1), offsets)
            gx = gx.to(x.dtype)
        if ctx.needs_input_grad[1]:
            gw = _grad_weight(x, grad, offsets, hardware).to(w.dtype)
        return gx, gw, None


def _per_expert(a: torch.Tensor, b: torch.Tensor, offsets: torch.Tensor,
                mm: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], n: int) -> torch.Tensor:  # fmt: skip
    out = a.new_zeros(a.shape[0], n, dtype=torch.float32)
    bounds = offsets.tolist()
    for e in range(b.shape[0]):
        lo, hi = bounds[e], bounds[e + 1]
        if hi > lo:
            out[lo:hi] = mm(a[lo:hi], b[e])
    return out


def _grad_weight(x: torch.Tensor, grad: torch.Tensor, offsets: torch.Tensor, hardware: bool) -> torch.Tensor:
    """``grad_w[e] = x_e.T @ grad_e`` with both operands quantised along tokens, groups padded to 32."""
    n_exp = offsets.shape[0] - 1
    xp, starts = pad_groups(x, offsets)
    gp, _ = pad_groups(grad, offsets)
    gw = x.new_zeros(n_exp, x.shape[1], grad.shape[1], dtype=torch.float32)
    if hardware:  # pragma: no cover - needs a Blackwell GPU
        for e in range(n_exp):
            if starts[e + 1] > starts[e]:
                gw[e] = mx_mm(xp[starts[e] : starts[e + 1]].t(), gp[starts[e] : starts[e + 1]])
        return gw
    # one quantisation call each: groups start on block boundaries, so no block mixes experts
    xq = fake_quantize(xp, axis=0)
    gq = fake_quantize(gp, axis=0)
    if hasattr(torch, "_grouped_mm") and x.device.type == "cpu" and starts[-1] > 0 and _aligned(xq, grad.shape[1]):
        ends = torch.tensor(starts[1:], dtype=torch.int32)
        return torch._grouped_mm(xq.t().contiguous(), gq, offs=ends)
    for e in range(n_exp):
        lo, hi = starts[e], starts[e + 1]
        if hi > lo:
            gw[e] = xq[lo:hi].t() @ gq[lo:hi]
    return gw


def grouped_mm(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, *, precision: Precision = "fp32") -> torch.Tensor:
    """``out[offsets[e]:offsets[e+1]] = x[offsets[e]:offsets[e+1]] @ w[e]`` for every expert; autograd-aware."""
    _check(x, w, offsets)
    if precision == "fp32":
        return _plain(x, w, offsets)
    if precision == "bf16":
        return _plain(x.bfloat16(), w.bfloat16(), offsets).to(x.dtype)
    if precision == "mxfp8":
        return _MXFP8GroupedMM.apply(x, w, offsets)
    raise ValueError(f"unknown precision {precision!r}")
