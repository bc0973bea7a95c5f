// CPU SIMD schedules for the forward pass of generators/mha_forward.h. The algorithm never
// changes here: only where each stage is computed, how its loops are split, vectorized,
// unrolled and parallelized.
//
// Intermediate stages are computed in whole tiles (TailStrategy::RoundUp), which the algorithm
// makes safe (see mha_forward.h): register tiles then have constant sizes and live in registers.
// Only the pipeline's outputs are written with guarded tails.
#pragma once

#include <algorithm>
#include <tuple>
#include <utility>
#include <vector>

#include "Halide.h"
#include "cpu_params.h"
#include "mha_decode.h"
#include "mha_forward.h"

namespace mha::cpu {

// What a parallel loop does, for the `parallel` tunable: streaming loops read weights or a KV
// cache once (projections, a decode step's pass over the cache), which every core reading its
// share speeds up even for one token; the other stages of a small call are too short to pay for
// waking the other cores.
enum class LoopWork { streaming, other };

// Runs loop `var` of `stage` on the thread pool if the `parallel` tunable says so for its work:
// 0 keeps the whole call on one core, 1 forks the streaming loops only, 2 every stage.
inline void fork_over_cores(Halide::Stage stage, const Halide::VarOrRVar &var,
                            const ScheduleParams &sp, LoopWork work = LoopWork::other) {
    if (sp.parallel >= (work == LoopWork::streaming ? 1 : 2)) {
        stage.parallel(var);
    }
}

// An accumulator computed whole inside one register tile at `at`: both definitions vectorized
// along `cols` and unrolled along `rows`, the update's reduction variables `k` (innermost first)
// outside the tile. With `pairs` (a product of bf16 pairs, paired_scaled_scores), the innermost
// one is taken two at a time inside each vector, which Halide emits as one vdpbf16ps.
inline void schedule_register_tile(Halide::Func acc, const Halide::LoopLevel &at,
                                   const Halide::Var &cols, const Halide::Var &rows,
                                   std::vector<Halide::RVar> k, int vec, bool pairs = false) {
    using namespace Halide;
    acc.compute_at(at)
        .store_in(MemoryType::Register)
        .vectorize(cols, vec)
        .unroll(cols)
        .unroll(rows);
    Stage update = acc.update();
    std::vector<VarOrRVar> order = {cols, rows};
    RVar pair("pair"), pairs_of_k("pairs_of_k");
    if (pairs) {
        update.split(k[0], pairs_of_k, pair, 2);
        k[0] = pairs_of_k;
        order.insert(order.begin(), pair);
    }
    order.insert(order.end(), k.begin(), k.end());
    update.reorder(order);
    if (pairs) {
        update.atomic().vectorize(pair);
    }
    update.vectorize(cols, vec).unroll(cols).unroll(rows);
}

// A projection (init + update over k) as a register-tiled GEMM: a wrapper computed in whole
// tiles, each accumulating proj_vectors x proj_rows outputs in registers over all of k. Calls
// with fewer rows than a tile (a token, a decode step) get tiles of just 1, 2 or 4 rows: one
// row in a tile of 12 would multiply the weights twelve times for one real result.
inline Halide::Func schedule_projection(const StageVars &v, Projection &p,
                                        const ScheduleParams &sp) {
    using namespace Halide;
    const auto whole = TailStrategy::RoundUp;
    const int cols = sp.vector_lanes * sp.proj_vectors;
    // Blocked like a BLAS: a task takes one panel of weight columns and a block of rows, and
    // sweeps the block's row tiles while the panel stays in cache.
    Var eo("eo"), ei("ei"), rb("rb"), ro("ro"), ri("ri"), t("t");
    Func tiles = p.result.in();
    // Tiles start on weight panel boundaries, so that each reads one panel with dense loads.
    tiles.compute_root().align_bounds(v.e, contract::kWeightPanel);
    const auto tile = [&](Stage stage, int rows) {
        stage.split(v.e, eo, ei, cols, whole)
            .split(v.r, ro, ri, rows, whole)
            .split(ro, rb, ro, sp.proj_block_tiles, TailStrategy::GuardWithIf)
            .reorder(ei, ri, ro, eo, rb)
            .fuse(eo, rb, t)
            .vectorize(ei, sp.vector_lanes)
            .unroll(ei)
            .unroll(ri);
        fork_over_cores(stage, t, sp, LoopWork::streaming);
    };
    for (int rows : {1, 2, 4}) {
        if (rows < sp.proj_rows) {
            tile(tiles.specialize(p.row_count <= rows), rows);
        }
    }
    tile(tiles, sp.proj_rows);
    schedule_register_tile(p.result, LoopLevel(tiles, ro), v.e, v.r, {p.k.x}, sp.vector_lanes);
    return tiles;
}

// A tile product (tile_product) read by `consumer` whose loop `at` runs over one output tile (or
// `column_tiles` side by side), as the instruction set's bf16 products do it
// (ScheduleParams::bf16_products): the tile accumulated over every slice, then stored into a
// 16 x 16 stack buffer that the consumer reads, or with `stored_by_consumer` straight into the
// consumer, which must be a plain view of the tiles over one whole tile, vectorized (AMX) or
// its rows vectorized and unrolled (dot products).
// Every index of the tile is then a constant:
// - on the matrix engine (x86 AMX), in a tile register, as the AMX lowering needs;
// - as vdpbf16ps dot products, in 16 vector registers, one per row of 16 f32 lanes, each step of
//   a pair of reduction features one instruction per row, the row's pair broadcast against the
//   16 columns' pairs (the right operand's layout, pairs innermost). With `column_tiles` > 1,
//   that many adjacent tiles at once, each in row blocks of 16 / column_tiles: a broadcast pair
//   serves one product per tile (on Zen 4 a load per product bounded the 16 x 16 tile).
// Consumers read whole tiles through the product's % and / views.
inline void schedule_tile_product(Halide::Func acc, const Halide::RDom &k, Halide::Func consumer,
                                  const Halide::Var &at, contract::Bf16Products products,
                                  bool stored_by_consumer = false, int column_tiles = 1) {
    using namespace Halide;
    const std::vector<Var> tile = acc.args();  // (lane, row, column tile, row tile, outer...)
    const bool dot_pairs = products == contract::Bf16Products::dot_pairs;
    LoopLevel tile_level(consumer, at);
    if (!stored_by_consumer) {
        Func copy = acc.in(consumer);
        copy.compute_at(consumer, at).store_in(MemoryType::Stack);
        copy.bound_storage(tile[2], column_tiles);
        for (size_t d = 3; d < tile.size(); d++) {
            copy.bound_storage(tile[d], 1);
        }
        copy.align_storage(tile[0], 2 * contract::kBf16TileWidth).vectorize(tile[0]);
        if (dot_pairs) {
            copy.unroll(tile[1]);
        } else {
            copy.vectorize(tile[1]);
        }
        tile_level = LoopLevel(copy, tile[2]);
        if (column_tiles > 1) {
            Var half("half"), rows("rows");
            copy.split(tile[1], half, rows, contract::kBf16TileWidth / column_tiles)
                .reorder(tile[0], rows, tile[2], half);
            tile_level = LoopLevel(copy, half);
        }
    }
    if (dot_pairs) {
        // Every index of the tile a constant, so that its 16 rows stay in registers: a consumer
        // that reads it at computed indices would leave it on the stack, each dot product
        // loading and storing its row.
        RVar pairs("pairs"), pair("pair");
        acc.compute_at(tile_level)
            .store_in(MemoryType::Register)
            .vectorize(tile[0])
            .unroll(tile[1]);
        // Several column tiles: all of them inside each step of pairs, as one register block.
        const size_t inner = column_tiles > 1 ? 3 : 2;
        std::vector<VarOrRVar> order(tile.begin(), tile.begin() + inner);
        order.insert(order.begin(), pair);
        order.insert(order.end(), {pairs, k.y});
        order.insert(order.end(), tile.begin() + inner, tile.end());
        Stage update = acc.update();
        update.split(k.x, pairs, pair, 2)
            .reorder(order)
            .atomic()
            .vectorize(pair)
            .vectorize(tile[0])
            .unroll(tile[1]);
        if (column_tiles > 1) {
            acc.unroll(tile[2]);
            update.unroll(tile[2]);
        }
        return;
    }
    acc.compute_at(tile_level).store_in(MemoryType::AMXTile).vectorize(tile[0]).vectorize(tile[1]);
    std::vector<VarOrRVar> order = {k.x, tile[0], tile[1], k.y};
    order.insert(order.end(), tile.begin() + 2, tile.end());
    acc.update().reorder(order).atomic().vectorize(k.x).vectorize(tile[0]).vectorize(tile[1]);
}

// A projection in the tiled form (tiled_projection) in bf16 products: a task per run of up
// to 4 strips of 16 token rows, staged once in bf16, and share of the output's column tiles,
// each output tile a tile product; the strips of a task take each column of weight tiles in
// turn, so that all but the first read it from L1. Runs are shorter where that leaves fewer
// than 8 tasks; with fewer than 8 strips (short batches, decode steps), the column tiles are
// shared out among the tasks instead, so that every core streams its part of the weights. The
// outputs are computed over whole tiles from 0 (the rows rounded up; the features are padded).
inline void schedule_tiled_projection(const StageVars &v, Projection &p, const ScheduleParams &sp) {
    using namespace Halide;
    const int width = contract::kBf16TileWidth, tasks = 8;
    // Dot products: two column tiles at once (8 rows of each), so that each row's broadcast
    // pair serves two products; out_features, padded to kMaxTile, holds whole pairs of tiles.
    const int column_tiles = sp.bf16_products == contract::Bf16Products::dot_pairs ? 2 : 1;
    Var ro("ro"), ri("ri"), rb("rb"), eo("eo"), ei("ei"), ec("ec");
    const std::vector<Var> strip = p.strips.args();  // (feature, row, slice, strip)
    const Expr run = clamp(p.row_count / (tasks * width), 1, 4);
    const Expr row_tasks = (p.row_count + run * width - 1) / (run * width);
    const Expr column_blocks = p.out_features / (width * column_tiles);
    const Expr column_tasks = clamp(tasks / row_tasks, 1, column_blocks);
    p.result.compute_root()
        .bound(v.e, 0, p.out_features)
        .bound(v.r, 0, contract::round_up(p.row_count, width));
    const auto schedule_tasks = [&](Stage stage, bool share_columns) {
        stage.split(v.r, ro, ri, width)
            .split(ro, rb, ro, run, TailStrategy::GuardWithIf)
            .split(v.e, eo, ei, width * column_tiles);
        if (share_columns) {
            stage
                .split(eo, ec, eo, (column_blocks + column_tasks - 1) / column_tasks,
                       TailStrategy::GuardWithIf)
                .reorder(ei, ri, ro, eo, ec, rb);
            fork_over_cores(stage, ec, sp, LoopWork::streaming);
        } else {
            stage.reorder(ei, ri, ro, eo, rb);
        }
        stage.vectorize(ei);
        fork_over_cores(stage, rb, sp, LoopWork::streaming);
    };
    schedule_tasks(p.result.specialize(row_tasks < tasks), true);
    schedule_tasks(p.result, false);
    p.strips.compute_at(p.result, rb).vectorize(strip[0], contract::kBf16TileDepth);
    schedule_tile_product(p.tiles, p.k, p.result, ro, sp.bf16_products, false, column_tiles);
}

// The masked softmax of an attention tile computed at `tile_loop` of `owner` (its buffers stored
// at `task_loop`): the row statistics, rfactored into vector-wide partial results; the
// exponentials.
inline void schedule_softmax_tile(const StageVars &v, MaskedSoftmax &sm, Halide::Func owner,
                                  const Halide::Var &task_loop, const Halide::Var &tile_loop,
                                  const ScheduleParams &sp) {
    using namespace Halide;
    const int vec = sp.vector_lanes;
    for (auto [row, r] : {std::pair{sm.row_max, sm.max_j}, {sm.row_sum, sm.sum_j}}) {
        RVar rjo("rjo"), rji("rji");
        Var lane("lane");
        row.store_at(owner, task_loop).compute_at(owner, tile_loop);
        // Causal rows reduce over blocks of one vector's keys (ScoreMasks::key_block), whose
        // lanes become the partial results: split here instead, the visibility predicate would
        // guard every lane and keep the loop over every key.
        Func partial = sm.causal ? row.update().rfactor(r.y, lane)
                                 : row.update().split(r.x, rjo, rji, vec).rfactor(rji, lane);
        partial.compute_at(owner, tile_loop).reorder_storage(lane, v.i, v.h, v.b).vectorize(lane);
        partial.update().vectorize(lane);
    }
    sm.exps.store_at(owner, task_loop)
        .compute_at(owner, tile_loop)
        .vectorize(v.j, vec, TailStrategy::RoundUp);
    sm.inv_sum.store_at(owner, task_loop).compute_at(owner, tile_loop);
}

// The attention tile computed at `tile_loop` of `owner` (its buffers stored at `task_loop`):
// Q·Kᵀ for the tile's query rows against every key, in register tiles of qk_vectors x
// `qk_rows` (with shared_keys, each column of keys taken by all the tile's rows while in L1);
// the masked softmax (schedule_softmax_tile). Returns the Q·Kᵀ tile buffer.
inline Halide::Func schedule_attention_tile(const StageVars &v, ScaledScores &scores,
                                            MaskedSoftmax &sm, Halide::Func owner,
                                            const Halide::Var &task_loop,
                                            const Halide::Var &tile_loop, int qk_rows,
                                            const ScheduleParams &sp) {
    using namespace Halide;
    const int vec = sp.vector_lanes;
    const auto whole = TailStrategy::RoundUp;
    Func score_tiles = scores.dot.in();
    Var jo("jo"), ji("ji"), qio("qio"), qii("qii");
    const bool shared = sp.shared_keys > 0;
    score_tiles.store_at(owner, task_loop).compute_at(owner, tile_loop);
    score_tiles.split(v.j, jo, ji, vec * sp.qk_vectors, whole)
        .split(v.i, qio, qii, qk_rows, whole)
        .reorder(ji, qii, shared ? qio : jo, shared ? jo : qio)
        .vectorize(ji, vec)
        .unroll(ji)
        .unroll(qii);
    const bool pairs = scores.paired_queries.defined();
    schedule_register_tile(scores.dot, LoopLevel(score_tiles, shared ? qio : jo), v.j, v.i,
                           {scores.c.x}, vec, pairs);
    if (pairs) {
        scores.paired_queries.store_at(owner, task_loop)
            .compute_at(owner, tile_loop)
            .vectorize(v.c, 2 * vec, whole);
    }
    schedule_softmax_tile(v, sm, owner, task_loop, tile_loop, sp);
    return score_tiles;
}

// The attention weights as the pipeline's output, computed once in tiles of `rows` queries, a run
// of `tiles_per_task` tiles per task. Returns its (task, tile) loops, where each tile's scores and
// softmax go.
inline std::pair<Halide::Var, Halide::Var> schedule_weights_output(
    const StageVars &v, MaskedSoftmax &sm, int rows, const Halide::Expr &tiles_per_task,
    const ScheduleParams &sp) {
    using namespace Halide;
    const auto guard = TailStrategy::GuardWithIf;
    Var wo("wo"), wi("wi"), wp("wp"), wot("wot");
    sm.weights.compute_root()
        .split(v.i, wo, wi, rows, guard)
        .split(wo, wp, wot, tiles_per_task, guard)
        .reorder(v.j, wi, wot, wp, v.h, v.b)
        .vectorize(v.j, sp.vector_lanes, guard);
    for (const Var &task : {wp, v.h, v.b}) {
        fork_over_cores(sm.weights, task, sp);
    }
    return {wp, wot};
}

// The attention core in the tiled form (tiled_scaled_scores, tiled_attend_values) in bf16
// products, per (batch x head, tile of 16 queries): the tile's queries staged as bf16 strips, its
// scores against every key as tile products, the masked softmax in f32, its weights staged as bf16
// strips, weights·V as tile products. Keys and values are packed as tiles once per call. Without
// weights requested no [B, H, Sq, Sk] tensor exists; with them, the softmax is the weights
// output's, per row tile, and weights·V reads them back. What is computed at root in those tiles,
// in merged-head order: the core's context (`context_reader` null), or `context_reader`, a Func
// of the context (a plain view of the tiles then, stored into at each tile) and the softmax's row
// statistics.
inline void schedule_tiled_attention(const StageVars &v, CoreStages &core,
                                     const Halide::Func *context_reader,
                                     const Halide::Expr &query_len, const Halide::Expr &value_dim,
                                     const Halide::Expr &mask_keys_dense, bool weights_are_output,
                                     const ScheduleParams &sp) {
    using namespace Halide;
    const int width = contract::kBf16TileWidth;
    const auto guard = TailStrategy::GuardWithIf;
    const Expr query_tiles = (query_len + width - 1) / width;
    const Expr tiles_per_task = max(1, (query_tiles + sp.tasks_per_head - 1) / sp.tasks_per_head);
    ScaledScores &scores = core.scores;
    AttendValues &context = core.context;
    MaskedSoftmax &sm = core.softmax;

    // Keys and values packed as tiles, in loops that read the projections' token rows in order:
    // a tile's pairs innermost, then the features (of K: its slices; of V: its column tiles) and
    // the heads, the tokens outermost (of K: its column tiles; of V: its slices). The run-time
    // divisions that find a tile's place then run once per tile.
    for (const auto &[packed, tokens_are_columns] :
         {std::pair{scores.tiled.packed, true}, {context.tiled.packed, false}}) {
        Func tiles = packed.tiles;
        const std::vector<Var> t = tiles.args();  // (pair, lane, index)
        Var pl("pl"), tile("tile"), pairs("pairs"), slice("slice"), column("column");
        Var head("head"), column_tile("column_tile");
        const auto whole = TailStrategy::RoundUp;
        tiles.compute_root()
            .fuse(t[0], t[1], pl)
            .vectorize(pl)
            .split(t[2], tile, pairs, contract::kBf16TileDepth / 2, whole)
            .split(tile, column, slice, packed.slices, whole)
            .split(column, head, column_tile, packed.column_tiles, whole);
        const Var &token = tokens_are_columns ? column_tile : slice;
        const Var &feature = tokens_are_columns ? slice : column_tile;
        tiles.reorder(pl, pairs, feature, head, token);
        fork_over_cores(tiles, token, sp);
    }

    // weights·V, stored in merged-head order for the output projection.
    Func values = context_reader != nullptr ? *context_reader : context.result;
    Var io("io"), ii("ii"), iop("iop"), iot("iot"), co("co"), ci("ci"), task("task");
    values.compute_root()
        .bound(v.c, 0, contract::round_up(value_dim, width))
        .align_bounds(v.i, width)
        .reorder_storage(v.c, v.h, v.i, v.b)
        .split(v.i, io, ii, width)
        .split(io, iop, iot, tiles_per_task, guard)
        .split(v.c, co, ci, width)
        .reorder(ci, ii, co, iot, iop, v.h, v.b)
        .vectorize(ci)
        // One flat loop of tasks over the runs of query tiles, heads and batch rows: nested
        // parallel loops waited at the end of each head's.
        .fuse(iop, v.h, task)
        .fuse(task, v.b, task);
    fork_over_cores(values, task, sp);
    if (context_reader == nullptr) {
        schedule_tile_product(context.tiled.tiles, context.j, values, co, sp.bf16_products);
    } else {
        // (Only AMX runs the attention kernels' tiled form.) Rows 2 tiles wide: the tile store
        // wants row strides (a 16-wide buffer is one ramp).
        Var tile_c("tile_c"), tile_i("tile_i");
        context.result.compute_at(values, co)
            .align_bounds(v.c, width)
            .align_bounds(v.i, width)
            .align_storage(v.c, 2 * width)
            .split(v.c, tile_c, v.c, width)
            .split(v.i, tile_i, v.i, width)
            .reorder(v.c, v.i, tile_c, tile_i)
            .vectorize(v.c)
            .vectorize(v.i);
        schedule_tile_product(context.tiled.tiles, context.j, context.result, tile_c,
                              sp.bf16_products, true);
    }
    context.tiled.strips.store_at(values, task)
        .compute_at(values, iot)
        .fold_storage(context.tiled.strips.args()[3], 1)
        .vectorize(context.tiled.strips.args()[0]);

    // Scores and softmax per tile of 16 queries: of weights·V, or of the weights output.
    Func owner = values;
    Var tile_loop = iot, task_loop = task;
    if (weights_are_output) {
        owner = sm.weights;
        std::tie(task_loop, tile_loop) = schedule_weights_output(v, sm, width, tiles_per_task, sp);
    }
    Var jo("jo"), ji("ji"), qo("qo"), qi("qi"), jp("jp");
    scores.dot.store_at(owner, task_loop)
        .compute_at(owner, tile_loop)
        .align_bounds(v.j, width)
        .align_bounds(v.i, width)
        .split(v.j, jo, ji, width)
        .split(v.i, qo, qi, width)
        // Key tiles in unrolled pairs, two tile products in flight: one product's few slices
        // (2 for 64 features), chained in one accumulator, leave the engine waiting on them.
        .split(jo, jp, jo, 2, guard)
        .reorder(ji, qi, jo, jp, qo)
        .vectorize(ji)
        .unroll(jo);
    // A tile register is stored whole; vector registers hold a tile's rows, one store each (a
    // 256-lane store of the tile would scatter across the rows of the scores).
    if (sp.bf16_products == contract::Bf16Products::dot_pairs) {
        scores.dot.unroll(qi);
    } else {
        scores.dot.vectorize(qi);
    }
    schedule_tile_product(scores.tiled.tiles, scores.c, scores.dot, jo, sp.bf16_products, true);
    scores.tiled.strips.store_at(owner, task_loop)
        .compute_at(owner, tile_loop)
        .fold_storage(scores.tiled.strips.args()[3], 1)
        .vectorize(scores.tiled.strips.args()[0]);
    schedule_softmax_tile(v, sm, owner, task_loop, tile_loop, sp);
    // A task's tiles reuse one tile's worth of storage.
    for (Func tile_buffer : {scores.dot, sm.exps, sm.row_max, sm.row_sum, sm.inv_sum}) {
        tile_buffer.fold_storage(v.i, width);
    }
    if (mask_keys_dense.defined()) {
        owner.specialize(mask_keys_dense);
    }
}

// weights·V of an attention tile computed at `tile_loop` of `owner`, in blocks of shared_keys keys:
// per block, register tiles of pv_vectors x pv_rows (the block's partial sums, an rfactor over
// the blocks) for every row of the tile while the block's values stay in L1, added to the tile's
// context in memory.
inline void schedule_key_blocked_values(const StageVars &v, AttendValues &context, bool causal,
                                        Halide::Func owner, const Halide::Var &tile_loop,
                                        const ScheduleParams &sp) {
    using namespace Halide;
    const int vec = sp.vector_lanes;
    const auto whole = TailStrategy::RoundUp;
    // Causal rows count keys in blocks of one vector (CausalBlocks): j.x runs over those.
    const int per_block = causal ? sp.shared_keys / vec : sp.shared_keys;
    RVar block("block"), in_block("in_block");
    Var block_index("block_index"), co("co"), ci("ci"), io("io"), ii("ii");
    Func tile = context.result;
    Func partial =
        tile.update().split(context.j.x, block, in_block, per_block).rfactor(block, block_index);
    tile.compute_at(owner, tile_loop).vectorize(v.c, vec, whole);
    tile.update()
        .split(v.c, co, ci, vec * sp.pv_vectors, whole)
        .split(v.i, io, ii, sp.pv_rows, whole)
        .reorder(ci, ii, io, co, block)
        .vectorize(ci, vec)
        .unroll(ci)
        .unroll(ii);
    const std::vector<RVar> keys =
        causal ? std::vector<RVar>{context.j.y, in_block} : std::vector<RVar>{in_block};
    schedule_register_tile(partial, LoopLevel(tile, io), v.c, v.i, keys, vec,
                           context.paired_values.defined());
}

// Where the attention core's tile buffers live: the loops of a task and of its tiles, of `owner`.
struct AttentionTiles {
    Halide::Func owner;
    Halide::Var task, tile;
};

// The attention core (mha_attention.h) per (batch x head, query tile): Q·Kᵀ for the tile's rows
// against every key it sees, the masked softmax and weights·V all stay in tile-sized buffers, so
// without weights requested no [B, H, Sq, Sk] tensor exists. With `weights_are_output`,
// softmax.weights is the pipeline's weights output, written once, and weights·V reads it back.
// `context_tiles` is what the pipeline reads of the context (a wrapper of core.context.result, or
// a Func of it and the softmax's row statistics): computed at root in register tiles, in
// merged-head order. `k_heads` and `v_heads` are copied here (compute_root); `keys_padded`: K's
// heads may be read up to a whole vector of features past head_dim (the projections' padded
// features), not past the end of a caller's tensor.
inline AttentionTiles schedule_attention(const StageVars &v, CoreStages &core,
                                         Halide::Func context_tiles, Halide::Func k_heads,
                                         Halide::Func v_heads, const Halide::Expr &query_len,
                                         const Halide::Expr &num_keys,
                                         const Halide::Expr &mask_keys_dense,
                                         bool weights_are_output, bool keys_padded,
                                         const ScheduleParams &sp) {
    using namespace Halide;
    const int vec = sp.vector_lanes;
    const auto whole = TailStrategy::RoundUp;
    const auto guard = TailStrategy::GuardWithIf;
    // Each task's tile buffers are allocated once, so a fixed number of tasks per head keeps
    // the allocations per call independent of the sequence length.
    const Expr query_tiles = (query_len + sp.attention_rows - 1) / sp.attention_rows;
    const Expr tiles_per_task = max(1, (query_tiles + sp.tasks_per_head - 1) / sp.tasks_per_head);
    // K is stored key-major inside each head, so Q·Kᵀ vectorizes over keys with dense loads.
    // Its rows (one per head feature) are kept off multiples of 4 KiB apart, which would alias in
    // L1 while Q·Kᵀ walks down the features.
    Var so("so"), si("si"), hb("hb"), co_copy("co_copy"), ci_copy("ci_copy"), hb_copy("hb_copy");
    const int key_cols = vec * sp.qk_vectors;
    // Q·Kᵀ's whole tiles reach past the last key by up to a tile. With a window they start at
    // each query tile's first visible key, and bounds inference, which takes that start and the
    // tiles' extent as independent, asks for up to twice the keys: a copy of O(Sk·d) against
    // the window's O(Sq·W·d).
    const Expr tiles = (num_keys + key_cols - 1) / key_cols;
    const Expr key_tiles = core.windowed ? 2 * tiles + 1 : tiles;
    // V is copied head-major, so weights·V streams each head's values contiguously instead of
    // striding across the projection's rows (page-sized strides defeat the prefetchers).
    // Products of bf16 pairs copy K and V in their paired layouts instead, in bf16.
    const bool pairs = core.scores.paired_keys.defined();
    if (pairs) {
        Func keys = core.scores.paired_keys, values = core.context.paired_values;
        const std::vector<Var> k = keys.args(), w = values.args();  // (pair, ·, ·, h, b)
        keys.compute_root()
            .bound(v.j, 0, key_tiles * key_cols + vec)
            .split(v.j, so, si, vec, whole)
            .reorder(k[0], si, k[2], so, v.h, v.b)
            .fuse(v.h, v.b, hb)
            .vectorize(k[0])
            .vectorize(si);
        values.compute_root()
            .split(v.c, co_copy, ci_copy, vec, whole)
            .reorder(w[0], ci_copy, co_copy, w[2], v.h, v.b)
            .fuse(v.h, v.b, hb_copy)
            .vectorize(w[0])
            .vectorize(ci_copy);
        fork_over_cores(keys, hb, sp);
        fork_over_cores(values, hb_copy, sp);
    } else {
        // With `keys_padded` (a head's features readable up to a whole vector past head_dim),
        // K is transposed in blocks of vec x vec, loaded along the features and stored along
        // the keys through registers; else gathered a vector of keys at a time, a scalar load
        // per key (16 % of a one-token call, which copies whole tiles of keys).
        Func keys = k_heads;
        Var fo("fo"), fi("fi");
        if (keys_padded) {
            keys = k_heads.in();
            k_heads.compute_at(keys, so)
                .store_in(MemoryType::Register)
                .bound_extent(v.c, vec)
                .bound_extent(v.s, vec)
                .bound_extent(v.h, 1)
                .bound_extent(v.b, 1)
                .vectorize(v.c)
                .unroll(v.s);
        }
        keys.compute_root()
            .bound(v.s, 0, key_tiles * key_cols + vec)
            .reorder_storage(v.s, v.c, v.h, v.b)
            .split(v.s, so, si, vec, whole);
        if (keys_padded) {
            keys.split(v.c, fo, fi, vec, whole).reorder(si, fi, so, fo, v.h, v.b).unroll(fi);
        } else {
            keys.reorder(si, v.c, so, v.h, v.b);
        }
        keys.fuse(v.h, v.b, hb).vectorize(si);
        fork_over_cores(keys, hb, sp);
        v_heads.compute_root()
            .split(v.c, co_copy, ci_copy, vec, whole)
            .fuse(v.h, v.b, hb_copy)
            .vectorize(ci_copy);
        fork_over_cores(v_heads, hb_copy, sp);
    }

    // weights·V: register tiles of (feature, query), accumulating in registers.
    Var io("io"), ii("ii"), iop("iop"), iot("iot");
    Var co("co"), ci("ci"), pio("pio"), pii("pii");
    const int pv_cols = vec * sp.pv_vectors;
    // Heads and batches are separate parallel loops, not fused: through a fused loop's
    // modulus, bounds inference would widen each register tile to every head.
    // Stored in merged-head order, so that the output projection reads each token's features
    // contiguously.
    context_tiles.compute_root().reorder_storage(v.c, v.h, v.i, v.b);
    const auto tile = [&](Stage stage, int rows, int pv_rows) {
        stage.split(v.i, io, ii, rows, whole)
            .split(io, iop, iot, tiles_per_task, guard)
            .split(v.c, co, ci, pv_cols, whole)
            .split(ii, pio, pii, pv_rows, whole)
            .reorder(ci, pii, co, pio, iot, iop, v.h, v.b)
            .vectorize(ci, vec)
            .unroll(ci)
            .unroll(pii);
        for (const Var &task : {iop, v.h, v.b}) {
            fork_over_cores(stage, task, sp);
        }
    };
    tile(context_tiles, sp.attention_rows, sp.pv_rows);
    // Causal: the keys of one block (j.y) inside the block loop (j.x), whose bound is the row
    // tile's (CausalBlocks).
    const std::vector<RVar> keys = core.softmax.causal
                                       ? std::vector<RVar>{core.context.j.y, core.context.j.x}
                                       : std::vector<RVar>{core.context.j.x};
    if (sp.shared_keys == 0) {
        schedule_register_tile(core.context.result, LoopLevel(context_tiles, co), v.c, v.i, keys,
                               vec, pairs);
    } else {
        schedule_key_blocked_values(v, core.context, core.softmax.causal, context_tiles, iot, sp);
    }

    // Scores and softmax live in tile buffers allocated once per task: per attention tile of
    // weights·V, or per row block of the weights output when the caller asked for the weights.
    MaskedSoftmax &sm = core.softmax;
    Func tile_owner = context_tiles;
    Var tile_loop = iot, task_loop = iop;
    if (weights_are_output) {
        tile_owner = sm.weights;
        std::tie(task_loop, tile_loop) =
            schedule_weights_output(v, sm, sp.attention_rows, tiles_per_task, sp);
    } else if (sp.materialize_weights || pairs) {
        // Paired, the weights are stored in bf16, rounded once.
        Func weights = pairs ? core.context.paired_weights : sm.weights;
        weights.store_at(context_tiles, iop)
            .compute_at(context_tiles, iot)
            .vectorize(v.j, vec, whole)
            .fold_storage(v.i, sp.attention_rows);
    }

    const Func score_tiles = schedule_attention_tile(v, core.scores, sm, tile_owner, task_loop,
                                                     tile_loop, sp.qk_rows, sp);
    // A task's tiles reuse one tile's worth of storage.
    for (Func tile_buffer : {score_tiles, sm.exps, sm.row_max, sm.row_sum, sm.inv_sum}) {
        tile_buffer.fold_storage(v.i, sp.attention_rows);
    }
    // The caller chooses the mask's key stride (zero broadcasts a mask over keys): the common
    // dense case, a key-padding or [Sq, Sk] mask, gets its own copy of the attention loops in
    // which mask loads are vectors rather than gathers.
    if (mask_keys_dense.defined()) {
        tile_owner.specialize(mask_keys_dense);
    }
    return {tile_owner, task_loop, tile_loop};
}

// The attention core for one query per head (a decode step), reading K and V where they lie:
// for one row, the copies of schedule_attention would cost three times the reads of the step.
// Its rows are the query heads that share a key/value head (`rows` of them, the generator's
// fold), taken kRowTile at a time, so that each K and V row read serves the whole tile; tasks
// are (row tile, key/value head, batch row). Each score a dot product along the head's
// features, vectorized across them (rfactor), for a few keys of every row at a time; each row's
// keys then summed across their lanes together, as one partial vector reduction (pairs of
// vectors folded into one by vpermt2ps and an add, until one lane per key is left) rather than
// one horizontal sum per key, which had taken a quarter of the kernel; the masked softmax in
// per-row buffers; weights·V over the visible keys, vectorized over the features. Both register
// tiles hold pv_vectors x pv_rows accumulators. The head sizes of today's models (32, 64, 128,
// 256) get loops in which the features' clamps and tail predicates fold away; other sizes
// (clamped, gathered) tiles of one vector. One row (no grouped heads) keeps tiles of one row.
// `grouped_core`, where given (a paged cache, which holds each slot's key/value heads side by
// side), is the same stages for grouped heads (rows > 1) where `all_keys` holds (no window
// leaves keys out): one task per batch row, each tile of keys taken by every key/value head in
// turn, so that its reads are whole slot rows rather than one head's piece of each (about a
// third less time at 8,192 keys, bench/RESULTS.md); weights·V then sums block by block of keys
// (the windowed kernels' key blocks, ScoreMasks::key_block) into the row's context in memory.
inline void schedule_single_query_attention(
    const StageVars &v, CoreStages &core, CoreStages *grouped_core, const Halide::Expr &all_keys,
    Halide::Func context_tiles, const Halide::Expr &rows, const Halide::Expr &head_dim,
    const Halide::Expr &value_dim, const Halide::Expr &mask_keys_dense, const ScheduleParams &sp) {
    using namespace Halide;
    constexpr int kRowTile = 4;
    const std::vector<int> model_head_dims = {32, 64, 128, 256};
    const int vec = sp.vector_lanes, accumulators = sp.pv_vectors * sp.pv_rows;
    const auto whole = TailStrategy::RoundUp;
    Var co("co"), ci("ci"), io("io"), ii("ii");
    context_tiles.compute_root();
    // Row tiles, heads and batch rows are separate parallel loops (see schedule_attention); a
    // grouped core's tasks are its batch rows.
    const auto tile = [&](Stage stage, int cols, int tile_rows, bool per_row) {
        stage.split(v.c, co, ci, cols, whole)
            .split(v.i, io, ii, tile_rows, whole)
            .reorder(ci, ii, co, io, v.h, v.b)
            .vectorize(ci, vec)
            .unroll(ci)
            .unroll(ii);
        if (!per_row) {
            fork_over_cores(stage, io, sp, LoopWork::streaming);
            fork_over_cores(stage, v.h, sp, LoopWork::streaming);
        }
        fork_over_cores(stage, v.b, sp, LoopWork::streaming);
    };
    const int tile_vectors = std::max(1, accumulators / kRowTile);
    // Nested so that each branch knows `all_keys` and `rows > 1` apart, which decides the
    // generator's choice of core (one simplifies away, with the stages only it reads).
    const auto tiles = [&](Stage stage, bool grouped_per_row) {
        Stage grouped = stage.specialize(rows > 1);
        for (int d : model_head_dims) {
            const Expr model = head_dim == d && value_dim == d;
            tile(grouped.specialize(model), std::min(d, tile_vectors * vec), kRowTile,
                 grouped_per_row);
        }
        tile(grouped, vec, kRowTile, grouped_per_row);
        for (int d : model_head_dims) {
            tile(stage.specialize(head_dim == d && value_dim == d), std::min(d, 8 * vec), 1, false);
        }
        tile(stage, vec, 1, false);
    };
    if (grouped_core != nullptr) {
        tiles(context_tiles.specialize(all_keys), true);
    }
    tiles(context_tiles, false);

    const auto schedule_core = [&](CoreStages &c, bool per_row) {
        Var jo("jo"), ji("ji"), lane("lane"), ro("ro"), ri("ri"), cot("cot"), cit("cit"), u("u");
        RVar rco("rco"), rci("rci");
        // Per row: the context in memory, summed block by block of keys (rfactor), each block
        // taken by every key/value head's register tiles in turn. Else a register tile over all
        // of its keys per tile of context_tiles.
        if (per_row) {
            Func acc = c.context.result;
            const RVar block = c.context.j.x;
            Func blocks = acc.update().rfactor(block, u);
            acc.compute_at(context_tiles, v.b).vectorize(v.c, vec);
            acc.update()
                .split(v.c, cot, cit, tile_vectors * vec, TailStrategy::GuardWithIf)
                .split(v.i, ro, ri, kRowTile, TailStrategy::GuardWithIf)
                .reorder(cit, ri, cot, ro, v.h, block)
                .vectorize(cit, vec);
            blocks.bound_extent(v.c, tile_vectors * vec).bound_extent(v.i, kRowTile);
            schedule_register_tile(blocks, LoopLevel(acc, cot), v.c, v.i, {c.context.j.y}, vec);
        } else {
            const std::vector<RVar> keys = c.softmax.causal
                                               ? std::vector<RVar>{c.context.j.y, c.context.j.x}
                                               : std::vector<RVar>{c.context.j.x};
            schedule_register_tile(c.context.result, LoopLevel(context_tiles, co), v.c, v.i, keys,
                                   vec);
        }
        // Q·Kᵀ: the lanes of each key's partial sums over the features, then the sums of a
        // row's keys in flight at once (vectorized over keys); the keys in flight fill the
        // accumulators of a tile of kRowTile rows (one row takes as many keys). Per row, each
        // tile of keys is taken by every key/value head in turn.
        const int keys_in_flight = tile_vectors;
        const Var task = per_row ? v.b : io;
        Func dot = c.scores.dot;
        dot.store_at(context_tiles, task).compute_at(context_tiles, task);
        Func partial = dot.update().split(c.scores.c.x, rco, rci, vec).rfactor(rci, lane);
        dot.update().split(v.j, jo, ji, keys_in_flight, whole);
        if (per_row) {
            dot.update()
                .split(v.i, ro, ri, kRowTile, whole)
                .reorder(rci, ji, ri, ro, v.h, jo)
                .unroll(ri);
        } else {
            dot.update().reorder(rci, ji, v.i, jo).unroll(v.i);
        }
        dot.update().atomic().vectorize(rci).vectorize(ji);
        partial.compute_at(dot, per_row ? ro : jo)
            .reorder_storage(lane, v.j, v.i)
            .vectorize(lane)
            .unroll(v.j)
            .unroll(v.i);
        partial.update().reorder(lane, v.j, v.i, rco).vectorize(lane).unroll(v.j).unroll(v.i);
        MaskedSoftmax &sm = c.softmax;
        sm.weights.compute_at(context_tiles, task).vectorize(v.j, vec, whole);
        schedule_softmax_tile(v, sm, context_tiles, task, task, sp);
    };
    schedule_core(core, false);
    if (grouped_core != nullptr) {
        schedule_core(*grouped_core, true);
    }
    if (mask_keys_dense.defined()) {
        context_tiles.specialize(mask_keys_dense);
    }
}

// The forward pass: projections as register-tiled GEMMs around the attention core
// (schedule_attention, or in bf16 products schedule_tiled_attention).
inline void schedule_forward(ForwardStages &f, bool weights_are_output, const ScheduleParams &sp) {
    using namespace Halide;
    const StageVars &v = f.v;
    const int vec = sp.vector_lanes;
    const auto whole = TailStrategy::RoundUp;
    const auto guard = TailStrategy::GuardWithIf;

    const auto schedule_any_projection = [&](Projection &p) {
        if (p.tiles.defined()) {
            schedule_tiled_projection(v, p, sp);
        } else {
            schedule_projection(v, p, sp);
        }
    };
    for (Projection &p : f.input_projections) {
        schedule_any_projection(p);
    }
    // The output projection reads the merged heads as plain token rows, copied once: read in
    // its reduction through the head split (k / d, k % d), every step of the register tile
    // needs its own index arithmetic and the tile spills.
    schedule_any_projection(f.out_proj);
    Var ro_copy("ro_copy"), ri_copy("ri_copy");
    f.out_proj.rows.compute_root()
        .split(v.r, ro_copy, ri_copy, sp.proj_rows, whole)
        .vectorize(v.e, vec, guard);
    fork_over_cores(f.out_proj.rows, ro_copy, sp);
    // With d known, each vector of the copy is a dense load from one head (otherwise a gather
    // through e / d, e % d): the head sizes of BERT-base/large, GPT-2 and LLaMA-style models.
    for (int head_dim : {32, 64, 128}) {
        f.out_proj.rows.specialize(f.head_dim == head_dim);
    }

    if (f.core.scores.tiled.tiles.defined()) {
        schedule_tiled_attention(v, f.core, nullptr, f.query_len, f.head_dim, f.mask_keys_dense,
                                 weights_are_output, sp);
        return;
    }
    // K's heads are views of the projection, whose features are padded past every head's
    // whole vectors (contract::padded_features).
    schedule_attention(v, f.core, f.core.context.result.in(), f.k_heads, f.v_heads, f.query_len,
                       f.num_keys, f.mask_keys_dense, weights_are_output, true, sp);
}

// A decode step (mha_decode.h). Per task (split x key/value head, batch row) and tile of
// kDecodeRowTile rows (query heads of one group; one row where the group and step have fewer):
// Q·Kᵀ against the split's keys in register tiles of key vectors x the tile's rows, the masked
// softmax in per-tile buffers, weights·V in register tiles of the head's features (a model
// head's whole when it fits); the splits merged; the output projection over the few new rows.
// A tile in memory would load and store its accumulators at every key. The cache is read where
// it lies, never copied: the runtime passes it cropped to a multiple of contract::kCacheKeyTile
// keys and splits it at multiples of them, so that whole key tiles stay inside it.
inline void schedule_decode(DecodeStages &f, const ScheduleParams &sp) {
    using namespace Halide;
    const StageVars &v = f.v;
    const int vec = sp.vector_lanes;
    const auto guard = TailStrategy::GuardWithIf, whole = TailStrategy::RoundUp;
    schedule_projection(v, f.out_proj, sp);
    f.out_proj.rows.compute_root().vectorize(v.e, vec, guard);
    for (Func merge : {f.context, f.weighted_contexts}) {
        merge.compute_root().vectorize(v.c, vec, guard);
    }
    f.weighted_contexts.update().vectorize(v.c, vec, guard);
    f.lse_max.compute_root();
    f.weight_sum.compute_root();

    CoreStages &core = f.core;
    Func tiles = f.split_results;
    tiles.compute_root();
    Var co("co"), ci("ci"), io("io"), ii("ii"), jo("jo"), ji("ji");
    const auto tile = [&](Stage stage, int cols, int rows) {
        stage.split(v.c, co, ci, cols, whole)
            .split(v.i, io, ii, rows, whole)
            .reorder(ci, ii, co, io, v.h, v.b)
            .vectorize(ci, vec)
            .unroll(ci)
            .unroll(ii);
        // Tasks and batch rows are separate parallel loops (see schedule_forward).
        fork_over_cores(stage, v.h, sp, LoopWork::streaming);
        fork_over_cores(stage, v.b, sp, LoopWork::streaming);
    };
    // Half the registers accumulate (the tiles of the forward kernels' tuned buckets, made for
    // other shapes, may take a single vector), in tiles of whole powers of two vectors, which
    // divide a model head's features.
    const int accumulators = sp.vector_registers / 2;
    const auto vectors_of = [&](int rows) {
        int vectors = 1;
        while (vectors * 2 * rows <= accumulators) {
            vectors *= 2;
        }
        return vectors;
    };
    const Expr grouped = f.rows >= kDecodeRowTile;
    Stage grouped_tiles = tiles.specialize(grouped);
    for (int d : {32, 64, 128, 256}) {
        tile(grouped_tiles.specialize(f.head_dim == d),
             std::min(d, vectors_of(kDecodeRowTile) * vec), kDecodeRowTile);
        tile(tiles.specialize(f.head_dim == d), std::min(d, vectors_of(1) * vec), 1);
    }
    tile(grouped_tiles, vec, kDecodeRowTile);
    tile(tiles, vec, 1);
    schedule_register_tile(core.context.result, LoopLevel(tiles, co), v.c, v.i,
                           {core.context.j.y, core.context.j.x}, vec);
    MaskedSoftmax &sm = core.softmax;
    sm.weights.compute_at(tiles, io).vectorize(v.j, vec, whole);

    // Q·Kᵀ: enough key vectors in flight for independent accumulators, within a key tile.
    Func score_tiles = core.scores.dot.in();
    score_tiles.compute_at(tiles, io);
    const auto key_tile = [&](Stage stage, int key_vectors) {
        stage.split(v.j, jo, ji, std::min(key_vectors, contract::kCacheKeyTile / vec) * vec, whole)
            .reorder(ji, v.i, jo)
            .vectorize(ji, vec)
            .unroll(ji)
            .unroll(v.i);
    };
    key_tile(score_tiles.specialize(grouped), vectors_of(kDecodeRowTile));
    key_tile(score_tiles, vectors_of(1));
    schedule_register_tile(core.scores.dot, LoopLevel(score_tiles, jo), v.j, v.i, {core.scores.c.x},
                           vec);
    schedule_softmax_tile(v, sm, tiles, io, io, sp);
}

// A pipeline output copied out of a whole-tile stage: the only place tails are guarded.
inline void schedule_output_copy(const StageVars &v, Halide::Func output,
                                 const ScheduleParams &sp) {
    using namespace Halide;
    Var so("so"), si("si"), t("t");
    output.compute_root()
        .split(v.s, so, si, sp.proj_rows, TailStrategy::GuardWithIf)
        .fuse(so, v.b, t)
        .vectorize(v.e, sp.vector_lanes, TailStrategy::GuardWithIf);
    fork_over_cores(output, t, sp);
}

}  // namespace mha::cpu
