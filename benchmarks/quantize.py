"""MXFP8 quantisation throughput.

CPU: the torch reference (``kernels.mx.quantize_mx``) against torchao's
``MXTensor.to_mx`` on the same 4096x4096 tensors (float32 and bfloat16, both
scale modes), interleaved in one run, median of several repeats; GB/s counts
the input bytes read. The ratio is reference throughput / torchao throughput.
Before timing, each pair is checked byte for byte (the random normal data has
no case where torchao departs from the spec).

GPU (when CUDA is available): the Triton kernel's GB/s (input read, and all
traffic: input + 1 byte per element + 1 per 32) and that traffic as a
fraction of the device's peak memory bandwidth, after checking it is
bit-identical to the reference on the same device. Without CUDA this records
``"gpu": "skipped: no CUDA device"``.

Usage: python benchmarks/quantize.py [--quick]
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
    if not torch.cuda.is_available():
        return "skipped: no CUDA device"
    from kernels.triton_mx import quantize_mx_triton

    name = torch.cuda.get_device_name()
    peak = next((bw for key, bw in PEAK_BANDWIDTH.items() if key in name), None)
    rows, cols = (4096, 4096) if quick else (16384, 8192)
    out: dict = {"device": name, "peak_bytes_per_s": peak, "shape": [rows, cols], "cases": {}}
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(rows, cols, device="cuda").to(dtype)
        got, want = quantize_mx_triton(x), quantize_mx(x)
        identical = bool(torch.equal(got.data, want.data) and torch.equal(got.scales, want.scales))
        for _ in range(3):
            quantize_mx_triton(x)
        torch.cuda.synchronize()
        ts = [timed(lambda: quantize_mx_triton(x), torch.cuda.synchronize) for _ in range(10 if quick else 30)]  # noqa: B023
        s = median(ts)
        read = x.numel() * x.element_size()
        traffic = read + x.numel() + x.numel() // 32
        out["cases"][str(dtype).removeprefix("torch.")] = {
            "bit_identical_to_reference": identical,
            "seconds": s,
            "gb_per_s_input": read / s / 1e9,
            "gb_per_s_total": traffic / s / 1e9,
            "fraction_of_peak": traffic / s / peak if peak else None,
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1024x1024, 3 repeats (a smoke run)")
    args = ap.parse_args()
    rows, cols, repeats = (1024, 1024, 3) if args.quick else (4096, 4096, 7)
    cpu = cpu_section(rows, cols, repeats)
    write_result("quantize" + ("_quick" if args.quick else ""), {"cpu": cpu, "gpu": gpu_section(args.quick)})


if __name__ == "__main__":
    main()
