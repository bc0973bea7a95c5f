#!/usr/bin/env bash
# One entry point for a fresh clone: installs what is missing, configures, builds, then runs.
#   scripts/dev.sh run [mha options]   build and run the main job (the `mha` command-line program)
#   scripts/dev.sh test                build and run every test: ctest, then `pip install .` into
#                                      .venv-torch (PyTorch, transformers; large download) and
#                                      the Python package's pytest suite
#   scripts/dev.sh tune --isa ISA [mha-tune options]
#                                      search CPU schedule parameters (see README, Tuning)
#   scripts/dev.sh build               build everything (benchmarks too) and run nothing
#   scripts/dev.sh bench [compare.py options]
#                                      build and run the benchmark comparison against OpenBLAS,
#                                      PyTorch and ONNX Runtime (in .venv-torch), ours also through
#                                      the Python package; writes a table and a plot (PNG)
#   scripts/dev.sh bench-attention [sdpa_compare.py options]
#                                      build the Python package and time the attention core
#                                      against F.scaled_dot_product_attention (and generate()
#                                      of a small Llama on each); writes a table and a plot
#   scripts/dev.sh stmt KERNEL         write Halide's HTML statement view and assembly of one
#                                      kernel (names: build/cli/mha --list-kernels)
#   scripts/dev.sh cross arm64 [ctest options]
#                                      build the CPU libraries, `mha` and the emulated tests for
#                                      arm64 (build-arm64, with the host build's generators) and
#                                      run the tests under qemu-aarch64-static
#   scripts/dev.sh gpu-bundle         build build-gpu/gpu-bundle: the GPU test and benchmark programs
#                                      and scripts that bench/gpu_check.sh runs on a GPU machine
#   scripts/dev.sh fuzz [libFuzzer options]
#                                      build the libFuzzer harness (tests/fuzz) and run it from
#                                      the committed seed corpus, e.g. -runs=1000000
# A second call reuses the virtual environment and the build directory of the first.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv="$root/.venv"
torch_venv="$root/.venv-torch"
build="${MHA_BUILD_DIR:-$root/build}"

# Pinned Python-side toolchain: Halide's wheel carries libHalide, its headers, CMake package and
# autoscheduler plugins; Halide 21's CMake files need CMake >= 3.28, newer than Debian 12's.
python_requirements=(halide==21.0.0 cmake==4.4.5 ninja==1.13.2)
# The Python package's tests and the benchmarks' peers.
torch_requirements=(torch==2.15.0 onnxruntime==1.32.0 onnx==1.23.2 numpy==2.4.6
                    transformers==5.24.0 matplotlib==3.11.2 pytest==9.2.0 atheris==3.0.0)
debian_packages=(g++ python3 python3-venv libfmt-dev libgtest-dev libbenchmark-dev
                 libcli11-dev nlohmann-json3-dev pocl-opencl-icd ocl-icd-opencl-dev
                 libopenblas-dev binutils clang-format pkgconf clang libclang-rt-14-dev
                 g++-aarch64-linux-gnu qemu-user-static)

log() { printf '[dev.sh %s] %s\n' "$(date +%T)" "$*" >&2; }

install_debian_packages() {
    local missing=()
    for p in "${debian_packages[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return
    log "installing Debian packages: ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
}

# install_venv DIR PACKAGE...: a virtual environment holding exactly these pinned packages.
install_venv() {
    local dir=$1
    shift
    local stamp="$dir/.requirements"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$*" ]; then
        return
    fi
    log "creating $dir with $*"
    python3 -m venv "$dir"
    "$dir/bin/python" -m pip install -q --disable-pip-version-check "$@"
    echo "$*" >"$stamp"
}

