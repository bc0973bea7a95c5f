// The production generators: the forward pass, a decode step's two halves (QKV projection,
// attention over the KV cache), the attention core on projected heads, all with their Inputs and
// Outputs declared from the contract (contract/mha_contract.h), and the probe that tells the
// runtime which CPU instruction set Halide's own target check accepts. Algorithms come from
// mha_stages.h, mha_attention.h, mha_forward.h and mha_decode.h; schedules from schedules/.
#include <functional>
#include <map>

#include "Halide.h"
#include "contract_halide.h"
#include "cpu_schedule.h"
#include "gpu_schedule.h"
#include "mha_attention.h"
#include "mha_decode.h"
#include "mha_forward.h"

namespace {

using namespace Halide;
using mha::contract::ArgId;
using mha::contract::ArgKind;

// A generator's Inputs and Outputs, declared in configure() from the contract's argument list of
// its variant, in that order, so that the generated function takes exactly what the runtime
// passes (checked again at compile time by the runtime's kernel tables).
class ContractArguments {
public:
    void declare(Internal::GeneratorBase &gen, const mha::contract::KernelVariant &variant,
                 const Target &target) {
        const mha::Device device = mha::device_of(target);
        for (ArgId id : mha::contract::kernel_arguments(variant)) {
            const mha::contract::ArgSpec &a = mha::contract::arg(id);
            const std::string name(a.name);
            const Type type = mha::halide_type_of(mha::contract::arg_type(id, variant, device));
            switch (a.kind) {
            case ArgKind::input_buffer:
                buffers_[id] = gen.add_input<Buffer<>>(name, type, a.rank);
                break;
            case ArgKind::input_scalar:
                scalars_[id] = gen.add_input<Expr>(name, type);
                break;
            case ArgKind::output_buffer:
                outputs_[id] = gen.add_output<Buffer<>>(name, type, a.rank);
                break;
            }
        }
    }

    GeneratorInput<Buffer<>> &input(ArgId id) { return *buffers_.at(id); }
    Expr scalar(ArgId id) { return *scalars_.at(id); }
    GeneratorInput<Expr> &scalar_input(ArgId id) { return *scalars_.at(id); }
    GeneratorOutput<Buffer<>> &output(ArgId id) { return *outputs_.at(id); }
    const std::map<ArgId, GeneratorInput<Buffer<>> *> &inputs() const { return buffers_; }

private:
    std::map<ArgId, GeneratorInput<Buffer<>> *> buffers_;
    std::map<ArgId, GeneratorInput<Expr> *> scalars_;
    std::map<ArgId, GeneratorOutput<Buffer<>> *> outputs_;
};

// The CPU schedule parameters of a generator's target: the defaults of its instruction set, then
// the "schedule" generator param.
mha::cpu::ScheduleParams cpu_params(const Target &target, const std::string &assignments) {
    const mha::contract::CpuIsa isa = mha::cpu_isa_of(target);
    if (target.natural_vector_size<float>() != isa.f32_lanes) {
        throw CompileError("contract/mha_contract.h gives " + std::string(isa.name) + " " +
                           std::to_string(isa.f32_lanes) + " f32 lanes, Halide " +
                           std::to_string(target.natural_vector_size<float>()));
    }
    mha::cpu::ScheduleParams params = mha::cpu::ScheduleParams::defaults(isa);
    try {
        params.apply(assignments);
    } catch (const std::invalid_argument &e) {
        throw CompileError(e.what());
    }
    return params;
}

// The contract's mask kinds by name, for the generators' `mask` param.
std::map<std::string, mha::contract::MaskKind> mask_kinds_by_name() {
    std::map<std::string, mha::contract::MaskKind> names;
    for (mha::contract::MaskKind kind : mha::contract::kMaskKinds) {
        names.emplace(mha::contract::mask_kind_name(kind), kind);
    }
    return names;
}

// The contract's dtypes by name, for the forward generator's `dtype` param.
std::map<std::string, mha::DType> dtypes_by_name() {
    std::map<std::string, mha::DType> names;
    for (mha::DType dtype : mha::contract::kDTypes) {
        names.emplace(mha::contract::dtype_name(dtype), dtype);
    }
    return names;
}

// The contract's KV cache dtypes by name, for the decode generator's `cache` param.
std::map<std::string, mha::CacheDType> cache_dtypes_by_name() {
    std::map<std::string, mha::CacheDType> names;
    for (mha::CacheDType dtype : mha::contract::kCacheDTypes) {
        names.emplace(mha::contract::cache_dtype_name(dtype), dtype);
    }
    return names;
}

class MultiHeadAttentionForward : public Generator<MultiHeadAttentionForward> {
public:
    GeneratorParam<mha::contract::MaskKind> mask_kind{"mask_kind", mha::contract::MaskKind::none,
                                                      mask_kinds_by_name()};
    GeneratorParam<bool> return_weights{"return_weights", false};
    // Self-attention with query = key = value: one fused QKV projection.
    GeneratorParam<bool> fused_qkv{"fused_qkv", false};
    GeneratorParam<bool> causal{"causal", false};
    // bf16 or f16: activations and projection weights in 16 bits. On the CPU (bf16, the
    // contract's bf16 instruction sets only) the products are bf16 tile products; on GPUs the
    // kernels widen them to f32 as they read them.
    GeneratorParam<mha::DType> dtype{"dtype", mha::DType::f32, dtypes_by_name()};
    // CPU schedule parameters, "name:value,..." (schedules/cpu_params.h); the hand-written
    // defaults of the target's instruction set where empty.
    GeneratorParam<std::string> schedule_params{"schedule", ""};
    // The shape Halide's autoschedulers optimize for (they need estimates of every extent).
    GeneratorParam<int> est_batch{"est_batch", 1};
    GeneratorParam<int> est_query_len{"est_query_len", 512};
    GeneratorParam<int> est_key_len{"est_key_len", 512};
    GeneratorParam<int> est_embed_dim{"est_embed_dim", 512};
    GeneratorParam<int> est_heads{"est_heads", 8};

