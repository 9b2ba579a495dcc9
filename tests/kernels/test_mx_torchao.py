"""kernels/mx.py agrees byte for byte with torchao's ``MXTensor.to_mx`` wherever torchao follows the spec.

torchao 0.18 (``torchao.prototype.mx_formats``, elem dtype float8_e4m3fn,
block 32, eager torch path) departs from OCP MX v1.0 in these cases, each an
expected failure below with its reason (also listed in kernels/mx.py):

* ``inf``: a block with ±Inf gets a finite scale (FLOOR 2**120 from Inf's
  exponent field, RCEIL byte 254) and Inf saturates to ±448. The spec's
  ``floor(log2(Inf))`` overflows E8M0, so the scale is NaN.
* ``nan_data`` (FLOOR only): a NaN block gets the NaN scale, as it should,
  but its other elements are quantised with 2**120 rather than all made NaN.
  Only the element bytes differ; both dequantise to all-NaN.
* ``min_scale_floor``: a block whose scale clamps to 2**-127 (byte 0) is
  divided by 2**-126 (torchao clamps the float scale to the smallest normal
  float32), so its elements are half what the recorded scale implies.
* ``min_scale_rceil``: the same blocks in RCEIL are multiplied by 1.0 instead
  of 2**127 (TransformerEngine's special case), i.e. flushed to zero.
* ``rceil_log2``: RCEIL's ``ceil(log2(amax / 448))`` is evaluated with a
  float32 log2, which rounds ``log2(2**k * (1 + 2**-23))`` to ``k`` for every
  ``k`` outside [-4, 3]; amax a few ulps above ``448 * 2**k`` then keeps
  ``2**k`` and saturates the top element.

Zeros, -0.0, denormal elements under a normal scale, rounding ties, 448/464/
480, FLT_MAX and random data in both scale modes agree exactly.
"""

from __future__ import annotations

import pytest
import torch

from kernels.mx import BLOCK, ScaleMode, quantize_mx
from tests.kernels.golden import TORCHAO_REASONS, Golden, block, params

ao_mx = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor")
ao_config = pytest.importorskip("torchao.prototype.mx_formats.config")

MODES = [ScaleMode.FLOOR, ScaleMode.RCEIL]


def torchao_bytes(x: torch.Tensor, mode: ScaleMode) -> tuple[torch.Tensor, torch.Tensor]:
    """torchao's (data, scale) bytes for ``x`` blocked along the last axis (padded with zeros to 32)."""
    pad = (-x.shape[-1]) % BLOCK
    x = torch.nn.functional.pad(x, (0, pad)).contiguous()
    mx = ao_mx.MXTensor.to_mx(x, torch.float8_e4m3fn, BLOCK, scaling_mode=ao_config.ScaleCalculationMode(mode.value))
    return mx.qdata.view(torch.uint8), mx.scale.view(torch.uint8).reshape(*x.shape[:-1], -1)


def golden_params() -> list:
    out = []
    for case, dtype in params():
        for mode in MODES:
            reason = case.torchao.get(mode.value)
            marks = [pytest.mark.xfail(reason=TORCHAO_REASONS[reason], strict=True)] if reason else []
            out.append(pytest.param(case, dtype, mode, marks=marks, id=f"{case.name}-{str(dtype)[6:]}-{mode}"))
    return out


@pytest.mark.parametrize("case,dtype,mode", golden_params())
def test_golden_case_agrees(case: Golden, dtype: torch.dtype, mode: ScaleMode) -> None:
    x = torch.tensor(block(case)).to(dtype)
    data, scale = torchao_bytes(x, mode)
    ours = quantize_mx(x, mode=mode)
    assert torch.equal(ours.scales, scale) and torch.equal(ours.data, data)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("axis", [-1, 0])
def test_random_tensors_agree(axis: int, dtype: torch.dtype, mode: ScaleMode) -> None:
    """Normal data with block magnitudes 2**-100 .. 2**100 and some zero blocks (no min-scale, Inf or NaN blocks)."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(256, 4 * BLOCK, generator=g) * torch.exp2(torch.randint(-100, 100, (256, 1), generator=g).float())
    x[::17] = 0.0
    x = x.to(dtype)
    ours = quantize_mx(x, axis=axis, mode=mode)
    moved = x.movedim(axis, -1)
    data, scale = torchao_bytes(moved, mode)
    assert torch.equal(ours.scales, scale.movedim(-1, axis)) and torch.equal(ours.data, data.movedim(-1, axis))