# configure_and_build [cmake -D options]: configures on the first call or when options are given;
# builds everything, or the target MHA_BUILD_TARGET names.
configure_and_build() {
    local halide_root
    halide_root=$("$venv/bin/python" -c 'import halide; print(halide.install_dir())')
    if [ ! -f "$build/build.ninja" ] || [ $# -gt 0 ]; then
        log "configuring $build"
        "$venv/bin/cmake" -S "$root" -B "$build" -G Ninja \
            -DCMAKE_MAKE_PROGRAM="$venv/bin/ninja" \
            -DCMAKE_BUILD_TYPE=Release -DMHA_WARNINGS_AS_ERRORS=ON \
            -DHalide_ROOT="$halide_root" -DHalide_DIR="$halide_root/lib64/cmake/Halide" "$@"
    fi
    "$venv/bin/cmake" --build "$build" ${MHA_BUILD_TARGET:+--target "$MHA_BUILD_TARGET"}
}

# cross_build ARCH [ctest options]: the CPU libraries, `mha` and the emulated tests for another
# architecture, in $build-ARCH, configured once with cmake/toolchains/<triple>.cmake and the host
# build's generators (which must be built first); then its tests under the emulator.
cross_build() {
    local triple
    case "$1" in
        arm64) triple=aarch64-linux-gnu ;;
        *) echo "scripts/dev.sh cross: no toolchain for '$1' (arm64 is the one there is)" >&2; exit 2 ;;
    esac
    local cross="$build-$1"
    if [ ! -f "$cross/build.ninja" ]; then
        log "configuring $cross"
        # fmt is used header-only, so the host's package configuration serves any architecture.
        "$venv/bin/cmake" -S "$root" -B "$cross" -G Ninja \
            -DCMAKE_MAKE_PROGRAM="$venv/bin/ninja" \
            -DCMAKE_TOOLCHAIN_FILE="$root/cmake/toolchains/$triple.cmake" \
            -DCMAKE_BUILD_TYPE=Release -DMHA_WARNINGS_AS_ERRORS=ON \
            -Dmha-halide_generators_ROOT="$build" \
            -DHalide_DIR="$("$venv/bin/python" -c 'import halide; print(halide.install_dir())')/lib64/cmake/Halide" \
            -Dfmt_DIR="$(dirname "$(dpkg -L libfmt-dev | grep -m1 'fmt-config.cmake$')")"
    fi
    "$venv/bin/cmake" --build "$cross"
    shift
    "$venv/bin/ctest" --test-dir "$cross" --output-on-failure -j "$(nproc)" "$@"
}

# install_python_package [CMake definitions]: `pip install .` into .venv-torch, as a user would
# (pip builds in an isolated environment with pyproject.toml's build requirements: the CPU
# kernels and the extension, every time), with those definitions (NAME=VALUE) passed to CMake.
install_python_package() {
    install_venv "$torch_venv" "${torch_requirements[@]}"
    log "pip install . into $torch_venv${*:+ (CMake: $*)}"
    local settings=()
    for definition in "$@"; do
        settings+=("--config-settings=cmake.define.$definition")
    done
    "$torch_venv/bin/python" -m pip install -q --disable-pip-version-check "${settings[@]}" "$root"
}

