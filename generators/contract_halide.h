// The contract (contract/mha_contract.h) as the generators see it: which CPU instruction set a
// Halide target compiles for, and element types as Halide types.
#pragma once

#include <string>

#include "Halide.h"
#include "halide_types.h"
#include "mha_contract.h"

namespace mha {

// The first (best) CPU instruction set of the contract whose features the target has all of;
// for a target of no contract instruction set (a cross-compiled architecture the runtime does
// not link), one described from Halide's knowledge of the target, untuned.
inline contract::CpuIsa cpu_isa_of(const Halide::Target &target) {
    for (const contract::CpuIsa &isa : contract::kCpuIsas) {
        const Halide::Target want(std::string(isa.halide_target));
        const bool same_platform =
            target.arch == want.arch && target.bits == want.bits && target.os == want.os;
        if (same_platform && (want.get_features_bitset() & ~target.get_features_bitset()).none()) {
            return isa;
        }
    }
    const bool wide_register_file = target.arch == Halide::Target::ARM && target.bits == 64;
    return {"other", "", target.natural_vector_size<float>(), wide_register_file ? 32 : 16, false};
}

inline Halide::Type halide_type_of(contract::ElementType type) {
    return Halide::Type(contract::halide_type(type));
}

}  // namespace mha
