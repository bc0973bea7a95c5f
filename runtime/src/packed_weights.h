// The module's weights, prepacked once for the kernels: Wᵀ in panels of contract::kWeightPanel
// output features (each panel contiguous over all input features, which a GEMM streams in
// order), zero-padded to contract::padded_features per projection, q, k and v one after
// the other: stacked for the fused QKV projection when all three take E input features (k and
// v take kdim and vdim). On a GPU, each buffer holds its device copy.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "buffers.h"
#include "kernel_table.h"

namespace mha::detail {

struct PackedWeights {
    // Uploads to `gpu` when given. With `with_bf16_tiles` (a bf16 module whose forward kernels
    // run on the matrix engine), also packs the projection weights as bf16 tiles
    // (contract::kBf16TileDepth) into tile_buffers; the f32 panels then serve its decode steps.
    PackedWeights(int64_t embed_dim, int64_t num_heads, const Linear *linears[4],
                  const KernelComponent *gpu, bool with_bf16_tiles = false);

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
    // The bf16 tiles of q, k, v and out, and of q, k, v stacked; their buffers by id
    // (q_weight, ..., qkv_weight, out_weight), empty without tiles.
    std::array<std::vector<uint16_t>, 4> projection_tiles;
    std::vector<uint16_t> qkv_tiles;
    std::array<std::optional<HostBuffer>, contract::kArgCount> tile_buffers;
    bool has_bf16_tiles() const {
        return tile_buffers[size_t(contract::ArgId::out_weight)].has_value();
    }
};

}  // namespace mha::detail
