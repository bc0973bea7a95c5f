// The contract between the generated kernels and the runtime that calls them, in plain C++ so
// that both sides include it.
#pragma once

#include <cstdint>

namespace mha {

// Widest tile, in features, that a schedule may round a head or a projection up to; tiles over
// features must divide it.
inline constexpr int kMaxTile = 64;

// Prepacked weights are Wᵀ in panels of this many output features: panel p holds features
// [p·kWeightPanel, (p+1)·kWeightPanel) for every input feature, contiguously.
inline constexpr int kWeightPanel = 32;

inline constexpr int64_t round_up(int64_t x, int64_t multiple) {
    return (x + multiple - 1) / multiple * multiple;
}

// Output features each prepacked projection weight Wᵀ (and bias) is padded to with zeros, so a
// schedule may compute whole tiles past E (see mha_forward.h): far enough for the last head
// rounded up to a whole tile, itself rounded up to a whole tile.
inline constexpr int64_t padded_features(int64_t embed_dim, int64_t num_heads) {
    const int64_t head_dim = embed_dim / num_heads;
    return round_up(embed_dim - head_dim + round_up(head_dim, kMaxTile), kMaxTile);
}

// CPU kernels are built (and tuned) per shape bucket of the token rows of the largest projection,
// B·max(Sq, Sk) (a single query against a long context is a large GEMM); GPU kernels serve any.
// Keep in step with MHA_SHAPE_BUCKETS in cmake/TunedSchedules.cmake.
enum class ShapeBucket { small, medium, large, any };
inline constexpr int64_t kSmallBucketRows = 64, kMediumBucketRows = 1024;
inline constexpr ShapeBucket shape_bucket(int64_t token_rows) {
    return token_rows <= kSmallBucketRows    ? ShapeBucket::small
           : token_rows <= kMediumBucketRows ? ShapeBucket::medium
                                             : ShapeBucket::large;
}

}  // namespace mha
