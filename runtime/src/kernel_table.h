// The ahead-of-time compiled forward kernels linked into the program, one table per device
// (kernels/<device>_kernels.cpp, written by the configure step from the contract), and the
// compile-time check that each kernel takes the arguments the contract gives its variant.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "HalideRuntime.h"
#include "halide_types.h"
#include "mha/mha.h"
#include "mha_contract.h"

namespace mha::detail {

struct CompiledKernel {
    std::string_view name;
    Device device;
    int isa;                        // index into contract::kCpuIsas; -1 on GPUs
    contract::ScheduleCells cells;  // the (tuning, shape bucket) pairs it serves
    contract::KernelVariant variant;
    int (*call_argv)(void **args);  // Halide's _argv entry point: user_context, then arguments
};

// A CPU whose tuned parameters an instruction set's kernels were also compiled with.
struct TunedCpu {
    int isa;   // index into contract::kCpuIsas; -1 ends a table
    int slot;  // its tuning slot in the kernels' cells (contract::schedule_cell)
    contract::CpuIdentity cpu;
};

// One device's kernels; GPU devices come as separately linked components.
struct KernelComponent {
    Device device;
    const CompiledKernel *kernels;
    size_t count;
    const halide_device_interface_t *(*device_interface)();  // null on the CPU
    const TunedCpu *tuned_cpus;                              // ended by isa -1; null on GPUs
};

// The CPU kernels (always linked), and a GPU device's component, or null when the program was
// not linked with it.
const KernelComponent &cpu_kernels();
const KernelComponent *linked_component(Device device);

// The kernel of `component` for a call of `variant` whose largest projection has `token_rows`,
// on CPU instruction set `isa` (ignored on GPUs); null when the build has none.
const CompiledKernel *find_kernel(const KernelComponent &component, int isa, int64_t token_rows,
                                  const contract::KernelVariant &variant);

// Whether `component` has forward kernels of `dtype` (a GPU build may leave the 16-bit ones out,
// MHA_GPU_DTYPES).
bool has_forward_kernels(const KernelComponent &component, DType dtype);

constexpr HalideFunctionInfo::ArgumentKind function_info_kind(contract::ArgKind kind) {
    switch (kind) {
    case contract::ArgKind::input_buffer:
        return HalideFunctionInfo::InputBuffer;
    case contract::ArgKind::input_scalar:
        return HalideFunctionInfo::InputScalar;
    case contract::ArgKind::output_buffer:
        return HalideFunctionInfo::OutputBuffer;
    }
    return HalideFunctionInfo::InputScalar;
}

// The Halide type of argument `id` of a kernel.
constexpr halide_type_t argument_type(const CompiledKernel &kernel, contract::ArgId id) {
    return contract::halide_type(contract::arg_type(id, kernel.variant, kernel.device));
}

// Whether a generated kernel's arguments (its function_info header) are the user_context and
// then exactly the contract's arguments of `variant` on `device`: same names, order, kinds,
// ranks, types.
template <size_t N>
constexpr bool takes_contract_arguments(const std::array<HalideFunctionInfo::ArgumentInfo, N> &info,
                                        const contract::KernelVariant &variant, Device device) {
    const contract::ArgList args = contract::kernel_arguments(variant);
    if (N != args.size() + 1 || info[0].name != "__user_context") {
        return false;
    }
    for (size_t i = 0; i < args.size(); i++) {
        const contract::ArgSpec &want = contract::arg(args[i]);
        const HalideFunctionInfo::ArgumentInfo &got = info[i + 1];
        if (got.name != want.name || got.kind != function_info_kind(want.kind) ||
            got.dimensions != want.rank ||
            got.type != contract::halide_type(contract::arg_type(args[i], variant, device))) {
            return false;
        }
    }
    return true;
}

}  // namespace mha::detail
