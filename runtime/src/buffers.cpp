#include "buffers.h"

namespace mha::detail {

std::vector<int64_t> dense_strides(const std::vector<int64_t> &shape) {
    std::vector<int64_t> strides(shape.size());
    int64_t stride = 1;
    for (size_t d = shape.size(); d-- > 0;) {
        strides[d] = stride;
        stride *= shape[d];
    }
    return strides;
}

BufferView::BufferView(const void *data, halide_type_t type, const std::vector<int64_t> &shape,
                       const std::vector<int64_t> &strides) {
    const int rank = static_cast<int>(shape.size());
    for (int d = 0; d < rank; d++) {
        // Halide lists dimensions innermost first.
        dims_[d] = {0, static_cast<int32_t>(shape[rank - 1 - d]),
                    static_cast<int32_t>(strides[rank - 1 - d]), 0};
    }
    buffer_.host = static_cast<uint8_t *>(const_cast<void *>(data));
    buffer_.type = type;
    buffer_.dimensions = rank;
    buffer_.dim = dims_.data();
}

namespace {
std::vector<int64_t> broadcast_strides(const std::vector<int64_t> &shape,
                                       const std::vector<int64_t> &full) {
    const std::vector<int64_t> own = dense_strides(shape);
    std::vector<int64_t> strides(full.size(), 0);
    const size_t offset = full.size() - shape.size();
    for (size_t d = 0; d < shape.size(); d++) {
        strides[offset + d] = shape[d] == 1 ? 0 : own[d];
    }
    return strides;
}
}  // namespace

MaskView::MaskView(const Mask &mask, const std::vector<int64_t> &full)
    : BufferView(mask.values.data, halide_type_of<uint8_t>(), full,
                 broadcast_strides(mask.values.shape, full)) {}

}  // namespace mha::detail
