// CPU SIMD schedules for the stages of generators/mha_stages.h. The algorithm never changes here:
// only where each stage is computed, how its loops are split, vectorized and parallelized.
//
// Shapes are run-time values (S = 1, E = 12 are legal), so every split of a data dimension uses
// GuardWithIf: a tile never reads or writes past a buffer's edge.
#pragma once

#include "Halide.h"
#include "mha_forward.h"

namespace mha::cpu {

// Loop shape of the first schedule; the autotuner's parameter sets replace these later.
struct ScheduleParams {
    int vector_multiple = 2;      // output columns per register tile, in vectors
    int projection_rows = 4;      // rows per register tile of a projection
    int attention_rows = 4;       // query rows per attention tile
};

// Register-tiled GEMM for a projection: each tile accumulates rows x (vector_multiple vectors)
// while streaming the reduction, and tiles of rows run in parallel.
inline void schedule_projection(const StageVars &v, Projection &p, int vec,
                                const ScheduleParams &sp) {
    using namespace Halide;
    Var so("so"), si("si"), eo("eo"), ei("ei"), t("t");
    const auto guard = TailStrategy::GuardWithIf;
    const int cols = vec * sp.vector_multiple;
    p.result.compute_root()
        .split(v.s, so, si, sp.projection_rows, guard)
        .fuse(so, v.b, t)
        .parallel(t)
        .vectorize(v.e, vec, guard);
    p.result.update()
        .split(v.s, so, si, sp.projection_rows, guard)
        .split(v.e, eo, ei, cols, guard)
        .reorder(ei, si, p.k, eo, so, v.b)
        .fuse(so, v.b, t)
        .parallel(t)
        .vectorize(ei, vec)
        .unroll(si);
}

// The forward pass: projections as tiled GEMMs; the attention core per (batch x head, query
// tile), whose scores and softmax stay in a tile-sized buffer unless the weights are an output.
// With `weights_are_output`, softmax.weights is also a pipeline output and is computed whole.
inline void schedule_forward(ForwardStages &f, bool weights_are_output,
                             const Halide::Target &target, const ScheduleParams &sp = {}) {
    using namespace Halide;
    const StageVars &v = f.v;
    const int vec = target.natural_vector_size<float>();
    const auto guard = TailStrategy::GuardWithIf;

    for (Projection *p : {&f.q_proj, &f.k_proj, &f.v_proj, &f.out_proj}) {
        schedule_projection(v, *p, vec, sp);
    }

    // K is stored key-major inside each head so that scores vectorize over keys with
    // contiguous loads.
    Var so("so"), si("si"), hb("hb");
    f.k_heads.compute_root()
        .reorder_storage(v.s, v.c, v.h, v.b)
        .reorder(v.s, v.c, v.h, v.b)
        .fuse(v.h, v.b, hb)
        .parallel(hb)
        .vectorize(v.s, vec, guard);

    // context(c, i, h, b), stored in merged-head order so merge_heads is a plain view.
    Func context = f.context.result;
    Var io("io"), ii("ii"), co("co"), ci("ci"), t("t");
    context.compute_root()
        .reorder_storage(v.c, v.h, v.i, v.b)
        .split(v.i, io, ii, sp.attention_rows, guard)
        .fuse(v.h, v.b, hb)
        .fuse(io, hb, t)
        .parallel(t)
        .vectorize(v.c, vec, guard);
    context.update()
        .split(v.i, io, ii, sp.attention_rows, guard)
        .split(v.c, co, ci, vec, guard)
        .reorder(ci, ii, f.context.j, co, io, v.h, v.b)
        .fuse(v.h, v.b, hb)
        .fuse(io, hb, t)
        .parallel(t)
        .vectorize(ci)
        .unroll(ii);

    // Scores and softmax live inside one attention tile, or inside one row block of the
    // weights output when the caller asked for the weights.
    Func tile_owner = context;
    Var tile_var = t;
    MaskedSoftmax &sm = f.softmax;
    if (weights_are_output) {
        Var wo("wo"), wi("wi"), wt("wt");
        sm.weights.compute_root()
            .split(v.i, wo, wi, sp.attention_rows, guard)
            .fuse(v.h, v.b, hb)
            .fuse(wo, hb, wt)
            .parallel(wt)
            .vectorize(v.j, vec, guard);
        tile_owner = sm.weights;
        tile_var = wt;
    } else {
        sm.weights.compute_at(context, t).vectorize(v.j, vec, guard);
    }
    f.scores.dot.compute_at(tile_owner, tile_var).vectorize(v.j, vec, guard);
    f.scores.dot.update()
        .reorder(v.j, v.i, f.scores.c)
        .vectorize(v.j, vec, guard);
    sm.row_max.compute_at(tile_owner, tile_var);
    sm.exps.compute_at(tile_owner, tile_var).vectorize(v.j, vec, guard);
    sm.row_sum.compute_at(tile_owner, tile_var);
}

}  // namespace mha::cpu