    mha::contract::KernelVariant variant() const {
        return {
            mha::contract::KernelOp::forward, mask_kind, return_weights, fused_qkv, causal, dtype};
    }
    void configure() { args_.declare(*this, variant(), get_target()); }

    void generate() {
        const bool fused = fused_qkv;
        GeneratorInput<Buffer<>> &query = input(ArgId::query);
        mha::ForwardInputs in;
        in.embed_dim = query.dim(0).extent();
        in.head_dim = args_.scalar(ArgId::head_dim);
        in.query_len = query.dim(1).extent();
        in.batch = query.dim(2).extent();
        // Inputs the contract gives as 16-bit bits (a GPU kernel of a 16-bit dtype) are widened
        // to f32 where they are read.
        const bool widened = query.type() == UInt(16);
        const auto read = [&](ArgId id, const std::string &name) -> Func {
            return widened ? mha::widened_to_f32(input(id), dtype, name) : Func(input(id));
        };
        in.query = read(ArgId::query, "query_f32");
        in.kv_heads = args_.scalar(ArgId::kv_heads);
        in.padded = mha::contract::padded_features(in.embed_dim, in.head_dim);
        in.padded_kv = mha::contract::padded_features(in.kv_heads * in.head_dim, in.head_dim);
        // A projection's weights: Wᵀ panels (of 16-bit bits on a GPU), or bf16 tiles for the
        // CPU's matrix engine.
        in.tile_products = !get_target().has_gpu_feature() && dtype != mha::DType::f32;
        if (in.tile_products && mha::cpu_isa_of(get_target()).dtype != dtype) {
            throw CompileError(std::string(mha::contract::dtype_name(dtype)) +
                               " forward kernels are for GPUs and the contract's CPU instruction "
                               "set of that dtype, not " +
                               get_target().to_string());
        }
        const auto weights = [&](ArgId id, const std::string &name) -> Func {
            GeneratorInput<Buffer<>> &w = input(id);
            if (!in.tile_products) {
                return mha::panel_view(read(id, name + "_panels"), name);
            }
            // Each tile contiguous, pairs innermost: the layout the tile loads need.
            w.dim(0).set_bounds(0, 2).set_stride(1);
            w.dim(1).set_bounds(0, mha::contract::kBf16TileWidth).set_stride(2);
            w.dim(2).set_min(0).set_stride(2 * mha::contract::kBf16TileWidth);
            return w;
        };
        if (fused) {
            in.num_keys = in.query_len;
            in.key_features = in.value_features = in.embed_dim;
            in.key = in.value = in.query;
            in.qkv_weight_t = weights(ArgId::qkv_weight, "qkv_weight_t");
            in.qkv_bias = input(ArgId::qkv_bias);
        } else {
            in.num_keys = input(ArgId::key).dim(1).extent();
            in.key_features = input(ArgId::key).dim(0).extent();
            in.value_features = input(ArgId::value).dim(0).extent();
            in.key = read(ArgId::key, "key_f32");
            in.value = read(ArgId::value, "value_f32");
            in.q_weight_t = weights(ArgId::q_weight, "q_weight_t");
            in.k_weight_t = weights(ArgId::k_weight, "k_weight_t");
            in.v_weight_t = weights(ArgId::v_weight, "v_weight_t");
            in.q_bias = input(ArgId::q_bias);
            in.k_bias = input(ArgId::k_bias);
            in.v_bias = input(ArgId::v_bias);
        }
        in.out_weight_t = weights(ArgId::out_weight, "out_weight_t");
        in.out_bias = input(ArgId::out_bias);
        if (mask_kind != mha::contract::MaskKind::none) {
            const bool bytes = mask_kind == mha::contract::MaskKind::bytes;
            GeneratorInput<Buffer<>> &mask = input(bytes ? ArgId::mask : ArgId::additive_mask);
            // The mask may broadcast along any dimension through zero strides, keys included.
            mask.dim(0).set_stride(Expr());
            in.mask_keys_dense = mask.dim(0).stride() == 1;
            // Whole attention tiles may read past the last query and key: repeat the edge.
            Func extended =
                BoundaryConditions::repeat_edge(mask, {{0, in.num_keys}, {0, in.query_len}});
            if (bytes) {
                in.mask = extended;
                in.mask_blocks_nonzero = args_.scalar(ArgId::mask_blocks_nonzero);
            } else {
                in.additive_mask = extended;
            }
        }
        if (causal) {
            in.causal_offset = args_.scalar(ArgId::causal_offset);
            // CPU schedules vectorize the row reductions across a block of one vector's keys and
            // compute weights·V in register tiles of pv_rows queries.
            if (!get_target().has_gpu_feature()) {
                in.causal_key_block = get_target().natural_vector_size<float>();
                in.causal_query_block = cpu_params(get_target(), schedule_params).pv_rows;
            }
        }
        in.weights_are_output = return_weights;
        in.recompute_scores = get_target().has_gpu_feature();
        stages_ = mha::define_forward(in);
        // The output is a guarded copy of the whole-tile output projection.
        const mha::StageVars &v = stages_.v;
        args_.output(ArgId::output)(v.e, v.s, v.b) = stages_.output(v.e, v.s, v.b);
        if (return_weights) {
            args_.output(ArgId::weights) = stages_.core.softmax.weights;
        }
        set_shape_estimates();
    }

