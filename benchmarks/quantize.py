"""MXFP8 quantisation throughput.

CPU: the torch reference (``kernels.mx.quantize_mx``) against torchao's
``MXTensor.to_mx`` on the same 4096x4096 tensors (float32 and bfloat16, both
scale modes), interleaved in one run, median of several repeats; GB/s counts
the input bytes read. The ratio is reference throughput / torchao throughput.
Before timing, each pair is checked byte for byte (the random normal data has
no case where torchao departs from the spec).

GPU (when CUDA is available): the Triton kernel on 16384x8192 float32 and
bfloat16, quantised along the last axis and along axis 0 (the token axis of
the weight-gradient GEMM), after checking it is bit-identical to the torch
reference on the same device in both scale modes. GB/s counts all traffic
(input + 1 byte per element + 1 per 32), timed with ``triton.testing.do_bench``;
reported for every tile (blocks per program x warps), as a fraction of the
datasheet's peak bandwidth and of a device-to-device copy measured in the same
run, and against the torch reference on the GPU. Without CUDA this records
``"gpu": "skipped: no CUDA device"``; ``--gpu-only`` writes just that section
to ``quantize_gpu.json`` (the CPU figures stay those of the CPU machine).

Usage: python benchmarks/quantize.py [--quick] [--gpu-only]
"""

from __future__ import annotations

import argparse
import os
import time

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before torchao imports triton

from _common import median, write_result  # noqa: E402

from kernels.mx import ScaleMode, quantize_mx  # noqa: E402

PEAK_BANDWIDTH = {  # bytes/s, by a substring of torch.cuda.get_device_name()
    "H200": 4.8e12,
    "H100": 3.35e12,
    "B200": 8.0e12,
    "GB200": 8.0e12,
    "A100": 2.0e12,
}


def torchao_to_mx():  # noqa: ANN201 - returns a callable or None
    try:
        from torchao.prototype.mx_formats.config import ScaleCalculationMode
        from torchao.prototype.mx_formats.mx_tensor import MXTensor
    except ImportError:
        return None

    def run(x: torch.Tensor, mode: ScaleMode) -> tuple[torch.Tensor, torch.Tensor]:
        mx = MXTensor.to_mx(x, torch.float8_e4m3fn, 32, scaling_mode=ScaleCalculationMode(mode.value))
        return mx.qdata.view(torch.uint8), mx.scale.view(torch.uint8)

    return run


def timed(fn, sync=None) -> float:  # noqa: ANN001
    start = time.perf_counter()
    fn()
    if sync:
        sync()
    return time.perf_counter() - start


def cpu_section(rows: int, cols: int, repeats: int) -> dict:
    ao = torchao_to_mx()
    out: dict = {"shape": [rows, cols], "repeats": repeats, "threads": torch.get_num_threads(), "cases": {}}
    if ao is None:
        out["torchao"] = "skipped: torchao not installed"
    g = torch.Generator().manual_seed(0)
    base = torch.randn(rows, cols, generator=g)
    for dtype in (torch.float32, torch.bfloat16):
        x = base.to(dtype)
        nbytes, numel = x.numel() * x.element_size(), x.numel()
        for mode in (ScaleMode.RCEIL, ScaleMode.FLOOR):
            ours = quantize_mx(x, mode=mode)
            case: dict = {}
            if ao is not None:
                data, scale = ao(x, mode)
                case["bytes_identical_to_torchao"] = bool(
                    torch.equal(ours.data, data) and torch.equal(ours.scales, scale.reshape(ours.scales.shape))
                )
            t_ours, t_ao = [], []
            for _ in range(repeats):  # interleaved so drift hits both alike
                t_ours.append(timed(lambda: quantize_mx(x, mode=mode)))  # noqa: B023
                if ao is not None:
                    t_ao.append(timed(lambda: ao(x, mode)))  # noqa: B023
            for name, ts in (("reference", t_ours), ("torchao", t_ao)):
                if ts:
                    s = median(ts)
                    case[name] = {"seconds": s, "gb_per_s": nbytes / s / 1e9, "melem_per_s": numel / s / 1e6}
            if t_ao:
                case["reference_over_torchao_throughput"] = case["torchao"]["seconds"] / case["reference"]["seconds"]
            out["cases"][f"{str(dtype).removeprefix('torch.')}/{mode}"] = case
    return out


