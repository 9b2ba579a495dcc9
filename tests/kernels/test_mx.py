"""kernels/mx.py: the torch reference against hand-derived bytes and the format's own bounds."""

from __future__ import annotations

import math

import pytest
import torch

from kernels.mx import BLOCK, ScaleMode, dequantize_mx, e4m3_values, encode_e4m3, encode_e4m3_by_cast, quantize_mx
from tests.kernels.golden import Golden, block, expected, params

MODES = [ScaleMode.FLOOR, ScaleMode.RCEIL]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case,dtype", params(), ids=lambda v: getattr(v, "name", str(v).removeprefix("torch.")))
def test_golden_bytes(case: Golden, dtype: torch.dtype, mode: ScaleMode) -> None:
    scale, data = expected(case, mode)
    mx = quantize_mx(torch.tensor(block(case)).to(dtype), mode=mode)
    assert mx.scales.tolist() == [scale]
    assert [hex(b) for b in mx.data.tolist()] == [hex(b) for b in data]


def test_every_e4m3_rounding_boundary() -> None:
    """Midpoints between neighbouring E4M3 values go to the even code; one float32 ulp either side goes outward."""
    table = e4m3_values()
    codes = list(range(0x00, 0x7F))  # non-negative finite codes, ascending values
    lo, hi, mid, want = [], [], [], []
    for a, b in zip(codes[:-1], codes[1:], strict=True):
        m = (table[a] + table[b]) / 2  # exact in float32 (4 significant bits plus one)
        down, up = torch.nextafter(m, torch.tensor(-1.0)), torch.nextafter(m, torch.tensor(1000.0))
        mid.append(m)
        want.append(a if a % 2 == 0 else b)
        lo.append(down)
        hi.append(up)
    for values, codes_want in ((mid, want), (lo, codes[:-1]), (hi, codes[1:])):
        for k in (0, -110, 100):  # the same boundaries under other scales (x * 2**k stays exact)
            e = torch.full((1,), k, dtype=torch.int32)
            x = torch.stack(values) * 2.0**k
            neg = [c | 0x80 for c in codes_want]
            assert encode_e4m3(x.view(torch.int32), e).tolist() == list(codes_want)
            assert encode_e4m3((-x).view(torch.int32), e).tolist() == neg
            assert encode_e4m3_by_cast(x, e).tolist() == list(codes_want)
            assert encode_e4m3_by_cast(-x, e).tolist() == neg


def test_e4m3_value_table() -> None:
    table = e4m3_values()
    assert table[0x7E] == 448 and table[0x01] == 2.0**-9 and table[0x08] == 2.0**-6 and table[0x38] == 1
    assert table[0x7F].isnan() and table[0xFF].isnan()
    assert bool((table[1:0x7F] > table[0:0x7E]).all())
    assert torch.equal(table[0x80:0xFF], -table[0x00:0x7F])


def _spread(shape: tuple[int, ...], seed: int, lo: int = -60, hi: int = 60) -> torch.Tensor:
    """Normal values times a power of two per element drawn from [2**lo, 2**hi)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g) * torch.exp2(torch.randint(lo, hi, shape, generator=g).float())


@pytest.mark.parametrize("mode", MODES)
def test_scale_rule_matches_log2_definition(mode: ScaleMode) -> None:
    """The integer scale rule equals the spec's real-number definition (computed here with frexp)."""
    g = torch.Generator().manual_seed(1)
    rows = torch.randint(-152, 125, (1024, 1), generator=g).float()  # block magnitudes from denormal to huge
    x = torch.randn(1024, BLOCK, generator=g) * torch.exp2(rows)
    mx = quantize_mx(x, mode=mode)
    for amax, s in zip(x.abs().amax(dim=1).tolist(), mx.scales[:, 0].tolist(), strict=True):
        if amax == 0:
            e = -127  # log2(0) = -inf, clamped
        elif mode == ScaleMode.FLOOR:
            mant, exp = math.frexp(amax)  # amax = mant * 2**exp, mant in [0.5, 1)
            e = exp - 1 - 8
        else:
            mant, exp = math.frexp(amax / 448)  # float64: cannot round onto a power of two (module docstring)
            e = exp - 1 if mant == 0.5 else exp
        assert s == max(-127, min(127, e)) + 127


