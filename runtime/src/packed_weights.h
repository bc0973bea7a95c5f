// The module's weights, prepacked once for the kernels: Wᵀ in panels of contract::kWeightPanel
// output features (each panel contiguous over all input features, which a GEMM streams in
// order), zero-padded to contract::padded_features per projection, q, k and v one after
// the other: stacked for the fused QKV projection when all three take E input features (k and
// v take kdim and vdim). On a GPU, each buffer the kernels read holds its device copy.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

#include "buffers.h"
#include "kernel_table.h"

namespace mha::detail {

struct PackedWeights {
    // Uploads to `gpu` when given. A module whose forward kernels read 16-bit weights
    // (`kernel_dtype`) packs them too: as bf16 tiles (contract::kBf16TileDepth) for the CPU's
    // matrix engine; on a GPU as the panels' 16-bit bits, which the device then holds instead of
    // the f32 panels. On the CPU, the fused QKV and output panels are also packed in
    // `step_dtype`, which decode steps stream.
    PackedWeights(int64_t embed_dim, int64_t num_heads, const Linear *linears[4],
                  const KernelComponent *gpu, DType kernel_dtype = DType::f32,
                  DType step_dtype = DType::f32);

    // Whether the fused QKV kernels can run: q, k and v all take embed_dim input features.
    bool stacked() const { return in_features[1] == embed_dim && in_features[2] == embed_dim; }

    // What a forward kernel of the module's kernel_dtype (the others: an f32 one) reads for
    // argument `id`; empty for arguments that are not weights.
    const std::optional<HostBuffer> &kernel_buffer(contract::ArgId id, DType dtype) const {
        const std::optional<HostBuffer> &narrow = narrow_buffers[size_t(id)];
        return dtype != DType::f32 && narrow ? narrow : buffers[size_t(id)];
    }

    int64_t embed_dim;
    DType kernel_dtype;
    int64_t padded, padded_kv;            // output features of Wq, Wo and of Wk, Wv, padded
    std::array<int64_t, 4> in_features;   // of q, k, v, out
    std::array<int64_t, 4> out_features;  // E, kv_heads · d, kv_heads · d, E
    std::vector<float> qkv_panels, qkv_bias, out_panels, out_bias;
    // The kernels' weight arguments (q_weight, ..., qkv_weight, qkv_bias, out_bias), by id;
    // empty for the other arguments.
    std::array<std::optional<HostBuffer>, contract::kArgCount> buffers;
    // The 16-bit projection weights: the bf16 tiles of q, k, v, out and of q, k, v stacked, or
    // the bits of qkv_panels and out_panels ({qkv, out}); their buffers by id (q_weight, ...,
    // qkv_weight, out_weight), empty for f32 kernels.
    std::deque<std::vector<uint16_t>> narrow_weights;  // growing, it moves none of them
    std::array<std::optional<HostBuffer>, contract::kArgCount> narrow_buffers;
    // What a decode step's kernels read for qkv_weight and out_weight: the panels in step_dtype
    // (16-bit ones hold the f32 panels' values, the module's weights rounded to it, in half the
    // bytes); empty on a GPU and where the QKV projections are not stacked.
    DType step_dtype;
    std::optional<HostBuffer> step_qkv_panels, step_out_panels;
};

}  // namespace mha::detail
