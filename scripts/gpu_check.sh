#!/usr/bin/env bash
# The checks that need a CUDA GPU, as one short run (about 3 minutes on an H200).
#
#   scripts/gpu_check.sh [OUT_DIR]
#
# Runs with the machine's own python3 (its torch and triton; nothing is
# installed): the kernel tests compiled for the GPU instead of Triton's
# interpreter, then `benchmarks/quantize.py --gpu-only`. Logs and
# quantize_gpu.json go to OUT_DIR (default: benchmarks/results). Exits non-zero
# when a test fails; the benchmark still runs.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-benchmarks/results}
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
unset TRITON_INTERPRET

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv | tee "$out/gpu_info.txt"
"$py" -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, "cuda", torch.version.cuda)' \
    | tee -a "$out/gpu_info.txt"

# -c /dev/null: the project's pytest config names plugins (asyncio) the GPU image may lack
timeout 300 "$py" -m pytest -q -c /dev/null --rootdir . -p no:cacheprovider tests/kernels 2>&1 | tee "$out/gpu_kernel_tests.log"
tests=${PIPESTATUS[0]}

FLYWHEEL_BENCH_RESULTS=$out timeout 300 "$py" benchmarks/quantize.py --gpu-only 2>&1 | tee "$out/gpu_quantize.log"
exit "$tests"
