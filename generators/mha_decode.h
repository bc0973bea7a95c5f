// A decode step composed from the stages of mha_stages.h: the new tokens of each batch row
// attend over that row's KV cache through the attention core (mha_attention.h), into which the
// runtime has already written their keys and values, causally within the new block; then the
// output projection.
//
// Row b holds cached_lengths(b) tokens from earlier steps and adds new_counts(b) <= n this step;
// new token i sits at position cached_lengths(b) + i and sees keys 0..that position (keys of the
// step's later tokens and past the row's length, as the cache is read up to the longest row,
// weigh exactly 0); keys the key-padding mask hides get the seeds' -1e9. The outputs are those
// of a causal forward pass over the whole sequence (Causal::top_left, the mask applying among
// the keys a query sees), however the sequence was split into steps. Outputs of padding tokens
// (i >= new_counts(b)) are 0.
//
// The core's rows are the new tokens' query heads that read one key/value head (token-major:
// row i·group + g is token i's head kv·group + g), so that each key and value read serves them
// all; its heads are tasks (split, key/value head): split s of a row takes the keys
// [s·split_keys, (s + 1)·split_keys), so that a batch of few rows and key/value heads still
// gives every thread work over a long cache. The splits' contexts are merged by their rows'
// log-sum-exp: weighed by exp(lse_s - max lse), which is exact with one split.
#pragma once

#include "mha_attention.h"

