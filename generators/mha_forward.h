// The whole forward pass composed from the stages of mha_stages.h, as torch.nn.MultiheadAttention
// (and the seed's first article) computes it.
//
// Whole tiles. A schedule may compute any intermediate stage over a region rounded up to its
// tiles, so that register tiles have constant sizes and no buffer is sized at run time inside a
// hot loop. That is safe because every read past the end of real data is defined:
//  - projections read token rows past the end as the last token (token_rows);
//  - mask rows/columns (byte or additive) are read through repeat-edge boundary conditions (the
//  generator);
//  - the runtime pads each prepacked Wᵀ and bias with zero output features up to
//    `padded_features(E, d)` (contract/mha_contract.h), which covers head and projection tiles that
//    divide kMaxTile features;
//  - an output that the pipeline also consumes (the attention weights) is read through a clamp.
// Values computed past the ends are never used by a real output element.
#pragma once

#include "mha_attention.h"
#include "mha_contract.h"
#include "mha_stages.h"

namespace mha {

// Wᵀ(e, k) of prepacked weight panels (lane, k, panel): e = panel·kWeightPanel + lane.
inline Halide::Func panel_view(const Halide::Func &panels, const std::string &name) {
    Halide::Var e("e"), k("k");
    Halide::Func weight_t(name);
    weight_t(e, k) = panels(e % contract::kWeightPanel, k, e / contract::kWeightPanel);
    return weight_t;
}

// What the forward pass reads, as Halide functions with their run-time extents.
struct ForwardInputs {
    Halide::Func query, key, value;  // (e, s, b)
    // Separate projections: (padded out, in) Wᵀ and (padded out) bias per projection.
    Halide::Func q_weight_t, k_weight_t, v_weight_t, q_bias, k_bias, v_bias;
    // Fused QKV (self-attention, query = key = value): Wq, Wk, Wv stacked along the output
    // features, each block `padded` wide. Used when defined.
    Halide::Func qkv_weight_t, qkv_bias;
    Halide::Expr padded, padded_kv;  // of the q and the k, v blocks (qkv_block_offset)
    Halide::Func out_weight_t, out_bias;
    Halide::Func mask;                 // (j, i, h, b) extended by repeat-edge, or undefined
    Halide::Expr mask_blocks_nonzero;  // the mask's convention (see masked_softmax)
    Halide::Func additive_mask;        // (j, i, h, b) added to the scores, or undefined
    Halide::Expr causal_offset;        // query i sees keys j <= i + causal_offset, or undefined
    int causal_key_block = 1;          // see ScoreMasks::key_block
    int causal_query_block = 1;        // see CausalBlocks
    // True when the (byte or additive) mask's keys are dense (stride 1), so that a schedule can
    // specialize its loads to vectors; undefined without a mask.
    Halide::Expr mask_keys_dense;
    bool weights_are_output = false;
    // Separate copies of the scores for the row max and row sum (see ScoreSources).
    bool recompute_scores = false;
    // head_dim is a scalar input, not E / H, so that a schedule can specialize on its value.
    Halide::Expr embed_dim, head_dim, query_len, num_keys, batch;
    Halide::Expr key_features, value_features;  // kdim and vdim: E when fused
    Halide::Expr kv_heads;                      // key/value heads, dividing E / head_dim
    // The projections, Q·Kᵀ and weights·V as tile products in bf16 (tiled_projection,
    // tiled_scaled_scores, tiled_attend_values): the weights are bf16 tiles, not Wᵀ.
    bool tile_products = false;
};

// Every stage of the forward pass, kept so that a schedule can place each one.
struct ForwardStages {
    StageVars v;
    Halide::Expr head_dim, query_len, num_keys;
    Halide::Expr mask_keys_dense;               // see ForwardInputs
    std::vector<Projection> input_projections;  // {q, k, v}, or {qkv} when fused
    Halide::Func q_proj, k_proj, v_proj;        // (e, s, b) views of the projections' rows
    Halide::Func q_heads, k_heads, v_heads;
    CoreStages core;  // scores, softmax, weights·V (mha_attention.h)
    Halide::Func merged;
    Projection out_proj;
    Halide::Func output;  // (e, s, b) view of out_proj's rows
};

inline ForwardStages define_forward(const ForwardInputs &in) {
    using Halide::Func;
    ForwardStages f;
    const StageVars &v = f.v;
    f.head_dim = in.head_dim;
    f.query_len = in.query_len;
    f.num_keys = in.num_keys;
    f.mask_keys_dense = in.mask_keys_dense;
    const Halide::Expr Sq = in.query_len, Sk = in.num_keys, B = in.batch;
    // A projection of `out_features` (padded) outputs in the form the inputs ask for; tiled, the
    // input projections are kept in bf16, which is how the attention's tile products read them.
    const auto project = [&](const TokenRows &rows, const Func &weight, const Func &bias,
                             const Halide::Expr &in_features, const Halide::Expr &out_features,
                             const std::string &name, bool is_input = true) {
        return in.tile_products ? tiled_projection(v, rows, weight, bias, in_features, out_features,
                                                   name, is_input)
                                : linear_projection(v, rows, weight, bias, in_features, name);
    };
    const TokenRows query_rows = token_rows(v, in.query, Sq, B, "query_rows");
    if (in.qkv_weight_t.defined()) {
        Projection qkv = project(query_rows, in.qkv_weight_t, in.qkv_bias, in.embed_dim,
                                 in.padded + 2 * in.padded_kv, "qkv_proj");
        f.q_proj = token_view(v, qkv.result, Sq, 0, "q_proj");
        f.k_proj = token_view(v, qkv.result, Sq,
                              contract::qkv_block_offset(1, in.padded, in.padded_kv), "k_proj");
        f.v_proj = token_view(v, qkv.result, Sq,
                              contract::qkv_block_offset(2, in.padded, in.padded_kv), "v_proj");
        f.input_projections = {qkv};
    } else {
        f.input_projections = {
            project(query_rows, in.q_weight_t, in.q_bias, in.embed_dim, in.padded, "q_proj"),
            project(token_rows(v, in.key, Sk, B, "key_rows"), in.k_weight_t, in.k_bias,
                    in.key_features, in.padded_kv, "k_proj"),
            project(token_rows(v, in.value, Sk, B, "value_rows"), in.v_weight_t, in.v_bias,
                    in.value_features, in.padded_kv, "v_proj")};
        f.q_proj = token_view(v, f.input_projections[0].result, Sq, 0, "q_view");
        f.k_proj = token_view(v, f.input_projections[1].result, Sk, 0, "k_view");
        f.v_proj = token_view(v, f.input_projections[2].result, Sk, 0, "v_view");
    }
    f.q_heads = split_heads(v, f.q_proj, f.head_dim, "q_heads");
    // K and V have kv_heads heads, each read by a group of query heads, never copied per query
    // head.
    f.k_heads = split_heads(v, f.k_proj, f.head_dim, "k_heads");
    f.v_heads = split_heads(v, f.v_proj, f.head_dim, "v_heads");
    CoreInputs core;
    core.q_heads = f.q_heads;
    core.k_heads = f.k_heads;
    core.v_heads = f.v_heads;
    core.head_dim = f.head_dim;
    core.query_len = in.query_len;
    core.num_keys = in.num_keys;
    core.kv_heads = in.kv_heads;
    core.kv_group = in.embed_dim / in.head_dim / in.kv_heads;
    core.masks.blocking = in.mask;
    core.masks.blocks_nonzero = in.mask_blocks_nonzero;
    core.masks.additive = in.additive_mask;
    core.masks.key_block = in.causal_key_block;
    if (in.causal_offset.defined()) {
        core.visible_keys = Func("visible_keys");
        core.visible_keys(v.i, v.h, v.b) =
            Halide::clamp(v.i + in.causal_offset + 1, 0, in.num_keys);
    }
    core.query_block = in.causal_query_block;
    core.weights_are_output = in.weights_are_output;
    core.recompute_scores = in.recompute_scores;
    core.tile_products = in.tile_products;
    core.bf16_context = in.tile_products;  // what the output projection's strips read
    f.core = define_attention_core(v, core);
    f.merged = merge_heads(v, f.core.context.result, f.head_dim);
    f.out_proj = project(token_rows(v, f.merged, Sq, B, "merged_rows"), in.out_weight_t,
                         in.out_bias, in.embed_dim, in.padded, "out_proj", false);
    f.output = token_view(v, f.out_proj.result, Sq, 0, "output_view");
    return f;
}

}  // namespace mha
