#include "buffers.h"

namespace mha::detail {

HostBuffer view_buffer(const void *data, halide_type_t type, int rank, const int64_t *shape,
                       const int64_t *strides) {
    std::array<halide_dimension_t, kMaxRank> dims{};
    for (int d = 0; d < rank; d++) {
        // Sizes were checked against the kernels' 32-bit addressing before any buffer is made.
        dims[d] = {0, static_cast<int32_t>(shape[rank - 1 - d]),
                   static_cast<int32_t>(strides[rank - 1 - d]), 0};
    }
    return HostBuffer(type, const_cast<void *>(data), rank, dims.data());
}

HostBuffer mask_buffer(const Mask &mask, const std::vector<int64_t> &full) {
    const std::vector<int64_t> &shape = mask.values.shape;
    std::array<int64_t, kMaxRank> strides{};
    const size_t offset = full.size() - shape.size();
    int64_t stride = 1;
    for (size_t d = shape.size(); d-- > 0;) {
        strides[offset + d] = shape[d] == 1 ? 0 : stride;
        stride *= shape[d];
    }
    return view_buffer(mask.values.data, halide_type_of<uint8_t>(), int(full.size()), full.data(),
                       strides.data());
}

}  // namespace mha::detail