command=${1:-}
shift || true
case "$command" in
    run)
        install_debian_packages
        install_venv "$venv" "${python_requirements[@]}"
        configure_and_build
        "$build/cli/mha" "$@"
        ;;
    test)
        install_debian_packages
        install_venv "$venv" "${python_requirements[@]}"
        # The PyTorch environment downloads while the kernels compile (it needs no CPU to speak
        # of); pip install . below waits for it.
        install_venv "$torch_venv" "${torch_requirements[@]}" &
        torch_venv_job=$!
        configure_and_build
        log "ctest in $build"
        "$venv/bin/ctest" --test-dir "$build" --output-on-failure -j "$(nproc)" "$@"
        cross_build arm64
        wait "$torch_venv_job"
        # The package's tests check the binding, not the kernels (ctest ran all of them): it is
        # built with one instruction set's kernels, copied from the build just tested.
        install_python_package MHA_CPU_ISAS=avx2 "MHA_KERNELS_FROM=$build"
        log "pytest in python/tests"
        (cd "$root/python/tests" && "$torch_venv/bin/python" -m pytest -q -p no:cacheprovider)
        log "every test passed"
        ;;
    build)  # everything, benchmarks included, and the Python package; runs nothing
        install_debian_packages
        install_venv "$venv" "${python_requirements[@]}"
        configure_and_build -DMHA_BUILD_BENCHMARKS=ON
        install_python_package
        ;;
    tune)  # the schedule tuner: scripts/dev.sh tune --isa avx512 [mha-tune options]
        install_debian_packages
        install_venv "$venv" "${python_requirements[@]}"
        configure_and_build
        "$build/tuner/mha-tune" "$@"
        ;;
    bench)
        install_debian_packages
        install_venv "$venv" "${python_requirements[@]}"
        configure_and_build -DMHA_BUILD_BENCHMARKS=ON
        install_python_package
        "$torch_venv/bin/python" "$root/bench/compare.py" --bench "$build/bench/mha_bench" \
            --out "$build/bench/comparison.md" --plot "$build/bench/comparison.png" "$@"
        ;;
    bench-attention)
        install_debian_packages
        install_venv "$venv" "${python_requirements[@]}"
        configure_and_build
        install_python_package
        mkdir -p "$build/bench"
        "$torch_venv/bin/python" "$root/bench/sdpa_compare.py" --out "$build/bench/attention.md" \
            --plot "$build/bench/attention.png" "$@"
        ;;
    stmt)  # scripts/dev.sh stmt mha_forward_cpu_avx512_medium_none_mask_fused
        [ $# -eq 1 ] || { echo "usage: scripts/dev.sh stmt KERNEL" >&2; exit 2; }
        install_debian_packages
        install_venv "$venv" "${python_requirements[@]}"
        configure_and_build
        "$venv/bin/cmake" --build "$build" --target "$1.stmt"
        ;;
    cross)  # scripts/dev.sh cross arm64 [ctest options]
        [ $# -ge 1 ] || { echo "usage: scripts/dev.sh cross arm64 [ctest options]" >&2; exit 2; }
        install_debian_packages
        install_venv "$venv" "${python_requirements[@]}"
        configure_and_build
        cross_build "$@"
        ;;
    gpu-bundle)  # what the GPU machine runs: build-gpu/gpu-bundle, then gpu_check.sh there
        install_debian_packages
        install_venv "$venv" "${python_requirements[@]}"
        # A build of its own: the bundle's two programs link the CPU kernels too, and with every
        # instruction set's they took 57 of the 64 MiB a device run carries. The GPU machines'
        # hosts (Xeon, EPYC) run avx2.
        build="$build-gpu" MHA_BUILD_TARGET=gpu_bundle configure_and_build \
            -DMHA_CPU_ISAS=avx2 -DMHA_GPU_KERNELS=ON -DMHA_BUILD_BENCHMARKS=ON \
            -DMHA_SANITIZER_TESTS=OFF -DMHA_FUZZ=OFF
        du -sh "$build-gpu/gpu-bundle"
        ls -l "$build-gpu/gpu-bundle"
        ;;
    fuzz)  # scripts/dev.sh fuzz -runs=1000000 (or -max_total_time=600)
        install_debian_packages
        install_venv "$venv" "${python_requirements[@]}"
        configure_and_build
        "$venv/bin/ctest" --test-dir "$build" -R '^Fuzz\.Build$' --output-on-failure
        fuzz="$build/tests/fuzz"
        "$fuzz/build/mha_fuzz_api" -timeout=10 -print_final_stats=1 -artifact_prefix="$fuzz/" "$@" \
            "$fuzz/corpus" "$root/tests/fuzz/corpus"
        ;;
    *)
        echo "usage: scripts/dev.sh run [mha options] | test [ctest options] | tune [mha-tune options] | bench [options] | bench-attention [options] | build | stmt KERNEL | fuzz [libFuzzer options] | cross arm64 | gpu-bundle" >&2
        exit 2
        ;;
esac