    void schedule() {
        if (using_autoscheduler()) {
            return;
        }
        Func output = args_.output(ArgId::output);
        if (get_target().has_gpu_feature()) {
            mha::gpu::schedule_forward(stages_, return_weights, causal, {});
            mha::gpu::schedule_output_copy(stages_.v, output);
            return;
        }
        const mha::cpu::ScheduleParams params = cpu_params(get_target(), schedule_params);
        mha::cpu::schedule_forward(stages_, return_weights, params);
        mha::cpu::schedule_output_copy(stages_.v, output, params);
    }

private:
    GeneratorInput<Buffer<>> &input(ArgId id) { return args_.input(id); }

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
            {ArgId::additive_mask, {{0, Sk}, {0, Sq}, {0, H}, {0, B}}},
        };
        for (auto &[id, buffer] : args_.inputs()) {
            const auto known = estimates.find(id);
            if (known != estimates.end()) {
                buffer->set_estimates(known->second);
            } else if (buffer->dimensions() == 3) {  // one projection's Wᵀ panels
                buffer->set_estimates({{0, panel}, {0, E}, {0, P / panel}});
            } else {  // one projection's bias
                buffer->set_estimates({{0, P}});
            }
        }
        args_.scalar_input(ArgId::head_dim).set_estimate(d);
        args_.scalar_input(ArgId::kv_heads).set_estimate(H);
        if (causal) {
            args_.scalar_input(ArgId::causal_offset).set_estimate(Sk - Sq);
        }
        args_.output(ArgId::output).set_estimates({{0, E}, {0, Sq}, {0, B}});
        if (return_weights) {
            args_.output(ArgId::weights).set_estimates({{0, Sk}, {0, Sq}, {0, H}, {0, B}});
        }
    }

    ContractArguments args_;
    mha::ForwardStages stages_;
};

