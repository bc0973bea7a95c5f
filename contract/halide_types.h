// The contract's element types as Halide's runtime types, for the generators (Halide::Type is
// constructible from halide_type_t) and for the runtime's compile-time argument checks.
#pragma once

#include "HalideRuntime.h"
#include "mha_contract.h"

namespace mha::contract {

constexpr halide_type_t halide_type(ElementType type) {
    switch (type) {
    case ElementType::f32:
        return halide_type_t(halide_type_float, 32);
    case ElementType::bf16:
        return halide_type_t(halide_type_bfloat, 16);
    case ElementType::f16:
        return halide_type_t(halide_type_float, 16);
    case ElementType::u16:
        return halide_type_t(halide_type_uint, 16);
    case ElementType::u8:
        return halide_type_t(halide_type_uint, 8);
    case ElementType::i8:
        return halide_type_t(halide_type_int, 8);
    case ElementType::i32:
        return halide_type_t(halide_type_int, 32);
    }
    return halide_type_t();
}

}  // namespace mha::contract
