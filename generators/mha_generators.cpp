// Halide generators: the whole forward pass, and one small generator per stage so that tests can
// check each stage alone. Algorithms come from mha_stages.h / mha_forward.h; schedules from
// schedules/.
#include "Halide.h"
#include "cpu_schedule.h"
#include "gpu_schedule.h"
#include "mha_forward.h"

namespace {

using namespace Halide;
using mha::MaskKind;

const std::map<std::string, MaskKind> kMaskKinds = {
    {"none", MaskKind::none}, {"keep", MaskKind::keep}, {"block", MaskKind::block}};

// The mask may broadcast along any dimension through zero strides, keys included.
void allow_mask_broadcast(GeneratorInput<Buffer<uint8_t, 4>> &mask) { mask.dim(0).set_stride(Expr()); }

class MultiHeadAttentionForward : public Generator<MultiHeadAttentionForward> {
public:
    GeneratorParam<MaskKind> mask_kind{"mask_kind", MaskKind::none, kMaskKinds};
    GeneratorParam<bool> return_weights{"return_weights", false};
    // Self-attention with query = key = value: one fused QKV projection.
    GeneratorParam<bool> fused_qkv{"fused_qkv", false};
    // Tuned CPU schedule parameters, "isa@name:value,.../isa@..." (schedules/tuned/); the
    // hand-written defaults where empty or where no entry matches the target.
    GeneratorParam<std::string> schedule_params{"schedule", ""};
    // The shape Halide's autoschedulers optimize for (they need estimates of every extent).
    GeneratorParam<int> est_batch{"est_batch", 1};
    GeneratorParam<int> est_query_len{"est_query_len", 512};
    GeneratorParam<int> est_key_len{"est_key_len", 512};
    GeneratorParam<int> est_embed_dim{"est_embed_dim", 512};
    GeneratorParam<int> est_heads{"est_heads", 8};

    Input<Buffer<float, 3>> query{"query"};  // (e, sq, b)
    // Weights are Wᵀ panels (lane, in, panel) of padded output features (kernel_abi.h).
    Input<Buffer<float, 3>> out_weight{"out_weight"};
    Input<Buffer<float, 1>> out_bias{"out_bias"};  // (padded out)
    Input<int> head_dim{"head_dim", 1};  // E / H
    // Separate projections: key, value (e, sk, b) and one Wᵀ and bias per projection.
    Input<Buffer<float, 3>> *key = nullptr, *value = nullptr;
    Input<Buffer<float, 3>> *q_weight = nullptr, *k_weight = nullptr, *v_weight = nullptr;
    Input<Buffer<float, 1>> *q_bias = nullptr, *k_bias = nullptr, *v_bias = nullptr;
    // Fused QKV: Wq, Wk, Wv stacked along the output features, each block equally padded.
    Input<Buffer<float, 3>> *qkv_weight = nullptr;
    Input<Buffer<float, 1>> *qkv_bias = nullptr;
    Input<Buffer<uint8_t, 4>> *mask = nullptr;  // (j, i, h, b), only for keep / block masks

    Output<Buffer<float, 3>> output{"output"};    // (e, sq, b)
    Output<Buffer<float, 4>> *weights = nullptr;  // (j, i, h, b), only when requested

    void configure() {
        if (fused_qkv) {
            qkv_weight = add_input<Buffer<float, 3>>("qkv_weight");
            qkv_bias = add_input<Buffer<float, 1>>("qkv_bias");
        } else {
            key = add_input<Buffer<float, 3>>("key");
            value = add_input<Buffer<float, 3>>("value");
            q_weight = add_input<Buffer<float, 3>>("q_weight");
            q_bias = add_input<Buffer<float, 1>>("q_bias");
            k_weight = add_input<Buffer<float, 3>>("k_weight");
            k_bias = add_input<Buffer<float, 1>>("k_bias");
            v_weight = add_input<Buffer<float, 3>>("v_weight");
            v_bias = add_input<Buffer<float, 1>>("v_bias");
        }
        if (mask_kind != MaskKind::none) {
            mask = add_input<Buffer<uint8_t, 4>>("mask");
        }
        if (return_weights) {
            weights = add_output<Buffer<float, 4>>("weights");
        }
    }

    void generate() {
        mha::ForwardInputs in;
        in.embed_dim = query.dim(0).extent();
        in.head_dim = head_dim;
        in.query_len = query.dim(1).extent();
        in.batch = query.dim(2).extent();
        in.query = query;
        if (fused_qkv) {
            in.num_keys = in.query_len;
            in.key = in.value = in.query;
            in.qkv_weight_t = mha::panel_view(*qkv_weight, "qkv_weight_t");
            in.qkv_bias = *qkv_bias;
            in.padded = qkv_weight->dim(2).extent() * mha::kWeightPanel / 3;
        } else {
            in.num_keys = key->dim(1).extent();
            in.key = *key;
            in.value = *value;
            in.q_weight_t = mha::panel_view(*q_weight, "q_weight_t");
            in.k_weight_t = mha::panel_view(*k_weight, "k_weight_t");
            in.v_weight_t = mha::panel_view(*v_weight, "v_weight_t");
            in.q_bias = *q_bias;
            in.k_bias = *k_bias;
            in.v_bias = *v_bias;
        }
        in.out_weight_t = mha::panel_view(out_weight, "out_weight_t");
        in.out_bias = out_bias;
        if (mask) {
            allow_mask_broadcast(*mask);
            // Whole attention tiles may read past the last query and key: repeat the edge.
            in.mask = BoundaryConditions::repeat_edge(*mask, {{0, in.num_keys}, {0, in.query_len}});
        }
        in.mask_kind = mask_kind;
        in.weights_are_output = return_weights;
        in.recompute_scores = get_target().has_gpu_feature();
        stages_ = mha::define_forward(in);
        // The output is a guarded copy of the whole-tile output projection.
        output(stages_.v.e, stages_.v.s, stages_.v.b) =
            stages_.output(stages_.v.e, stages_.v.s, stages_.v.b);
        if (weights) {
            *weights = stages_.softmax.weights;
        }
        set_shape_estimates();
    }