// A decode step's first half: the new tokens' fused QKV projection, written as qkv_rows
// (f, i, b) for the runtime to append keys and values to the cache and for the decode kernel to
// read queries from.
class QkvProjection : public Generator<QkvProjection> {
public:
    // Of the weights' panels, widened to f32 as they are read.
    GeneratorParam<mha::DType> dtype{"dtype", mha::DType::f32, dtypes_by_name()};
    GeneratorParam<std::string> schedule_params{"schedule", ""};

    void configure() {
        args_.declare(*this,
                      {mha::contract::KernelOp::qkv_projection, mha::contract::MaskKind::none,
                       false, true, false, dtype},
                      get_target());
    }

    void generate() {
        GeneratorInput<Buffer<>> &tokens = args_.input(ArgId::query);
        const Expr n = tokens.dim(1).extent(), batch = tokens.dim(2).extent();
        projection_ = mha::linear_projection(
            v_, mha::token_rows(v_, tokens, n, batch, "token_rows"),
            mha::panel_view(mha::as_f32(args_.input(ArgId::qkv_weight), "qkv_panels_f32"),
                            "qkv_weight_t"),
            args_.input(ArgId::qkv_bias), tokens.dim(0).extent(), "qkv_proj");
        args_.output(ArgId::qkv_rows)(v_.e, v_.s, v_.b) = projection_.result(v_.e, v_.s + v_.b * n);
    }

    void schedule() {
        const mha::cpu::ScheduleParams params = cpu_params(get_target(), schedule_params);
        mha::cpu::schedule_projection(v_, projection_, params);
        mha::cpu::schedule_output_copy(v_, args_.output(ArgId::qkv_rows), params);
    }

private:
    ContractArguments args_;
    mha::StageVars v_;
    mha::Projection projection_;
};

// A decode step's second half: attention of the new tokens over the KV cache, and the output
// projection (generators/mha_decode.h).
class DecodeAttention : public Generator<DecodeAttention> {
public:
    GeneratorParam<mha::contract::MaskKind> mask_kind{"mask_kind", mha::contract::MaskKind::none,
                                                      mask_kinds_by_name()};
    // Of the output projection's panels and of the KV cache, widened to f32 as they are read.
    GeneratorParam<mha::DType> dtype{"dtype", mha::DType::f32, dtypes_by_name()};
    GeneratorParam<mha::CacheDType> cache{"cache", mha::CacheDType::f32, cache_dtypes_by_name()};
    GeneratorParam<std::string> schedule_params{"schedule", ""};

    void configure() {
        if (mask_kind == mha::contract::MaskKind::additive) {
            throw CompileError("decode kernels take a byte key-padding mask or none");
        }
        args_.declare(*this,
                      {mha::contract::KernelOp::decode, mask_kind, false, true, false, dtype, false,
                       false, cache},
                      get_target());
    }

