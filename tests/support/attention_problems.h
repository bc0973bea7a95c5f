// Random problems of the attention core (reference::AttentionProblem) and their run through
// mha::attention, in a chosen layout and element type.
#pragma once

#include <cstdint>
#include <vector>

#include "attention.h"
#include "mha/mha.h"

namespace mha::problems {

using reference::AttentionProblem;

struct AttentionShape {
    int64_t batch, heads, kv_heads, query_len, key_len, head_dim, value_dim;
};

// Uniform(-1, 1) queries, keys and values.
AttentionProblem random_attention_problem(const AttentionShape &shape, uint64_t seed);
// A random mask of `shape` (broadcasting to [B, H, Sq, Sk]): booleans, about a third of them
// leaving their key out (key 0 never, so that a row keeps a key unless `fully_masked_rows`), in
// `convention`; or finite floats in [-3, 1].
void add_random_attention_mask(AttentionProblem &p, bool is_bool, std::vector<int64_t> shape,
                               uint64_t seed, MaskConvention convention = MaskConvention::keep);

// How the library sees the tensors: [B, H, S, d] dense, or [B, S, H, d] memory seen as
// [B, H, S, d] through strides (what transformers' attention layers hold).
// [B, H, S, d] (heads_outer), [B, S, H, d] (heads_inner), or heads_outer with every other element
// a feature (features_strided: rows the runtime must copy, not read in place).
enum class Layout { heads_outer, heads_inner, features_strided };

struct AttentionOutputs {
    std::vector<float> output;  // dense [B, H, Sq, dv]
    std::vector<float> lse;     // [B, H, Sq]
};
// mha::attention on `p`'s tensors, of `dtype` (16-bit inputs are p's rounded to it, the output
// widened back), laid out as `layout`; every option of p.
AttentionOutputs run_attention(const AttentionProblem &p, Layout layout, DType dtype = DType::f32);

// p's options for mha::attention, its mask viewed from `p` itself.
AttentionOptions attention_options(const AttentionProblem &p);

}  // namespace mha::problems
