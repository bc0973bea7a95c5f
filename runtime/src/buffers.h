// Halide buffers over caller or module memory, never owning the host memory; on a GPU they own
// the device allocations they receive (uploads, wrapped handles) and release them when the last
// copy goes.
#pragma once

#include <cstdint>
#include <vector>

#include "HalideBuffer.h"
#include "mha/mha.h"

namespace mha::detail {

using HostBuffer = Halide::Runtime::Buffer<void>;

// Over `data` of `type`, with shape and strides (in elements) outermost first, as PyTorch lists
// them; Halide lists dimensions innermost first.
HostBuffer view_buffer(const void *data, halide_type_t type, const std::vector<int64_t> &shape,
                       const std::vector<int64_t> &strides);

// A dense row-major tensor.
template <typename T>
HostBuffer dense_buffer(const TensorView<T> &t) {
    std::vector<int64_t> strides(t.shape.size());
    int64_t stride = 1;
    for (size_t d = t.shape.size(); d-- > 0;) {
        strides[d] = stride;
        stride *= t.shape[d];
    }
    return view_buffer(t.data, halide_type_of<std::remove_const_t<T>>(), t.shape, strides);
}

// A mask as a [B, H, Sq, Sk] (= `full`) buffer: broadcast dimensions get stride 0.
HostBuffer mask_buffer(const Mask &mask, const std::vector<int64_t> &full);

}  // namespace mha::detail
