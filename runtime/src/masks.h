// The masks of a forward call (ForwardOptions), checked and reduced to the one mask a kernel
// reads: a byte or float view broadcast to [B, H, Sq, Sk] by its strides, or, when PyTorch's
// key_padding_mask and attn_mask come together, their combination made by the runtime.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "buffers.h"
#include "mha/mha.h"
#include "mha_contract.h"

namespace mha::detail {

// One of PyTorch's masks, checked, as a view of [B, H, Sq, Sk] (strides outermost first).
struct TorchMask {
    bool is_bool;
    const void *data;
    uint64_t device_handle;
    std::array<int64_t, kMaxRank> strides;
    bool per_head;

    // Element at `offset` as an additive float: a True boolean is -inf, as PyTorch converts it.
    float additive(int64_t offset) const {
        if (is_bool) {
            return static_cast<const uint8_t *>(data)[offset] != 0
                       ? -std::numeric_limits<float>::infinity()
                       : 0.0f;
        }
        return static_cast<const float *>(data)[offset];
    }
    bool blocks(int64_t offset) const { return static_cast<const uint8_t *>(data)[offset] != 0; }
};

// key_padding_mask and attn_mask together, as one [B, 1 or H, Sq, Sk] tensor.
struct Combination {
    TorchMask key_padding, attn;
    int64_t heads;  // 1 or H

    int64_t elements(const std::array<int64_t, 4> &full) const {
        return full[0] * heads * full[2] * full[3];
    }
    bool bytes() const { return key_padding.is_bool && attn.is_bool; }
};

struct KernelMask {
    contract::MaskKind kind = contract::MaskKind::none;
    int32_t blocks_nonzero = 0;  // the byte mask's convention: 1 = nonzero blocks
    // The view the kernel reads, [B, H, Sq, Sk] by strides (0 = broadcast)...
    const void *data = nullptr;
    uint64_t device_handle = 0;
    std::array<int64_t, kMaxRank> strides{};
    // ...unless two of PyTorch's masks combine: then the runtime writes them into one tensor.
    std::optional<Combination> combination;
};

// The strides, in elements, of a mask of `shape` (and `strides`; empty: row-major) broadcast
// against [B, H, Sq, Sk] = `full` as torch broadcasts (right-aligned, each dimension 1 or the
// full extent): 0 where it broadcasts. Throws mha::Error naming `name`.
std::array<int64_t, 4> broadcast_strides(const char *name, const std::vector<int64_t> &shape,
                                         const std::vector<int64_t> &strides,
                                         const std::array<int64_t, 4> &full);

// What the kernel reads of an attention call's mask.
KernelMask attention_mask(const AttentionMask &mask, const std::array<int64_t, 4> &full);

// Checks `options`' masks against [B, H, Sq, Sk] = `full` and says what the kernel reads. Throws
// mha::Error naming a bad mask, or masks that must not come together.
KernelMask resolve_masks(const ForwardOptions &options, const std::array<int64_t, 4> &full);

// The buffer a kernel reads for `mask`, the combination written into `combined_bytes` or
// `combined_floats` when there is one.
HostBuffer kernel_mask_buffer(const KernelMask &mask, const std::array<int64_t, 4> &full,
                              std::vector<uint8_t> &combined_bytes,
                              std::vector<float> &combined_floats);

}  // namespace mha::detail
