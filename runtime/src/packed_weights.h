// The module's weights, prepacked once for the kernels: Wᵀ in panels of contract::kWeightPanel
// output features (each panel contiguous over all input features, which a GEMM streams in
// order), zero-padded to contract::padded_features per projection, q, k and v one after
// the other: stacked for the fused QKV projection when all three take E input features (k and
// v take kdim and vdim). On a GPU, each buffer holds its device copy.
#pragma once

#include <array>
#include <optional>
#include <vector>

#include "buffers.h"
#include "kernel_table.h"

namespace mha::detail {

struct PackedWeights {
    // Uploads to `gpu` when given.
    PackedWeights(int64_t embed_dim, int64_t num_heads, const Linear *linears[4],
                  const KernelComponent *gpu);

    // Whether the fused QKV kernels can run: q, k and v all take embed_dim input features.
    bool stacked() const { return in_features[1] == embed_dim && in_features[2] == embed_dim; }

    int64_t embed_dim;
    int64_t padded, padded_kv;            // output features of Wq, Wo and of Wk, Wv, padded
    std::array<int64_t, 4> in_features;   // of q, k, v, out
    std::array<int64_t, 4> out_features;  // E, kv_heads · d, kv_heads · d, E
    std::vector<float> qkv_panels, qkv_bias, out_panels, out_bias;
    // The kernels' weight arguments (q_weight, ..., qkv_weight, qkv_bias, out_bias), by id;
    // empty for the other arguments.
    std::array<std::optional<HostBuffer>, contract::kArgCount> buffers;
};

}  // namespace mha::detail
