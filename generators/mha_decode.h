// A decode step composed from the stages of mha_stages.h: the new tokens of each batch row
// attend over that row's KV cache, into which the runtime has already written their keys and
// values, causally within the new block; then the output projection.
//
// Row b holds cached_lengths(b) tokens from earlier steps and adds new_counts(b) <= n this step;
// new token i sits at position cached_lengths(b) + i and sees keys 0..that position. Keys it
// does not see (later tokens of the step; past the row's length, as the cache is read up to the
// longest row) get the lowest float, so they weigh exactly 0; keys the key-padding mask hides get
// the seeds' -1e9. The outputs are those of a causal forward pass over the whole sequence
// (Causal::top_left, the mask applying among the keys a query sees), however the sequence was
// split into steps. Outputs of padding tokens (i >= new_counts(b)) are 0.
#pragma once

#include "mha_forward.h"

namespace mha {

struct DecodeInputs {
    Halide::Func new_qkv;                     // (f, i, b): the new tokens' fused QKV projections
    Halide::Func key_cache;                   // (j, c, kv head, b), in f32
    Halide::Func value_cache;                 // (c, j, kv head, b), in f32
    Halide::Expr kv_heads;                    // dividing the query heads
    Halide::Func cached_lengths, new_counts;  // (b)
    Halide::Func cache_mask;                  // (j, b), or undefined
    Halide::Expr mask_blocks_nonzero;         // the cache mask's convention
    Halide::Func out_weight_t, out_bias;
    Halide::Expr embed_dim, head_dim, new_tokens, num_keys, batch;
};

struct DecodeStages {
    StageVars v;
    Halide::Expr head_dim, new_tokens, num_keys;
    Halide::Func q_heads, k_heads, v_heads;  // views of the projection and of the cache
    ScaledScores scores;
    MaskedSoftmax softmax;
    AttendValues context;
    Halide::Func merged;
    Projection out_proj;
    Halide::Func output;  // (e, i, b), zero for padding tokens
};

inline DecodeStages define_decode(const DecodeInputs &in) {
    using namespace Halide;
    DecodeStages f;
    const StageVars &v = f.v;
    f.head_dim = in.head_dim;
    f.new_tokens = in.new_tokens;
    f.num_keys = in.num_keys;
    f.q_heads(v.c, v.i, v.h, v.b) = in.new_qkv(v.h * in.head_dim + v.c, v.i, v.b);
    // Query head h reads cached key/value head h / group (grouped-query attention).
    const Expr kv_head = kv_head_of(v, in.embed_dim / in.head_dim / in.kv_heads);
    f.k_heads(v.c, v.s, v.h, v.b) = in.key_cache(v.s, v.c, kv_head, v.b);
    f.v_heads(v.c, v.s, v.h, v.b) = in.value_cache(v.c, v.s, kv_head, v.b);
    f.scores = scaled_scores(v, f.q_heads, f.k_heads, in.head_dim);

    // New token i sees the keys up to its own position; later ones (the step's later tokens,
    // and keys past the row's length) weigh exactly 0, whatever the mask hides.
    const Expr cached = in.cached_lengths(v.b);
    const Expr visible = v.j <= cached + v.i && v.j < cached + in.new_counts(v.b);
    Func scores("visible_scores");
    scores(v.j, v.i, v.h, v.b) =
        select(visible, f.scores.result(v.j, v.i, v.h, v.b), Float(32).min());
    ScoreMasks masks;
    if (in.cache_mask.defined()) {
        const Expr hidden = (in.cache_mask(v.j, v.b) != 0) == (in.mask_blocks_nonzero != 0);
        Func blocked("blocked");
        blocked(v.j, v.i, v.h, v.b) = cast<uint8_t>(visible && hidden);
        masks.blocking = blocked;
        masks.blocks_nonzero = 1;
    }
    f.softmax = masked_softmax(v, {scores, scores, scores}, masks, in.num_keys);
    f.context = attend_values(v, f.softmax.weights, f.v_heads, in.num_keys);
    f.merged = merge_heads(v, f.context.result, in.head_dim);
    f.out_proj =
        linear_projection(v, token_rows(v, f.merged, in.new_tokens, in.batch, "merged_rows"),
                          in.out_weight_t, in.out_bias, in.embed_dim, "out_proj");
    f.output = Func("decode_output");
    f.output(v.e, v.s, v.b) =
        select(v.s < in.new_counts(v.b), f.out_proj.result(v.e, v.s + v.b * in.new_tokens), 0.0f);
    return f;
}

}  // namespace mha
