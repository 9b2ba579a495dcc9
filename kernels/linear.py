"""MXFP8 linear layer: every matmul operand is quantised to MXFP8 along the contraction axis.

``y = x @ W.T`` quantises ``x`` and ``W`` along K. The backward pass
re-quantises from the saved high-precision tensors along the axis each
product contracts over (never re-uses the forward's quantised copies, whose
blocks run the wrong way):

* ``grad_x = grad_y @ W``: ``grad_y`` and ``W`` along N;
* ``grad_W = grad_y.T @ x``: both along the token axis (flattened batch).

Where the matmul runs:

* Emulated (CPU, and GPUs without MX block-scaled matmul, e.g. H100/H200):
  dequantise both operands exactly to float32 and multiply in float32. The
  products are those of the quantised values; only the float32 accumulation
  order differs from hardware.
* Hardware (CUDA compute capability >= 10, i.e. Blackwell-class, with
  ``torch._scaled_mm`` and ``torch.float8_e8m0fnu``): ``torch._scaled_mm``
  on E4M3 data with E8M0 scales in cuBLAS's swizzled layout, bfloat16 output
  (upcast to float32 here). Used only when M and N are multiples of 16;
  otherwise emulated. THIS BRANCH HAS NOT BEEN RUN: no such GPU was
  available when it was written. Its output is not bit-identical to the
  emulation (bfloat16 output rounding, accumulation order).

Quantisation uses the Triton kernel for CUDA tensors and the torch reference
otherwise; the two are bit-identical. Scale mode: RCEIL throughout.
"""

from __future__ import annotations

import functools

import torch

from kernels.mx import MXTensor, ScaleMode, dequantize_mx, quantize_mx

SCALE_MODE = ScaleMode.RCEIL


def quantize(x: torch.Tensor, axis: int) -> MXTensor:
    """MXFP8-quantise ``x`` along ``axis`` with the fastest bit-identical implementation for its device."""
    if x.is_cuda:
        from kernels.triton_mx import quantize_mx_triton

        return quantize_mx_triton(x, axis=axis, mode=SCALE_MODE)
    return quantize_mx(x, axis=axis, mode=SCALE_MODE)


def fake_quantize(x: torch.Tensor, axis: int) -> torch.Tensor:
    """``x`` rounded through MXFP8 along ``axis``, as float32 (exact values of the quantised tensor)."""
    return dequantize_mx(quantize(x, axis), torch.float32)


@functools.cache
def _hardware_mx(device_index: int) -> bool:
    if not (hasattr(torch, "_scaled_mm") and hasattr(torch, "float8_e8m0fnu")):
        return False
    major, _ = torch.cuda.get_device_capability(device_index)
    return major >= 10


def hardware_mx_available(device: torch.device) -> bool:
    """True when ``device`` is a GPU with MX block-scaled matmul (Blackwell-class); H100/H200 are not."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    return _hardware_mx(device.index if device.index is not None else torch.cuda.current_device())


def _swizzle_scales(scales: torch.Tensor) -> torch.Tensor:
    """cuBLAS's block-scaling-factor layout: 128x4 tiles, each stored as 32x16 (see torchao ``to_blocked``)."""
    rows, cols = scales.shape
    rb, cb = -(-rows // 128), -(-cols // 4)
    padded = scales.new_zeros(rb * 128, cb * 4)
    padded[:rows, :cols] = scales
    tiles = padded.view(rb, 128, cb, 4).permute(0, 2, 1, 3)
    return tiles.reshape(-1, 4, 32, 4).transpose(1, 2).reshape(-1, 32, 16).flatten()


def _hardware_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:  # pragma: no cover - needs a Blackwell GPU
    qa = quantize(a, axis=1)  # [M, Kp] row-major
    qb = quantize(b.t(), axis=1)  # [N, Kp]: b column-major, blocks along K
    out = torch._scaled_mm(
        qa.data.view(torch.float8_e4m3fn),
        qb.data.view(torch.float8_e4m3fn).t(),
        _swizzle_scales(qa.scales).view(torch.float8_e8m0fnu),
        _swizzle_scales(qb.scales).view(torch.float8_e8m0fnu),
        out_dtype=torch.bfloat16,
    )
    return out.float()


def mx_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` (float32 result) with ``a`` [M, K] and ``b`` [K, N] both quantised to MXFP8 along K.

    ``b`` may be a transposed view. Not guaranteed: identical results on the
    hardware and emulated paths (see the module docstring).
    """
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"mx_mm wants [M, K] @ [K, N], got {tuple(a.shape)} @ {tuple(b.shape)}")
    m, n = a.shape[0], b.shape[1]
    if hardware_mx_available(a.device) and m % 16 == 0 and n % 16 == 0 and a.shape[1] > 0:
        return _hardware_mm(a, b)
    return fake_quantize(a, axis=1) @ fake_quantize(b, axis=0)


class MXFP8LinearFunction(torch.autograd.Function):
    """``x @ weight.T + bias`` with MXFP8 operands in the forward and both backward products.

    The bias and its gradient stay in high precision. Output and gradients are
    computed in float32 and cast to the dtype of the tensor they belong to.
    """

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor, weight: torch.Tensor,
                bias: torch.Tensor | None) -> torch.Tensor:  # fmt: skip
        x2 = x.reshape(-1, x.shape[-1])
        out = mx_mm(x2, weight.t())
        if bias is not None:
            out = out + bias.float()
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        ctx.bias_dtype = bias.dtype if bias is not None else None
        return out.reshape(*x.shape[:-1], weight.shape[0]).to(x.dtype)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx,
                 grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # fmt: skip
        x, weight = ctx.saved_tensors
        g2 = grad_out.reshape(-1, weight.shape[0])
        x2 = x.reshape(-1, x.shape[-1])
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = mx_mm(g2, weight).reshape(x.shape).to(x.dtype)  # contraction over N
        if ctx.needs_input_grad[1]:
            grad_w = mx_mm(g2.t(), x2).to(weight.dtype)  # contraction over tokens
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = g2.float().sum(0).to(ctx.bias_dtype)
        return grad_x, grad_w, grad_b


def mxfp8_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` with MXFP8 operands: x [..., K], weight [N, K], bias [N] or None → [..., N]."""
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(f"x has K = {x.shape[-1]} but weight is {tuple(weight.shape)}")
    return MXFP8LinearFunction.apply(x, weight, bias)


class MXFP8Linear(torch.nn.Linear):
    """Drop-in ``nn.Linear`` whose forward and backward matmuls run in MXFP8 (weights stay high precision)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return mxfp8_linear(x, self.weight, self.bias)

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear) -> MXFP8Linear:
        """A copy of ``linear`` (same parameters, shared storage) that computes in MXFP8."""
        new = cls(linear.in_features, linear.out_features, bias=linear.bias is not None,
                  device=linear.weight.device, dtype=linear.weight.dtype)  # fmt: skip
        new.weight = linear.weight
        new.bias = linear.bias
        return new
