"""kernels/linear.py: MXFP8 linear forward/backward on the emulated (CPU) path."""

from __future__ import annotations

import pytest
import torch

from kernels.linear import (
    MXFP8Linear,
    _swizzle_scales,
    fake_quantize,
    hardware_mx_available,
    mx_mm,
    mxfp8_linear,
)
from kernels.metrics import sqnr_db


def tensors(seed: int = 0, k: int = 96, n: int = 40) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 25, k, generator=g)  # 75 tokens: not a multiple of 32
    w = torch.randn(n, k, generator=g) / k**0.5
    b = torch.randn(n, generator=g)
    return x, w, b


def test_forward_is_the_product_of_quantised_operands() -> None:
    x, w, b = tensors()
    expect = fake_quantize(x.reshape(-1, 96), axis=1) @ fake_quantize(w, axis=1).t() + b
    assert torch.equal(mxfp8_linear(x, w, b), expect.reshape(3, 25, 40))


def test_backward_requantises_along_each_contraction_axis() -> None:
    """grad_x: grad_out and W along N; grad_W: grad_out and x along the token axis; from high precision."""
    x, w, b = tensors()
    x.requires_grad_()
    w.requires_grad_()
    b.requires_grad_()
    g = torch.randn(3, 25, 40, generator=torch.Generator().manual_seed(1))
    mxfp8_linear(x, w, b).backward(g)
    g2, x2 = g.reshape(-1, 40), x.detach().reshape(-1, 96)
    assert torch.equal(x.grad, (fake_quantize(g2, axis=1) @ fake_quantize(w.detach(), axis=0)).reshape(x.shape))
    assert torch.equal(w.grad, fake_quantize(g2, axis=0).t() @ fake_quantize(x2, axis=0))
    assert torch.allclose(b.grad, g2.sum(0))


def test_accuracy_against_fp32() -> None:
    x, w, b = tensors(seed=2, k=256, n=128)
    x.requires_grad_()
    w.requires_grad_()
    g = torch.randn(3, 25, 128, generator=torch.Generator().manual_seed(3))
    out = mxfp8_linear(x, w, b)
    out.backward(g)
    gx, gw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    ref = torch.nn.functional.linear(x, w, b)
    ref.backward(g)
    assert sqnr_db(ref, out) >= 27 and sqnr_db(x.grad, gx) >= 25 and sqnr_db(w.grad, gw) >= 24


def test_module_is_a_drop_in_linear() -> None:
    lin = torch.nn.Linear(64, 32)
    mx = MXFP8Linear.from_linear(lin)
    assert isinstance(mx, torch.nn.Linear) and mx.weight is lin.weight and mx.bias is lin.bias
    assert mx.state_dict().keys() == lin.state_dict().keys()
    x = torch.randn(5, 64)
    assert torch.equal(mx(x), mxfp8_linear(x, lin.weight, lin.bias))
    assert MXFP8Linear(64, 32, bias=False)(x).shape == (5, 32)


def test_bfloat16_keeps_dtypes() -> None:
    x, w, b = (t.bfloat16() for t in tensors())
    x.requires_grad_()
    w.requires_grad_()
    out = mxfp8_linear(x, w, b)
    out.sum().backward()
    assert out.dtype == x.grad.dtype == w.grad.dtype == torch.bfloat16


def test_shape_errors() -> None:
    with pytest.raises(ValueError):
        mxfp8_linear(torch.ones(2, 8), torch.ones(4, 9))
    with pytest.raises(ValueError):
        mx_mm(torch.ones(2, 8), torch.ones(9, 4))


def test_no_hardware_path_on_cpu() -> None:
    assert not hardware_mx_available(torch.device("cpu"))


def test_scale_swizzle_matches_torchao_layout() -> None:
    """The hardware path's cuBLAS scale layout (the only part of it that can run without a Blackwell GPU)."""
    utils = pytest.importorskip("torchao.prototype.mx_formats.utils")
    for rows, cols in ((128, 4), (200, 7), (5, 1)):
        s = torch.randint(0, 255, (rows, cols), dtype=torch.uint8, generator=torch.Generator().manual_seed(rows))
        assert torch.equal(_swizzle_scales(s), utils.to_blocked(s))