    void generate() {
        GeneratorInput<Buffer<>> &new_qkv = args_.input(ArgId::new_qkv);
        GeneratorInput<Buffer<>> &key_cache = args_.input(ArgId::key_cache);
        mha::DecodeInputs in;
        in.new_qkv = new_qkv;
        in.key_cache = mha::as_f32(key_cache, "key_cache_f32");
        in.value_cache = mha::as_f32(args_.input(ArgId::value_cache), "value_cache_f32");
        in.cached_lengths = args_.input(ArgId::cached_lengths);
        in.new_counts = args_.input(ArgId::new_counts);
        in.split_keys = args_.scalar(ArgId::split_keys);
        in.key_block = get_target().natural_vector_size<float>();
        if (cache == mha::CacheDType::int8) {
            in.key_scales = args_.input(ArgId::key_scales);
            in.value_scales = args_.input(ArgId::value_scales);
        }
        if (mask_kind == mha::contract::MaskKind::bytes) {
            in.cache_mask = args_.input(ArgId::cache_mask);
            in.mask_blocks_nonzero = args_.scalar(ArgId::mask_blocks_nonzero);
        }
        in.out_weight_t = mha::panel_view(
            mha::as_f32(args_.input(ArgId::out_weight), "out_panels_f32"), "out_weight_t");
        in.out_bias = args_.input(ArgId::out_bias);
        in.head_dim = args_.scalar(ArgId::head_dim);
        in.kv_heads = args_.scalar(ArgId::kv_heads);
        in.num_keys = key_cache.dim(2).extent() * mha::contract::kCacheKeyTile;
        in.new_tokens = new_qkv.dim(1).extent();
        in.batch = new_qkv.dim(2).extent();
        // The output projection's input features: E (the cache holds kv_heads heads, fewer).
        in.embed_dim = args_.input(ArgId::out_weight).dim(1).extent();
        stages_ = mha::define_decode(in);
        const mha::StageVars &v = stages_.v;
        args_.output(ArgId::output)(v.e, v.s, v.b) = stages_.output(v.e, v.s, v.b);
    }

    void schedule() {
        const mha::cpu::ScheduleParams params = cpu_params(get_target(), schedule_params);
        mha::cpu::schedule_decode(stages_, params);
        mha::cpu::schedule_output_copy(stages_.v, args_.output(ArgId::output), params);
    }

private:
    ContractArguments args_;
    mha::DecodeStages stages_;
};

// The attention weights averaged over heads (nn.MultiheadAttention's average_attn_weights),
// from the per-head weights a forward kernel wrote.
class AverageHeads : public Generator<AverageHeads> {
public:
    GeneratorParam<std::string> schedule_params{"schedule", ""};

    void configure() {
        args_.declare(*this, {mha::contract::KernelOp::average_heads}, get_target());
    }

    void generate() {
        GeneratorInput<Buffer<>> &heads = args_.input(ArgId::head_weights);
        const Expr num_heads = heads.dim(2).extent();
        RDom h(0, num_heads, "h");
        Func sum("head_sum");
        sum(v_.j, v_.i, v_.b) = 0.0f;
        sum(v_.j, v_.i, v_.b) += heads(v_.j, v_.i, h, v_.b);
        averaged_ = args_.output(ArgId::averaged_weights);
        averaged_(v_.j, v_.i, v_.b) = sum(v_.j, v_.i, v_.b) / cast<float>(num_heads);
        sum_ = sum;
    }

    void schedule() {
        Var jo("jo"), ji("ji"), row("row");
        if (get_target().has_gpu_feature()) {
            averaged_.compute_root()
                .split(v_.j, jo, ji, 32, TailStrategy::GuardWithIf)
                .fuse(v_.i, v_.b, row)
                .gpu_blocks(jo, row)
                .gpu_threads(ji);
            sum_.compute_at(averaged_, ji);
            return;
        }
        const mha::cpu::ScheduleParams params = cpu_params(get_target(), schedule_params);
        averaged_.compute_root()
            .fuse(v_.i, v_.b, row)
            .vectorize(v_.j, params.vector_lanes, TailStrategy::GuardWithIf);
        mha::cpu::fork_over_cores(averaged_, row, params);
        sum_.compute_at(averaged_, v_.j).vectorize(v_.j);
        sum_.update().vectorize(v_.j);
    }

private:
    ContractArguments args_;
    mha::StageVars v_;
    Func averaged_, sum_;
};

