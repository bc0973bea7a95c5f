// The module's weights, prepacked once for the kernels: Wᵀ in panels of kWeightPanel output
// features (each panel contiguous over all input features, which a GEMM streams in order),
// zero-padded to padded_features(E, H) per projection, with q, k and v side by side for the
// fused QKV projection. On a GPU, each view holds its device copy.
#pragma once

#include <memory>
#include <vector>

#include "buffers.h"
#include "kernel_table.h"

namespace mha::detail {

struct PackedWeights {
    PackedWeights(int64_t embed_dim, int64_t num_heads, const Linear *linears[4], Device device);
    ~PackedWeights();
    PackedWeights(const PackedWeights &) = delete;
    PackedWeights &operator=(const PackedWeights &) = delete;

    int64_t embed_dim, padded;
    Device device;
    std::vector<float> qkv_panels, qkv_bias, out_panels, out_bias;
    // The kernels' arguments, by name (qkv_weight, qkv_bias, q_weight, ..., out_bias).
    struct Named {
        const char *name;
        std::unique_ptr<BufferView> view;
    };
    std::vector<Named> views;
};

}  // namespace mha::detail
