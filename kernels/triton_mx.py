"""MXFP8 quantisation as a Triton kernel, bit-identical to ``kernels.mx.quantize_mx``.

The kernel never uses a float operation on the data beyond one exact
int -> float32 conversion (to find a denormal's leading bit): it loads float32 (or bfloat16) bit
patterns as integers and derives the E8M0 scale and the E4M3 bytes with the
integer steps of ``kernels.mx.block_scale_exponent`` and
``kernels.mx.encode_e4m3`` (see ``kernels/mx.py`` for the rules).
That matters twice: Triton's interpreter (``TRITON_INTERPRET=1``, how this
runs on a CPU) casts to float8 without saturation and with the wrong tie
rule, and on a GPU float ops may flush denormals or use approximate division.

Layout: the input is viewed as ``[outer, L, inner]`` with ``L`` the quantised
axis; one program handles ``BLOCKS`` blocks of 32, each block a strided
column when ``inner > 1``. Adjacent block ids are adjacent in memory, so a
tile's loads are coalesced along the block dimension.

CPU tensors run in Triton's interpreter, which must be chosen before
``triton`` is first imported: importing this module on a machine without
CUDA sets ``TRITON_INTERPRET=1`` when it is unset (the one import-time side
effect, needed because ``triton.language``'s own helpers are decorated at
import). If ``triton`` was imported earlier without it (torchao imports it),
CPU calls raise.

On a GPU (measured on an H200 with ``scripts/gpu_check.sh``; figures in
``benchmarks/results/quantize_gpu.json``) the compiled kernel is bit-identical
to the reference in every kernel test and on 16384x8192 tensors, and moves
about 2.8 TB/s (float32, last axis; 58% of the datasheet peak, 67% of a
measured device copy) — it is bound by its integer instructions, not memory.
Quantising along a strided axis or from bfloat16 is slower (1.3-2.1 TB/s).

Not guaranteed: speed in the interpreter (slow; keep CPU inputs small); the
GPU figures above on other devices or Triton versions.
"""

from __future__ import annotations

import math
import os
import sys

import torch

if "TRITON_INTERPRET" not in os.environ and "triton" not in sys.modules and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton import knobs  # noqa: E402

from kernels.mx import BLOCK, MXTensor, ScaleMode, normalize_axis  # noqa: E402


