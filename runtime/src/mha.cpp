#include "mha/mha.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <array>
#include <limits>

#include "HalideRuntime.h"
#include "kernel_abi.h"
#include "kernel_table.h"

namespace mha {
namespace {

using detail::ForwardKernel;
using detail::MaskKind;

// Halide buffers address at most 2^31 - 1 bytes without the large_buffers feature.
constexpr int64_t kMaxBufferBytes = std::numeric_limits<int32_t>::max();

std::string shape_string(const std::vector<int64_t> &shape) {
    return fmt::format("[{}]", fmt::join(shape, ", "));
}

template <typename T>
void check_tensor(const char *name, const TensorView<T> &t, const std::vector<int64_t> &expected) {
    if (t.shape != expected) {
        throw Error(fmt::format("{} has shape {} but must be {}", name, shape_string(t.shape),
                                shape_string(expected)));
    }
    if (t.data == nullptr) {
        throw Error(fmt::format("{} has a null data pointer", name));
    }
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
    if (t.data == nullptr) {
        throw Error(fmt::format("{} has a null data pointer", name));
    }
}

// A halide_buffer_t over caller memory, outermost-first shape and strides as given.
class BufferView {
public:
    BufferView(const void *data, halide_type_t type, const std::vector<int64_t> &shape,
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
    BufferView(const BufferView &) = delete;
    BufferView &operator=(const BufferView &) = delete;

    halide_buffer_t *raw() { return &buffer_; }

private:
    std::array<halide_dimension_t, 4> dims_{};
    halide_buffer_t buffer_{};
};

std::vector<int64_t> dense_strides(const std::vector<int64_t> &shape) {
    std::vector<int64_t> strides(shape.size());
    int64_t stride = 1;
    for (size_t d = shape.size(); d-- > 0;) {
        strides[d] = stride;
        stride *= shape[d];
    }
    return strides;
}

template <typename T>
struct DenseView : BufferView {
    explicit DenseView(const TensorView<T> &t)
        : BufferView(t.data, halide_type_of<std::remove_const_t<T>>(), t.shape,
                     dense_strides(t.shape)) {}
};

// The mask as a [B, H, Sq, Sk] view, broadcast dimensions given stride 0.
struct MaskView : BufferView {
    MaskView(const Mask &mask, const std::vector<int64_t> &full)
        : BufferView(mask.values.data, halide_type_of<uint8_t>(), full,
                     broadcast_strides(mask.values.shape, full)) {}

