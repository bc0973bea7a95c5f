// The attention core composed from the stages of mha_stages.h: scaled scores, their masks and
// modifications, softmax and weights·V, on heads already projected. The forward pass runs it on
// its projections (mha_forward.h); the attention kernels (F.scaled_dot_product_attention's level)
// on the caller's Q, K and V.
#pragma once

#include <string>
#include <vector>

#include "mha_stages.h"

namespace mha {

struct CoreInputs {
    Halide::Func q_heads, k_heads, v_heads;  // (c, i, h, b); (c, j, key/value head, b)
    Halide::Expr head_dim, query_len, num_keys;
    Halide::Expr value_dim;           // of V's heads; undefined: head_dim
    Halide::Expr kv_heads, kv_group;  // query head h reads key/value head h / kv_group
    Halide::Expr scale;               // of q·kᵀ; undefined: 1 / sqrt(head_dim)
    // An int8 cache's per-key scales (j, key/value head, b), or undefined: each score is
    // multiplied by its key's after the dot product, each weight by its value's before
    // weights·V, so that no key or value element is ever scaled (not with recompute_scores).
    Halide::Func key_scales, value_scales;
    // The masks, the visible keys and the scores' modifications (ScoreMasks); a causal order, a
    // window or a task's share of the keys is given by first_visible and visible_keys as
    // functions of (query, head, batch row) (undefined: every key), key_block and query_block
    // the blocks their reductions run over (CausalBlocks).
    ScoreMasks masks;
    Halide::Func first_visible, visible_keys;
    int query_block = 1;
    bool weights_are_output = false;  // a consumer reads the weights as the pipeline's output
    bool recompute_scores = false;    // separate copies for the row max and sum (ScoreSources)
    bool tile_products = false;       // Q·Kᵀ and weights·V as bf16 tile products
    bool dot_pairs = false;           // ... or as bf16 dot products over pairs, in the same loops
    bool bf16_context = false;        // tile products: the context rounded to bf16 (else f32)
    // K and V may be read at any key (their reads clamped), past the last: the tiled weights·V
    // then reads the weights of whole slices of keys as they lie, and Q·Kᵀ's tiles span them.
    bool keys_read_anywhere = false;
};

struct CoreStages {
    ScaledScores scores;                    // read by the softmax weights
    std::vector<ScaledScores> stat_scores;  // {for the row max, for the row sum}, or none
    MaskedSoftmax softmax;
    Halide::Func weights_for_values;  // what attend_values reads: the weights, or a clamped view
    AttendValues context;             // (c, i, h, b)
    bool windowed = false;            // the visible keys start past the first (first_visible)
};

inline CoreStages define_attention_core(const StageVars &v, const CoreInputs &in) {
    using Halide::Func;
    CoreStages core;
    const Halide::Expr d = in.head_dim, group = in.kv_group;
    const Halide::Expr dv = in.value_dim.defined() ? in.value_dim : d;
    const int slice = contract::kBf16TileDepth;
    const Halide::Expr score_keys =
        in.keys_read_anywhere ? (in.num_keys + slice - 1) / slice * slice : in.num_keys;
    core.scores = in.tile_products ? tiled_scaled_scores(v, in.q_heads, in.k_heads, d, score_keys,
                                                         in.kv_heads, group, in.scale)
                  : in.dot_pairs
                      ? paired_scaled_scores(v, in.q_heads, in.k_heads, d, group, in.scale)
                      : scaled_scores(v, in.q_heads, in.k_heads, d, "", group, in.scale);
    ScoreSources sources{core.scores.result, core.scores.result, core.scores.result};
    if (in.key_scales.defined()) {
        Func scaled("scores_times_key_scales");
        scaled(v.j, v.i, v.h, v.b) =
            core.scores.result(v.j, v.i, v.h, v.b) * in.key_scales(v.j, kv_head_of(v, group), v.b);
        sources = {scaled, scaled, scaled};
    }
    if (in.recompute_scores) {
        core.stat_scores = {
            scaled_scores(v, in.q_heads, in.k_heads, d, "_for_max", group, in.scale),
            scaled_scores(v, in.q_heads, in.k_heads, d, "_for_sum", group, in.scale)};
        sources.for_max = core.stat_scores[0].result;
        sources.for_sum = core.stat_scores[1].result;
    }
    ScoreMasks masks = in.masks;
    CausalBlocks blocks{in.visible_keys, in.first_visible, masks.key_block, in.query_block};
    Halide::Expr first, end;
    if (in.visible_keys.defined()) {
        end = in.visible_keys(v.i, v.h, v.b);
        masks.visible_keys = end;
    }
    if (in.first_visible.defined()) {
        first = in.first_visible(v.i, v.h, v.b);
        masks.first_visible = first;
        core.windowed = true;
    }
    core.softmax = masked_softmax(v, sources, masks, in.num_keys, in.tile_products);
    Func weights = core.softmax.weights;
    if (in.weights_are_output) {
        // The output read back: only inside its bounds, and 0 outside the visible keys for the
        // reductions' whole blocks.
        weights = Func("weights_clamped");
        Halide::Expr read = core.softmax.weights(Halide::clamp(v.j, 0, in.num_keys - 1),
                                                 Halide::clamp(v.i, 0, in.query_len - 1), v.h, v.b);
        if (end.defined()) {
            read = Halide::select(v.j < end, read, 0.0f);
        }
        if (first.defined()) {
            read = Halide::select(v.j >= first, read, 0.0f);
        }
        weights(v.j, v.i, v.h, v.b) = read;
    }
    if (in.value_scales.defined()) {
        Func scaled("weights_times_value_scales");
        scaled(v.j, v.i, v.h, v.b) =
            weights(v.j, v.i, v.h, v.b) * in.value_scales(v.j, kv_head_of(v, group), v.b);
        weights = scaled;
    }
    core.weights_for_values = weights;
    core.context =
        in.tile_products
            ? tiled_attend_values(v, weights, in.v_heads, dv, in.num_keys, in.kv_heads, group,
                                  in.bf16_context, blocks, in.keys_read_anywhere)
            : attend_values(v, weights, in.v_heads, in.num_keys, blocks, group, in.dot_pairs);
    return core;
}

}  // namespace mha
