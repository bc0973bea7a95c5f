// Argument checks shared by the module's calls: each throws mha::Error naming the argument and
// what is wrong with it, and allocates nothing unless it throws.
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "mha/mha.h"
#include "mha_contract.h"

namespace mha::detail {

// Halide buffers address at most 2^31 - 1 bytes without the large_buffers feature.
static_assert(kMaxBufferBytes == std::numeric_limits<int32_t>::max());

// Raises mha::Error unless a buffer of these extents and element size fits a kernel. `what()`
// names the buffer by the user's arguments (made only for the message: a check allocates
// nothing unless it throws); the message gives its true size.
template <typename What>
void check_kernel_buffer(std::initializer_list<int64_t> extents, int64_t element_bytes,
                         What &&what) {
    const std::optional<int64_t> bytes = contract::checked_bytes(extents, element_bytes);
    if (!bytes || *bytes > kMaxBufferBytes) {
        throw Error(fmt::format(
            "{} is {} x {} bytes = {} bytes, more than the {} bytes a kernel "
            "addresses",
            what(), fmt::join(extents, " x "), element_bytes,
            bytes ? std::to_string(*bytes) : std::string("over 2^63"), kMaxBufferBytes));
    }
}

template <typename Shape>
std::string shape_string(const Shape &shape) {
    return fmt::format("[{}]", fmt::join(shape, ", "));
}

// A tensor needs host data or, on a GPU module, a device handle.
template <typename T>
void check_data(const char *name, const TensorView<T> &t) {
    if (t.data == nullptr && t.device_handle == 0) {
        throw Error(fmt::format("{} has a null data pointer", name));
    }
}

// A tensor the library reads or writes on the host: it may not name device memory. `where`
// says why, e.g. "the module runs on the cpu".
template <typename T>
void check_on_host(const char *name, const TensorView<T> &t, const char *where) {
    if (t.device_handle != 0) {
        throw Error(fmt::format("{} has a device_handle but {}", name, where));
    }
}

// A caller's enumeration holds one of its values (an integer cast to it may not).
inline void check_convention(const char *name, MaskConvention convention) {
    if (convention != MaskConvention::keep && convention != MaskConvention::block) {
        throw Error(fmt::format("{} has convention {}, neither keep ({}) nor block ({})", name,
                                int(convention), int(MaskConvention::keep),
                                int(MaskConvention::block)));
    }
}

inline void check_dtype(const char *name, DType dtype) {
    if (std::find(contract::kDTypes.begin(), contract::kDTypes.end(), dtype) ==
        contract::kDTypes.end()) {
        throw Error(fmt::format("{} {} is none of f32, bf16 and f16", name, int(dtype)));
    }
}

inline void check_dtype(const char *name, CacheDType dtype) {
    if (std::find(contract::kCacheDTypes.begin(), contract::kCacheDTypes.end(), dtype) ==
        contract::kCacheDTypes.end()) {
        throw Error(fmt::format("{} {} is none of f32, bf16, f16 and int8", name, int(dtype)));
    }
}

// `expected`: any container of extents (an std::array allocates nothing).
template <typename T, typename Shape>
void check_tensor(const char *name, const TensorView<T> &t, const Shape &expected) {
    if (!std::equal(t.shape.begin(), t.shape.end(), std::begin(expected), std::end(expected))) {
        throw Error(fmt::format("{} has shape {} but must be {}", name, shape_string(t.shape),
                                shape_string(expected)));
    }
    check_data(name, t);
}

// Checks rank, positive extents, a data pointer and the kernel's addressing limit.
template <typename T>
void check_view(const char *name, const TensorView<T> &t, size_t rank, const char *layout) {
    if (t.shape.size() != rank) {
        throw Error(fmt::format("{} has shape {} but must have {} dimensions {}", name,
                                shape_string(t.shape), rank, layout));
    }
    int64_t bytes = sizeof(T);
    for (size_t d = 0; d < rank; d++) {
        if (t.shape[d] < 1) {
            throw Error(fmt::format("{} has shape {}: dimension {} is {}, must be >= 1", name,
                                    shape_string(t.shape), d, t.shape[d]));
        }
        if (t.shape[d] > kMaxBufferBytes / bytes) {
            bytes = kMaxBufferBytes + 1;
            break;
        }
        bytes *= t.shape[d];
    }
    if (bytes > kMaxBufferBytes) {
        throw Error(fmt::format("{} has shape {}: more than the {} bytes a kernel addresses", name,
                                shape_string(t.shape), kMaxBufferBytes));
    }
    check_data(name, t);
}

// A host view of `rank` dimensions (its strides as many, or none), with data: the plain loops'
// check (write_paged_cache, rotary_embedding), layout naming the dimensions.
template <typename T>
void check_rank(const char *name, const StridedView<T> &view, size_t rank, const char *layout) {
    if (view.data == nullptr) {
        throw Error(fmt::format("{} has a null data pointer", name));
    }
    if (view.shape.size() != rank || (!view.strides.empty() && view.strides.size() != rank)) {
        throw Error(
            fmt::format("{} has shape {} but must be {}", name, shape_string(view.shape), layout));
    }
}

// A view's strides, outermost first: its own, or row-major ones when it has none (rank <= 4, as
// check_rank checks first).
template <typename T>
std::array<int64_t, 4> strides_of(const StridedView<T> &view) {
    std::array<int64_t, 4> strides{};
    int64_t row_major = 1;
    for (size_t d = view.shape.size(); d-- > 0;) {
        strides[d] = view.strides.empty() ? row_major : view.strides[d];
        row_major *= view.shape[d];
    }
    return strides;
}

}  // namespace mha::detail