    void schedule() {
        if (using_autoscheduler()) {
            return;
        }
        if (get_target().has_gpu_feature()) {
            mha::gpu::schedule_forward(stages_, return_weights, {});
            mha::gpu::schedule_output_copy(stages_.v, output);
        } else {
            const auto params =
                mha::cpu::ScheduleParams::for_target(get_target(), schedule_params);
            mha::cpu::schedule_forward(stages_, return_weights, params);
            mha::cpu::schedule_output_copy(stages_.v, output, params);
        }
    }

private:
    void set_shape_estimates() {
        const int B = est_batch, Sq = est_query_len, Sk = est_key_len, E = est_embed_dim;
        const int H = est_heads;
        const int P = static_cast<int>(mha::padded_features(E, H));
        const int panel = mha::kWeightPanel;
        head_dim.set_estimate(E / H);
        query.set_estimates({{0, E}, {0, Sq}, {0, B}});
        output.set_estimates({{0, E}, {0, Sq}, {0, B}});
        out_weight.set_estimates({{0, panel}, {0, E}, {0, P / panel}});
        out_bias.set_estimates({{0, P}});
        if (fused_qkv) {
            qkv_weight->set_estimates({{0, panel}, {0, E}, {0, 3 * P / panel}});
            qkv_bias->set_estimates({{0, 3 * P}});
        } else {
            for (auto *x : {key, value}) {
                x->set_estimates({{0, E}, {0, Sk}, {0, B}});
            }
            for (auto *w : {q_weight, k_weight, v_weight}) {
                w->set_estimates({{0, panel}, {0, E}, {0, P / panel}});
            }
            for (auto *b : {q_bias, k_bias, v_bias}) {
                b->set_estimates({{0, P}});
            }
        }
        if (mask) {
            mask->set_estimates({{0, Sk}, {0, Sq}, {0, H}, {0, B}});
        }
        if (weights) {
            weights->set_estimates({{0, Sk}, {0, Sq}, {0, H}, {0, B}});
        }
    }

    mha::ForwardStages stages_;
};

// --- One generator per stage, for tests of each stage alone. ---

// Vectorizes the innermost dimension and parallelizes the outermost of a stage's output.
void schedule_stage_output(Func f, const Target &target) {
    std::vector<Var> args = f.args();
    const int vec = target.natural_vector_size<float>();
    f.compute_root().parallel(args.back()).vectorize(args.front(), vec, TailStrategy::GuardWithIf);
}

class LinearProjectionStage : public Generator<LinearProjectionStage> {
public:
    Input<Buffer<float, 3>> x{"x"};
    Input<Buffer<float, 2>> weight_t{"weight_t"};
    Input<Buffer<float, 1>> bias{"bias"};
    Output<Buffer<float, 3>> y{"y"};

    void generate() {
        const Expr seq_len = x.dim(1).extent(), batch = x.dim(2).extent();
        const Func rows = mha::token_rows(v_, x, seq_len, batch, "rows");
        const Func y_rows =
            mha::linear_projection(v_, rows, weight_t, bias, x.dim(0).extent(), "projection").result;
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

    void generate() {
        heads = mha::split_heads(v_, x, x.dim(0).extent() / num_heads, "heads");
    }
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
    GeneratorParam<MaskKind> mask_kind{"mask_kind", MaskKind::none, kMaskKinds};
    Input<Buffer<float, 4>> scores{"scores"};
    Input<Buffer<uint8_t, 4>> *mask = nullptr;
    Output<Buffer<float, 4>> weights{"weights"};

    void configure() {
        if (mask_kind != MaskKind::none) {
            mask = add_input<Buffer<uint8_t, 4>>("mask");
        }
    }
    void generate() {
        Func mask_func;
        if (mask) {
            allow_mask_broadcast(*mask);
            mask_func = *mask;
        }
        softmax_ = mha::masked_softmax(v_, {scores, scores, scores}, mask_func, mask_kind,
                                       scores.dim(0).extent());
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

HALIDE_REGISTER_GENERATOR(MultiHeadAttentionForward, mha_forward)
HALIDE_REGISTER_GENERATOR(LinearProjectionStage, mha_linear_projection)
HALIDE_REGISTER_GENERATOR(SplitHeadsStage, mha_split_heads)
HALIDE_REGISTER_GENERATOR(ScaledScoresStage, mha_scaled_scores)
HALIDE_REGISTER_GENERATOR(MaskedSoftmaxStage, mha_masked_softmax)
HALIDE_REGISTER_GENERATOR(AttendValuesStage, mha_attend_values)
HALIDE_REGISTER_GENERATOR(MergeHeadsStage, mha_merge_heads)