// The attention core on the caller's projected queries, keys and values, as
// F.scaled_dot_product_attention computes it (generators/mha_attention.h): any strides but dense
// features, grouped-query heads from the extents, blocked keys left out of the softmax.
class Attention : public Generator<Attention> {
public:
    GeneratorParam<mha::contract::MaskKind> mask_kind{"mask_kind", mha::contract::MaskKind::none,
                                                      mask_kinds_by_name()};
    // Query i sees keys i + window_start <= j <= i + window_end only.
    GeneratorParam<bool> window{"window", false};
    // Soft-capping and ALiBi (their run-time values may leave the scores as they are).
    GeneratorParam<bool> modified_scores{"modified_scores", false};
    // One query row per head (a decode step); K and V are then read where they lie.
    GeneratorParam<bool> single_query{"single_query", false};
    // K and V in a paged cache, the query row the last position of each sequence.
    GeneratorParam<bool> paged{"paged", false};
    // Of Q, K and V; the scores, softmax and context are f32 in every dtype.
    GeneratorParam<mha::DType> dtype{"dtype", mha::DType::f32, dtypes_by_name()};
    GeneratorParam<std::string> schedule_params{"schedule", ""};

    mha::contract::KernelVariant variant() const {
        return {mha::contract::KernelOp::attention,
                mask_kind,
                false,
                false,
                window,
                dtype,
                modified_scores,
                single_query,
                mha::CacheDType::f32,
                paged};
    }
    void configure() { args_.declare(*this, variant(), get_target()); }

