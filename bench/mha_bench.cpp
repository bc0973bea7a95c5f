// Google Benchmark: this project's forward pass and each stage over the sweep, and its decode
// steps over the decode sweep, against this machine's practical ceilings (OpenBLAS sgemm 2048³,
// a streaming read) and a hand-written BLAS multi-head attention, at 1 and 2 threads.
// bench/compare.py adds PyTorch and ONNX Runtime and the tables.
//
// Names: sgemm2048/threads:T, fma/threads:T, bf16dot/threads:T and f16widened/threads:T (the
// peaks of f32 FMAs, vdpbf16ps and f16 products widened into f32, where the CPU has them),
// stream_read/MB:256/threads:T, <system>/<shape>/weights:W/threads:T
// with system halide | blas, decode/B<b>_N<cached>_E<e>_H<h>[_KV<kv>]/threads:T,
// dtype/<shape>/dtype:<f32 | bf16 | f16>/threads:T and stage/<stage>/<shape>/threads:T. Counters:
// GFLOP/s and pct_sgemm (percent of the same run's sgemm at the same thread count); for decode
// steps and the streaming read, bytes and GB/s.
#include <benchmark/benchmark.h>
#include <cblas.h>
#include <fmt/format.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <random>

#include "HalideBuffer.h"
#include "HalideRuntime.h"
#include "blas_mha.h"
#include "command_line.h"
#include "mha_attend_values.h"
#include "mha_linear_projection.h"
#include "mha_masked_softmax_none.h"
#include "mha_merge_heads.h"
#include "mha_scaled_scores.h"
#include "mha_split_heads.h"
#include "problems.h"
#include "product_peaks.h"
#include "stream_read.h"
#include "sweeps.h"

extern "C" void openblas_set_num_threads(int);

