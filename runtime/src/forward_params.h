// A forward call's arguments, checked and reduced to what chooses and feeds its kernels, in the
// manner of ONNX Runtime's CheckInputs: check_forward() reads no tensor and allocates nothing
// unless it throws mha::Error naming the argument.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

#include "masks.h"
#include "mha/mha.h"
#include "packed_weights.h"

namespace mha::detail {

struct ForwardParams {
    int64_t batch, query_len, key_len, heads, head_dim, kv_heads;  // B, Sq, Sk, H, d, Hkv
    KernelMask mask;        // the one mask the kernel reads (masks.h)
    Causal causal;          // none, or the alignment of...
    int32_t causal_offset;  // ...query i seeing keys j <= i + causal_offset
    bool self_attention;    // query, key and value one tensor on stacked weights: fused QKV
    bool returns_weights;   // per head, or with average_weights their mean over heads
    bool average_weights;
    DType kernel_dtype;  // what the kernels read: f32, or the matrix engine's or a GPU's 16 bits
    Device device;

    std::array<int64_t, 4> weights_shape() const { return {batch, heads, query_len, key_len}; }
    // What CPU kernels are bucketed by: the token rows of the largest projection.
    int64_t token_rows() const { return batch * std::max(query_len, key_len); }
};

// Checks a forward call of the module whose weights are `packed`, with `num_heads` heads, on
// `device`, for kernels reading `kernel_dtype`. The tensors' data are not read (16-bit tensors
// come as views of their memory).
ForwardParams check_forward(const PackedWeights &packed, int64_t num_heads, Device device,
                            const Tensor &query, const Tensor &key, const Tensor &value,
                            const ForwardOptions &options, DType kernel_dtype);

}  // namespace mha::detail
