#include "mha/mha.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <limits>

#include "HalideRuntime.h"
#include "buffers.h"
#include "device.h"
#include "kernel_abi.h"
#include "kernel_table.h"
#include "packed_weights.h"

namespace mha {
namespace {

using detail::DenseView;
using detail::ForwardKernel;
using detail::MaskKind;
using detail::MaskView;

// Halide buffers address at most 2^31 - 1 bytes without the large_buffers feature.
constexpr int64_t kMaxBufferBytes = std::numeric_limits<int32_t>::max();

std::string shape_string(const std::vector<int64_t> &shape) {
    return fmt::format("[{}]", fmt::join(shape, ", "));
}

// A tensor needs host data or, on a GPU module, a device handle.
template <typename T>
void check_data(const char *name, const TensorView<T> &t) {
    if (t.data == nullptr && t.device_handle == 0) {
        throw Error(fmt::format("{} has a null data pointer", name));
    }
}

template <typename T>
void check_tensor(const char *name, const TensorView<T> &t, const std::vector<int64_t> &expected) {
    if (t.shape != expected) {
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
    check_data("mask", mask.values);
}

const char *const kProjectionNames[4] = {"q_proj", "k_proj", "v_proj", "out_proj"};

}  // namespace

MultiHeadAttention::MultiHeadAttention(int64_t embed_dim, int64_t num_heads, const Linear &q_proj,
                                       const Linear &k_proj, const Linear &v_proj,
                                       const Linear &out_proj, Device device)
    : embed_dim_(embed_dim), num_heads_(num_heads), device_(device) {
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
    const int64_t E = embed_dim;
    if (3 * padded_features(E, num_heads) * E >
        kMaxBufferBytes / static_cast<int64_t>(sizeof(float))) {
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
    packed_ = std::make_shared<const detail::PackedWeights>(E, num_heads, linears, device);
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
    if (device_ == Device::cpu) {
        for (const auto &[name, handle] :
             {std::pair{"query", query.device_handle}, {"key", key.device_handle},
              {"value", value.device_handle}, {"output", output.device_handle},
              {"weights", weights ? weights->device_handle : 0},
              {"mask", mask ? mask->values.device_handle : 0}}) {
            if (handle != 0) {
                throw Error(fmt::format("{} has a device_handle but the module runs on the cpu",
                                        name));
            }
        }
    }
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
                       query.device_handle == key.device_handle &&
                       query.device_handle == value.device_handle && query.shape == key.shape &&
                       query.shape == value.shape;
    const ForwardKernel *kernel = detail::find_forward_kernel(
        device_, B * std::max(Sq, Sk), mask_kind, weights.has_value(), fused);
    if (kernel == nullptr) {
        throw Error(fmt::format("this build has no {} kernels (see MHA_GPU_KERNELS)",
                                detail::device_name(device_)));
    }

    DenseView<const float> q(query), k(key), v(value);
    DenseView<float> out(output);
    std::optional<MaskView> mask_view;
    if (mask) {
        mask_view.emplace(*mask, weights_shape);
    }
    std::optional<DenseView<float>> weights_view;
    if (weights) {
        weights_view.emplace(*weights);
    }
    detail::CallContext context;
    std::optional<detail::DeviceCall> on_device;
    if (device_ != Device::cpu) {
        on_device.emplace(device_, context);
        on_device->input(q.raw(), query.device_handle);
        if (!fused) {
            on_device->input(k.raw(), key.device_handle);
            on_device->input(v.raw(), value.device_handle);
        }
        if (mask_view) {
            on_device->input(mask_view->raw(), mask->values.device_handle);
        }
        on_device->output(out.raw(), output.device_handle);
        if (weights_view) {
            on_device->output(weights_view->raw(), weights->device_handle);
        }
    }
    int32_t head_dim = static_cast<int32_t>(E / H);
    std::vector<detail::NamedArgument> named = {
        {"query", q.raw()},
        {"key", k.raw()},
        {"value", v.raw()},
        {"head_dim", &head_dim},
        {"mask", mask_view ? mask_view->raw() : nullptr},
        {"weights", weights_view ? weights_view->raw() : nullptr},
        {"output", out.raw()}};
    for (const auto &w : packed_->views) {
        named.push_back({w.name, w.view->raw()});
    }
    detail::call_kernel(*kernel, context, named);
    if (on_device) {
        on_device->finish();
    }
}

std::string dispatched_isa() { return detail::dispatched_isa(); }

}  // namespace mha
