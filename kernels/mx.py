"""MXFP8 (OCP Microscaling Formats v1.0): the torch reference.

A tensor is cut into blocks of ``BLOCK = 32`` consecutive elements along one
axis. Each block gets one shared scale ``X = 2**e`` stored as E8M0 (the biased
exponent ``e + 127`` in a byte, 255 = NaN) and 32 FP8 E4M3 elements (bias 7,
largest normal 448 = S.1111.110, denormals down to 2**-9, no Inf,
NaN = S.1111.111). The element bytes hold ``round(V_i / X)``.

Scales come from integer operations on the float32 bit patterns. Elements
are ``x * 2**-e`` (exact: a power-of-two multiplier) clamped to ±448 and cast
with torch's float8_e4m3fn conversion (round to nearest even); ``encode_e4m3``
is the same encoding written with integer operations only, which is what
``kernels/triton_mx.py`` runs (Triton's interpreter gets float8 casts wrong).
Tests check the two encoders agree at every E4M3 rounding boundary and that
the Triton kernel is bit-identical to ``quantize_mx``.

Scale rule (``ScaleMode``), with ``amax`` the block's largest magnitude and
``E``/``M`` its float32 exponent field and mantissa bits:

* ``FLOOR`` (the spec, section 6.3): ``e = floor(log2(amax)) - 8`` (8 is
  E4M3's largest exponent), i.e. ``E - 127 - 8``. The top of the block may
  land in [448, 512) and is saturated to 448.
* ``RCEIL`` (cuBLAS / TransformerEngine "round the scale up"): the smallest
  ``e`` with ``amax / 2**e <= 448``, i.e. ``ceil(log2(amax / 448))`` computed
  exactly: ``E - 127 - 8 + (M > 0x600000)`` (0x600000 is 1.75 = 448 / 2**8).
  Whenever ``amax / 448`` is a normal float32 this equals what cuBLAS
  computes (float32 ``amax / 448``, then rounding up to a power of two): that
  division cannot round onto a power of two from above. (Just above
  ``448 * 2**-127`` the float32 quotient is denormal and can round down, so
  cuBLAS may pick 2**-127 where this picks 2**-126.) Not checked against
  TransformerEngine's ``amax * (1/448)`` variant, which can differ by one
  step at a few boundary values.
* Both: ``e`` is clamped to E8M0's range [-127, 127]. Blocks that are all
  zero, or whose ``amax`` is below 2**-118 (FLOOR) / at most
  ``448 * 2**-127`` (about 2**-118.2, RCEIL), get the minimum scale 2**-127
  (byte 0); their elements are then encoded relative to 2**-127 (not
  flushed to zero).

Special values (a choice; written down here because the spec leaves details
to the implementation):

* A block containing a NaN gets scale 0xFF (NaN) — the spec: X = NaN.
* A block containing ±Inf also gets scale 0xFF. The spec's rule gives
  ``floor(log2(Inf)) = Inf``, beyond E8M0's range, and the spec's companion
  reference library (microsoft/microxcaling, ``_quantize_mx``) sets such
  scales to NaN. E4M3 cannot represent Inf, so there is no faithful finite
  encoding of that block. (torchao instead emits a finite scale and
  saturates Inf to 448: see below.)
* Every element byte of a NaN-scale block is 0x7F (positive E4M3 NaN); the
  whole block dequantises to NaN.
* Finite elements: round-to-nearest-even of the exact quotient, saturating
  to ±448 (so 464, the tie between 448 and 480, goes to 448 by RNE anyway,
  and anything above goes to 448 by saturation). The sign is kept: -0.0 and
  negative values that round to zero encode as 0x80.

Inputs: float32, bfloat16 and float16 are converted to float32 exactly;
float64 is first rounded to float32 (NOT guaranteed equal to quantising the
float64 value directly). The axis is zero-padded to a multiple of 32; the
padding takes part in the blocks (zeros never change a block's ``amax``).

Where the installed torchao (0.18, ``MXTensor.to_mx``) departs from this:

1. FLOOR, scale byte 0 (amax < 2**-118): torchao records 2**-127 but divides
   by 2**-126 (its comment: it clamps the float scale to the smallest normal
   float32), so its elements are half of what the scale says.
2. RCEIL, scale byte 0 (amax <= 448 * 2**-127): torchao multiplies by 1.0
   instead of 2**127 (TransformerEngine's ``exp2f_rcp`` special case), so it
   flushes those blocks to zero.
3. RCEIL near the boundaries ``amax = 448 * 2**k * (1 + tiny)``: torchao's
   eager fallback computes ``ceil(log2(amax / 448))`` with a float32
   ``log2`` that rounds to the integer ``k`` (for every ``k`` outside
   [-4, 3] when amax is one ulp above); it picks ``2**k`` and saturates the
   top element to 448 where the exact rule picks ``2**(k+1)``.
4. Inf: torchao gives a finite scale (FLOOR: 2**120; RCEIL: byte 254) and
   saturates ±Inf to ±448; we give NaN (above).
5. NaN blocks, FLOOR: same scale (0xFF) but torchao's element bytes are
   not all 0x7F (only the data bytes differ; both dequantise to all-NaN).

Everything else (zeros, -0.0, ties, 448/464/480, FLT_MAX, denormal elements
under a normal scale, random data, both modes) agrees byte for byte:
tests/kernels/test_mx_torchao.py.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

BLOCK = 32
E4M3_MAX = 448.0
E8M0_BIAS = 127
E8M0_NAN = 0xFF
E4M3_NAN = 0x7F
_F32_EXP_MASK = 0x7F800000
_ABS_MASK = 0x7FFFFFFF


class ScaleMode(enum.StrEnum):
    """How a block's shared exponent is chosen (see the module docstring)."""

    FLOOR = "floor"
    RCEIL = "rceil"


