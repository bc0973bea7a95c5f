#!/usr/bin/env bash
# The GPU check, run on the GPU machine from the bundle folder alone: scripts/dev.sh gpu-bundle
# makes it, build-gpu/gpu-bundle, here (the GPU machine has the driver, nvcc, python3 with PyTorch,
# but no Halide and nothing to fetch). Within the 10 minutes a device command may run (at most
# 200 s for the tests, 360 for the timing):
#   1. nvidia-smi;
#   2. every CUDA suite of mha_gpu_tests (each forward kernel variant and masks of every family
#      in f32, bf16 and f16, the averaging kernel, kdim/vdim, grouped-query heads, causal orders,
#      16-bit modules, device-resident tensors) against the double-precision reference;
#   3. the timing tables against PyTorch (gpu_compare.py: f32, then bf16 and f16 modules
#      against PyTorch in that dtype), each row printed as it is measured (a run cut short keeps
#      those), the tables printed last and written to OUT_DIR.
# Without a driver (CI runs it here) the CUDA cases report skipped and the timing is skipped.
#   usage: gpu_check.sh [OUT_DIR]     (default: ./gpu-check-out beside this script)
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out=${1:-$here/gpu-check-out}
mkdir -p "$out"
status=0

if command -v nvidia-smi >/dev/null &&
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader |
    tee "$out/gpu.txt"; then
    gpu=1
else
    echo "gpu_check: no NVIDIA GPU or driver here: the CUDA cases report skipped" | tee "$out/gpu.txt"
    gpu=0
fi

echo "gpu_check: the CUDA suites against the double-precision reference"
timeout 200 "$here/mha_gpu_tests" --gtest_filter='*cuda*:Cuda.*' 2>&1 | tee "$out/tests.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "gpu_check: CUDA tests FAILED"; status=1; }

if [ "$gpu" -eq 1 ] && python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
    echo "gpu_check: timing against PyTorch"
    (cd "$here" && PYTHONUNBUFFERED=1 timeout 360 python3 gpu_compare.py \
        --bench "$here/mha_gpu_bench" --out "$out/gpu_table.md") 2>&1 | tee "$out/timing.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "gpu_check: timing FAILED"; status=1; }
else
    echo "gpu_check: timing against PyTorch skipped: no CUDA GPU with PyTorch here"
fi

if [ -f "$out/gpu_table.md" ]; then
    echo
    cat "$out/gpu_table.md"
fi
exit $status
