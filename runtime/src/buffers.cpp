#include "buffers.h"

#include <fmt/format.h>

namespace mha::detail {

HostBuffer view_buffer(const void *data, halide_type_t type, int rank, const int64_t *shape,
                       const int64_t *strides) {
    if (rank > kMaxKernelRank) {
        throw Error(
            fmt::format("internal error: a buffer of rank {}, past {}", rank, kMaxKernelRank));
    }
    std::array<halide_dimension_t, kMaxKernelRank> dims{};
    for (int d = 0; d < rank; d++) {
        // Sizes were checked against the kernels' 32-bit addressing before any buffer is made.
        dims[d] = {0, static_cast<int32_t>(shape[rank - 1 - d]),
                   static_cast<int32_t>(strides[rank - 1 - d]), 0};
    }
    return HostBuffer(type, const_cast<void *>(data), rank, dims.data());
}

}  // namespace mha::detail