@dataclass(frozen=True)
class MXTensor:
    """A tensor quantised to MXFP8 along ``axis``.

    ``data`` has the input's shape with ``axis`` padded to a multiple of 32;
    ``scales`` has the same shape with ``axis`` divided by 32. ``shape`` is
    the original (unpadded) shape. Nothing checks that a hand-built
    ``MXTensor`` is consistent.
    """

    data: torch.Tensor  # uint8, E4M3 bit patterns, same shape as the (padded) input
    scales: torch.Tensor  # uint8 E8M0 (bias 127, 255 = NaN), one per 32-block along axis
    axis: int
    shape: torch.Size  # original shape


def normalize_axis(x: torch.Tensor, axis: int) -> int:
    """``axis`` as a non-negative index into ``x``'s dimensions (raises ValueError when out of range)."""
    if x.dim() == 0:
        raise ValueError("cannot quantise a 0-d tensor along an axis")
    if not -x.dim() <= axis < x.dim():
        raise ValueError(f"axis {axis} out of range for a {x.dim()}-d tensor")
    return axis % x.dim()


def as_float32(x: torch.Tensor) -> torch.Tensor:
    """``x`` as contiguous float32; see the module docstring for which dtypes convert exactly."""
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        raise TypeError(f"MX quantisation wants a floating-point tensor, got {x.dtype}")
    return x.to(torch.float32).contiguous()


def block_scale_exponent(amax_bits: torch.Tensor, mode: ScaleMode) -> torch.Tensor:
    """Unbiased scale exponent ``e`` (int32, clamped to [-127, 127]) from |amax|'s float32 bits."""
    exp_field = amax_bits >> 23
    e = exp_field - (127 + 8)
    if mode == ScaleMode.RCEIL:
        e = e + ((amax_bits & 0x7FFFFF) > 0x600000).to(torch.int32)
    elif mode != ScaleMode.FLOOR:
        raise ValueError(f"unknown scale mode {mode!r}")
    return e.clamp(-E8M0_BIAS, E8M0_BIAS)


