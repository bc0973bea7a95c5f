// The whole forward pass composed from the stages of mha_stages.h, as torch.nn.MultiheadAttention
// (and the seed's first article) computes it.
#pragma once

#include "mha_stages.h"

namespace mha {

// What the forward pass reads, as Halide functions with their run-time extents.
struct ForwardInputs {
    Halide::Func query, key, value;  // (e, s, b)
    Halide::Func q_weight_t, k_weight_t, v_weight_t, out_weight_t;  // (out, in)
    Halide::Func q_bias, k_bias, v_bias, out_bias;                  // (out)
    Halide::Func mask;                                              // (j, i, h, b), or undefined
    MaskKind mask_kind = MaskKind::none;
    Halide::Expr embed_dim, num_heads, num_keys;
};

// Every stage of the forward pass, kept so that a schedule can place each one.
struct ForwardStages {
    StageVars v;
    Halide::Expr head_dim;
    Projection q_proj, k_proj, v_proj;
    Halide::Func q_heads, k_heads, v_heads;
    ScaledScores scores;
    MaskedSoftmax softmax;
    AttendValues context;
    Halide::Func merged;
    Projection out_proj;
};

inline ForwardStages define_forward(const ForwardInputs &in) {
    ForwardStages f;
    const StageVars &v = f.v;
    f.head_dim = in.embed_dim / in.num_heads;
    f.q_proj = linear_projection(v, in.query, in.q_weight_t, in.q_bias, in.embed_dim, "q_proj");
    f.k_proj = linear_projection(v, in.key, in.k_weight_t, in.k_bias, in.embed_dim, "k_proj");
    f.v_proj = linear_projection(v, in.value, in.v_weight_t, in.v_bias, in.embed_dim, "v_proj");
    f.q_heads = split_heads(v, f.q_proj.result, f.head_dim, "q_heads");
    f.k_heads = split_heads(v, f.k_proj.result, f.head_dim, "k_heads");
    f.v_heads = split_heads(v, f.v_proj.result, f.head_dim, "v_heads");
    f.scores = scaled_scores(v, f.q_heads, f.k_heads, f.head_dim);
    f.softmax = masked_softmax(v, f.scores.result, in.mask, in.mask_kind, in.num_keys);
    f.context = attend_values(v, f.softmax.weights, f.v_heads, in.num_keys);
    f.merged = merge_heads(v, f.context.result, f.head_dim);
    f.out_proj = linear_projection(v, f.merged, in.out_weight_t, in.out_bias, in.embed_dim,
                                   "out_proj");
    return f;
}

}  // namespace mha
