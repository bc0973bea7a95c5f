#include "candidate.h"

#include <cmath>
#include <map>
#include <mutex>

#include "Halide.h"
#include "buffers.h"
#include "dtype.h"
#include "scratch_pool.h"
#include "thread_pool.h"

namespace mha::tune {
namespace {

void *scratch_malloc(Halide::JITUserContext *, size_t bytes) {
    return detail::scratch_allocate(bytes);
}
void scratch_free(Halide::JITUserContext *, void *block) { detail::scratch_release(block); }
// Parallel loops on the library's pool, as its kernels' run: Halide's own pool, which sleeps
// after tens of microseconds, favoured other parameters at few rows (bench/RESULTS.md).
int pool_do_par_for(Halide::JITUserContext *context,
                    int (*task)(Halide::JITUserContext *, int, uint8_t *), int min, int extent,
                    uint8_t *closure) {
    return detail::pool_par_for(context, reinterpret_cast<halide_task_t>(task), min, extent,
                                closure);
}

}  // namespace

Workload::Workload(const contract::ProblemShape &shape, uint64_t seed, const contract::CpuIsa &isa)
    : problem(problems::random_problem(shape, seed, shape.query_len == shape.key_len)),
      output(shape.batch * shape.query_len * shape.embed_dim) {
    problem.dtype = isa.dtype;
    const std::array<Linear, 4> lin = problems::linears(problem);
    const detail::WidenedLinears rounded(
        std::array<const Linear *, 4>{&lin[0], &lin[1], &lin[2], &lin[3]}, isa.dtype);
    const Linear *linears[4] = {&rounded.linears[0], &rounded.linears[1], &rounded.linears[2],
                                &rounded.linears[3]};
    weights = std::make_unique<detail::PackedWeights>(shape.embed_dim, shape.num_heads, linears,
                                                      nullptr, isa.dtype);
    if (isa.dtype != DType::f32) {
        for (auto [from, to] : {std::pair{problems::query_view(problem), &query},
                                {problems::key_view(problem), &key},
                                {problems::value_view(problem), &value}}) {
            const int64_t n = from.shape[0] * from.shape[1] * from.shape[2];
            to->resize(size_t(n));
            detail::convert(from.data, to->data(), n);
        }
    }
}

struct Candidate::Compiled {
    std::vector<contract::ArgId> argument_order;  // the callable's arguments, as contract ids
    Halide::Callable callable;
};

Candidate::Candidate(const contract::CpuIsa &isa, const contract::ProblemShape &estimates,
                     const std::string &schedule, const std::string &autoscheduler)
    : compiled_(std::make_unique<Compiled>()) {
    const Halide::Target target(std::string(isa.halide_target));
    Halide::GeneratorContext context(target);
    auto gen = Halide::Internal::GeneratorRegistry::create("mha_forward", context);
    const bool fused = estimates.query_len == estimates.key_len;
    gen->set_generatorparam_value("fused_qkv", fused ? "true" : "false");
    gen->set_generatorparam_value("schedule", schedule);
    gen->set_generatorparam_value("dtype", std::string(contract::dtype_name(isa.dtype)));
    const std::pair<const char *, int64_t> shape_estimates[] = {
        {"est_batch", estimates.batch},
        {"est_query_len", estimates.query_len},
        {"est_key_len", estimates.key_len},
        {"est_embed_dim", estimates.embed_dim},
        {"est_heads", estimates.num_heads}};
    for (const auto &[name, value] : shape_estimates) {
        gen->set_generatorparam_value(name, std::to_string(value));
    }
    if (!autoscheduler.empty()) {
        gen->set_generatorparam_value("autoscheduler", autoscheduler);
    }
    Halide::Pipeline pipeline = gen->build_pipeline();
    if (!autoscheduler.empty()) {
        pipeline.apply_autoscheduler(target, {autoscheduler, {{"parallelism", "2"}}});
    }
    // The callable takes the pipeline's inputs in its own order, then its outputs: map each to
    // the contract's argument of the same name (Halide makes Func names unique within a
    // process with a "$n" suffix).
    std::map<std::string, contract::ArgId> by_name;
    for (const contract::ArgSpec &a : contract::kArgs) {
        by_name.emplace(std::string(a.name), a.id);
    }
    const std::vector<Halide::Argument> arguments = pipeline.infer_arguments();
    for (const Halide::Argument &a : arguments) {
        compiled_->argument_order.push_back(by_name.at(a.name));
    }
    for (const Halide::Func &out : pipeline.outputs()) {
        compiled_->argument_order.push_back(by_name.at(out.name().substr(0, out.name().find('$'))));
    }
    compiled_->callable = pipeline.compile_to_callable(arguments, target);
}

Candidate::~Candidate() = default;
Candidate::Candidate(Candidate &&) noexcept = default;

void load_autoscheduler_plugins() {
    static std::once_flag once;
    std::call_once(once, [] {
        Halide::load_plugin(MHA_ADAMS2019_PLUGIN);
        Halide::load_plugin(MHA_MULLAPUDI2016_PLUGIN);
        Halide::load_plugin(MHA_LI2018_PLUGIN);
    });
}

int Candidate::run(Workload &work) const {
    const contract::ProblemShape &d = work.problem.dims;
    const int E = int(d.embed_dim), Sq = int(d.query_len), B = int(d.batch);
    const reference::Problem &p = work.problem;
    const bool bf16 = !work.query.empty();
    const auto input = [bf16](const Tensor &t, const std::vector<bfloat16> &t16) {
        return bf16 ? detail::dense_buffer(TensorView<const bfloat16>{t16.data(), t.shape})
                    : detail::dense_buffer(t);
    };
    const detail::HostBuffer q = input(problems::query_view(p), work.query);
    const detail::HostBuffer k = input(problems::key_view(p), work.key);
    const detail::HostBuffer v = input(problems::value_view(p), work.value);
    Halide::Runtime::Buffer<float> out(work.output.data(), {E, Sq, B});
    int32_t head_dim = int32_t(d.head_dim());
    std::array<const void *, contract::kArgCount> values{};
    values[size_t(contract::ArgId::query)] = q.raw_buffer();
    values[size_t(contract::ArgId::key)] = k.raw_buffer();
    values[size_t(contract::ArgId::value)] = v.raw_buffer();
    values[size_t(contract::ArgId::output)] = out.raw_buffer();
    values[size_t(contract::ArgId::head_dim)] = &head_dim;
    int32_t kv_heads = int32_t(d.num_heads);
    values[size_t(contract::ArgId::kv_heads)] = &kv_heads;
    for (size_t id = 0; id < contract::kArgCount; id++) {
        // As the library's call: a matrix engine's kernel reads the bf16 tiles where they exist.
        const std::optional<detail::HostBuffer> &weights =
            work.weights->kernel_buffer(contract::ArgId(id), bf16 ? DType::bf16 : DType::f32);
        if (weights) {
            values[id] = weights->raw_buffer();
        }
    }
    Halide::JITUserContext context;
    context.handlers.custom_malloc = &scratch_malloc;
    context.handlers.custom_free = &scratch_free;
    context.handlers.custom_do_par_for = &pool_do_par_for;
    Halide::JITUserContext *context_pointer = &context;
    std::vector<const void *> argv = {&context_pointer};
    for (contract::ArgId id : compiled_->argument_order) {
        argv.push_back(values[size_t(id)]);
    }
    return compiled_->callable.call_argv_fast(argv.size(), argv.data());
}

bool accurate(const Candidate &candidate, const contract::CpuIsa &isa,
              const contract::ProblemShape &like, double &error) {
    const bool self = like.query_len == like.key_len;
    Workload work({2, 7, self ? 7 : 11, like.embed_dim, like.num_heads}, 99, isa);
    error = candidate.run(work) != 0
                ? INFINITY
                : reference::relative_l2(work.output, reference::forward(work.problem).output);
    return error < reference::output_tolerance(work.problem);
}

}  // namespace mha::tune