namespace {

using mha::reference::Dims;
using mha::reference::Problem;

std::string shape_name(const Dims &d) {
    return fmt::format("B{}_Sq{}_Sk{}_E{}_H{}", d.batch, d.query_len, d.key_len, d.embed_dim,
                       d.num_heads);
}

std::map<int, double> g_sgemm_gflops;  // threads -> GFLOP/s, measured first in this run

void set_threads(int threads) {
    mha::set_num_threads(threads);
    openblas_set_num_threads(threads);
}

void report(benchmark::State &state, double flops, int threads) {
    state.counters["GFLOP/s"] =
        benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
    if (auto it = g_sgemm_gflops.find(threads); it != g_sgemm_gflops.end()) {
        // Percent of sgemm: GFLOP/s over the ceiling, as a rate counter scaled by 100 / ceiling.
        state.counters["pct_sgemm"] = benchmark::Counter(
            flops * 1e-9 * 100.0 / it->second, benchmark::Counter::kIsIterationInvariantRate);
    }
}

void sgemm_ceiling(benchmark::State &state, int threads) {
    set_threads(threads);
    const int n = 2048;
    std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
    const auto start = std::chrono::steady_clock::now();
    for (auto _ : state) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(),
                    n, 0.0f, c.data(), n);
        benchmark::DoNotOptimize(c.data());
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (c.front() != 0.125f * n || c.back() != 0.125f * n) {
        state.SkipWithError("sgemm computed a wrong product");
    }
    const double flops = 2.0 * n * n * n;
    // Remembered for pct_sgemm of every later benchmark at this thread count.
    g_sgemm_gflops[threads] = flops * state.iterations() * 1e-9 / seconds;
    state.counters["GFLOP/s"] =
        benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

// A product peak of this machine (product_peaks.h): f32 FMAs, vdpbf16ps (the ceiling of the
// avx512bf16 kernels' products), f16 products widened into f32.
void product_ceiling(benchmark::State &state, mha::bench::Products products, int threads) {
    const int64_t steps = int64_t(1) << 24;
    for (auto _ : state) {
        benchmark::DoNotOptimize(mha::bench::product_chains(products, steps, threads));
    }
    state.counters["GFLOP/s"] = benchmark::Counter(64.0 * double(steps) * threads * 1e-9,
                                                   benchmark::Counter::kIsIterationInvariantRate);
}

struct Buffers {
    Problem problem;
    std::vector<float> output, weights;
    explicit Buffers(const Dims &d)
        : problem(mha::problems::random_problem(d, 1, d.query_len == d.key_len)),
          output(d.batch * d.query_len * d.embed_dim) {}
};

void halide_forward(benchmark::State &state, Dims d, bool with_weights, int threads) {
    set_threads(threads);
    Buffers buf(d);
    const auto module = mha::problems::make_module(buf.problem);
    std::optional<mha::MutableTensor> weights;
    if (with_weights) {
        buf.weights.resize(d.batch * d.num_heads * d.query_len * d.key_len);
        weights =
            mha::MutableTensor{buf.weights.data(), {d.batch, d.num_heads, d.query_len, d.key_len}};
    }
    const mha::MutableTensor out{buf.output.data(), {d.batch, d.query_len, d.embed_dim}};
    for (auto _ : state) {
        module.forward(mha::problems::query_view(buf.problem), mha::problems::key_view(buf.problem),
                       mha::problems::value_view(buf.problem), out, std::nullopt, weights);
        benchmark::DoNotOptimize(buf.output.data());
    }
    state.SetLabel(mha::dispatched_isa());
    report(state, d.forward_flops(), threads);
}

void blas_forward(benchmark::State &state, Dims d, bool with_weights, int threads) {
    set_threads(threads);
    Buffers buf(d);
    mha::bench::BlasMultiHeadAttention blas(buf.problem);
    if (with_weights) {
        buf.weights.resize(d.batch * d.num_heads * d.query_len * d.key_len);
    }
    const auto &p = buf.problem;
    const float *query = p.query.data();
    const float *key = mha::problems::key_view(p).data;
    const float *value = mha::problems::value_view(p).data;
    for (auto _ : state) {
        blas.forward(query, key, value, buf.output.data(),
                     with_weights ? buf.weights.data() : nullptr);
        benchmark::DoNotOptimize(buf.output.data());
    }
    report(state, d.forward_flops(), threads);
}

// The streaming-read rate of this machine (a large buffer summed): the floor of memory-bound
// calls is their bytes over it.
void stream_read_rate(benchmark::State &state, size_t megabytes, int threads) {
    const std::vector<float> data(megabytes * (size_t(1) << 20) / sizeof(float), 1.0f);
    for (auto _ : state) {
        benchmark::DoNotOptimize(mha::bench::stream_read(data.data(), data.size() * 4, threads));
    }
    state.counters["GB/s"] = benchmark::Counter(double(data.size()) * 4 * 1e-9,
                                                benchmark::Counter::kIsIterationInvariantRate);
}

// A decode step: one new token per batch row against a cache of d.cached tokens (truncated back
// to them before each step).
void halide_decode(benchmark::State &state, mha::bench::DecodeShape d, int threads) {
    set_threads(threads);
    const int64_t B = d.batch, N = d.cached, E = d.embed_dim;
    const Problem p =
        mha::problems::random_problem({B, 1, N, E, d.num_heads}, 1, false, 0, 0, d.kv_heads);
    const auto module = mha::problems::make_module(p);
    mha::KvCache cache = module.make_cache(B, N + 1);
    std::vector<float> prompt_output(B * N * E), token(p.query), output(B * E);
    module.decode({p.key.data(), {B, N, E}}, cache, {prompt_output.data(), {B, N, E}});
    for (auto _ : state) {
        cache.truncate(N);
        module.decode({token.data(), {B, 1, E}}, cache, {output.data(), {B, 1, E}});
        benchmark::DoNotOptimize(output.data());
    }
    state.SetLabel(mha::dispatched_isa());
    state.counters["bytes"] = d.bytes_read();
    state.counters["GB/s"] =
        benchmark::Counter(d.bytes_read() * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

// Causal self-attention (top-left) as ForwardOptions::causal, as PyTorch's boolean triangular
// attn_mask, or not causal at all, for scale.
void halide_causal(benchmark::State &state, Dims d, mha::bench::CausalMode mode, int threads) {
    set_threads(threads);
    Buffers buf(d);
    const auto module = mha::problems::make_module(buf.problem);
    std::vector<uint8_t> above_diagonal(d.query_len * d.key_len);
    for (int64_t i = 0; i < d.query_len; i++) {
        for (int64_t j = 0; j < d.key_len; j++) {
            above_diagonal[i * d.key_len + j] = j > i;
        }
    }
    mha::ForwardOptions options;
    if (mode == mha::bench::CausalMode::implicit) {
        options.causal = mha::Causal::top_left;
    } else if (mode == mha::bench::CausalMode::explicit_mask) {
        options.attn_mask = mha::BoolTensor{above_diagonal.data(), {d.query_len, d.key_len}};
    }
    const mha::MutableTensor out{buf.output.data(), {d.batch, d.query_len, d.embed_dim}};
    for (auto _ : state) {
        module.forward(mha::problems::query_view(buf.problem), mha::problems::key_view(buf.problem),
                       mha::problems::value_view(buf.problem), out, options);
        benchmark::DoNotOptimize(buf.output.data());
    }
    state.SetLabel(mha::dispatched_isa());
}

// Grouped-query self-attention: kv_heads key/value heads for the shape's query heads.
void halide_gqa(benchmark::State &state, mha::bench::GqaShape g, int threads) {
    set_threads(threads);
    const Dims &d = g.shape;
    const Problem p = mha::problems::random_problem(d, 1, true, 0, 0, g.kv_heads);
    const auto module = mha::problems::make_module(p);
    std::vector<float> output(d.batch * d.query_len * d.embed_dim);
    const mha::MutableTensor out{output.data(), {d.batch, d.query_len, d.embed_dim}};
    for (auto _ : state) {
        module.forward(mha::problems::query_view(p), mha::problems::key_view(p),
                       mha::problems::value_view(p), out);
        benchmark::DoNotOptimize(output.data());
    }
    state.SetLabel(mha::dispatched_isa());
}

// Self-attention of a module in `dtype` on tensors of that type (converted before timing), no
// weights; labelled with the kernel that runs (bf16 on a matrix engine, or f32).
void halide_dtype(benchmark::State &state, Dims d, mha::DType dtype, int threads) {
    set_threads(threads);
    Buffers buf(d);
    buf.problem.dtype = dtype;
    const auto module = mha::problems::make_module(buf.problem);
    const mha::problems::ProblemTensors tensors(buf.problem);
    const mha::MutableTensor out{buf.output.data(), {d.batch, d.query_len, d.embed_dim}};
    for (auto _ : state) {
        tensors.forward(module, out, {});
        benchmark::DoNotOptimize(buf.output.data());
    }
    state.SetLabel(module.kernel_name(mha::problems::query_view(buf.problem),
                                      mha::problems::key_view(buf.problem),
                                      mha::problems::value_view(buf.problem), {}));
    report(state, d.forward_flops(), threads);
}

// Each stage's own library (tests' stage generators) on the shape's tensors.
using Halide::Runtime::Buffer;
void stage(benchmark::State &state, const std::string &which, Dims d, int threads) {
    set_threads(threads);
    const int B = d.batch, Sq = d.query_len, Sk = d.key_len, E = d.embed_dim, H = d.num_heads;
    const int hd = d.head_dim();
    auto filled = [](Buffer<float> b) {
        std::mt19937 rng(3);
        std::uniform_real_distribution<float> u(-1, 1);
        b.for_each_value([&](float &x) { x = u(rng); });
        return b;
    };
    double flops = 0;
    std::function<int()> run;
    if (which == "linear_projection") {
        auto x = filled(Buffer<float>(E, Sq, B)), w = filled(Buffer<float>(E, E));
        auto bias = filled(Buffer<float>(E));
        Buffer<float> y(E, Sq, B);
        run = [=]() mutable {
            return mha_linear_projection(x, w, bias, y);
        };
        flops = 2.0 * B * Sq * E * E;
    } else if (which == "split_heads") {
        auto x = filled(Buffer<float>(E, Sq, B));
        Buffer<float> heads(hd, Sq, H, B);
        run = [=]() mutable {
            return mha_split_heads(x, H, heads);
        };
    } else if (which == "scaled_scores") {
        auto q = filled(Buffer<float>(hd, Sq, H, B)), k = filled(Buffer<float>(hd, Sk, H, B));
        Buffer<float> s(Sk, Sq, H, B);
        run = [=]() mutable {
            return mha_scaled_scores(q, k, s);
        };
        flops = 2.0 * B * H * Sq * Sk * hd;
    } else if (which == "masked_softmax") {
        auto s = filled(Buffer<float>(Sk, Sq, H, B));
        Buffer<float> w(Sk, Sq, H, B);
        run = [=]() mutable {
            return mha_masked_softmax_none(s, w);
        };
    } else if (which == "attend_values") {
        auto w = filled(Buffer<float>(Sk, Sq, H, B)), v = filled(Buffer<float>(hd, Sk, H, B));
        Buffer<float> c(hd, Sq, H, B);
        run = [=]() mutable {
            return mha_attend_values(w, v, c);
        };
        flops = 2.0 * B * H * Sq * Sk * hd;
    } else {
        auto c = filled(Buffer<float>(hd, Sq, H, B));
        Buffer<float> m(E, Sq, B);
        run = [=]() mutable {
            return mha_merge_heads(c, m);
        };
    }
    for (auto _ : state) {
        if (run() != 0) {
            state.SkipWithError("stage kernel failed");
            break;
        }
    }
    if (flops > 0) {
        report(state, flops, threads);
    }
}

void register_all(const std::vector<int> &thread_counts) {
    for (int threads : thread_counts) {
        benchmark::RegisterBenchmark(fmt::format("sgemm2048/threads:{}", threads).c_str(),
                                     sgemm_ceiling, threads)
            ->Unit(benchmark::kMillisecond)
            ->MinTime(0.5);
        using mha::bench::Products;
        for (const auto &[name, products] : {std::pair{"fma", Products::f32_fma},
                                             {"bf16dot", Products::bf16_dot},
                                             {"f16widened", Products::f16_widened}}) {
            if (mha::bench::has_products(products)) {
                benchmark::RegisterBenchmark(fmt::format("{}/threads:{}", name, threads).c_str(),
                                             product_ceiling, products, threads)
                    ->Unit(benchmark::kMillisecond);
            }
        }
    }
    for (const Dims &d : mha::bench::kBenchmarkSweep) {
        for (bool w : {false, true}) {
            for (int threads : thread_counts) {
                const auto suffix =
                    fmt::format("{}/weights:{}/threads:{}", shape_name(d), int(w), threads);
                benchmark::RegisterBenchmark(("halide/" + suffix).c_str(), halide_forward, d, w,
                                             threads)
                    ->Unit(benchmark::kMillisecond);
                benchmark::RegisterBenchmark(("blas/" + suffix).c_str(), blas_forward, d, w,
                                             threads)
                    ->Unit(benchmark::kMillisecond);
            }
        }
    }
    for (int threads : thread_counts) {
        benchmark::RegisterBenchmark(fmt::format("stream_read/MB:256/threads:{}", threads).c_str(),
                                     stream_read_rate, 256, threads)
            ->Unit(benchmark::kMillisecond);
        for (const mha::bench::DecodeShape &d : mha::bench::kDecodeSweep) {
            const std::string kv = d.kv_heads ? fmt::format("_KV{}", d.kv_heads) : "";
            benchmark::RegisterBenchmark(
                fmt::format("decode/B{}_N{}_E{}_H{}{}/threads:{}", d.batch, d.cached, d.embed_dim,
                            d.num_heads, kv, threads)
                    .c_str(),
                halide_decode, d, threads)
                ->Unit(benchmark::kMillisecond);
        }
    }
    for (const Dims &d : mha::bench::kCausalSweep) {
        for (mha::bench::CausalMode mode : mha::bench::kCausalModes) {
            benchmark::RegisterBenchmark(fmt::format("causal/{}/mode:{}/threads:2", shape_name(d),
                                                     mha::bench::causal_mode_name(mode))
                                             .c_str(),
                                         halide_causal, d, mode, 2)
                ->Unit(benchmark::kMillisecond);
        }
    }
    for (const mha::bench::GqaShape &g : mha::bench::kGqaSweep) {
        benchmark::RegisterBenchmark(
            fmt::format("gqa/{}_kv{}/threads:2", shape_name(g.shape), g.kv_heads).c_str(),
            halide_gqa, g, 2)
            ->Unit(benchmark::kMillisecond);
    }
    for (const Dims &d : mha::bench::kDtypeSweep) {
        for (mha::DType dtype : mha::contract::kDTypes) {
            benchmark::RegisterBenchmark(fmt::format("dtype/{}/dtype:{}/threads:2", shape_name(d),
                                                     mha::contract::dtype_name(dtype))
                                             .c_str(),
                                         halide_dtype, d, dtype, 2)
                ->Unit(benchmark::kMillisecond);
        }
    }
    for (const char *st : {"linear_projection", "split_heads", "scaled_scores", "masked_softmax",
                           "attend_values", "merge_heads"}) {
        for (const Dims &d : mha::bench::kBenchmarkSweep) {
            benchmark::RegisterBenchmark(
                fmt::format("stage/{}/{}/threads:2", st, shape_name(d)).c_str(), stage,
                std::string(st), d, 2)
                ->Unit(benchmark::kMillisecond);
        }
    }
}

}  // namespace

int main(int argc, char **argv) {
    benchmark::Initialize(&argc, argv);  // takes Google Benchmark's --benchmark_* flags
    CLI::App app(
        "This project's forward pass and stages against OpenBLAS over the benchmark "
        "sweep (contract/mha_contract.h); Google Benchmark's --benchmark_* flags apply.",
        "mha_bench");
    std::vector<int> thread_counts = {1, 2};
    app.add_option("--threads", thread_counts, "thread counts to run the forward pass at")
        ->check(CLI::Range(1, 1024))
        ->type_name("N...")
        ->capture_default_str();
    if (const auto code = mha::tools::parse_command_line(app, argc, argv)) {
        return *code;
    }
    register_all(thread_counts);
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
