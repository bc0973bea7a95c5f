#include "masks.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <optional>

#include "checks.h"

namespace mha::detail {
namespace {

using contract::MaskKind;
using Strides = std::array<int64_t, 4>;

const char *const kDimNames[] = {"batch", "num_heads", "query length", "key length"};

// A seed mask: four dimensions, each 1 (broadcast, stride 0) or the full extent.
template <typename T>
Strides broadcast_strides(const char *name, const TensorView<T> &t,
                          const std::array<int64_t, 4> &full) {
    const auto &shape = t.shape;
    if (shape.size() != 4) {
        throw Error(fmt::format(
            "{} has shape {} but must have 4 dimensions, each 1 or the extent of [B, H, Sq, Sk] = "
            "{}; PyTorch's [B, Sk] key padding goes in key_padding_mask, an [Sq, Sk] mask in "
            "attn_mask",
            name, shape_string(shape), shape_string(full)));
    }
    check_view(name, t, 4, "[B or 1, H or 1, Sq or 1, Sk or 1]");
    Strides strides{};
    int64_t stride = 1;
    for (size_t d = 4; d-- > 0;) {
        if (shape[d] != 1 && shape[d] != full[d]) {
            throw Error(fmt::format(
                "{} has shape {} which does not broadcast to [B, H, Sq, Sk] = {}: dimension {} "
                "is {}, but {} is {}",
                name, shape_string(shape), shape_string(full), d, shape[d], kDimNames[d], full[d]));
        }
        strides[d] = shape[d] == 1 ? 0 : stride;
        stride *= shape[d];
    }
    return strides;
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
        k.strides = broadcast_strides("mask", o.mask->values, full);
        k.data = o.mask->values.data;
        k.device_handle = o.mask->values.device_handle;
        k.blocks_nonzero = o.mask->convention == MaskConvention::block;
    } else if (o.additive_mask) {
        k.kind = MaskKind::additive;
        k.strides = broadcast_strides("additive_mask", *o.additive_mask, full);
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
