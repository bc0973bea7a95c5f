#!/usr/bin/env bash
# On a machine with an NVIDIA GPU (and the project's set-up reachable: Debian packages, PyPI):
# builds, checks the CUDA kernels against the double-precision reference, times them against
# PyTorch's F.linear + F.scaled_dot_product_attention, and prints the table last. Bounded to
# 8 minutes.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build="${MHA_BUILD_DIR:-$root/build}"
cd "$root"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
timeout 480 bash -c "
    bash scripts/dev.sh build &&
    .venv-torch/bin/python bench/gpu_compare.py --bench '$build/bench/mha_gpu_bench' \
        --out '$build/bench/gpu_comparison.md'
"
