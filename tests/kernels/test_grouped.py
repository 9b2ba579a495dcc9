"""kernels/grouped.py: fast paths equal the loop definition; mxfp8 forward/backward and its accuracy."""

from __future__ import annotations

import pytest
import torch

from kernels.grouped import grouped_mm, grouped_mm_reference, pad_groups
from kernels.linear import fake_quantize
from kernels.metrics import sqnr_db

# expert token counts: empty experts, groups that are not multiples of 32, a single expert
COUNTS = [[256], [40, 0, 100, 7], [0, 0, 33, 31, 64, 1, 0, 129], [5, 17, 0, 60, 3, 0, 90, 11, 0, 33, 2, 40, 0, 0, 8, 1]]


def problem(counts: list[int], k: int = 64, n: int = 48, seed: int = 0, dtype: torch.dtype = torch.float32):  # noqa: ANN201
    g = torch.Generator().manual_seed(seed)
    offsets = torch.tensor([0, *counts]).cumsum(0)
    x = torch.randn(sum(counts), k, generator=g, dtype=dtype)
    w = (torch.randn(len(counts), k, n, generator=g) / k**0.5).to(dtype)
    grad = torch.randn(sum(counts), n, generator=g, dtype=dtype)
    return x, w, offsets, grad


def run(precision: str, x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, grad: torch.Tensor):  # noqa: ANN201
    x, w = x.clone().requires_grad_(), w.clone().requires_grad_()
    out = grouped_mm(x, w, offsets, precision=precision)
    out.backward(grad)
    return out.detach(), x.grad, w.grad


def reference(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, grad: torch.Tensor):  # noqa: ANN201
    x, w = x.clone().requires_grad_(), w.clone().requires_grad_()
    out = grouped_mm_reference(x, w, offsets)
    out.backward(grad)
    return out.detach(), x.grad, w.grad


@pytest.mark.parametrize("counts", COUNTS, ids=len)
def test_fp32_equals_reference_with_grads(counts: list[int]) -> None:
    x, w, offsets, grad = problem(counts)
    for got, want in zip(run("fp32", x, w, offsets, grad), reference(x, w, offsets, grad), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_fp32_unaligned_dims_and_uncovered_rows() -> None:
    """K, N not multiples of 4 and rows outside the offsets take the loop; uncovered rows are zero."""
    x, w, _, grad = problem([10, 20], k=7, n=5)
    offsets = torch.tensor([3, 10, 25])
    got, want = run("fp32", x, w, offsets, grad), reference(x, w, offsets, grad)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)
    assert bool((got[0][:3] == 0).all()) and bool((got[0][25:] == 0).all())


def test_gradcheck_fp32_path() -> None:
    x, w, offsets, _ = problem([3, 0, 5, 2], k=4, n=3, dtype=torch.float64)
    x.requires_grad_()
    w.requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: grouped_mm(a, b, offsets, precision="fp32"), (x, w))


def test_bf16_close_to_reference() -> None:
    x, w, offsets, grad = problem(COUNTS[1])
    out, gx, gw = run("bf16", x, w, offsets, grad)
    ref = grouped_mm_reference(x.bfloat16(), w.bfloat16(), offsets).float()
    torch.testing.assert_close(out, ref, rtol=1e-2, atol=1e-2)
    assert out.dtype == gx.dtype == gw.dtype == torch.float32


@pytest.mark.parametrize("counts", COUNTS, ids=len)
def test_mxfp8_accuracy(counts: list[int]) -> None:
    """SQNR against fp32: output >= 27 dB, input grad >= 25 dB, weight grad >= 24 dB (random normal data)."""
    x, w, offsets, grad = problem(counts, k=128, n=96, seed=len(counts))
    out, gx, gw = run("mxfp8", x, w, offsets, grad)
    ref_out, ref_gx, ref_gw = reference(x, w, offsets, grad)
    assert sqnr_db(ref_out, out) >= 27
    assert sqnr_db(ref_gx, gx) >= 25
    assert sqnr_db(ref_gw, gw) >= 24


def test_mxfp8_matches_per_expert_definition() -> None:
    """Forward quantises along K; grad_x along N; grad_w[e] along each expert's own (padded) token group."""
    x, w, offsets, grad = problem(COUNTS[2])
    out, gx, gw = run("mxfp8", x, w, offsets, grad)
    torch.testing.assert_close(out, grouped_mm_reference(fake_quantize(x, 1), fake_quantize(w, 1), offsets))
    wt = w.transpose(1, 2)
    torch.testing.assert_close(gx, grouped_mm_reference(fake_quantize(grad, 1), fake_quantize(wt, 1), offsets))
    bounds = offsets.tolist()
    for e in range(w.shape[0]):
        xe, ge = x[bounds[e] : bounds[e + 1]], grad[bounds[e] : bounds[e + 1]]
        torch.testing.assert_close(gw[e], fake_quantize(xe, 0).t() @ fake_quantize(ge, 0))


def test_mxfp8_weight_grad_blocks_never_span_experts() -> None:
    """A huge token in expert 0 must not coarsen expert 1's scales (they would share a block without padding)."""
    x, w, offsets, grad = problem([20, 20])
    _, _, gw_small = run("mxfp8", x, w, offsets, grad)
    x_big = x.clone()
    x_big[0] *= 1e6
    _, _, gw_big = run("mxfp8", x_big, w, offsets, grad)
    assert torch.equal(gw_small[1], gw_big[1])


def test_mxfp8_empty_experts_get_zero_weight_grad() -> None:
    x, w, offsets, grad = problem([0, 40, 0])
    _, _, gw = run("mxfp8", x, w, offsets, grad)
    assert bool((gw[0] == 0).all()) and bool((gw[2] == 0).all()) and bool((gw[1] != 0).any())
    x, w, offsets, grad = problem([0, 0])
    out, gx, gw = run("mxfp8", x, w, offsets, grad)
    assert out.shape == (0, 48) and gx.shape == (0, 64) and bool((gw == 0).all())


def test_pad_groups_aligns_every_group() -> None:
    t = torch.arange(1, 9, dtype=torch.float32).unsqueeze(1)
    padded, starts = pad_groups(t, torch.tensor([0, 3, 3, 8]))
    assert starts == [0, 32, 32, 64]
    assert padded[:3, 0].tolist() == [1, 2, 3] and padded[32:37, 0].tolist() == [4, 5, 6, 7, 8]
    assert float(padded.sum()) == 36


def test_rejects_bad_arguments() -> None:
    x, w, offsets, _ = problem([4, 4])
    with pytest.raises(ValueError):
        grouped_mm(x, w, offsets, precision="fp8")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        grouped_mm(x, w, offsets[:-1])
    with pytest.raises(ValueError):
        grouped_mm(x[:, :3], w, offsets)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (scripts/gpu_check.sh runs it)")
@pytest.mark.parametrize("counts", COUNTS, ids=len)
def test_mxfp8_on_cuda_equals_cpu(counts: list[int]) -> None:
    """The GPU path (Triton quantiser, emulated or hardware products) gives the CPU path's numbers."""
    x, w, offsets, grad = problem(counts, k=128, n=96)
    cpu = run("mxfp8", x, w, offsets, grad)
    gpu = run("mxfp8", x.cuda(), w.cuda(), offsets.cuda(), grad.cuda())
    for a, b in zip(gpu, cpu, strict=True):
        # the quantised operands are bit-identical; only the float32 summation order differs
        torch.testing.assert_close(a.cpu(), b, rtol=1e-4, atol=1e-4)