namespace mha {

// The rows of the core's tiles (DecodeStages::core), in which every row's keys lie in the
// visible blocks of the tile's last row.
inline constexpr int kDecodeRowTile = 4;

struct DecodeInputs {
    Halide::Func new_qkv;                     // (f, i, b): the new tokens' fused QKV projections
    Halide::Func key_cache;                   // (jj, c, key tile, kv head, b), in f32
    Halide::Func value_cache;                 // (c, j, kv head, b), in f32
    Halide::Func key_scales, value_scales;    // (j, kv head, b): an int8 cache's, or undefined
    Halide::Expr kv_heads;                    // dividing the query heads
    Halide::Func cached_lengths, new_counts;  // (b)
    Halide::Expr split_keys;                  // a multiple of key_block
    int key_block = 1;                        // of the core's reductions
    Halide::Func cache_mask;                  // (j, b), or undefined
    Halide::Expr mask_blocks_nonzero;         // the cache mask's convention
    Halide::Func out_weight_t, out_bias;
    Halide::Expr embed_dim, head_dim, new_tokens, num_keys, batch;
};

struct DecodeStages {
    StageVars v;
    Halide::Expr head_dim, rows, kv_heads, splits;
    CoreStages core;                   // (c, row, split x kv_heads + kv head, b)
    Halide::Func split_results;        // {context, lse} of the core, one loop nest
    Halide::Func lse_max, weight_sum;  // (row, kv head, b) over the splits
    Halide::Func weighted_contexts;    // (c, row, kv head, b): their sum weighed by exp(lse)
    Halide::Func context;              // ... divided by the weights' sum
    Projection out_proj;
    Halide::Func output;  // (e, i, b), zero for padding tokens
};

inline DecodeStages define_decode(const DecodeInputs &in) {
    using namespace Halide;
    DecodeStages f;
    const StageVars &v = f.v;
    const Expr d = in.head_dim, kv_heads = in.kv_heads;
    const Expr group = in.embed_dim / d / kv_heads;
    f.head_dim = d;
    f.kv_heads = kv_heads;
    f.rows = in.new_tokens * group;
    f.splits = (in.num_keys + in.split_keys - 1) / in.split_keys;
    // Whole tiles of rows past the last repeat it.
    const Expr row = clamp(v.i, 0, f.rows - 1), token = row / group;
    const Expr kv_head = v.h % kv_heads, split = v.h / kv_heads;
    CoreInputs core;
    core.q_heads = Func("q_heads");
    core.q_heads(v.c, v.i, v.h, v.b) =
        in.new_qkv((kv_head * group + row % group) * d + v.c, token, v.b);
    // A task reads whole key tiles of its split only, all inside the cache; bounds inference,
    // which takes each task's first key and its number of keys as independent intervals, would
    // otherwise ask for up to a split past the cache's end.
    const Expr key = unsafe_promise_clamped(v.s, 0, in.num_keys - 1);
    core.k_heads = Func("k_heads");
    core.k_heads(v.c, v.s, v.h, v.b) = in.key_cache(key % contract::kCacheKeyTile, v.c,
                                                    key / contract::kCacheKeyTile, kv_head, v.b);
    core.v_heads = Func("v_heads");
    core.v_heads(v.c, v.s, v.h, v.b) = in.value_cache(v.c, key, kv_head, v.b);
    const Expr any_key = unsafe_promise_clamped(v.j, 0, in.num_keys - 1);
    if (in.key_scales.defined()) {
        core.key_scales = Func("task_key_scales");
        core.key_scales(v.j, v.h, v.b) = in.key_scales(any_key, kv_head, v.b);
        core.value_scales = Func("task_value_scales");
        core.value_scales(v.j, v.h, v.b) = in.value_scales(any_key, kv_head, v.b);
    }
    core.head_dim = d;
    core.query_len = f.rows;
    core.num_keys = in.num_keys;
    core.kv_heads = kv_heads;
    // A row sees its split's keys up to its own position, or the step's last token (padding).
    const Expr cached = in.cached_lengths(v.b);
    core.first_visible = Func("first_visible");
    // A multiple of the key tile, as the simplifier then sees: a tile's keys are one vector.
    const Expr split_keys = in.split_keys / contract::kCacheKeyTile * contract::kCacheKeyTile;
    core.first_visible(v.i, v.h, v.b) = split * split_keys;
    core.visible_keys = Func("visible_keys");
    core.visible_keys(v.i, v.h, v.b) = clamp(
        min(cached + min(token + 1, in.new_counts(v.b)), (split + 1) * split_keys), 0, in.num_keys);
    core.masks.key_block = in.key_block;
    core.query_block = kDecodeRowTile;
    if (in.cache_mask.defined()) {
        core.masks.blocking = Func("cache_mask_rows");
        core.masks.blocking(v.j, v.i, v.h, v.b) = in.cache_mask(any_key, v.b);
        core.masks.blocks_nonzero = in.mask_blocks_nonzero;
    }
    f.core = define_attention_core(v, core);
    f.split_results = Func("split_results");
    f.split_results(v.c, v.i, v.h, v.b) =
        Tuple(f.core.context.result(v.c, v.i, v.h, v.b), f.core.softmax.lse(v.i, v.h, v.b));

    // A split that sees no key of a row has lse Float(32).min() and a zero context: weight 0.
    RDom s(0, f.splits, "split");
    const auto split_lse = [&](const Expr &split_index) {
        return f.split_results(0, v.i, split_index * kv_heads + v.h, v.b)[1];
    };
    f.lse_max = Func("split_lse_max");
    f.lse_max(v.i, v.h, v.b) = Float(32).min();
    f.lse_max(v.i, v.h, v.b) = max(f.lse_max(v.i, v.h, v.b), split_lse(s));
    Func split_weight("split_weight");
    split_weight(v.i, v.h, v.b, v.s) = exp(split_lse(v.s) - f.lse_max(v.i, v.h, v.b));
    f.weight_sum = Func("split_weight_sum");
    f.weight_sum(v.i, v.h, v.b) = 0.0f;
    f.weight_sum(v.i, v.h, v.b) += split_weight(v.i, v.h, v.b, s);
    Func &weighted = f.weighted_contexts;
    weighted = Func("weighted_contexts");
    weighted(v.c, v.i, v.h, v.b) = 0.0f;
    weighted(v.c, v.i, v.h, v.b) +=
        split_weight(v.i, v.h, v.b, s) * f.split_results(v.c, v.i, s * kv_heads + v.h, v.b)[0];
    f.context = Func("merged_context");
    f.context(v.c, v.i, v.h, v.b) = weighted(v.c, v.i, v.h, v.b) / f.weight_sum(v.i, v.h, v.b);

    // Query head h = kv·group + g of token i is row i·group + g of key/value head kv.
    const Expr head = v.e / d;
    Func merged("merge_heads");
    merged(v.e, v.s, v.b) = f.context(v.e % d, v.s * group + head % group, head / group, v.b);
    f.out_proj = linear_projection(v, token_rows(v, merged, in.new_tokens, in.batch, "merged_rows"),
                                   in.out_weight_t, in.out_bias, in.embed_dim, "out_proj");
    f.output = Func("decode_output");
    f.output(v.e, v.s, v.b) =
        select(v.s < in.new_counts(v.b), f.out_proj.result(v.e, v.s + v.b * in.new_tokens), 0.0f);
    return f;
}

}  // namespace mha
