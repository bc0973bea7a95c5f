// One forward pass JIT-compiled for a CPU instruction set, with given schedule parameters or by
// one of Halide's autoschedulers, and the problem it runs on. It runs the way the library runs
// its kernels: on prepacked weights, with Halide's allocations served by the library's scratch
// pool and its parallel loops by the library's thread pool, so that what the tuner times is what
// a call of the library costs.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "mha_contract.h"
#include "packed_weights.h"
#include "problems.h"

namespace mha::tune {

// What the tuning database records of that (RunContext::thread_pool).
inline constexpr const char *kCandidateThreadPool = "library";

// A problem and its packed weights, built once per shape; the variant is self-attention (fused
// QKV) when Sq = Sk, as in the benchmark sweep, with no mask and no weights returned. For a
// matrix engine's instruction set, what a bf16 module holds: weights rounded and packed as bf16
// tiles, the inputs in bf16.
struct Workload {
    Workload(const contract::ProblemShape &shape, uint64_t seed, const contract::CpuIsa &isa);

    reference::Problem problem;
    std::unique_ptr<detail::PackedWeights> weights;
    std::vector<bfloat16> query, key, value;  // bf16 inputs; empty for f32
    std::vector<float> output;
};

// Halide stays inside candidate.cpp: the rest of the tuner compiles without Halide.h.
class Candidate {
public:
    // `schedule`: "name:value,..." (empty: the defaults); `autoscheduler`: a Halide
    // autoscheduler's name instead. Throws (Halide::CompileError) when it does not compile.
    Candidate(const contract::CpuIsa &isa, const contract::ProblemShape &estimates,
              const std::string &schedule, const std::string &autoscheduler = "");
    ~Candidate();
    Candidate(Candidate &&) noexcept;

    // One forward pass on `work`; Halide's result code.
    int run(Workload &work) const;

private:
    struct Compiled;
    std::unique_ptr<Compiled> compiled_;
};

// Makes Halide's autoschedulers available to Candidate (once per process).
void load_autoscheduler_plugins();

// Whether the candidate meets the library's accuracy (reference::output_tolerance of its dtype)
// against the double-precision reference on a small awkward shape with the embedding and heads
// of `like`; the relative L2 error (infinity when the candidate fails) in `error`.
bool accurate(const Candidate &candidate, const contract::CpuIsa &isa,
              const contract::ProblemShape &like, double &error);

}  // namespace mha::tune
