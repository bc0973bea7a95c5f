// halide_buffer_t views over caller or module memory, on the host or on a GPU.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "HalideRuntime.h"
#include "mha/mha.h"

namespace mha::detail {

std::vector<int64_t> dense_strides(const std::vector<int64_t> &shape);

// A halide_buffer_t over existing memory; shape and strides outermost first. It never owns the
// host memory; a device allocation it receives (upload, wrap) is released by its owner.
class BufferView {
public:
    BufferView(const void *data, halide_type_t type, const std::vector<int64_t> &shape,
               const std::vector<int64_t> &strides);
    BufferView(const BufferView &) = delete;
    BufferView &operator=(const BufferView &) = delete;

    halide_buffer_t *raw() { return &buffer_; }

private:
    std::array<halide_dimension_t, 4> dims_{};
    halide_buffer_t buffer_{};
};

// A dense row-major tensor.
template <typename T>
struct DenseView : BufferView {
    explicit DenseView(const TensorView<T> &t)
        : BufferView(t.data, halide_type_of<std::remove_const_t<T>>(), t.shape,
                     dense_strides(t.shape)) {}
};

// A mask as a [B, H, Sq, Sk] view, broadcast dimensions given stride 0.
struct MaskView : BufferView {
    MaskView(const Mask &mask, const std::vector<int64_t> &full);
};

}  // namespace mha::detail