def test_rceil_never_saturates_and_is_tight() -> None:
    x = _spread((256, BLOCK), seed=2)
    mx = quantize_mx(x, mode=ScaleMode.RCEIL)
    amax = x.abs().amax(dim=1).double()
    scale = torch.exp2(mx.scales[:, 0].double() - 127)
    assert bool((amax / scale <= 448).all()) and bool((amax / scale > 224).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", MODES)
def test_roundtrip_error_within_format_bound(mode: ScaleMode, dtype: torch.dtype) -> None:
    """|x - deq(q(x))| <= half an E4M3 ulp (2**-4 |x|, or 2**-10 X in the denormal range), plus clipping for FLOOR."""
    x = _spread((64, 3 * BLOCK), seed=3).to(dtype)
    mx = quantize_mx(x, mode=mode)
    err = (dequantize_mx(mx).double() - x.double()).abs()
    scale = torch.exp2(mx.scales.double() - 127).repeat_interleave(BLOCK, dim=1)
    bound = torch.maximum(x.double().abs() * 2.0**-4, scale * 2.0**-10)
    if mode == ScaleMode.FLOOR:
        bound = torch.maximum(bound, x.double().abs() - 448 * scale)
    assert bool((err <= bound).all())


@pytest.mark.parametrize("shape,axis", [((3, 70, 5), 1), ((70, 3), 0), ((2, 33), -1), ((5,), 0), ((4, 64), -2)])
def test_axis_layout_equals_moving_the_axis_last(shape: tuple[int, ...], axis: int) -> None:
    x = _spread(shape, seed=4)
    mx = quantize_mx(x, axis=axis)
    ax = axis % len(shape)
    padded = math.ceil(shape[ax] / BLOCK) * BLOCK
    assert mx.axis == ax and mx.shape == x.shape
    assert mx.data.shape[ax] == padded and mx.scales.shape[ax] == padded // BLOCK
    last = quantize_mx(x.movedim(ax, -1).contiguous(), axis=-1)
    assert torch.equal(mx.data, last.data.movedim(-1, ax))
    assert torch.equal(mx.scales, last.scales.movedim(-1, ax))
    assert dequantize_mx(mx).shape == x.shape


def test_nan_scale_dequantises_the_whole_block_to_nan() -> None:
    x = torch.ones(2, BLOCK)
    x[0, 5] = float("inf")
    out = dequantize_mx(quantize_mx(x))
    assert bool(out[0].isnan().all()) and torch.equal(out[1], x[1])


def test_minimum_scale_block_dequantises_exactly() -> None:
    """Blocks clamped to 2**-127 keep their elements relative to 2**-127 (no flush to zero)."""
    x = torch.zeros(BLOCK)
    x[:3] = torch.tensor([1.5 * 2**-127, 2**-120, -(2**-130)])
    assert torch.equal(dequantize_mx(quantize_mx(x, mode=ScaleMode.FLOOR)), x)


def test_dequantize_dtype() -> None:
    x = _spread((4, BLOCK), seed=5, lo=-4, hi=4)
    mx = quantize_mx(x)
    assert torch.equal(dequantize_mx(mx, torch.float64), dequantize_mx(mx).double())
    assert dequantize_mx(mx, torch.bfloat16).dtype == torch.bfloat16


def test_float64_input_is_rounded_to_float32_first() -> None:
    x = _spread((4, BLOCK), seed=6).double() * (1 + 1e-12)
    assert torch.equal(quantize_mx(x).data, quantize_mx(x.float()).data)


def test_rejects_bad_input() -> None:
    with pytest.raises(TypeError):
        quantize_mx(torch.ones(4, BLOCK, dtype=torch.int32))
    with pytest.raises(ValueError):
        quantize_mx(torch.ones(4, BLOCK), axis=2)
    with pytest.raises(ValueError):
        quantize_mx(torch.tensor(1.0))
    with pytest.raises(ValueError):
        quantize_mx(torch.ones(BLOCK), mode="even")  # type: ignore[arg-type]


def test_empty_axis() -> None:
    mx = quantize_mx(torch.ones(3, 0))
    assert mx.data.shape == (3, 0) and mx.scales.shape == (3, 0)
    assert dequantize_mx(mx).shape == (3, 0)


def test_integer_encoder_equals_cast_encoder() -> None:
    """``encode_e4m3`` (what the Triton kernel runs) and ``encode_e4m3_by_cast`` (what quantize_mx runs) agree."""
    g = torch.Generator().manual_seed(8)
    bits = torch.randint(-(2**31), 2**31 - 1, (1 << 18,), generator=g, dtype=torch.int32)
    bits = bits[(bits & 0x7FFFFFFF) < 0x7F800000]  # every finite float32 pattern, denormals included
    # scales the block rules could give a block holding this value: from "it is the amax" to 24 binades above
    e = ((bits & 0x7FFFFFFF) >> 23) - 135 + torch.randint(0, 24, bits.shape, generator=g, dtype=torch.int32)
    e = e.clamp(-127, 127)
    assert torch.equal(encode_e4m3(bits, e), encode_e4m3_by_cast(bits.view(torch.float32), e))
