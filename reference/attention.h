// A naive double-precision reference of the attention core as F.scaled_dot_product_attention
// (and FlashAttention for windows, soft-capping and ALiBi) define it, written plainly for
// reading: pure functions of row-major vectors.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "mha/types.h"

namespace mha::reference {

struct AttentionProblem {
    int64_t batch = 1, heads = 1, kv_heads = 1, query_len = 1, key_len = 1, head_dim = 1,
            value_dim = 1;
    // Dense [B, H, Sq, d], [B, Hkv, Sk, d], [B, Hkv, Sk, dv]; query head h reads key/value head
    // h / (H / Hkv).
    std::vector<float> query, key, value;
    std::optional<double> scale;  // 1 / sqrt(d) unless given
    // A mask broadcast against [B, H, Sq, Sk], right-aligned (empty shape: none): booleans in
    // `convention` (keep: nonzero takes part) or floats, added.
    std::vector<int64_t> mask_shape;
    bool mask_is_bool = true;
    MaskConvention convention = MaskConvention::keep;
    std::vector<uint8_t> bools;
    std::vector<float> floats;
    Causal causal = Causal::none;
    int64_t window_left = -1, window_right = -1;  // -1: unbounded
    double softcap = 0;                           // 0: none
    std::vector<float> alibi_slopes;              // [H], or empty: none
};

struct AttentionResult {
    std::vector<double> output;  // [B, H, Sq, dv]
    std::vector<double> lse;     // [B, H, Sq]: -inf for a row no key weighs
};

// Query i sees key j when j is inside its window about the diagonal i + Sk - Sq (i with
// top-left causality): j <= the diagonal with a causal order, within window_left before it and
// window_right after it.
bool sees(const AttentionProblem &p, int64_t i, int64_t j);

AttentionResult attention(const AttentionProblem &p);

}  // namespace mha::reference