    void generate() {
        const mha::StageVars &v = v_;
        GeneratorInput<Buffer<>> &q = args_.input(ArgId::q);
        GeneratorInput<Buffer<>> &k = args_.input(paged ? ArgId::key_pages : ArgId::k);
        GeneratorInput<Buffer<>> &values = args_.input(paged ? ArgId::value_pages : ArgId::v);
        query_len_ = q.dim(1).extent();
        head_dim_ = q.dim(0).extent();
        value_dim_ = values.dim(0).extent();
        if (single_query) {
            q.dim(1).set_bounds(0, 1);
        }
        const Expr d = head_dim_, dv = value_dim_;
        const Expr heads = q.dim(2).extent(), kv_heads = k.dim(paged ? 1 : 2).extent();
        // Where key j of row b lies: in a paged cache, slot j % slots of block
        // block_table(j / slots, b), read within the row's keys and the pool whatever whole
        // tiles ask (the query is the row's last key); else at j, within the keys. Blocks hold
        // a power of two slots (the runtime checks), so that a key's block and slot are a shift
        // and a mask rather than a division per key.
        Expr row_keys;
        std::function<Expr(Func, Expr, Expr, Expr, Expr)> read;
        if (paged) {
            Func table = args_.input(ArgId::block_table);
            const Expr slots = k.dim(2).extent(), blocks = k.dim(3).extent();
            const Expr shift = 31 - count_leading_zeros(slots);
            num_keys_ = args_.input(ArgId::block_table).dim(0).extent() * slots;
            row_keys = args_.input(ArgId::sequence_lengths)(v.b);
            const Expr table_blocks = args_.input(ArgId::block_table).dim(0).extent();
            read = [=](Func f, Expr c, Expr key, Expr h, Expr b) {
                // Within the table: the runtime checks that every row's keys are.
                const Expr j = clamp(key, 0, max(row_keys - 1, 0));
                const Expr entry = unsafe_promise_clamped(j >> shift, 0, table_blocks - 1);
                const Expr slot = unsafe_promise_clamped(j & (slots - 1), 0, slots - 1);
                return f(c, h, slot, clamp(table(entry, b), 0, blocks - 1));
            };
        } else {
            num_keys_ = k.dim(1).extent();
            row_keys = num_keys_;
            read = [=](Func f, Expr c, Expr key, Expr h, Expr b) {
                return f(c, clamp(key, 0, num_keys_ - 1), h, b);
            };
        }
        const Expr Sq = query_len_, Sk = num_keys_;
        const Expr group = heads / kv_heads;
        // One query per head: the core's rows are then the `group` query heads that share a
        // key/value head, so that each K and V row is read once for all of them (whole tiles of
        // rows past the group repeat the last head). `position` is the query row of the core's
        // row v.i, `query_head` its head; `query_of` reads a function of (key, query row, head,
        // batch row) at the core's rows.
        const auto query_head = [&](const Expr &row, const Expr &head) {
            return single_query ? clamp(head * group + row, 0, heads - 1) : head;
        };
        const Expr position = paged ? row_keys - 1 : single_query ? Expr(0) : Expr(v.i);
        const auto query_of = [&](const Func &f) {
            if (!single_query) {
                return f;
            }
            Func per_row(f.name() + "_per_row");
            per_row(v.j, v.i, v.h, v.b) = f(v.j, position, query_head(v.i, v.h), v.b);
            return per_row;
        };
        // bf16 rows of many queries multiply as tile products on the matrix engine (AMX), or as
        // dot products over pairs (vdpbf16ps); one bf16 query row is read in place and widened,
        // its step bound by the bytes of K and V.
        const bool bf16_products = dtype == mha::DType::bf16 && !single_query;
        const bool amx =
            mha::cpu_isa_of(get_target()).bf16_products == mha::contract::Bf16Products::amx_tiles;
        const auto as_read = [&](const Expr &x) {
            return bf16_products ? x : cast<float>(x);
        };
        // Whole tiles read past the last query, key and value feature: the edges repeat.
        Func q_heads("q_heads");
        q_heads(v.c, v.s, v.h, v.b) = as_read(
            q(v.c, single_query ? Expr(0) : clamp(v.s, 0, Sq - 1), query_head(v.s, v.h), v.b));
        k_heads_(v.c, v.s, v.h, v.b) = as_read(read(k, v.c, v.s, v.h, v.b));
        v_heads_(v.c, v.s, v.h, v.b) = as_read(read(values, clamp(v.c, 0, dv - 1), v.s, v.h, v.b));
        mha::CoreInputs in;
        in.q_heads = q_heads;
        in.k_heads = k_heads_;
        in.v_heads = v_heads_;
        in.head_dim = d;
        in.value_dim = dv;
        core_rows_ = single_query ? group : Sq;
        in.query_len = core_rows_;
        in.num_keys = Sk;
        in.kv_heads = kv_heads;
        if (!single_query) {
            in.kv_group = group;
        }
        in.scale = args_.scalar(ArgId::scale);
        in.tile_products = bf16_products && amx;
        in.keys_read_anywhere = true;  // k_heads_ and v_heads_ clamp the key
        in.dot_pairs = bf16_products && !amx;
        in.masks.blocked = mha::BlockedKeys::left_out;
        if (mask_kind != mha::contract::MaskKind::none) {
            const bool bytes = mask_kind == mha::contract::MaskKind::bytes;
            GeneratorInput<Buffer<>> &mask =
                args_.input(bytes ? ArgId::mask : ArgId::additive_mask);
            mask.dim(0).set_stride(Expr());  // broadcasts along any dimension, keys included
            mask_keys_dense_ = mask.dim(0).stride() == 1;
            Func extended = query_of(BoundaryConditions::repeat_edge(mask, {{0, Sk}, {0, Sq}}));
            if (bytes) {
                in.masks.blocking = extended;
                in.masks.blocks_nonzero = args_.scalar(ArgId::mask_blocks_nonzero);
            } else {
                in.masks.additive = extended;
            }
        }
        const mha::cpu::ScheduleParams params = cpu_params(get_target(), schedule_params);
        if (window) {
            in.first_visible = Func("first_visible");
            in.first_visible(v.i, v.h, v.b) =
                clamp(position + args_.scalar(ArgId::window_start), 0, row_keys);
            in.visible_keys = Func("visible_keys");
            in.visible_keys(v.i, v.h, v.b) =
                clamp(position + args_.scalar(ArgId::window_end) + 1, 0, row_keys);
            in.masks.key_block = get_target().natural_vector_size<float>();
            in.query_block = single_query ? 1 : params.pv_rows;
        }
        if (modified_scores) {
            in.masks.softcap = args_.scalar(ArgId::softcap);
            in.masks.alibi_slope = args_.input(ArgId::alibi_slopes)(query_head(v.i, v.h));
            in.masks.query_position = paged ? position : position + Sk - Sq;
        }
        core_ = mha::define_attention_core(v, in);
        // The context and the rows' log-sum-exp come out of one loop nest: the row statistics
        // live in its tiles.
        Expr context = core_.context.result(v.c, v.i, v.h, v.b);
        Expr lse = core_.softmax.lse(v.i, v.h, v.b);
        if (paged) {
            // Grouped query heads (several rows) over all of their keys run the same stages
            // again, scheduled per sequence with every key/value head inside each tile of keys
            // (schedule_single_query_attention), whose specialization on the same condition
            // leaves one of the two. A window keeps a task per key/value head: its steps run
            // unsplit (the runtime's paged_splits), so that the heads are their parallelism.
            all_keys_ = args_.scalar(ArgId::window_start) <= -num_keys_;
            const Expr per_row = core_rows_ > 1 && all_keys_;
            grouped_core_ = mha::define_attention_core(v, in);
            context = select(per_row, grouped_core_.context.result(v.c, v.i, v.h, v.b), context);
            lse = select(per_row, grouped_core_.softmax.lse(v.i, v.h, v.b), lse);
        }
        context_and_lse_(v.c, v.i, v.h, v.b) = Tuple(context, lse);
        const Expr row = single_query ? clamp(v.h % group, 0, group - 1) : Expr(v.i);
        const Expr head = single_query ? clamp(v.h / group, 0, kv_heads - 1) : Expr(v.h);
        args_.output(ArgId::context)(v.c, v.i, v.h, v.b) = context_and_lse_(v.c, row, head, v.b)[0];
        args_.output(ArgId::lse)(v.i, v.h, v.b) = context_and_lse_(0, row, head, v.b)[1];
        // Rows from 0, as every caller's buffers: a register tile's rows are then known to lie
        // in one query block (CausalBlocks), whose key range is computed once per tile.
        args_.output(ArgId::context).dim(1).set_min(0);
        args_.output(ArgId::lse).dim(0).set_min(0);
    }

