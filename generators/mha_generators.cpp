// The production generators: the forward pass, whose Inputs and Outputs are declared from the
// contract (contract/mha_contract.h), and the probe that tells the runtime which CPU instruction
// set Halide's own target check accepts. Algorithms come from mha_stages.h / mha_forward.h;
// schedules from schedules/.
#include <map>

#include "Halide.h"
#include "contract_halide.h"
#include "cpu_schedule.h"
#include "gpu_schedule.h"
#include "mha_forward.h"

namespace {

using namespace Halide;
using mha::contract::ArgId;
using mha::contract::ArgKind;

class MultiHeadAttentionForward : public Generator<MultiHeadAttentionForward> {
public:
    GeneratorParam<bool> masked{"masked", false};
    GeneratorParam<bool> return_weights{"return_weights", false};
    // Self-attention with query = key = value: one fused QKV projection.
    GeneratorParam<bool> fused_qkv{"fused_qkv", false};
    // CPU schedule parameters, "name:value,..." (schedules/cpu_params.h); the hand-written
    // defaults of the target's instruction set where empty.
    GeneratorParam<std::string> schedule_params{"schedule", ""};
    // The shape Halide's autoschedulers optimize for (they need estimates of every extent).
    GeneratorParam<int> est_batch{"est_batch", 1};
    GeneratorParam<int> est_query_len{"est_query_len", 512};
    GeneratorParam<int> est_key_len{"est_key_len", 512};
    GeneratorParam<int> est_embed_dim{"est_embed_dim", 512};
    GeneratorParam<int> est_heads{"est_heads", 8};

    mha::contract::ForwardVariant variant() const { return {masked, return_weights, fused_qkv}; }

    // The variant's arguments, in the contract's order, so that the generated function takes
    // exactly what the runtime passes (checked again at compile time by the runtime).
    void configure() {
        for (ArgId id : mha::contract::forward_arguments(variant())) {
            const mha::contract::ArgSpec &a = mha::contract::arg(id);
            const std::string name(a.name);
            const Type type = mha::halide_type_of(a.type);
            switch (a.kind) {
            case ArgKind::input_buffer:
                buffers_[id] = add_input<Buffer<>>(name, type, a.rank);
                break;
            case ArgKind::input_scalar:
                scalars_[id] = add_input<Expr>(name, type);
                break;
            case ArgKind::output_buffer:
                outputs_[id] = add_output<Buffer<>>(name, type, a.rank);
                break;
            }
        }
    }

    void generate() {
        const bool fused = fused_qkv;
        GeneratorInput<Buffer<>> &query = input(ArgId::query);
        mha::ForwardInputs in;
        in.embed_dim = query.dim(0).extent();
        in.head_dim = *scalars_.at(ArgId::head_dim);
        in.query_len = query.dim(1).extent();
        in.batch = query.dim(2).extent();
        in.query = query;
        in.padded = mha::contract::padded_features(in.embed_dim, in.head_dim);
        if (fused) {
            in.num_keys = in.query_len;
            in.key = in.value = in.query;
            in.qkv_weight_t = mha::panel_view(input(ArgId::qkv_weight), "qkv_weight_t");
            in.qkv_bias = input(ArgId::qkv_bias);
        } else {
            in.num_keys = input(ArgId::key).dim(1).extent();
            in.key = input(ArgId::key);
            in.value = input(ArgId::value);
            in.q_weight_t = mha::panel_view(input(ArgId::q_weight), "q_weight_t");
            in.k_weight_t = mha::panel_view(input(ArgId::k_weight), "k_weight_t");
            in.v_weight_t = mha::panel_view(input(ArgId::v_weight), "v_weight_t");
            in.q_bias = input(ArgId::q_bias);
            in.k_bias = input(ArgId::k_bias);
            in.v_bias = input(ArgId::v_bias);
        }
        in.out_weight_t = mha::panel_view(input(ArgId::out_weight), "out_weight_t");
        in.out_bias = input(ArgId::out_bias);
        if (masked) {
            GeneratorInput<Buffer<>> &mask = input(ArgId::mask);
            // The mask may broadcast along any dimension through zero strides, keys included.
            mask.dim(0).set_stride(Expr());
            in.mask_keys_dense = mask.dim(0).stride() == 1;
            // Whole attention tiles may read past the last query and key: repeat the edge.
            in.mask = BoundaryConditions::repeat_edge(mask, {{0, in.num_keys}, {0, in.query_len}});
            in.mask_blocks_nonzero = *scalars_.at(ArgId::mask_blocks_nonzero);
        }
        in.weights_are_output = return_weights;
        in.recompute_scores = get_target().has_gpu_feature();
        stages_ = mha::define_forward(in);
        // The output is a guarded copy of the whole-tile output projection.
        const mha::StageVars &v = stages_.v;
        (*outputs_.at(ArgId::output))(v.e, v.s, v.b) = stages_.output(v.e, v.s, v.b);
        if (return_weights) {
            *outputs_.at(ArgId::weights) = stages_.softmax.weights;
        }
        set_shape_estimates();
    }

