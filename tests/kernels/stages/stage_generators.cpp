// One generator per stage of mha_stages.h, so that tests (and the stage benchmarks) can check
// and time each stage alone. Simple schedules: these are not the production kernels.
#include <map>

#include "Halide.h"
#include "mha_stages.h"

namespace {

using namespace Halide;

// Vectorizes the innermost dimension and parallelizes the outermost of a stage's output, its
// updates (reductions) included.
void schedule_stage_output(Func f, const Target &target) {
    std::vector<Var> args = f.args();
    const int vec = target.natural_vector_size<float>();
    f.compute_root().parallel(args.back()).vectorize(args.front(), vec, TailStrategy::GuardWithIf);
    for (int u = 0; u < f.num_update_definitions(); u++) {
        f.update(u).parallel(args.back()).vectorize(args.front(), vec, TailStrategy::GuardWithIf);
    }
}

class LinearProjectionStage : public Generator<LinearProjectionStage> {
public:
    Input<Buffer<float, 3>> x{"x"};
    Input<Buffer<float, 2>> weight_t{"weight_t"};
    Input<Buffer<float, 1>> bias{"bias"};
    Output<Buffer<float, 3>> y{"y"};

    void generate() {
        const Expr seq_len = x.dim(1).extent(), batch = x.dim(2).extent();
        const mha::TokenRows rows = mha::token_rows(v_, x, seq_len, batch, "rows");
        const Func y_rows =
            mha::linear_projection(v_, rows, weight_t, bias, x.dim(0).extent(), "projection")
                .result;
        y = mha::token_view(v_, y_rows, seq_len, 0, "projection_view");
    }
    void schedule() { schedule_stage_output(y, get_target()); }

private:
    mha::StageVars v_;
};

class SplitHeadsStage : public Generator<SplitHeadsStage> {
public:
    Input<Buffer<float, 3>> x{"x"};
    Input<int> num_heads{"num_heads", 1};
    Output<Buffer<float, 4>> heads{"heads"};

    void generate() { heads = mha::split_heads(v_, x, x.dim(0).extent() / num_heads, "heads"); }
    void schedule() { schedule_stage_output(heads, get_target()); }

private:
    mha::StageVars v_;
};

class ScaledScoresStage : public Generator<ScaledScoresStage> {
public:
    Input<Buffer<float, 4>> q_heads{"q_heads"};
    Input<Buffer<float, 4>> k_heads{"k_heads"};
    Output<Buffer<float, 4>> scores{"scores"};

    void generate() {
        scores = mha::scaled_scores(v_, q_heads, k_heads, q_heads.dim(0).extent()).result;
    }
    void schedule() { schedule_stage_output(scores, get_target()); }

private:
    mha::StageVars v_;
};

class MaskedSoftmaxStage : public Generator<MaskedSoftmaxStage> {
public:
    GeneratorParam<bool> masked{"masked", false};
    Input<Buffer<float, 4>> scores{"scores"};
    Input<Buffer<uint8_t, 4>> *mask = nullptr;
    Input<int32_t> *blocks_nonzero = nullptr;
    Output<Buffer<float, 4>> weights{"weights"};

    void configure() {
        if (masked) {
            mask = add_input<Buffer<uint8_t, 4>>("mask");
            blocks_nonzero = add_input<int32_t>("blocks_nonzero");
        }
    }
    void generate() {
        mha::ScoreMasks masks;
        if (mask) {
            mask->dim(0).set_stride(Expr());  // broadcast over keys too
            masks.blocking = *mask;
            masks.blocks_nonzero = *blocks_nonzero;
        }
        softmax_ = mha::masked_softmax(v_, {scores, scores, scores}, masks, scores.dim(0).extent());
        weights = softmax_.weights;
    }
    void schedule() {
        schedule_stage_output(weights, get_target());
        softmax_.row_max.compute_root();
        softmax_.row_sum.compute_root();
    }

private:
    mha::StageVars v_;
    mha::MaskedSoftmax softmax_;
};

class AttendValuesStage : public Generator<AttendValuesStage> {
public:
    Input<Buffer<float, 4>> weights{"weights"};
    Input<Buffer<float, 4>> v_heads{"v_heads"};
    Output<Buffer<float, 4>> context{"context"};

    void generate() {
        context = mha::attend_values(v_, weights, v_heads, weights.dim(0).extent()).result;
    }
    void schedule() { schedule_stage_output(context, get_target()); }

private:
    mha::StageVars v_;
};

class MergeHeadsStage : public Generator<MergeHeadsStage> {
public:
    Input<Buffer<float, 4>> heads{"heads"};
    Output<Buffer<float, 3>> merged{"merged"};

    void generate() { merged = mha::merge_heads(v_, heads, heads.dim(0).extent()); }
    void schedule() { schedule_stage_output(merged, get_target()); }

private:
    mha::StageVars v_;
};

}  // namespace

HALIDE_REGISTER_GENERATOR(LinearProjectionStage, mha_linear_projection)
HALIDE_REGISTER_GENERATOR(SplitHeadsStage, mha_split_heads)
HALIDE_REGISTER_GENERATOR(ScaledScoresStage, mha_scaled_scores)
HALIDE_REGISTER_GENERATOR(MaskedSoftmaxStage, mha_masked_softmax)
HALIDE_REGISTER_GENERATOR(AttendValuesStage, mha_attend_values)
HALIDE_REGISTER_GENERATOR(MergeHeadsStage, mha_merge_heads)
