#include "candidate.h"

#include <cmath>
#include <map>
#include <mutex>

#include "Halide.h"
#include "scratch_pool.h"

namespace mha::tune {
namespace {

void *scratch_malloc(Halide::JITUserContext *, size_t bytes) {
    return detail::scratch_allocate(bytes);
}
void scratch_free(Halide::JITUserContext *, void *block) { detail::scratch_release(block); }

}  // namespace

Workload::Workload(const contract::ProblemShape &shape, uint64_t seed)
    : problem(reference::random_problem(shape, seed, shape.query_len == shape.key_len)),
      output(shape.batch * shape.query_len * shape.embed_dim) {
    const std::array<Linear, 4> lin = reference::linears(problem);
    const Linear *linears[4] = {&lin[0], &lin[1], &lin[2], &lin[3]};
    weights =
        std::make_unique<detail::PackedWeights>(shape.embed_dim, shape.num_heads, linears, nullptr);
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
    const int E = int(d.embed_dim), Sq = int(d.query_len), Sk = int(d.key_len), B = int(d.batch);
    const reference::Problem &p = work.problem;
    Halide::Runtime::Buffer<float> q(const_cast<float *>(p.query.data()), {E, Sq, B});
    Halide::Runtime::Buffer<float> k(const_cast<float *>(p.key.data()), {E, Sk, B});
    Halide::Runtime::Buffer<float> v(const_cast<float *>(p.value.data()), {E, Sk, B});
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
        if (work.weights->buffers[id]) {
            values[id] = work.weights->buffers[id]->raw_buffer();
        }
    }
    Halide::JITUserContext context;
    context.handlers.custom_malloc = &scratch_malloc;
    context.handlers.custom_free = &scratch_free;
    Halide::JITUserContext *context_pointer = &context;
    std::vector<const void *> argv = {&context_pointer};
    for (contract::ArgId id : compiled_->argument_order) {
        argv.push_back(values[size_t(id)]);
    }
    return compiled_->callable.call_argv_fast(argv.size(), argv.data());
}

double check_error(const Candidate &candidate, const contract::ProblemShape &like) {
    const bool self = like.query_len == like.key_len;
    Workload work({2, 7, self ? 7 : 11, like.embed_dim, like.num_heads}, 99);
    if (candidate.run(work) != 0) {
        return INFINITY;
    }
    return reference::relative_l2(work.output, reference::forward(work.problem).output);
}

}  // namespace mha::tune