    void schedule() {
        const mha::StageVars &v = v_;
        const mha::cpu::ScheduleParams params = cpu_params(get_target(), schedule_params);
        if (single_query) {
            mha::cpu::schedule_single_query_attention(
                v, core_, paged ? &grouped_core_ : nullptr, all_keys_, context_and_lse_, core_rows_,
                head_dim_, value_dim_, mask_keys_dense_, params);
        } else if (core_.scores.tiled.tiles.defined()) {
            mha::cpu::schedule_tiled_attention(v, core_, &context_and_lse_, query_len_, value_dim_,
                                               mask_keys_dense_, false, params);
        } else {
            mha::cpu::schedule_attention(v, core_, context_and_lse_, k_heads_, v_heads_, query_len_,
                                         num_keys_, mask_keys_dense_, false, false, params);
        }
        Var hb("hb");
        Func context = args_.output(ArgId::context), lse = args_.output(ArgId::lse);
        context.compute_root()
            .fuse(v.h, v.b, hb)
            .vectorize(v.c, params.vector_lanes, TailStrategy::GuardWithIf);
        mha::cpu::fork_over_cores(context, hb, params);
        lse.compute_root().vectorize(v.i, params.vector_lanes, TailStrategy::GuardWithIf);
    }

private:
    ContractArguments args_;
    mha::StageVars v_;
    Func k_heads_{"k_heads"}, v_heads_{"v_heads"}, context_and_lse_{"context_and_lse"};
    Expr query_len_, num_keys_, head_dim_, value_dim_, mask_keys_dense_, core_rows_, all_keys_;
    mha::CoreStages core_, grouped_core_;
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
HALIDE_REGISTER_GENERATOR(QkvProjection, mha_qkv_projection)
HALIDE_REGISTER_GENERATOR(DecodeAttention, mha_decode)
HALIDE_REGISTER_GENERATOR(AverageHeads, mha_average_heads)
HALIDE_REGISTER_GENERATOR(Attention, mha_attention)
HALIDE_REGISTER_GENERATOR(CpuIsaProbe, mha_cpu_isa_probe)
