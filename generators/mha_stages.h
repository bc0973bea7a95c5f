// The multi-head attention algorithm as Halide stages: what is computed, never how.
//
// Layout convention. Halide lists dimensions innermost first, so a PyTorch row-major tensor
// [B, S, E] is the Halide function (e, s, b), and [B, H, S, d] is (c, s, h, b) with c the
// position inside a head. Weights arrive prepacked by the runtime as Wᵀ: (out, in) with the
// output feature innermost, so a projection reads contiguous weight rows.
#pragma once

#include "Halide.h"
#include "mha_contract.h"

namespace mha {

// The pure variables every stage is written in; schedules refer to the same objects.
struct StageVars {
    Halide::Var e{"e"};  // embedding feature
    Halide::Var s{"s"};  // sequence position (query or key)
    Halide::Var b{"b"};  // batch
    Halide::Var c{"c"};  // feature inside one head
    Halide::Var h{"h"};  // head
    Halide::Var i{"i"};  // query position
    Halide::Var j{"j"};  // key position
    Halide::Var r{"r"};  // token row: position + batch x sequence length
};

// The score a blocked position gets, as in the seed (masked_fill(mask == 0, -1e9)): a fully
// masked row then has equal scores everywhere and softmax gives uniform weights, never NaN.
inline constexpr float kMaskedScore = -1e9f;

// nn.Linear applies to every token alike, so a projection sees [B, S, E] as B·S rows:
// rows(e, r) = x(e, r mod S, r / S). Rows past the end repeat the last token, so that schedules
// may compute whole tiles of rows; `count` is the real ones, for schedules that fit their tiles
// to few rows.
struct TokenRows {
    Halide::Func func;
    Halide::Expr count;
};
inline TokenRows token_rows(const StageVars &v, const Halide::Func &x, const Halide::Expr &seq_len,
                            const Halide::Expr &batch, const std::string &name) {
    TokenRows rows{Halide::Func(name), seq_len * batch};
    Halide::Expr r = Halide::clamp(v.r, 0, rows.count - 1);
    rows.func(v.e, v.r) = x(v.e, r % seq_len, r / seq_len);
    return rows;
}

// The inverse view: (e, s, b) of a function of token rows. Positions past the end read the last
// token, as token_rows does, but here, so that a consumer computed in whole tiles of positions
// (a key tile, a query tile) asks the projection for the real rows only: one token's call then
// projects one row, not a tile's worth.
inline Halide::Func token_view(const StageVars &v, const Halide::Func &rows,
                               const Halide::Expr &seq_len, const Halide::Expr &feature_offset,
                               const std::string &name) {
    Halide::Func x(name);
    x(v.e, v.s, v.b) =
        rows(v.e + feature_offset, Halide::clamp(v.s, 0, seq_len - 1) + v.b * seq_len);
    return x;
}

// y(e, r) = bias(e) + sum_k x(k, r) * weight_t(e, k): nn.Linear over token rows, Wᵀ prepacked.
struct Projection {
    Halide::Func result;
    Halide::RDom k;
    Halide::Func rows, weight_t;  // what it reads, for schedules that stage them
    Halide::Expr row_count;       // the real rows (see TokenRows)
    // The tiled form only (tiled_projection): the rows staged in bf16 strips, the f32 tiles
    // accumulated over the input features, and the output features computed.
    Halide::Func strips, tiles;
    Halide::Expr out_features;
};
inline Projection linear_projection(const StageVars &v, const TokenRows &rows,
                                    const Halide::Func &weight_t, const Halide::Func &bias,
                                    const Halide::Expr &in_features, const std::string &name) {
    Projection p{Halide::Func(name), Halide::RDom(0, in_features, name + "_k"),
                 rows.func,          weight_t,
                 rows.count,         Halide::Func(),
                 Halide::Func(),     Halide::Expr()};
    p.result(v.e, v.r) = bias(v.e);
    p.result(v.e, v.r) += rows.func(p.k, v.r) * weight_t(v.e, p.k);
    return p;
}

// An f32 value rounded to the nearest even bf16, NaN kept quiet, written as integer operations
// (Halide 21 emulates an f32 -> bf16 cast the same way, with a warning per kernel).
inline Halide::Expr rounded_to_bf16(const Halide::Expr &x) {
    using namespace Halide;
    const Expr bits = reinterpret<uint32_t>(x);
    const Expr nearest_even = (bits + 0x7fff + ((bits >> 16) & 1)) >> 16;
    return reinterpret(BFloat(16), cast<uint16_t>(select(is_nan(x), 0x7fc0, nearest_even)));
}

// The same projection in the form a matrix engine computes it (x86 AMX, whose lowering in Halide
// matches exactly this form): the `out_features` outputs in 16 x 16 tiles (kBf16TileWidth), each
// accumulated in f32 over slices of 32 input features (kBf16TileDepth); the rows staged as bf16
// in strips of 16 rows, features past `in_features` read as zero; the weights given as bf16
// tiles, weight_tiles(pair, lane, panel x pairs + p) (contract::kBf16TileDepth).
inline Projection tiled_projection(const StageVars &v, const TokenRows &rows,
                                   const Halide::Func &weight_tiles, const Halide::Func &bias,
                                   const Halide::Expr &in_features,
                                   const Halide::Expr &out_features, const std::string &name) {
    using namespace Halide;
    const int width = contract::kBf16TileWidth, depth = contract::kBf16TileDepth;
    const Expr slices = (in_features + depth - 1) / depth;
    Projection p{Func(name),
                 RDom({{0, depth}, {0, slices}}, name + "_k"),
                 rows.func,
                 weight_tiles,
                 rows.count,
                 Func(name + "_strips"),
                 Func(name + "_tiles"),
                 out_features};
    Var kk("kk"), ri("ri"), kt("kt"), rt("rt"), ei("ei"), ep("ep");
    const Expr k = kt * depth + kk;
    const Expr row = rows.func(min(k, in_features - 1), rt * width + ri);
    p.strips(kk, ri, kt, rt) =
        select(k < in_features, row.type().is_bfloat() ? row : rounded_to_bf16(row),
               cast(BFloat(16), 0.0f));
    p.tiles(ei, ri, ep, rt) = 0.0f;
    p.tiles(ei, ri, ep, rt) +=
        cast<float>(p.strips(p.k.x, ri, p.k.y, rt)) *
        cast<float>(weight_tiles(p.k.x % 2, ei, ((ep * slices + p.k.y) * depth + p.k.x) / 2));
    p.result(v.e, v.r) = p.tiles(v.e % width, v.r % width, v.e / width, v.r / width) + bias(v.e);
    return p;
}

// [B, S, E] -> [B, H, S, d]: feature h*d + c of token s becomes feature c of head h.
inline Halide::Func split_heads(const StageVars &v, const Halide::Func &x,
                                const Halide::Expr &head_dim, const std::string &name) {
    Halide::Func heads(name);
    heads(v.c, v.s, v.h, v.b) = x(v.h * head_dim + v.c, v.s, v.b);
    return heads;
}

// Grouped-query attention: query head h reads key/value head h / group (group = 1: one key/value
// head per query head, multi-head attention as the seed has it).
inline Halide::Expr kv_head_of(const StageVars &v, const Halide::Expr &group) {
    return group.defined() ? v.h / group : Halide::Expr(v.h);
}

// scores(j, i, h, b) = (q_i · k_j) / sqrt(d), over the d features of head h (and its key head).
struct ScaledScores {
    Halide::Func dot;     // unscaled q·kᵀ, the reduction
    Halide::Func result;  // dot / sqrt(d)
    Halide::RDom c;
};
inline ScaledScores scaled_scores(const StageVars &v, const Halide::Func &q_heads,
                                  const Halide::Func &k_heads, const Halide::Expr &head_dim,
                                  const std::string &suffix = "",
                                  const Halide::Expr &kv_group = Halide::Expr()) {
    ScaledScores s{Halide::Func("qk_dot" + suffix), Halide::Func("scaled_scores" + suffix),
                   Halide::RDom(0, head_dim, "scores_c" + suffix)};
    s.dot(v.j, v.i, v.h, v.b) = 0.0f;
    s.dot(v.j, v.i, v.h, v.b) +=
        q_heads(s.c, v.i, v.h, v.b) * k_heads(s.c, v.j, kv_head_of(v, kv_group), v.b);
    Halide::Expr scale = 1.0f / Halide::sqrt(Halide::cast<float>(head_dim));
    s.result(v.j, v.i, v.h, v.b) = s.dot(v.j, v.i, v.h, v.b) * scale;
    return s;
}

// Softmax over keys of the masked scores, subtracting the row maximum for range safety.
struct MaskedSoftmax {
    Halide::Func masked;   // scores with blocked positions set to kMaskedScore
    Halide::Func row_max;  // max over keys
    Halide::Func exps;     // exp(masked - row_max)
    Halide::Func row_sum;  // sum over keys of exps
    Halide::Func inv_sum;  // 1 / row_sum
    Halide::Func weights;  // exps * inv_sum
    Halide::RDom max_j, sum_j;
    bool causal = false;  // the reductions stop at each query's visible keys (see ScoreMasks)
};

// The scores each part of the softmax reads: the same function, or equal copies that a schedule
// computes where each part needs them (a GPU block recomputes scores rather than hold a row).
struct ScoreSources {
    Halide::Func for_max, for_sum, for_weights;
};

// What masks the scores: `blocking` (undefined: none) blocks a position where its byte is
// nonzero when `blocks_nonzero` (the TF article's 1 = blocked), where it is zero otherwise (the
// PyTorch article), so one pipeline serves both conventions; `additive` (undefined: none) is
// added to the scores (the TF article's mask·(-1e9) precomputed, PyTorch's float masks).
// Broadcasting is done by the caller's zero strides.
// `visible_keys` (undefined: all), an expression of the query position v.i, limits query i to
// keys j < visible_keys: the causal order. The softmax's and weights·V's reductions stop there
// (their reads clamped to the last visible key, so that bounds inference never asks for the
// scores of hidden keys), and hidden keys weigh exactly 0; a query that sees no key gets weights 0
// and a zero context. The row reductions then run over blocks of `key_block` keys, the blocks past
// the last visible key skipped whole: a schedule vectorizes across a block (rfactor) while the loop
// over blocks still stops where the row does.
struct ScoreMasks {
    Halide::Func blocking;
    Halide::Expr blocks_nonzero;
    Halide::Func additive;
    Halide::Expr visible_keys;
    int key_block = 1;
};

inline MaskedSoftmax masked_softmax(const StageVars &v, const ScoreSources &scores,
                                    const ScoreMasks &masks, const Halide::Expr &num_keys) {
    using namespace Halide;
    const auto masked_scores = [&](const Func &source, const std::string &name) {
        Func masked(name);
        Expr score = source(v.j, v.i, v.h, v.b);
        if (masks.additive.defined()) {
            score += masks.additive(v.j, v.i, v.h, v.b);
        }
        if (masks.blocking.defined()) {
            Expr blocked = (masks.blocking(v.j, v.i, v.h, v.b) != 0) == (masks.blocks_nonzero != 0);
            score = select(blocked, kMaskedScore, score);
        }
        masked(v.j, v.i, v.h, v.b) = score;
        return masked;
    };
    MaskedSoftmax m{masked_scores(scores.for_weights, "masked_scores"),
                    Func("row_max"),
                    Func("exps"),
                    Func("row_sum"),
                    Func("inv_row_sum"),
                    Func("masked_softmax"),
                    RDom(0, num_keys, "max_j"),
                    RDom(0, num_keys, "sum_j")};
    // The key each reduction reads, and whether a query sees it.
    Expr max_key = m.max_j.x, sum_key = m.sum_j.x, max_visible = true, sum_visible = true;
    if (masks.visible_keys.defined()) {
        m.causal = true;
        const int block = masks.key_block;
        const Expr blocks = (num_keys + block - 1) / block;
        m.max_j = RDom({{0, blocks}, {0, block}}, "max_j");
        m.sum_j = RDom({{0, blocks}, {0, block}}, "sum_j");
        m.max_j.where(m.max_j.x < (masks.visible_keys + block - 1) / block);
        m.sum_j.where(m.sum_j.x < (masks.visible_keys + block - 1) / block);
        max_key = m.max_j.x * block + m.max_j.y;
        sum_key = m.sum_j.x * block + m.sum_j.y;
        max_visible = max_key < masks.visible_keys;
        sum_visible = sum_key < masks.visible_keys;
        // Read clamped to the last visible key, so that bounds inference asks for no score past
        // it (a predicate on a block bound does not narrow the region it asks for; one on the
        // key itself does).
        if (block > 1) {
            max_key = min(max_key, max(masks.visible_keys - 1, 0));
            sum_key = min(sum_key, max(masks.visible_keys - 1, 0));
        }
    }
    const bool shared = scores.for_max.name() == scores.for_weights.name();
    const Func masked_for_max = shared ? m.masked : masked_scores(scores.for_max, "masked_for_max");
    const Func masked_for_sum = shared ? m.masked : masked_scores(scores.for_sum, "masked_for_sum");
    // The row reductions are explicit updates, so that schedules can vectorize them (rfactor).
    m.row_max(v.i, v.h, v.b) = Float(32).min();
    m.row_max(v.i, v.h, v.b) =
        max(m.row_max(v.i, v.h, v.b),
            select(max_visible, masked_for_max(max_key, v.i, v.h, v.b), Float(32).min()));
    // A NaN score (a NaN or Inf in unmasked data) makes its row NaN, as in PyTorch: max() may
    // skip a NaN and exp() clamps its argument, so without the select a NaN key would weigh 0.
    const auto nan_preserving_exp = [](const Expr &x) {
        return select(is_nan(x), x, exp(x));
    };
    m.exps(v.j, v.i, v.h, v.b) =
        nan_preserving_exp(m.masked(v.j, v.i, v.h, v.b) - m.row_max(v.i, v.h, v.b));
    Func exps_for_sum = m.exps;
    if (!shared) {
        exps_for_sum = Func("exps_for_sum");
        exps_for_sum(v.j, v.i, v.h, v.b) =
            nan_preserving_exp(masked_for_sum(v.j, v.i, v.h, v.b) - m.row_max(v.i, v.h, v.b));
    }
    m.row_sum(v.i, v.h, v.b) = 0.0f;
    m.row_sum(v.i, v.h, v.b) += select(sum_visible, exps_for_sum(sum_key, v.i, v.h, v.b), 0.0f);
    m.inv_sum(v.i, v.h, v.b) = 1.0f / m.row_sum(v.i, v.h, v.b);
    Expr weight = m.exps(v.j, v.i, v.h, v.b) * m.inv_sum(v.i, v.h, v.b);
    if (masks.visible_keys.defined()) {
        weight = select(v.j < masks.visible_keys, weight, 0.0f);
    }
    m.weights(v.j, v.i, v.h, v.b) = weight;
    return m;
}

// context(c, i, h, b) = sum_j weights(j, i, h, b) * v(c, j, h, b): [B, H, Sq, d].
struct AttendValues {
    Halide::Func result;
    Halide::RDom j;
};
// Causal attention in blocks: with `visible_keys` (defined: keys j < visible_keys(i) only, see
// ScoreMasks), the rows of each block of `query_block` queries run over the blocks of
// `key_block` keys up to the block's last row's last visible key, one bound for the whole row
// block (visibility grows with i), which a schedule with tiles of whole row blocks turns into a
// loop bound. `weights` must be 0 for every hidden key up to a whole key block past the last
// visible one.
struct CausalBlocks {
    Halide::Func visible_keys;  // (i), or undefined: not causal
    int key_block = 1, query_block = 1;
};
inline AttendValues attend_values(const StageVars &v, const Halide::Func &weights,
                                  const Halide::Func &v_heads, const Halide::Expr &num_keys,
                                  const CausalBlocks &causal = {},
                                  const Halide::Expr &kv_group = Halide::Expr()) {
    AttendValues a{Halide::Func("attend_values"), Halide::RDom(0, num_keys, "values_j")};
    Halide::Expr key = a.j.x;
    if (causal.visible_keys.defined()) {
        const int kb = causal.key_block, qb = causal.query_block;
        a.j = Halide::RDom({{0, (num_keys + kb - 1) / kb}, {0, kb}}, "values_j");
        const Halide::Expr blocks = (causal.visible_keys(v.i / qb * qb + qb - 1) + kb - 1) / kb;
        a.j.where(a.j.x < blocks);
        // Clamped to the last block, which the predicate already ensures: bounds inference then
        // asks for no weight past it (see masked_softmax).
        key = kb > 1 ? Halide::min(a.j.x * kb + a.j.y, Halide::max(blocks * kb - 1, 0)) : a.j.x;
    }
    a.result(v.c, v.i, v.h, v.b) = 0.0f;
    a.result(v.c, v.i, v.h, v.b) +=
        weights(key, v.i, v.h, v.b) * v_heads(v.c, key, kv_head_of(v, kv_group), v.b);
    return a;
}

// [B, H, S, d] -> [B, S, E]: the inverse of split_heads.
inline Halide::Func merge_heads(const StageVars &v, const Halide::Func &heads,
                                const Halide::Expr &head_dim) {
    Halide::Func merged("merge_heads");
    merged(v.e, v.s, v.b) = heads(v.e % head_dim, v.s, v.e / head_dim, v.b);
    return merged;
}

}  // namespace mha
