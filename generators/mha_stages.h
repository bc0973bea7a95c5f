// The multi-head attention algorithm as Halide stages: what is computed, never how.
//
// Layout convention. Halide lists dimensions innermost first, so a PyTorch row-major tensor
// [B, S, E] is the Halide function (e, s, b), and [B, H, S, d] is (c, s, h, b) with c the
// position inside a head. Weights arrive prepacked by the runtime as Wᵀ: (out, in) with the
// output feature innermost, so a projection reads contiguous weight rows.
#pragma once

#include <array>
#include <string>
#include <vector>

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

// The bits of a bf16 or an f16 tensor (contract::ElementType::u16) as f32, exactly, by
// Halide's own conversions (integer operations, which every GPU backend compiles): what a GPU
// kernel of a 16-bit dtype computes on.
inline Halide::Func widened_to_f32(const Halide::Func &bits, DType dtype, const std::string &name) {
    std::vector<Halide::Var> x(size_t(bits.dimensions()));
    Halide::Func f32(name);
    f32(x) = dtype == DType::bf16 ? Halide::Internal::bfloat16_to_float32(bits(x))
                                  : Halide::Internal::float16_to_float32(bits(x));
    return f32;
}

// A function of any element type widened (or kept) in f32: a decode step's 16-bit weights and
// cache, converted as they are read.
inline Halide::Func as_f32(const Halide::Func &f, const std::string &name) {
    std::vector<Halide::Var> x(size_t(f.dimensions()));
    Halide::Func f32(name);
    f32(x) = Halide::cast<float>(f(x));
    return f32;
}

// An f32 value rounded to the nearest even bf16, NaN kept quiet, written as integer operations
// (Halide 21 emulates an f32 -> bf16 cast the same way, with a warning per kernel).
inline Halide::Expr rounded_to_bf16(const Halide::Expr &x) {
    using namespace Halide;
    const Expr bits = reinterpret<uint32_t>(x);
    const Expr nearest_even = (bits + 0x7fff + ((bits >> 16) & 1)) >> 16;
    return reinterpret(BFloat(16), cast<uint16_t>(select(is_nan(x), 0x7fc0, nearest_even)));
}

// A value in bf16: as it is when it is one, else rounded.
inline Halide::Expr as_bf16(const Halide::Expr &x) {
    return x.type().is_bfloat() ? x : rounded_to_bf16(x);
}

// The three pieces of a bf16 product (x86 AMX tiles, whose lowering in Halide matches exactly
// these forms, or AVX512_BF16's dot products over the pairs), in tiles of kBf16TileWidth x
// kBf16TileWidth f32 accumulated over slices of kBf16TileDepth: the left operand staged as bf16
// strips of kBf16TileWidth rows, the right one as bf16 tiles whose pairs of reduction features are
// innermost; reduction features past `features` read as zero in both. `outer` are the products'
// outer pure dimensions (head, batch) and each operand's call arguments for them.

// strips(kk, ri, kt, rt, outer...) = source(kt·depth + kk, rt·width + ri, outer...) in bf16.
// A source `defined_past_features` is read there as it is (dense loads; the values are
// discarded), any other at its last feature.
inline Halide::Func bf16_strips(const Halide::Func &source, const Halide::Expr &features,
                                const std::vector<Halide::Var> &outer, const std::string &name,
                                bool defined_past_features = false) {
    using namespace Halide;
    const int width = contract::kBf16TileWidth, depth = contract::kBf16TileDepth;
    Var kk("kk"), ri("ri"), kt("kt"), rt("rt");
    std::vector<Var> args = {kk, ri, kt, rt};
    const Expr feature = kt * depth + kk;
    std::vector<Expr> read = {defined_past_features ? feature : min(feature, features - 1),
                              rt * width + ri};
    args.insert(args.end(), outer.begin(), outer.end());
    read.insert(read.end(), outer.begin(), outer.end());
    const Expr value = source(read);
    Func strips(name);
    strips(args) = select(feature < features, as_bf16(value), cast(BFloat(16), 0.0f));
    return strips;
}