def gpu_section(quick: bool) -> dict | str:
    """Triton kernel on CUDA: bit-identity, a tile sweep, GB/s against nominal and measured copy bandwidth."""
    if not torch.cuda.is_available():
        return "skipped: no CUDA device here (scripts/gpu_check.sh writes quantize_gpu.json on a GPU machine)"
    from triton.testing import do_bench

    from kernels.triton_mx import GPU_TILE, quantize_mx_triton

    name = torch.cuda.get_device_name()
    peak = next((bw for key, bw in PEAK_BANDWIDTH.items() if key in name), None)
    rows, cols = (4096, 4096) if quick else (16384, 8192)
    g = torch.Generator(device="cuda").manual_seed(0)
    base = torch.randn(rows, cols, device="cuda", generator=g)
    # the achievable ceiling on this device: a device-to-device copy (read + write)
    copy_s = do_bench(lambda: base.clone(), warmup=25, rep=200) / 1e3
    copy_bw = 2 * base.numel() * 4 / copy_s
    out: dict = {"device": name, "torch": torch.__version__, "peak_bytes_per_s": peak,
                 "copy_bytes_per_s": copy_bw, "shape": [rows, cols], "default_tile": list(GPU_TILE), "cases": {}}
    tiles = [(b, w) for b in (8, 16, 32, 64, 128) for w in (1, 2, 4, 8) if b * 32 >= w * 32]
    for dtype in (torch.float32, torch.bfloat16):
        x = base.to(dtype)
        for axis in (-1, 0):
            case: dict = {}
            for mode in (ScaleMode.RCEIL, ScaleMode.FLOOR):
                got, want = quantize_mx_triton(x, axis=axis, mode=mode), quantize_mx(x, axis=axis, mode=mode)
                case[f"bit_identical_to_reference_{mode}"] = bool(
                    torch.equal(got.data, want.data) and torch.equal(got.scales, want.scales))
            traffic = x.numel() * x.element_size() + x.numel() + x.numel() // 32
            sweep = {}
            for tile in tiles:
                ms = do_bench(lambda: quantize_mx_triton(x, axis=axis, tile=tile), warmup=10,  # noqa: B023
                              rep=30 if quick else 100)
                sweep[f"{tile[0]}x{tile[1]}"] = traffic / (ms / 1e3) / 1e9
            ref_ms = do_bench(lambda: quantize_mx(x, axis=axis), warmup=3, rep=30 if quick else 100)  # noqa: B023
            best = max(sweep, key=sweep.__getitem__)
            default = f"{GPU_TILE[0]}x{GPU_TILE[1]}"
            case.update({
                "gb_per_s_total_by_tile": sweep,
                "best_tile": best,
                "gb_per_s_total_best": sweep[best],
                "gb_per_s_total_default_tile": sweep[default],
                "fraction_of_peak_default_tile": sweep[default] * 1e9 / peak if peak else None,
                "fraction_of_copy_default_tile": sweep[default] * 1e9 / copy_bw,
                "torch_reference_gb_per_s_total": traffic / (ref_ms / 1e3) / 1e9,
                "triton_over_torch_reference": sweep[default] / (traffic / (ref_ms / 1e3) / 1e9),
            })
            out["cases"][f"{str(dtype).removeprefix('torch.')}/axis{axis}"] = case
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1024x1024, 3 repeats (a smoke run)")
    ap.add_argument("--gpu-only", action="store_true", help="only the CUDA section, written to quantize_gpu.json")
    args = ap.parse_args()
    suffix = "_quick" if args.quick else ""
    if args.gpu_only:
        write_result("quantize_gpu" + suffix, {"gpu": gpu_section(args.quick)})
        return
    rows, cols, repeats = (1024, 1024, 3) if args.quick else (4096, 4096, 7)
    cpu = cpu_section(rows, cols, repeats)
    write_result("quantize" + suffix, {"cpu": cpu, "gpu": gpu_section(args.quick)})


if __name__ == "__main__":
    main()
