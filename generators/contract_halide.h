// The contract (contract/mha_contract.h) as the generators see it: which CPU instruction set or
// device a Halide target compiles for, and element types as Halide types.
#pragma once

#include <string>

#include "Halide.h"
#include "halide_types.h"
#include "mha_contract.h"

namespace mha {

// The first (best) CPU instruction set of the contract whose platform is the target's and whose
// features the target has all of.
inline const contract::CpuIsa &cpu_isa_of(const Halide::Target &target) {
    for (const contract::CpuIsa &isa : contract::kCpuIsas) {
        const Halide::Target want(std::string(isa.halide_target));
        const bool same_platform =
            target.arch == want.arch && target.bits == want.bits && target.os == want.os;
        if (same_platform && (want.get_features_bitset() & ~target.get_features_bitset()).none()) {
            return isa;
        }
    }
    throw Halide::CompileError(
        "CPU kernels are built for the CPU instruction sets of "
        "contract/mha_contract.h (kCpuIsas) only, not " +
        target.to_string());
}

// The device a target's kernels run on: the contract's GPU target of the same device API, or
// the CPU.
inline Device device_of(const Halide::Target &target) {
    for (const contract::GpuTarget &g : contract::kGpuTargets) {
        const Halide::Target want(std::string(g.halide_target));
        if (target.has_gpu_feature() &&
            target.get_required_device_api() == want.get_required_device_api()) {
            return g.device;
        }
    }
    if (target.has_gpu_feature()) {
        throw Halide::CompileError(
            "GPU kernels are built for the contract's GPU targets only, not " + target.to_string());
    }
    return Device::cpu;
}

inline Halide::Type halide_type_of(contract::ElementType type) {
    return Halide::Type(contract::halide_type(type));
}

}  // namespace mha