// The right operand of a tile product computed, in the layout the runtime prepacks weights in
// (contract::kBf16TileDepth): tiles(pair, lane, (ct·slices + kt)·depth/2 + kp) =
// source(kt·depth + 2·kp + pair, ct·width + lane, h, b) in bf16, slices = the reduction's slices
// of depth features, ct counting `columns` in whole tiles per (h, b) of `heads` heads: the column
// tiles of head h of batch row b start at tile_columns_offset. One index for all, as the AMX
// lowering wants its tile loads one ramp from one base.
struct Bf16Tiles {
    Halide::Func tiles;
    Halide::Expr slices, column_tiles;  // column_tiles per (head, batch row)
};
// A tile product's three stages: the left operand's strips, the right operand packed, the tiles.
struct HeadTileProduct {
    Halide::Func strips;
    Bf16Tiles packed;
    Halide::Func tiles;
};
inline Bf16Tiles bf16_tiles(const Halide::Func &source, const Halide::Expr &features,
                            const Halide::Expr &columns, const Halide::Expr &heads,
                            const std::string &name) {
    using namespace Halide;
    const int width = contract::kBf16TileWidth, depth = contract::kBf16TileDepth;
    const Expr slices = (features + depth - 1) / depth;
    Bf16Tiles packed{Func(name), slices, (columns + width - 1) / width};
    Var pair("pair"), lane("lane"), t("t");
    const Expr kp = t % (depth / 2), kt = (t / (depth / 2)) % slices;
    const Expr column_tile = t / (depth / 2 * slices);
    const Expr ct = column_tile % packed.column_tiles, head = column_tile / packed.column_tiles;
    const Expr feature = kt * depth + 2 * kp + pair;
    const Expr value =
        source(min(feature, features - 1), ct * width + lane, head % heads, head / heads);
    packed.tiles(pair, lane, t) =
        select(feature < features, as_bf16(value), cast(BFloat(16), 0.0f));
    return packed;
}
inline Halide::Expr tile_columns_offset(const Bf16Tiles &packed, const Halide::Expr &head,
                                        const Halide::Expr &heads, const Halide::Expr &batch_row) {
    return (batch_row * heads + head) * packed.column_tiles;
}

// The row tile argument (rt) of a tile product's tiles, which predicates on its RDom may read.
inline Halide::Var tile_product_row_tile() { return Halide::Var("rt"); }

// acc(lane, ri, ct, rt, outer...) = sum over the reduction's `features` of
// strips(k, ri, ·, rt, outer...) · tiles(k, lane of column tile ct + tiles_offset): `k` its RDom
// (tile_slices).
inline Halide::Func tile_product(const Halide::Func &strips, const Halide::Func &tiles,
                                 const Halide::Expr &features, const Halide::RDom &k,
                                 const std::vector<Halide::Var> &outer,
                                 const Halide::Expr &tiles_offset, const std::string &name) {
    using namespace Halide;
    const int depth = contract::kBf16TileDepth;
    const Expr slices = (features + depth - 1) / depth;
    Var lane("lane"), ri("ri"), ct("ct"), rt = tile_product_row_tile();
    std::vector<Var> args = {lane, ri, ct, rt};
    std::vector<Expr> a = {k.x, ri, k.y, rt};
    args.insert(args.end(), outer.begin(), outer.end());
    a.insert(a.end(), outer.begin(), outer.end());
    Func acc(name);
    acc(args) = 0.0f;
    acc(args) +=
        cast<float>(strips(a)) *
        cast<float>(tiles(k.x % 2, lane, (((ct + tiles_offset) * slices + k.y) * depth + k.x) / 2));
    return acc;
}

// The reduction domain of a tile product over `features`.
inline Halide::RDom tile_slices(const Halide::Expr &features, const std::string &name) {
    const int depth = contract::kBf16TileDepth;
    return Halide::RDom({{0, depth}, {0, (features + depth - 1) / depth}}, name);
}

