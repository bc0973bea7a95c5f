// Halide buffers over caller or module memory, never owning the host memory; on a GPU they own
// the device allocations they receive (uploads, wrapped handles) and release them when the last
// copy goes. Making one allocates nothing (a decode step allocates nothing at all).
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "HalideBuffer.h"
#include "mha/mha.h"

// bf16 and f16 tensors as Halide's bfloat and float types (mha::bfloat16 and mha::float16 hold
// the same bits).
template <>
HALIDE_ALWAYS_INLINE constexpr halide_type_t halide_type_of<mha::bfloat16>() {
    return halide_type_t(halide_type_bfloat, 16);
}

template <>
HALIDE_ALWAYS_INLINE constexpr halide_type_t halide_type_of<mha::float16>() {
    return halide_type_t(halide_type_float, 16);
}

namespace mha::detail {

// Tensors have at most kMaxRank dimensions; the buffers the kernels take one more (the decode
// kernels' key cache, in tiles), held inside the buffer object, which then allocates nothing.
inline constexpr int kMaxRank = 4;
inline constexpr int kMaxKernelRank = 5;
using HostBuffer = Halide::Runtime::Buffer<void, Halide::Runtime::AnyDims, kMaxKernelRank>;

// Over `data` of `type`, with `rank` extents and strides (in elements) outermost first, as
// PyTorch lists them; Halide lists dimensions innermost first.
HostBuffer view_buffer(const void *data, halide_type_t type, int rank, const int64_t *shape,
                       const int64_t *strides);

inline HostBuffer view_buffer(const void *data, halide_type_t type,
                              std::initializer_list<int64_t> shape,
                              std::initializer_list<int64_t> strides) {
    return view_buffer(data, type, int(shape.size()), shape.begin(), strides.begin());
}

// A dense row-major tensor, of `type` (a kernel's 16-bit arguments take bf16 and f16 as their
// bits, contract::ElementType::u16).
template <typename T>
HostBuffer dense_buffer(const TensorView<T> &t,
                        halide_type_t type = halide_type_of<std::remove_const_t<T>>()) {
    const int rank = int(t.shape.size());
    std::array<int64_t, kMaxRank> strides{};
    int64_t stride = 1;
    for (int d = rank; d-- > 0;) {
        strides[d] = stride;
        stride *= t.shape[d];
    }
    return view_buffer(t.data, type, rank, t.shape.data(), strides.data());
}

}  // namespace mha::detail