    static std::vector<int64_t> broadcast_strides(const std::vector<int64_t> &shape,
                                                  const std::vector<int64_t> &full) {
        const std::vector<int64_t> own = dense_strides(shape);
        std::vector<int64_t> strides(full.size(), 0);
        const size_t offset = full.size() - shape.size();
        for (size_t d = 0; d < shape.size(); d++) {
            strides[offset + d] = shape[d] == 1 ? 0 : own[d];
        }
        return strides;
    }
};

void check_mask(const Mask &mask, const std::vector<int64_t> &full) {
    static const char *const kDimNames[] = {"batch", "num_heads", "query length", "key length"};
    const auto &shape = mask.values.shape;
    if (shape.empty() || shape.size() > full.size()) {
        throw Error(fmt::format(
            "mask has shape {} but must have 1 to 4 dimensions broadcasting to [B, H, Sq, Sk] = {}",
            shape_string(shape), shape_string(full)));
    }
    const size_t offset = full.size() - shape.size();
    for (size_t d = 0; d < shape.size(); d++) {
        if (shape[d] != 1 && shape[d] != full[offset + d]) {
            throw Error(fmt::format(
                "mask has shape {} which does not broadcast to [B, H, Sq, Sk] = {}: dimension {} "
                "is {}, but {} is {}",
                shape_string(shape), shape_string(full), d, shape[d], kDimNames[offset + d],
                full[offset + d]));
        }
    }
    if (mask.values.data == nullptr) {
        throw Error("mask has a null data pointer");
    }
}

const char *const kProjectionNames[4] = {"q_proj", "k_proj", "v_proj", "out_proj"};

// Rows of packed weights are `width` floats apart plus one cache line, so that a GEMM walking
// down a column never strides by a multiple of 4 KiB (which would alias in the L1 cache).
int64_t row_stride(int64_t width) { return width + 16; }

// Writes Wᵀ of one nn.Linear into columns [column, column + E) of a row-major [E, row_width]
// block, and its bias at the same offset.
void pack_linear(const Linear &lin, int64_t E, int64_t row_width, int64_t column,
                 std::vector<float> &weight_t, std::vector<float> &bias) {
    for (int64_t out = 0; out < E; out++) {
        for (int64_t in = 0; in < E; in++) {
            weight_t[in * row_width + column + out] = lin.weight.data[out * E + in];
        }
        bias[column + out] = lin.bias ? lin.bias->data[out] : 0.0f;
    }
}

}  // namespace

MultiHeadAttention::MultiHeadAttention(int64_t embed_dim, int64_t num_heads, const Linear &q_proj,
                                       const Linear &k_proj, const Linear &v_proj,
                                       const Linear &out_proj)
    : embed_dim_(embed_dim), num_heads_(num_heads) {
    detail::install_runtime_hooks();
    if (embed_dim < 1) {
        throw Error(fmt::format("embed_dim {} must be >= 1", embed_dim));
    }
    if (num_heads < 1) {
        throw Error(fmt::format("num_heads {} must be >= 1", num_heads));
    }
    if (embed_dim % num_heads != 0) {
        throw Error(fmt::format("embed_dim {} is not divisible by num_heads {}", embed_dim,
                                num_heads));
    }
    padded_ = padded_features(embed_dim, num_heads);
    const int64_t E = embed_dim, P = padded_;
    if (3 * P * E > kMaxBufferBytes / static_cast<int64_t>(sizeof(float))) {
        throw Error(fmt::format("embed_dim {} is too large: the packed weights exceed the {} "
                                "bytes a kernel addresses",
                                embed_dim, kMaxBufferBytes));
    }
    const Linear *linears[4] = {&q_proj, &k_proj, &v_proj, &out_proj};
    for (int p = 0; p < 4; p++) {
        check_tensor(fmt::format("{}.weight", kProjectionNames[p]).c_str(), linears[p]->weight,
                     {E, E});
        if (linears[p]->bias) {
            check_tensor(fmt::format("{}.bias", kProjectionNames[p]).c_str(), *linears[p]->bias,
                         {E});
        }
    }
    qkv_weight_t_.assign(E * row_stride(3 * P), 0.0f);
    qkv_bias_.assign(3 * P, 0.0f);
    for (int p = 0; p < 3; p++) {
        pack_linear(*linears[p], E, row_stride(3 * P), p * P, qkv_weight_t_, qkv_bias_);
    }
    out_weight_t_.assign(E * row_stride(P), 0.0f);
    out_bias_.assign(P, 0.0f);
    pack_linear(out_proj, E, row_stride(P), 0, out_weight_t_, out_bias_);
}

void MultiHeadAttention::forward(const Tensor &query, const Tensor &key, const Tensor &value,
                                 const MutableTensor &output, const std::optional<Mask> &mask,
                                 const std::optional<MutableTensor> &weights) const {
    const char *layout = "[batch, sequence, embed_dim]";
    check_view("query", query, 3, layout);
    check_view("key", key, 3, layout);
    check_view("value", value, 3, layout);
    const int64_t B = query.shape[0], Sq = query.shape[1], E = embed_dim_;
    const int64_t Sk = key.shape[1], H = num_heads_;
    for (const auto &[name, t] : {std::pair{"query", &query}, {"key", &key}, {"value", &value}}) {
        if (t->shape[2] != E) {
            throw Error(fmt::format("{} has embed dim {} but the module's embed_dim is {}", name,
                                    t->shape[2], E));
        }
        if (t->shape[0] != B) {
            throw Error(fmt::format("{} has batch {} but query has batch {}", name, t->shape[0],
                                    B));
        }
    }
    if (value.shape[1] != Sk) {
        throw Error(fmt::format("key has {} rows but value has {}", Sk, value.shape[1]));
    }
    check_tensor("output", output, {B, Sq, E});
    const std::vector<int64_t> weights_shape = {B, H, Sq, Sk};
    if (weights) {
        check_view("weights", *weights, 4, "[batch, num_heads, query length, key length]");
        check_tensor("weights", *weights, weights_shape);
    }
    MaskKind mask_kind = MaskKind::none;
    if (mask) {
        check_mask(*mask, weights_shape);
        mask_kind = mask->convention == MaskConvention::keep ? MaskKind::keep : MaskKind::block;
    }
    // Self-attention on one tensor takes the fused QKV projection.
    const bool fused = query.data == key.data && query.data == value.data &&
                       query.shape == key.shape && query.shape == value.shape;
    const ForwardKernel *kernel =
        detail::find_forward_kernel(mask_kind, weights.has_value(), fused);
    if (kernel == nullptr) {
        throw Error("internal error: this build has no kernel for the requested variant");
    }

    DenseView<const float> q(query), k(key), v(value);
    DenseView<float> out(output);
    const int64_t P = padded_;
    const auto f32 = halide_type_of<float>();
    // Views into the packed weights: the fused [in, 3P] block, or one P-wide block of it.
    const int64_t qkv_stride = row_stride(3 * P);
    BufferView qkv_w(qkv_weight_t_.data(), f32, {E, 3 * P}, {qkv_stride, 1});
    BufferView qkv_b(qkv_bias_.data(), f32, {3 * P}, {1});
    BufferView wq(qkv_weight_t_.data(), f32, {E, P}, {qkv_stride, 1});
    BufferView wk(qkv_weight_t_.data() + P, f32, {E, P}, {qkv_stride, 1});
    BufferView wv(qkv_weight_t_.data() + 2 * P, f32, {E, P}, {qkv_stride, 1});
    BufferView bq(qkv_bias_.data(), f32, {P}, {1});
    BufferView bk(qkv_bias_.data() + P, f32, {P}, {1});
    BufferView bv(qkv_bias_.data() + 2 * P, f32, {P}, {1});
    BufferView wo(out_weight_t_.data(), f32, {E, P}, {row_stride(P), 1});
    BufferView bo(out_bias_.data(), f32, {P}, {1});
    std::optional<MaskView> mask_view;
    if (mask) {
        mask_view.emplace(*mask, weights_shape);
    }
    std::optional<DenseView<float>> weights_view;
    if (weights) {
        weights_view.emplace(*weights);
    }
    int32_t heads = static_cast<int32_t>(H);
    detail::call_kernel(*kernel, {{"query", q.raw()},
                                  {"key", k.raw()},
                                  {"value", v.raw()},
                                  {"qkv_weight_t", qkv_w.raw()},
                                  {"qkv_bias", qkv_b.raw()},
                                  {"q_weight_t", wq.raw()},
                                  {"k_weight_t", wk.raw()},
                                  {"v_weight_t", wv.raw()},
                                  {"out_weight_t", wo.raw()},
                                  {"q_bias", bq.raw()},
                                  {"k_bias", bk.raw()},
                                  {"v_bias", bv.raw()},
                                  {"out_bias", bo.raw()},
                                  {"num_heads", &heads},
                                  {"mask", mask_view ? mask_view->raw() : nullptr},
                                  {"weights", weights_view ? weights_view->raw() : nullptr},
                                  {"output", out.raw()}});
}

std::string dispatched_isa() { return detail::dispatched_isa(); }

}  // namespace mha