@triton.jit
def _quantize_mx_kernel(
    x_ptr,  # int32 float32-bits, or int16 bfloat16-bits when IS_BF16
    data_ptr,  # uint8 [outer, Lp, inner]
    scale_ptr,  # uint8 [outer, Lp // 32, inner]
    n_blocks,
    length,
    padded,
    inner,
    n_per_row,
    IS_BF16: tl.constexpr,
    RCEIL: tl.constexpr,
    BLOCKS: tl.constexpr,
    CONTIGUOUS: tl.constexpr,  # inner == 1 and length % 32 == 0: block b is elements 32b..32b+31
    INDEX64: tl.constexpr,  # offsets may pass 2**31
):
    pid = tl.program_id(0)
    if INDEX64:
        blk = pid.to(tl.int64) * BLOCKS + tl.arange(0, BLOCKS).to(tl.int64)
        k = tl.arange(0, 32).to(tl.int64)
    else:
        blk = pid * BLOCKS + tl.arange(0, BLOCKS)
        k = tl.arange(0, 32)
    blk_ok = blk < n_blocks
    if CONTIGUOUS:  # no index division at all (the common case: quantising along the last axis)
        src = blk[:, None] * 32 + k[None, :]
        dst = src
        in_ok = blk_ok[:, None]
    else:
        col = blk % inner
        row_blk = (blk // inner) % n_per_row
        outer = blk // (inner * n_per_row)
        pos = row_blk[:, None] * 32 + k[None, :]  # index along the quantised axis
        in_ok = blk_ok[:, None] & (pos < length)
        src = outer[:, None] * length * inner + pos * inner + col[:, None]
        dst = outer[:, None] * padded * inner + pos * inner + col[:, None]
    if IS_BF16:
        raw = tl.load(x_ptr + src, mask=in_ok, other=0).to(tl.int32)
        bits = (raw & 0xFFFF) << 16  # bfloat16 is the top half of a float32
    else:
        bits = tl.load(x_ptr + src, mask=in_ok, other=0)

    # ---- shared scale (kernels/mx.py: block_scale_exponent) ----
    mag = bits & 0x7FFFFFFF
    amax = tl.max(mag, axis=1)  # Inf and NaN patterns sort above every finite magnitude
    nan_block = amax >= 0x7F800000
    e = (amax >> 23) - 135
    if RCEIL:
        e = e + ((amax & 0x7FFFFF) > 0x600000).to(tl.int32)
    e = tl.minimum(tl.maximum(e, -127), 127)

    # ---- elements (kernels/mx.py: encode_e4m3) ----
    sign = (bits >> 24) & 0x80
    is_normal = mag >= 0x00800000
    lead = (mag.to(tl.float32).to(tl.int32, bitcast=True) >> 23) - 127  # exact: mag < 2**23 where it is used
    sig = tl.where(is_normal, (mag & 0x7FFFFF) | 0x800000, mag << tl.minimum(tl.maximum(23 - lead, 0), 31))
    ex = tl.where(is_normal, (mag >> 23) - 127, lead - 149)
    t = ex - e[:, None]
    shift = tl.minimum(tl.maximum(14 - t, 20), 25)
    base = tl.maximum(t + 6, 0) * 8
    q = sig >> shift
    one = tl.full(sig.shape, 1, tl.int32)
    rem = sig & ((one << shift) - 1)
    half = one << (shift - 1)
    up = (rem > half) | ((rem == half) & ((q & 1) == 1))
    code = tl.minimum(base + q + up.to(tl.int32), 0x7E) | sign
    code = tl.where(nan_block[:, None], 0x7F, code)
    scale = tl.where(nan_block, 255, e + 127)

    tl.store(data_ptr + dst, code.to(tl.uint8), mask=blk_ok[:, None])
    tl.store(scale_ptr + blk, scale.to(tl.uint8), mask=blk_ok)


GPU_TILE = (32, 1)
"""Blocks of 32 per program and warps per program on a GPU (``benchmarks/quantize.py`` sweeps them)."""

INDEX32_LIMIT = 2**31
"""Element offsets at or above this use 64-bit index arithmetic in the kernel (slower on a GPU)."""


def quantize_mx_triton(x: torch.Tensor, *, axis: int = -1, mode: ScaleMode = ScaleMode.RCEIL,
                       tile: tuple[int, int] | None = None) -> MXTensor:  # fmt: skip
    """Same contract and bytes as ``kernels.mx.quantize_mx``; runs the Triton kernel.

    float32 and bfloat16 are read as they are; other float dtypes are first
    converted to float32 (as the reference does). A non-contiguous input is
    copied first. ``tile`` = (blocks per program, a power of two; warps) on a
    GPU, default :data:`GPU_TILE`; it changes speed only, never the bytes.
    """
    mode = ScaleMode(mode)
    tile = tile or GPU_TILE
    if tile[0] < 1 or tile[0] & (tile[0] - 1) or tile[1] < 1:
        raise ValueError(f"tile wants (blocks: a power of two, warps >= 1), got {tile}")
    ax = normalize_axis(x, axis)
    if x.dtype == torch.bfloat16:
        src, is_bf16 = x.contiguous().view(torch.int16), True
    elif x.dtype in (torch.float32, torch.float16, torch.float64):
        src, is_bf16 = x.to(torch.float32).contiguous().view(torch.int32), False
    else:
        raise TypeError(f"MX quantisation wants a floating-point tensor, got {x.dtype}")
    outer = math.prod(x.shape[:ax])
    length = x.shape[ax]
    inner = math.prod(x.shape[ax + 1 :])
    padded = math.ceil(length / BLOCK) * BLOCK
    n_per_row = padded // BLOCK
    data = torch.empty(*x.shape[:ax], padded, *x.shape[ax + 1 :], dtype=torch.uint8, device=x.device)
    scales = torch.empty(*x.shape[:ax], n_per_row, *x.shape[ax + 1 :], dtype=torch.uint8, device=x.device)
    n_blocks = outer * n_per_row * inner
    if n_blocks:
        interpret = bool(knobs.runtime.interpret)
        if x.device.type == "cpu" and not interpret:
            raise RuntimeError("quantize_mx_triton on a CPU tensor needs TRITON_INTERPRET=1 set before triton is imported")
        # the interpreter pays per program (one big tile); a GPU wants small ones
        blocks, warps = (min(1024, triton.next_power_of_2(n_blocks)), 4) if interpret else tile
        grid = (triton.cdiv(n_blocks, blocks),)
        _quantize_mx_kernel[grid](
            src, data, scales, n_blocks, length, padded, inner, n_per_row,
            IS_BF16=is_bf16, RCEIL=mode == ScaleMode.RCEIL, BLOCKS=blocks,
            CONTIGUOUS=inner == 1 and length % BLOCK == 0, INDEX64=outer * padded * inner + blocks * BLOCK >= INDEX32_LIMIT,
            num_warps=warps,
        )  # fmt: skip
    return MXTensor(data=data, scales=scales, axis=ax, shape=x.shape)