// The value at (column, row, outer...) of a tile product's tiles (tile_product).
inline Halide::Expr tile_element(const Halide::Func &tiles, const Halide::Expr &column,
                                 const Halide::Expr &row,
                                 const std::vector<Halide::Expr> &outer = {}) {
    const int width = contract::kBf16TileWidth;
    std::vector<Halide::Expr> at = {column % width, row % width, column / width, row / width};
    at.insert(at.end(), outer.begin(), outer.end());
    return tiles(at);
}

// The same projection as a tile product: the rows staged as strips, the weights given as tiles
// (weight_tiles(pair, lane, panel x pairs + p), contract::kBf16TileDepth), `out_features` outputs
// in whole tiles; with `bf16_result`, rounded to bf16 (for consumers that read them so: half the
// bytes through memory).
inline Projection tiled_projection(const StageVars &v, const TokenRows &rows,
                                   const Halide::Func &weight_tiles, const Halide::Func &bias,
                                   const Halide::Expr &in_features,
                                   const Halide::Expr &out_features, const std::string &name,
                                   bool bf16_result = false) {
    using namespace Halide;
    Projection p{Func(name), tile_slices(in_features, name + "_k"),
                 rows.func,  weight_tiles,
                 rows.count, bf16_strips(rows.func, in_features, {}, name + "_strips"),
                 Func(),     out_features};
    p.tiles = tile_product(p.strips, weight_tiles, in_features, p.k, {}, 0, name + "_tiles");
    const Expr y = tile_element(p.tiles, v.e, v.r) + bias(v.e);
    p.result(v.e, v.r) = bf16_result ? rounded_to_bf16(y) : y;
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

// scores(j, i, h, b) = (q_i · k_j) · scale, over the d features of head h (and its key head);
// scale 1 / sqrt(d) unless given.
struct ScaledScores {
    Halide::Func dot;     // unscaled q·kᵀ, the reduction
    Halide::Func result;  // dot · scale
    Halide::RDom c;
    // The tiled form only (tiled_scaled_scores): the queries as strips, the keys as tiles, the
    // product's tiles (dot is their view).
    HeadTileProduct tiled;
    // The paired form only (paired_scaled_scores): the queries and the keys in bf16.
    Halide::Func paired_queries, paired_keys;
};
inline ScaledScores scaled_scores(const StageVars &v, const Halide::Func &q_heads,
                                  const Halide::Func &k_heads, const Halide::Expr &head_dim,
                                  const std::string &suffix = "",
                                  const Halide::Expr &kv_group = Halide::Expr(),
                                  const Halide::Expr &scale = Halide::Expr()) {
    ScaledScores s;
    s.dot = Halide::Func("qk_dot" + suffix);
    s.result = Halide::Func("scaled_scores" + suffix);
    s.c = Halide::RDom(0, head_dim, "scores_c" + suffix);
    s.dot(v.j, v.i, v.h, v.b) = 0.0f;
    s.dot(v.j, v.i, v.h, v.b) +=
        q_heads(s.c, v.i, v.h, v.b) * k_heads(s.c, v.j, kv_head_of(v, kv_group), v.b);
    const Halide::Expr factor =
        scale.defined() ? scale : 1.0f / Halide::sqrt(Halide::cast<float>(head_dim));
    s.result(v.j, v.i, v.h, v.b) = s.dot(v.j, v.i, v.h, v.b) * factor;
    return s;
}

// The same scores as dot products over pairs of features in bf16, accumulated in f32
// (AVX512_BF16's vdpbf16ps: one instruction per pair and 16 keys): the queries as
// paired_queries(c, i, h, b), the keys as paired_keys(pair, j, c / 2, h, b), pairs innermost,
// both zero past the last feature up to a whole pair.
inline ScaledScores paired_scaled_scores(const StageVars &v, const Halide::Func &q_heads,
                                         const Halide::Func &k_heads, const Halide::Expr &head_dim,
                                         const Halide::Expr &kv_group, const Halide::Expr &scale) {
    using namespace Halide;
    ScaledScores s;
    s.dot = Func("qk_dot");
    s.result = Func("scaled_scores");
    s.paired_queries = Func("paired_queries");
    s.paired_keys = Func("paired_keys");
    const Expr d = head_dim, zero = cast(BFloat(16), 0.0f);
    s.c = RDom(0, (d + 1) / 2 * 2, "scores_c");
    Var pair("pair"), cp("cp");
    s.paired_queries(v.c, v.i, v.h, v.b) =
        select(v.c < d, as_bf16(q_heads(min(v.c, d - 1), v.i, v.h, v.b)), zero);
    const Expr feature = 2 * cp + pair;
    s.paired_keys(pair, v.j, cp, v.h, v.b) =
        select(feature < d, as_bf16(k_heads(min(feature, d - 1), v.j, v.h, v.b)), zero);
    s.dot(v.j, v.i, v.h, v.b) = 0.0f;
    s.dot(v.j, v.i, v.h, v.b) +=
        cast<float>(s.paired_queries(s.c, v.i, v.h, v.b)) *
        cast<float>(s.paired_keys(s.c % 2, v.j, s.c / 2, kv_head_of(v, kv_group), v.b));
    const Expr factor = scale.defined() ? scale : 1.0f / sqrt(cast<float>(d));
    s.result(v.j, v.i, v.h, v.b) = s.dot(v.j, v.i, v.h, v.b) * factor;
    return s;
}

// An attention product per (head, batch row) as a tile product: left(feature, row, h, b) staged
// as strips, right(feature, column, key head, b) packed as tiles once per key head (`columns` of
// them), over the reduction's `features` (`k` its RDom); `names`: of the strips, the packed tiles
// and the product; `left_defined_past_features`: see bf16_strips.
inline HeadTileProduct head_tile_product(const StageVars &v, const Halide::Func &left,
                                         const Halide::Func &right, const Halide::Expr &features,
                                         const Halide::Expr &columns, const Halide::RDom &k,
                                         const Halide::Expr &kv_heads, const Halide::Expr &kv_group,
                                         const std::array<std::string, 3> &names,
                                         bool left_defined_past_features = false) {
    HeadTileProduct p;
    p.strips = bf16_strips(left, features, {v.h, v.b}, names[0], left_defined_past_features);
    p.packed = bf16_tiles(right, features, columns, kv_heads, names[1]);
    p.tiles = tile_product(p.strips, p.packed.tiles, features, k, {v.h, v.b},
                           tile_columns_offset(p.packed, kv_head_of(v, kv_group), kv_heads, v.b),
                           names[2]);
    return p;
}

// The same scores as a tile product (see tile_product): each head's query features staged as
// strips, its key features as tiles (computed once per key head), in f32 tiles of 16 keys x 16
// queries that `dot` reads; scale 1 / sqrt(d) unless given.
inline ScaledScores tiled_scaled_scores(const StageVars &v, const Halide::Func &q_heads,
                                        const Halide::Func &k_heads, const Halide::Expr &head_dim,
                                        const Halide::Expr &num_keys, const Halide::Expr &kv_heads,
                                        const Halide::Expr &kv_group,
                                        const Halide::Expr &scale = Halide::Expr()) {
    using namespace Halide;
    ScaledScores s;
    s.dot = Func("qk_dot");
    s.result = Func("scaled_scores");
    s.c = tile_slices(head_dim, "scores_c");
    s.tiled = head_tile_product(v, q_heads, k_heads, head_dim, num_keys, s.c, kv_heads, kv_group,
                                {"q_strips", "k_tiles", "qk_tiles"});
    s.dot(v.j, v.i, v.h, v.b) = tile_element(s.tiled.tiles, v.j, v.i, {v.h, v.b});
    const Expr factor = scale.defined() ? scale : 1.0f / sqrt(cast<float>(head_dim));
    s.result(v.j, v.i, v.h, v.b) = s.dot(v.j, v.i, v.h, v.b) * factor;
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
    Halide::Func lse;     // log of the sum of exp(masked) over keys: row_max + log(row_sum)
};

// The scores each part of the softmax reads: the same function, or equal copies that a schedule
// computes where each part needs them (a GPU block recomputes scores rather than hold a row).
struct ScoreSources {
    Halide::Func for_max, for_sum, for_weights;
};

// A row whose every key is blocked: the seed's (a blocked score is exactly -1e9, so such a row
// has uniform weights), or F.scaled_dot_product_attention's (a blocked key is left out of the
// softmax, as a score of -inf; such a row has weights 0, its log-sum-exp -inf).
enum class BlockedKeys { score_minus_1e9, left_out };

// What masks the scores: `blocking` (undefined: none) blocks a position where its byte is
// nonzero when `blocks_nonzero` (the TF article's 1 = blocked), where it is zero otherwise (the
// PyTorch article), so one pipeline serves both conventions; `additive` (undefined: none) is
// added to the scores (the TF article's mask·(-1e9) precomputed, PyTorch's float masks).
// Broadcasting is done by the caller's zero strides.
// `first_visible` and `visible_keys` (undefined: from the first key; to the last), expressions
// of the query row v.i (and of v.h, v.b), limit query i to keys first_visible <= j < visible_keys:
// the causal order, a sliding window. The softmax's and weights·V's reductions run there only
// (their reads clamped to the visible keys, so that bounds inference never asks for the scores of
// hidden keys), and hidden keys weigh exactly 0; a query that sees no key gets weights 0 and a zero
// context. The row reductions then run over blocks of `key_block` keys, the blocks outside the
// visible ones skipped whole: a schedule vectorizes across a block (rfactor) while the loop over
// blocks still starts and stops where the row does.
// Before the masks the scores may be modified: soft-capped to softcap · tanh(s / softcap) (Gemma
// 2; `softcap` undefined: never, 0 at run time: not), then ALiBi's -slope · |position - j| added
// (`alibi_slope` undefined: none), the slope and the query's position among the keys expressions
// of the row v.i and the head v.h.
struct ScoreMasks {
    Halide::Func blocking;
    Halide::Expr blocks_nonzero;
    Halide::Func additive;
    Halide::Expr first_visible, visible_keys;
    int key_block = 1;
    Halide::Expr softcap;
    Halide::Expr alibi_slope, query_position;
    BlockedKeys blocked = BlockedKeys::score_minus_1e9;
};

// tanh(x) from exp, whose Halide lowering is an inline vector polynomial: exact at 0 and
// saturating to ±1, about 1e-7 absolute in between.
inline Halide::Expr vector_tanh(const Halide::Expr &x) {
    return 1.0f - 2.0f / (Halide::exp(2.0f * x) + 1.0f);
}

// exp(x) for x <= 0 to 3e-6 relative, which the weights (rounded to bf16, 2^-9) do not see and
// the f32 log-sum-exp barely does: 2^n, n the nearest integer to x·log2(e) (truncating
// x·log2(e) - 1/2 toward zero: it is negative), times a degree-4 polynomial of 2^u, |u| <= 1/2,
// fitted for the least relative error with p(0) = 1 (a lone key weighs exactly 1; Taylor's
// coefficients of the same degree err by 5.6e-5); exactly 0 below -87 (a masked score), as exp
// is. (Not the round-by-adding-1.5·2^23 trick: Halide's simplifier treats float addition as
// associative and would cancel it.)
inline Halide::Expr bf16_exp(const Halide::Expr &x) {
    using namespace Halide;
    constexpr float kLowest = -87.0f, kLn2 = 0.69314718f;
    const Expr t = max(x, kLowest) * (1.0f / kLn2);
    const Expr n = cast<int32_t>(t - 0.5f);
    // 2^u as a polynomial in u, each step one multiply-add.
    const Expr u = t - cast<float>(n);
    constexpr float c1 = 0.693124175f, c2 = 0.240240991f, c3 = 0.0559064262f, c4 = 0.00958285294f;
    const Expr p = 1.0f + u * (c1 + u * (c2 + u * (c3 + u * c4)));
    const Expr two_to_n = reinterpret<float>((n + 127) << 23);
    return select(x < kLowest, 0.0f, p * two_to_n);
}

// `approximate_exp`: exponentials by bf16_exp.
inline MaskedSoftmax masked_softmax(const StageVars &v, const ScoreSources &scores,
                                    const ScoreMasks &masks, const Halide::Expr &num_keys,
                                    bool approximate_exp = false) {
    using namespace Halide;
    const bool left_out = masks.blocked == BlockedKeys::left_out;
    const auto masked_scores = [&](const Func &source, const std::string &name) {
        Func masked(name);
        Expr score = source(v.j, v.i, v.h, v.b);
        if (masks.softcap.defined()) {
            score = select(masks.softcap > 0.0f, masks.softcap * vector_tanh(score / masks.softcap),
                           score);
        }
        if (masks.alibi_slope.defined()) {
            score -= masks.alibi_slope * cast<float>(abs(masks.query_position - v.j));
        }
        if (masks.additive.defined()) {
            score += masks.additive(v.j, v.i, v.h, v.b);
        }
        if (masks.blocking.defined()) {
            Expr blocked = (masks.blocking(v.j, v.i, v.h, v.b) != 0) == (masks.blocks_nonzero != 0);
            score = select(blocked, left_out ? Float(32).min() : Expr(kMaskedScore), score);
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
                    RDom(0, num_keys, "sum_j"),
                    false,
                    Func("lse")};
    // The key each reduction reads, and whether a query sees it.
    Expr max_key = m.max_j.x, sum_key = m.sum_j.x, max_visible = true, sum_visible = true;
    // The visible keys of query v.i: [first, end).
    const Expr first = masks.first_visible.defined() ? masks.first_visible : Expr(0);
    const Expr end = masks.visible_keys;
    if (end.defined()) {
        m.causal = true;
        const int block = masks.key_block;
        const Expr blocks = (num_keys + block - 1) / block;
        m.max_j = RDom({{0, blocks}, {0, block}}, "max_j");
        m.sum_j = RDom({{0, blocks}, {0, block}}, "sum_j");
        for (RDom *r : {&m.max_j, &m.sum_j}) {
            if (masks.first_visible.defined()) {
                r->where(r->x >= first / block);
            }
            r->where(r->x < (end + block - 1) / block);
        }
        max_key = m.max_j.x * block + m.max_j.y;
        sum_key = m.sum_j.x * block + m.sum_j.y;
        max_visible = max_key >= first && max_key < end;
        sum_visible = sum_key >= first && sum_key < end;
        if (!masks.first_visible.defined()) {
            max_visible = max_key < end;
            sum_visible = sum_key < end;
        }
        // Bounds inference takes the key of a block bound by a predicate on the block to be
        // any key; promised to lie in the visible blocks (as the predicates ensure), the reads
        // ask for their scores only, and stay dense vector loads (a clamp makes them gathers).
        // Blocks of one key (GPU schedules) read as they are.
        if (block > 1) {
            const Expr lowest = first / block * block;
            const Expr highest = max((end + block - 1) / block * block - 1, lowest);
            max_key = unsafe_promise_clamped(max_key, lowest, highest);
            sum_key = unsafe_promise_clamped(sum_key, lowest, highest);
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
    const auto nan_preserving_exp = [approximate_exp](const Expr &x) {
        return select(is_nan(x), x, approximate_exp ? bf16_exp(x) : exp(x));
    };
    // exp(score - row max); a row whose keys are all left out has max -inf (Float(32).min()),
    // where the difference would be NaN: its exponentials are exp(-inf) = 0.
    const auto row_exp = [&](const Expr &score) {
        const Expr row_max = m.row_max(v.i, v.h, v.b);
        return nan_preserving_exp(left_out
                                      ? select(row_max == Float(32).min(), score, score - row_max)
                                      : score - row_max);
    };
    m.exps(v.j, v.i, v.h, v.b) = row_exp(m.masked(v.j, v.i, v.h, v.b));
    Func exps_for_sum = m.exps;
    if (!shared) {
        exps_for_sum = Func("exps_for_sum");
        exps_for_sum(v.j, v.i, v.h, v.b) = row_exp(masked_for_sum(v.j, v.i, v.h, v.b));
    }
    m.row_sum(v.i, v.h, v.b) = 0.0f;
    m.row_sum(v.i, v.h, v.b) += select(sum_visible, exps_for_sum(sum_key, v.i, v.h, v.b), 0.0f);
    // A row that no key weighs (every visible key left out) has weights 0; a NaN sum stays NaN.
    const Expr sum = m.row_sum(v.i, v.h, v.b);
    m.inv_sum(v.i, v.h, v.b) = left_out ? select(sum == 0.0f, 0.0f, 1.0f / sum) : 1.0f / sum;
    Expr weight = m.exps(v.j, v.i, v.h, v.b) * m.inv_sum(v.i, v.h, v.b);
    if (end.defined()) {
        weight = select(masks.first_visible.defined() ? v.j >= first && v.j < end : v.j < end,
                        weight, 0.0f);
    }
    m.weights(v.j, v.i, v.h, v.b) = weight;
    m.lse(v.i, v.h, v.b) =
        select(sum == 0.0f, Float(32).min(), m.row_max(v.i, v.h, v.b) + log(sum));
    return m;
}

// context(c, i, h, b) = sum_j weights(j, i, h, b) * v(c, j, h, b): [B, H, Sq, d].
struct AttendValues {
    Halide::Func result;
    Halide::RDom j;
    // The tiled form only (tiled_attend_values): the weights as strips, the values as tiles, the
    // product's tiles (result is their view).
    HeadTileProduct tiled;
    // The paired form only (attend_values with `paired`): the weights and the values in bf16.
    Halide::Func paired_weights, paired_values;
};
// Causal attention in blocks: with `visible_keys` (defined: keys j < visible_keys(i) only, see
// ScoreMasks), the rows of each block of `query_block` queries run over the blocks of
// `key_block` keys up to the block's last row's last visible key, one bound for the whole row
// block (visibility grows with i; the first visible key is the same for the block), which a
// schedule with tiles of whole row blocks turns into a loop bound. `weights` must be 0 for every
// hidden key up to a whole key block past the last visible one.
struct CausalBlocks {
    Halide::Func visible_keys;   // (i, h, b), or undefined: not causal
    Halide::Func first_visible;  // (i, h, b), or undefined: from the first key
    int key_block = 1, query_block = 1;
};
// With `paired`, as dot products over pairs of keys in bf16 accumulated in f32 (AVX512_BF16's
// vdpbf16ps): the weights as paired_weights(j, i, h, b), the values as
// paired_values(pair, c, j / 2, h, b), pairs innermost, both zero past the last key (the
// reduction runs to a whole pair).
inline AttendValues attend_values(const StageVars &v, const Halide::Func &weights,
                                  const Halide::Func &v_heads, const Halide::Expr &num_keys,
                                  const CausalBlocks &causal = {},
                                  const Halide::Expr &kv_group = Halide::Expr(),
                                  bool paired = false) {
    AttendValues a;
    a.result = Halide::Func("attend_values");
    a.j = Halide::RDom(0, paired ? (num_keys + 1) / 2 * 2 : num_keys, "values_j");
    Halide::Expr key = a.j.x;
    if (causal.visible_keys.defined()) {
        const int kb = causal.key_block, qb = causal.query_block;
        a.j = Halide::RDom({{0, (num_keys + kb - 1) / kb}, {0, kb}}, "values_j");
        const Halide::Expr blocks =
            (causal.visible_keys(v.i / qb * qb + qb - 1, v.h, v.b) + kb - 1) / kb;
        a.j.where(a.j.x < blocks);
        // Promised to lie in the visible blocks, as the predicates ensure: bounds inference then
        // asks for no weight outside them, and the key stays a plain index (a clamp would be
        // recomputed for every key of the register tile; see masked_softmax).
        Halide::Expr first_key = 0;
        if (causal.first_visible.defined()) {
            const Halide::Expr first_block = causal.first_visible(v.i / qb * qb, v.h, v.b) / kb;
            a.j.where(a.j.x >= first_block);
            first_key = first_block * kb;
        }
        // Blocks of one key (GPU schedules) keep the block's bounds: their register tiles need
        // constant extents.
        // Paired, the block is promised instead, so that the simplifier still sees a key's
        // place in its pair (key % 2) once the promise is lowered away.
        if (kb > 1 && paired) {
            const Halide::Expr first_block = first_key / kb;
            key = Halide::unsafe_promise_clamped(a.j.x, first_block,
                                                 Halide::max(blocks - 1, first_block)) *
                      kb +
                  a.j.y;
        } else if (kb > 1) {
            key = Halide::unsafe_promise_clamped(a.j.x * kb + a.j.y, first_key,
                                                 Halide::max(blocks * kb - 1, 0));
        } else if (causal.first_visible.defined()) {
            key = Halide::max(key, first_key);
        }
    }
    const Halide::Expr kv_head = kv_head_of(v, kv_group);
    a.result(v.c, v.i, v.h, v.b) = 0.0f;
    if (!paired) {
        a.result(v.c, v.i, v.h, v.b) +=
            weights(key, v.i, v.h, v.b) * v_heads(v.c, key, kv_head, v.b);
        return a;
    }
    using namespace Halide;
    const Expr zero = cast(BFloat(16), 0.0f);
    a.paired_weights = Func("paired_weights");
    a.paired_values = Func("paired_values");
    a.paired_weights(v.j, v.i, v.h, v.b) =
        select(v.j < num_keys, as_bf16(weights(v.j, v.i, v.h, v.b)), zero);
    Var pair("pair"), jp("jp");
    const Expr value_key = 2 * jp + pair;
    a.paired_values(pair, v.c, jp, v.h, v.b) = select(
        value_key < num_keys, as_bf16(v_heads(v.c, min(value_key, num_keys - 1), v.h, v.b)), zero);
    a.result(v.c, v.i, v.h, v.b) +=
        cast<float>(a.paired_weights(key, v.i, v.h, v.b)) *
        cast<float>(a.paired_values(key % 2, v.c, key / 2, kv_head, v.b));
    return a;
}

// The same weights·V as a tile product: each query tile's weights staged as bf16 strips over the
// keys (keys past the last read as zero), each key head's values as tiles, in f32 tiles of 16
// features x 16 queries; with `bf16_result`, the context rounded to bf16 (what the output
// projection reads), else a plain view of the tiles. With `causal` visible keys, a query tile
// reads the slices of keys from its first row's first visible key to its last row's last only:
// every other key weighs exactly 0 for each of its rows. `weights_past_keys`: the weights may be
// read past the last key (see bf16_strips).
inline AttendValues tiled_attend_values(const StageVars &v, const Halide::Func &weights,
                                        const Halide::Func &v_heads, const Halide::Expr &head_dim,
                                        const Halide::Expr &num_keys, const Halide::Expr &kv_heads,
                                        const Halide::Expr &kv_group, bool bf16_result,
                                        const CausalBlocks &causal, bool weights_past_keys) {
    using namespace Halide;
    const int width = contract::kBf16TileWidth, depth = contract::kBf16TileDepth;
    AttendValues a;
    a.result = Func("attend_values");
    a.j = tile_slices(num_keys, "values_j");
    const Expr first_row = tile_product_row_tile() * width;
    if (causal.visible_keys.defined()) {
        a.j.where(a.j.y <
                  (causal.visible_keys(first_row + width - 1, v.h, v.b) + depth - 1) / depth);
    }
    if (causal.first_visible.defined()) {
        a.j.where(a.j.y >= causal.first_visible(first_row, v.h, v.b) / depth);
    }
    Func values_by_key("values_by_key");
    values_by_key(v.j, v.c, v.h, v.b) = v_heads(v.c, v.j, v.h, v.b);
    a.tiled =
        head_tile_product(v, weights, values_by_key, num_keys, head_dim, a.j, kv_heads, kv_group,
                          {"weight_strips", "v_tiles", "pv_tiles"}, weights_past_keys);
    const Expr context = tile_element(a.tiled.tiles, v.c, v.i, {v.h, v.b});
    a.result(v.c, v.i, v.h, v.b) = bf16_result ? rounded_to_bf16(context) : context;
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