    void schedule() {
        if (using_autoscheduler()) {
            return;
        }
        Func output = *outputs_.at(ArgId::output);
        if (get_target().has_gpu_feature()) {
            mha::gpu::schedule_forward(stages_, return_weights, {});
            mha::gpu::schedule_output_copy(stages_.v, output);
            return;
        }
        const mha::contract::CpuIsa isa = mha::cpu_isa_of(get_target());
        if (get_target().natural_vector_size<float>() != isa.f32_lanes) {
            throw CompileError("contract/mha_contract.h gives " + std::string(isa.name) + " " +
                               std::to_string(isa.f32_lanes) + " f32 lanes, Halide " +
                               std::to_string(get_target().natural_vector_size<float>()));
        }
        mha::cpu::ScheduleParams params = mha::cpu::ScheduleParams::defaults(isa);
        try {
            params.apply(std::string(schedule_params));
        } catch (const std::invalid_argument &e) {
            throw CompileError(e.what());
        }
        mha::cpu::schedule_forward(stages_, return_weights, params);
        mha::cpu::schedule_output_copy(stages_.v, output, params);
    }

private:
    GeneratorInput<Buffer<>> &input(ArgId id) { return *buffers_.at(id); }

    void set_shape_estimates() {
        const int B = est_batch, Sq = est_query_len, Sk = est_key_len, E = est_embed_dim;
        const int H = est_heads, d = E / H;
        const int P = mha::contract::padded_features(E, d);
        const int panel = mha::contract::kWeightPanel;
        const std::map<ArgId, Region> estimates = {
            {ArgId::query, {{0, E}, {0, Sq}, {0, B}}},
            {ArgId::key, {{0, E}, {0, Sk}, {0, B}}},
            {ArgId::value, {{0, E}, {0, Sk}, {0, B}}},
            {ArgId::qkv_weight, {{0, panel}, {0, E}, {0, 3 * P / panel}}},
            {ArgId::qkv_bias, {{0, 3 * P}}},
            {ArgId::mask, {{0, Sk}, {0, Sq}, {0, H}, {0, B}}},
        };
        for (auto &[id, buffer] : buffers_) {
            const auto known = estimates.find(id);
            if (known != estimates.end()) {
                buffer->set_estimates(known->second);
            } else if (buffer->dimensions() == 3) {  // one projection's Wᵀ panels
                buffer->set_estimates({{0, panel}, {0, E}, {0, P / panel}});
            } else {  // one projection's bias
                buffer->set_estimates({{0, P}});
            }
        }
        scalars_.at(ArgId::head_dim)->set_estimate(d);
        outputs_.at(ArgId::output)->set_estimates({{0, E}, {0, Sq}, {0, B}});
        if (return_weights) {
            outputs_.at(ArgId::weights)->set_estimates({{0, Sk}, {0, Sq}, {0, H}, {0, B}});
        }
    }

    std::map<ArgId, GeneratorInput<Buffer<>> *> buffers_;
    std::map<ArgId, GeneratorInput<Expr> *> scalars_;
    std::map<ArgId, GeneratorOutput<Buffer<>> *> outputs_;
    mha::ForwardStages stages_;
};

// Built for every CPU instruction set of the contract at once (Halide's multi-target dispatch
// runs the best one the CPU supports), it returns the index of the instruction set that ran.
class CpuIsaProbe : public Generator<CpuIsaProbe> {
public:
    Output<int32_t> isa_index{"isa_index"};

    void generate() {
        const std::optional<size_t> index =
            mha::contract::cpu_isa_index(mha::cpu_isa_of(get_target()).name);
        if (!index) {
            throw CompileError(
                "the probe is built for the contract's CPU instruction sets only, not " +
                get_target().to_string());
        }
        isa_index() = int32_t(*index);
    }
};

}  // namespace

HALIDE_REGISTER_GENERATOR(MultiHeadAttentionForward, mha_forward)
HALIDE_REGISTER_GENERATOR(CpuIsaProbe, mha_cpu_isa_probe)
