#include "masks.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <optional>
#include <type_traits>

#include "checks.h"

namespace mha::detail {
namespace {

using contract::MaskKind;
using Strides = std::array<int64_t, 4>;

const char *const kDimNames[] = {"batch", "num_heads", "query length", "key length"};

}  // namespace

Strides broadcast_strides(const char *name, const std::vector<int64_t> &shape,
                          const std::vector<int64_t> &strides, const std::array<int64_t, 4> &full) {
    const size_t rank = shape.size();
    if (rank < 1 || rank > 4) {
        throw Error(fmt::format(
            "{} has shape {} but must have 1 to 4 dimensions that broadcast against [B, H, Sq, "
            "Sk] = {} (right-aligned, each 1 or the full extent)",
            name, shape_string(shape), shape_string(full)));
    }
    if (!strides.empty() && strides.size() != rank) {
        throw Error(
            fmt::format("{} has {} strides for its {} dimensions", name, strides.size(), rank));
    }
    Strides out{};
    int64_t stride = 1;
    for (size_t d = rank; d-- > 0;) {
        const size_t at = 4 - rank + d;  // the dimension of [B, H, Sq, Sk] it broadcasts to
        if (shape[d] < 1) {
            throw Error(fmt::format("{} has shape {}: dimension {} is {}, must be >= 1", name,
                                    shape_string(shape), d, shape[d]));
        }
        if (shape[d] != 1 && shape[d] != full[at]) {
            throw Error(fmt::format(
                "{} has shape {} which does not broadcast to [B, H, Sq, Sk] = {}: dimension {} "
                "is {}, but {} is {}",
                name, shape_string(shape), shape_string(full), d, shape[d], kDimNames[at],
                full[at]));
        }
        const int64_t given = strides.empty() ? stride : strides[d];
        if (given < 0) {
            throw Error(fmt::format("{} has stride {} in dimension {}: strides must be >= 0", name,
                                    given, d));
        }
        out[at] = shape[d] == 1 ? 0 : given;
        stride *= shape[d];
    }
    return out;
}

namespace {

template <typename T>
Strides seed_mask_strides(const char *name, const TensorView<T> &t,
                          const std::array<int64_t, 4> &full) {
    check_data(name, t);
    return broadcast_strides(name, t.shape, {}, full);
}

// PyTorch's two masks.
enum class TorchArgument { key_padding_mask, attn_mask };

// key_padding_mask [B, Sk], or attn_mask [Sq, Sk] or [B·H, Sq, Sk].
TorchMask torch_mask(TorchArgument which, const MaskTensor &mask,
                     const std::array<int64_t, 4> &full) {
    const int64_t B = full[0], H = full[1], Sq = full[2], Sk = full[3];
    const bool key_padding = which == TorchArgument::key_padding_mask;
    const char *name = key_padding ? "key_padding_mask" : "attn_mask";
    return std::visit(
        [&](const auto &t) {
            TorchMask m{std::is_same_v<std::decay_t<decltype(t)>, BoolTensor>,
                        t.data,
                        t.device_handle,
                        {},
                        false};
            const auto &shape = t.shape;
            if (key_padding) {
                check_view(name, t, 2, "[batch, key length]");
                check_tensor(name, t, std::array{B, Sk});
                m.strides = {Sk, 0, 0, 1};
            } else if (shape.size() == 3) {
                check_view(name, t, 3, "[batch x num_heads, query length, key length]");
                check_tensor(name, t, std::array{B * H, Sq, Sk});
                m.strides = {H * Sq * Sk, Sq * Sk, Sk, 1};
                m.per_head = true;
            } else {
                check_view(name, t, 2, "[query length, key length] (or 3: [B x H, Sq, Sk])");
                check_tensor(name, t, std::array{Sq, Sk});
                m.strides = {0, 0, Sk, 1};
            }
            return m;
        },
        mask);
}

Combination combination(const ForwardOptions &o, const std::array<int64_t, 4> &full) {
    Combination c{torch_mask(TorchArgument::key_padding_mask, *o.key_padding_mask, full),
                  torch_mask(TorchArgument::attn_mask, *o.attn_mask, full), 1};
    c.heads = c.attn.per_head ? full[1] : 1;
    return c;
}

}  // namespace

KernelMask resolve_masks(const ForwardOptions &o, const std::array<int64_t, 4> &full) {
    const int seed_masks = int(o.mask.has_value()) + int(o.additive_mask.has_value());
    const bool torch_masks = o.key_padding_mask || o.attn_mask;
    if (seed_masks > 1 || (seed_masks == 1 && torch_masks)) {
        throw Error(
            "a call takes one mask family: mask or additive_mask (the seeds'), or "
            "key_padding_mask and attn_mask (PyTorch's)");
    }
    KernelMask k;
    if (o.mask) {
        check_convention("mask", o.mask->convention);
        k.kind = MaskKind::bytes;
        k.strides = seed_mask_strides("mask", o.mask->values, full);
        k.data = o.mask->values.data;
        k.device_handle = o.mask->values.device_handle;
        k.blocks_nonzero = o.mask->convention == MaskConvention::block;
    } else if (o.additive_mask) {
        k.kind = MaskKind::additive;
        k.strides = seed_mask_strides("additive_mask", *o.additive_mask, full);
        k.data = o.additive_mask->data;
        k.device_handle = o.additive_mask->device_handle;
    } else if (o.key_padding_mask && o.attn_mask) {
        const Combination c = combination(o, full);
        if (c.key_padding.device_handle != 0 || c.attn.device_handle != 0) {
            throw Error(
                "key_padding_mask and attn_mask together are combined on the host: pass them as "
                "host tensors");
        }
        check_kernel_buffer({full[0], c.heads, full[2], full[3]}, sizeof(float), [&] {
            return fmt::format("key_padding_mask and attn_mask combined, [B, {}, Sq, Sk],",
                               c.heads == 1 ? "1" : "H");
        });
        k.kind = c.bytes() ? MaskKind::bytes : MaskKind::additive;
        k.blocks_nonzero = 1;
        const int64_t plane = full[2] * full[3];
        k.strides = {c.heads * plane, c.heads == 1 ? 0 : plane, full[3], 1};
        k.combination = c;
    } else if (torch_masks) {
        const TorchMask m =
            o.key_padding_mask
                ? torch_mask(TorchArgument::key_padding_mask, *o.key_padding_mask, full)
                : torch_mask(TorchArgument::attn_mask, *o.attn_mask, full);
        k.kind = m.is_bool ? MaskKind::bytes : MaskKind::additive;
        k.blocks_nonzero = 1;
        k.strides = m.strides;
        k.data = m.data;
        k.device_handle = m.device_handle;
    }
    return k;
}

KernelMask attention_mask(const AttentionMask &mask, const std::array<int64_t, 4> &full) {
    check_convention("mask", mask.convention);
    return std::visit(
        [&](const auto &t) {
            KernelMask k;
            const bool bytes =
                std::is_same_v<std::decay_t<decltype(t)>, StridedView<const uint8_t>>;
            k.kind = bytes ? MaskKind::bytes : MaskKind::additive;
            k.blocks_nonzero = mask.convention == MaskConvention::block;
            if (t.data == nullptr) {
                throw Error("mask has a null data pointer");
            }
            k.data = t.data;
            k.strides = broadcast_strides("mask", t.shape, t.strides, full);
            return k;
        },
        mask.values);
}

HostBuffer kernel_mask_buffer(const KernelMask &mask, const std::array<int64_t, 4> &full,
                              std::vector<uint8_t> &combined_bytes,
                              std::vector<float> &combined_floats) {
    const bool bytes = mask.kind == MaskKind::bytes;
    const void *data = mask.data;
    if (mask.combination) {
        const Combination &c = *mask.combination;
        const auto offset = [](const Strides &s, int64_t b, int64_t h, int64_t i, int64_t j) {
            return b * s[0] + h * s[1] + i * s[2] + j * s[3];
        };
        const int64_t n = c.elements(full);
        if (bytes) {
            combined_bytes.resize(n);
        } else {
            combined_floats.resize(n);
        }
        int64_t out = 0;
        for (int64_t b = 0; b < full[0]; b++) {
            for (int64_t h = 0; h < c.heads; h++) {
                for (int64_t i = 0; i < full[2]; i++) {
                    for (int64_t j = 0; j < full[3]; j++, out++) {
                        const int64_t kp = offset(c.key_padding.strides, b, h, i, j);
                        const int64_t am = offset(c.attn.strides, b, h, i, j);
                        if (bytes) {
                            combined_bytes[out] = c.key_padding.blocks(kp) || c.attn.blocks(am);
                        } else {
                            combined_floats[out] = c.key_padding.additive(kp) + c.attn.additive(am);
                        }
                    }
                }
            }
        }
        data = bytes ? static_cast<const void *>(combined_bytes.data()) : combined_floats.data();
    }
    return view_buffer(data, bytes ? halide_type_of<uint8_t>() : halide_type_of<float>(), 4,
                       full.data(), mask.strides.data());
}

}  // namespace mha::detail
