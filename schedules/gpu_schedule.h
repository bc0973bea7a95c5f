// GPU schedules (CUDA, OpenCL) for the forward pass of generators/mha_forward.h. Same algorithm
// as the CPU; every stage runs on the device, so nothing returns to the host between stages.
//
// Projections: shared-memory tiled GEMMs. A block owns a tile of outputs, each thread a small
// register tile; slices of the token rows and of Wᵀ are staged in shared memory per step of the
// reduction.
// Attention: a block owns (query tile, head, batch). Its query rows are staged in shared memory
// once; the row max and sum are reduced on the device (one thread per row, scores recomputed);
// then key tiles are swept: the K tile, the V tile and the tile's softmax weights live in shared
// memory while every thread accumulates its slice of weights·V in registers.
// Registers: Halide's register memory needs constant coordinates, so a register Func computed at
// the block level is allocated whole in each thread (`float _q_proj_0[2048]` in the OpenCL C of
// a 64x32 projection tile), and the device compiler must find the thread's slice. NVPTX does for
// the projections and the unmasked-order attention (in the PTX, the accumulators are registers
// and nothing is in local memory), but not for the causal attention, whose weights·V kept a
// 4 KB local-memory array a thread: there the context accumulates in shared memory.
// Without the weights requested, no [B, H, Sq, Sk] tensor exists in global memory.
#pragma once

#include <vector>

#include "Halide.h"
#include "mha_forward.h"

