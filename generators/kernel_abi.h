// The contract between the generated kernels and the runtime that calls them, in plain C++ so
// that both sides include it.
#pragma once

#include <cstdint>

namespace mha {

// Widest tile, in features, that a schedule may round a projection or a head up to.
inline constexpr int kMaxTile = 64;

// Output features each prepacked projection weight Wᵀ (and bias) is padded to with zeros, so a
// schedule may compute whole tiles past E (see mha_forward.h).
inline constexpr int64_t padded_features(int64_t embed_dim) {
    return (embed_dim + kMaxTile - 1) / kMaxTile * kMaxTile + kMaxTile;
}

}  // namespace mha