def encode_e4m3(bits: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """E4M3 bytes of ``value(bits) / 2**e``: exact round-to-nearest-even, saturating to ±448.

    The integer-only formulation that ``kernels/triton_mx.py`` runs step for
    step. ``bits`` are float32 bit patterns (int32); ``e`` broadcasts against
    them. Inf/NaN inputs are NOT handled here (their block is NaN; see
    quantize_mx). Slower than ``encode_e4m3_by_cast``, which gives the same
    bytes (tests/kernels/test_mx.py checks every rounding boundary).
    """
    sign = (bits >> 24) & 0x80
    mag = bits & _ABS_MASK
    # significand with its leading bit at bit 23, and that bit's exponent. A
    # float32 denormal's leading bit is found by converting the integer ``mag``
    # (< 2**23, so exactly) to float32 and reading its exponent. A zero stays
    # zero. Shifts are clamped to 0..31 on the branch ``where`` discards.
    is_normal = mag >= 0x00800000
    lead = (mag.to(torch.float32).view(torch.int32) >> 23) - 127
    sig = torch.where(is_normal, (mag & 0x7FFFFF) | 0x800000, mag << (23 - lead).clamp(0, 31))
    ex = torch.where(is_normal, (mag >> 23) - 127, lead - 149)
    t = ex - e  # exponent of the scaled value's leading bit
    # E4M3 keeps 3 bits below the leading one for t >= -6; below that the
    # quantum is fixed at 2**-9 (denormals), so shift further.
    shift = (14 - t).clamp(20, 25)
    base = (t + 6).clamp(min=0) * 8  # exponent field * 8, minus the implicit leading 8
    q = sig >> shift
    rem = sig & ((1 << shift) - 1)
    half = 1 << (shift - 1)
    up = (rem > half) | ((rem == half) & ((q & 1) == 1))
    code = (base + q + up.to(torch.int32)).clamp(max=0x7E)  # carry into the exponent is automatic
    return (code | sign).to(torch.uint8)


def encode_e4m3_by_cast(x: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """Same bytes as ``encode_e4m3(x.view(int32), e)`` for finite float32 ``x``, about 10x faster.

    ``x * 2**-e`` is exact whenever the product is a normal float32 (the
    multiplier is a power of two); products below 2**-126 may round, but every
    such value encodes as ±0 either way. The clamp to ±448 is the saturation
    (RNE sends (448, 464] to 448 anyway), and torch's float32 -> float8_e4m3fn
    cast rounds to nearest even, including into E4M3's denormals.
    """
    inv = (E8M0_BIAS - e) << 23  # float32 bits of 2**-e for -e >= -126
    inv = torch.where(e == E8M0_BIAS, torch.full_like(inv, 0x00400000), inv).view(torch.float32)
    return (x * inv).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)


def quantize_mx(x: torch.Tensor, *, axis: int = -1, mode: ScaleMode = ScaleMode.RCEIL) -> MXTensor:
    """Quantise ``x`` to MXFP8 in blocks of 32 along ``axis`` (see the module docstring).

    Not guaranteed: speed (this is the readable reference; use
    ``kernels.triton_mx`` on a GPU), or exactness for float64 inputs.
    """
    mode = ScaleMode(mode)
    ax = normalize_axis(x, axis)
    xt = x.movedim(ax, -1)
    length = xt.shape[-1]
    padded = math.ceil(length / BLOCK) * BLOCK
    if padded != length:
        xt = F.pad(xt, (0, padded - length))
    xf = as_float32(xt).reshape(*xt.shape[:-1], padded // BLOCK, BLOCK)
    # integer order of |bits| is float order of magnitudes, with Inf and NaN above every finite value
    amax = (xf.view(torch.int32) & _ABS_MASK).amax(dim=-1)
    nan_block = amax >= _F32_EXP_MASK
    e = block_scale_exponent(amax, mode)
    data = encode_e4m3_by_cast(xf, e.unsqueeze(-1)).masked_fill(nan_block.unsqueeze(-1), E4M3_NAN)
    scales = torch.where(nan_block, E8M0_NAN, e + E8M0_BIAS).to(torch.uint8)
    data = data.reshape(*xt.shape[:-1], padded).movedim(-1, ax).contiguous()
    scales = scales.movedim(-1, ax).contiguous()
    return MXTensor(data=data, scales=scales, axis=ax, shape=x.shape)


def e4m3_values(device: torch.device | str = "cpu") -> torch.Tensor:
    """float32[256]: the value of every E4M3 byte (0x7F and 0xFF are NaN). A fresh tensor each call."""
    code = torch.arange(256, dtype=torch.int32, device=device)
    exp_field = (code >> 3) & 0xF
    man = (code & 7).to(torch.float32)
    normal = torch.ldexp(8 + man, exp_field - 10)  # (1 + m/8) * 2**(E-7)
    denormal = man * 2.0**-9
    value = torch.where(exp_field > 0, normal, denormal)
    value = torch.where((code & 0x7F) == 0x7F, torch.nan, value)
    return torch.where(code >= 0x80, -value, value)


def e8m0_values(scales: torch.Tensor) -> torch.Tensor:
    """float32 ``2**(s - 127)`` for E8M0 bytes (255 → NaN), built from bits (2**-127 is a denormal)."""
    s = scales.to(torch.int32)
    bits = torch.where(s == 0, torch.full_like(s, 0x00400000), s << 23)
    return torch.where(s == E8M0_NAN, torch.nan, bits.view(torch.float32))


def dequantize_mx(mx: MXTensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Values of ``mx`` in the original shape, computed in float32 then cast to ``dtype``.

    Exact in float32/float64. Not guaranteed exact in narrower dtypes: bfloat16
    loses values below its denormal range (2**-133), float16 overflows above
    65504. A NaN scale makes its whole block NaN.
    """
    ax = mx.axis
    dt = mx.data.movedim(ax, -1)
    padded = dt.shape[-1]
    values = e4m3_values(dt.device)[dt.long()]
    values = values.reshape(*dt.shape[:-1], padded // BLOCK, BLOCK)
    scale = e8m0_values(mx.scales.movedim(ax, -1)).unsqueeze(-1)
    out = (values * scale).reshape(*dt.shape[:-1], padded)
    out = out[..., : mx.shape[ax]].movedim(-1, ax)
    return out.to(dtype).contiguous()