namespace mha::gpu {

struct ScheduleParams {
    int proj_block_cols = 64;  // output features per block; divides kMaxTile
    int proj_block_rows = 32;  // token rows per block
    int proj_thread_cols = 4;  // register tile of one thread
    int proj_thread_rows = 4;
    int proj_k_step = 16;     // reduction slice staged in shared memory
    int attention_rows = 16;  // query rows per block
    // Keys per shared-memory tile: as many as the block has threads in x (kMaxTile /
    // head_cols_per_thread), so that the block has no idle threads in the key loop. A wider
    // tile widens the block, and PoCL 3.1 (LLVM 15) then loses the V staging's stores (weights·V
    // reads the K tile staged before): tests/gpu/opencl/idle_work_items.cl is the reduced case,
    // bench/RESULTS.md (the GPU check) the explanation.
    int key_step = 16;
    int head_cols_per_thread = 4;
};

// Stages `f` (as read by `consumer`) in shared memory at `level`, loaded cooperatively by a
// threads_x x threads_y grid, each thread loading a strided share of the tile.
inline Halide::Func stage_in_shared(Halide::Func f, const Halide::Func &consumer,
                                    const Halide::LoopLevel &level, int threads_x, int threads_y) {
    using namespace Halide;
    Func staged = f.in(consumer);
    std::vector<Var> a = staged.args();
    Var xo, xi, yo, yi;
    staged.compute_at(level)
        .store_in(MemoryType::GPUShared)
        .split(a[0], xo, xi, threads_x, TailStrategy::GuardWithIf)
        .split(a[1], yo, yi, threads_y, TailStrategy::GuardWithIf)
        .reorder(xo, yo, xi, yi)
        .gpu_threads(xi, yi);
    return staged;
}

inline void schedule_projection(const StageVars &v, Projection &p, const ScheduleParams &sp) {
    using namespace Halide;
    const auto whole = TailStrategy::RoundUp;
    Var eo("eo"), ro("ro"), ei("ei"), ri("ri"), et("et"), eu("eu"), rt("rt"), ru("ru");
    Func tiles = p.result.in();
    tiles.compute_root()
        .align_bounds(v.e, contract::kWeightPanel)
        .tile(v.e, v.r, eo, ro, ei, ri, sp.proj_block_cols, sp.proj_block_rows, whole)
        .tile(ei, ri, et, rt, eu, ru, sp.proj_thread_cols, sp.proj_thread_rows, whole)
        .reorder(eu, ru, et, rt, eo, ro)
        .gpu_blocks(eo, ro)
        .gpu_threads(et, rt)
        .unroll(eu)
        .unroll(ru);
    // The accumulators belong to the block; each thread keeps its register tile.
    p.result.compute_at(tiles, eo)
        .store_in(MemoryType::Register)
        .split(v.e, et, eu, sp.proj_thread_cols, whole)
        .split(v.r, rt, ru, sp.proj_thread_rows, whole)
        .reorder(eu, ru, et, rt)
        .gpu_threads(et, rt)
        .unroll(eu)
        .unroll(ru);
    RVar ko("ko"), ki("ki");
    p.result.update()
        .split(p.k.x, ko, ki, sp.proj_k_step)
        .split(v.e, et, eu, sp.proj_thread_cols, whole)
        .split(v.r, rt, ru, sp.proj_thread_rows, whole)
        .reorder(eu, ru, ki, et, rt, ko)
        .gpu_threads(et, rt)
        .unroll(eu)
        .unroll(ru);
    const int threads_x = sp.proj_block_cols / sp.proj_thread_cols;
    const int threads_y = sp.proj_block_rows / sp.proj_thread_rows;
    stage_in_shared(p.rows, p.result, LoopLevel(p.result, ko), threads_x, threads_y);
    stage_in_shared(p.weight_t, p.result, LoopLevel(p.result, ko), threads_x, threads_y);
}

// A head-major copy on the device (K and V, so that tiles of one head are contiguous).
inline void schedule_head_copy(const StageVars &v, Halide::Func heads) {
    using namespace Halide;
    Var so("so"), si("si");
    heads.compute_root()
        .split(v.s, so, si, 8, TailStrategy::RoundUp)
        .reorder(v.c, si, so, v.h, v.b)
        .gpu_blocks(so, v.h, v.b)
        .gpu_threads(v.c, si);
}

inline void schedule_forward(ForwardStages &f, bool weights_are_output, bool causal,
                             const ScheduleParams &sp) {
    using namespace Halide;
    const StageVars &v = f.v;
    const auto whole = TailStrategy::RoundUp;
    const auto guard = TailStrategy::GuardWithIf;

    for (Projection &p : f.input_projections) {
        schedule_projection(v, p, sp);
    }
    schedule_projection(v, f.out_proj, sp);
    schedule_head_copy(v, f.k_heads);
    schedule_head_copy(v, f.v_heads);

    // weights·V: a block per (query tile, head, batch); threads over (head features, rows). A
    // thread's features: adjacent in registers (one vector load from the V tile), or, in shared
    // memory, threads_x apart (consecutive threads, consecutive words).
    Func context_tiles = f.core.context.result.in();
    Var io("io"), ii("ii"), co("co"), ci("ci"), ct("ct"), cu("cu");
    const int head_tile = contract::kMaxTile;
    const int threads_x = head_tile / sp.head_cols_per_thread;
    const bool context_in_shared = causal;
    const auto split_features = [&](Stage s, const VarOrRVar &c) {
        if (context_in_shared) {
            s.split(c, cu, ct, threads_x, whole);
        } else {
            s.split(c, ct, cu, sp.head_cols_per_thread, whole);
        }
    };
    context_tiles.compute_root()
        .split(v.i, io, ii, sp.attention_rows, whole)
        .split(v.c, co, ci, head_tile, whole);
    split_features(context_tiles, ci);
    context_tiles.reorder(cu, ct, ii, co, io, v.h, v.b)
        .gpu_blocks(io, v.h, v.b)
        .gpu_threads(ct, ii)
        .unroll(cu);
    f.core.context.result.compute_at(context_tiles, co)
        .store_in(context_in_shared ? MemoryType::GPUShared : MemoryType::Register);
    split_features(f.core.context.result, v.c);
    f.core.context.result.reorder(cu, ct, v.i).gpu_threads(ct, v.i).unroll(cu);
    RVar jo("jo"), ji("ji");
    f.core.context.result.update().split(f.core.context.j.x, jo, ji, sp.key_step, guard);
    split_features(f.core.context.result.update(), v.c);
    f.core.context.result.update().reorder(cu, ji, ct, v.i, jo).gpu_threads(ct, v.i).unroll(cu);
    const LoopLevel key_tile(f.core.context.result, jo);
    stage_in_shared(f.v_heads, f.core.context.result, key_tile, threads_x, sp.attention_rows);

    MaskedSoftmax &sm = f.core.softmax;
    const int rows = sp.attention_rows;
    // Row max and sum: one thread per row over every key with the scores recomputed (their own
    // copies of the dot product, in registers), so that no row of Sk scores is ever held.
    f.core.stat_scores.at(0).dot.compute_at(sm.row_max, sm.max_j.x).store_in(MemoryType::Register);
    f.core.stat_scores.at(1).dot.compute_at(sm.row_sum, sm.sum_j.x).store_in(MemoryType::Register);
    if (weights_are_output) {
        // Row statistics in kernels of their own, then the weights output in (key tile, row
        // tile) blocks, read back tile by tile into shared memory by weights·V.
        Var io2("io2"), ii2("ii2");
        for (Func stat : {sm.row_max, sm.row_sum, sm.inv_sum}) {
            stat.compute_root()
                .split(v.i, io2, ii2, rows, whole)
                .gpu_blocks(io2, v.h, v.b)
                .gpu_threads(ii2);
        }
        for (Func stat : {sm.row_max, sm.row_sum}) {
            stat.update()
                .split(v.i, io2, ii2, rows, whole)
                .gpu_blocks(io2, v.h, v.b)
                .gpu_threads(ii2);
        }
        // Batches are launched in turn: a fused (head, batch) block index would hide from
        // bounds inference that each thread's score is a single element.
        Var wo("wo"), wi("wi"), jt("jt"), jj("jj");
        sm.weights.compute_root()
            .split(v.i, wo, wi, rows, guard)
            .split(v.j, jt, jj, sp.key_step, guard)
            .reorder(jj, wi, jt, wo, v.h, v.b)
            .gpu_blocks(jt, wo, v.h)
            .gpu_threads(jj, wi);
        // Each thread computes its own score in registers.
        f.core.scores.dot.compute_at(sm.weights, jj).store_in(MemoryType::Register);
        stage_in_shared(f.k_heads, f.core.scores.dot, LoopLevel(sm.weights, jt), threads_x, rows);
        f.core.weights_for_values.compute_at(key_tile)
            .store_in(MemoryType::GPUShared)
            .gpu_threads(v.j, v.i);
    } else {
        // Everything per block: statistics for the block's rows, then per key tile the
        // weights in shared memory from the staged Q rows and K tile.
        const LoopLevel block(context_tiles, io);
        for (Func stat : {sm.row_max, sm.row_sum, sm.inv_sum}) {
            stat.compute_at(block).gpu_threads(v.i);
        }
        for (Func stat : {sm.row_max, sm.row_sum}) {
            stat.update().gpu_threads(v.i);
        }
        sm.weights.compute_at(key_tile).store_in(MemoryType::GPUShared).gpu_threads(v.j, v.i);
        f.core.scores.dot.compute_at(sm.weights, v.j).store_in(MemoryType::Register);
        stage_in_shared(f.k_heads, f.core.scores.dot, key_tile, threads_x, rows);
        stage_in_shared(f.q_heads, f.core.scores.dot, LoopLevel(context_tiles, co), threads_x,
                        rows);
    }
}

// The pipeline output, copied out of the whole-tile output projection with guarded tails.
inline void schedule_output_copy(const StageVars &v, Halide::Func output) {
    using namespace Halide;
    Var eo("eo"), ei("ei"), so("so"), si("si");
    output.compute_root()
        .split(v.e, eo, ei, 32, TailStrategy::GuardWithIf)
        .split(v.s, so, si, 8, TailStrategy::GuardWithIf)
        .reorder(ei, si, eo, so, v.b)
        .gpu_blocks(eo, so, v.b)
        .gpu_threads(ei, si);
}

}  // namespace mha::gpu
