// mha-tune: benchmark-driven search over the CPU schedule's parameters (schedules/cpu_schedule.h).
//
// For each shape bucket it JIT-compiles candidates of the forward pass for one target, checks
// each against the double-precision reference, times it with Halide's benchmark harness, and
// keeps the fastest. Random sampling first, then local refinement of the best (one or two
// parameters moved to a neighbouring value), with early stopping; candidates that cannot fit
// the register file are pruned before compiling. The winner is kept only if it still beats the
// defaults when re-timed on every sweep shape of its bucket. Writes schedules/tuned/<target>.json.
//
// mha-tune --compare instead times, per shape of the CPU sweep, the default parameters, the
// tuned file's, and Halide's Adams2019, Mullapudi2016 and Li2018 autoschedulers on the same
// pipeline, and prints the table.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sys/wait.h>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

#include "Halide.h"
#include "cpu_schedule.h"
#include "halide_benchmark.h"
#include "packed_weights.h"
#include "reference.h"

namespace {

using mha::cpu::ScheduleParams;
using mha::reference::Dims;
using Clock = std::chrono::steady_clock;

struct Bucket {
    const char *name;
    int64_t max_rows;  // token rows B·max(Sq, Sk) up to which a call uses this bucket's kernels
    Dims shape;        // what it is tuned on
};
// Keep in step with kShapeBuckets in runtime/src/kernel_table.h.
const Bucket kBuckets[] = {{"small", 64, {2, 5, 5, 512, 8}},
                           {"medium", 1024, {4, 256, 256, 512, 8}},
                           {"large", int64_t(1) << 40, {1, 2048, 2048, 512, 8}}};

const Dims kSweep[] = {{2, 5, 5, 512, 8},          {1, 128, 128, 512, 8},
                       {4, 256, 256, 512, 8},      {1, 512, 512, 768, 12},
                       {1, 1024, 1024, 1024, 16},  {1, 2048, 2048, 512, 8},
                       {1, 64, 2048, 512, 8},      {1, 1, 4096, 512, 8}};

const Bucket &bucket_for(const Dims &d) {
    for (const Bucket &b : kBuckets) {
        if (d.batch * std::max(d.query_len, d.key_len) <= b.max_rows) {
            return b;
        }
    }
    return kBuckets[2];
}

// One JIT-compiled forward pass (no mask, no weights), callable by argument name.
class Candidate {
public:
    Candidate(const Halide::Target &target, const Dims &shape, const std::string &schedule,
              const std::string &autoscheduler = "") {
        Halide::GeneratorContext context(target);
        auto gen = Halide::Internal::GeneratorRegistry::create("mha_forward", context);
        const bool fused = shape.query_len == shape.key_len;
        gen->set_generatorparam_value("fused_qkv", fused ? "true" : "false");
        gen->set_generatorparam_value("schedule", schedule);
        const std::pair<const char *, int64_t> estimates[] = {
            {"est_batch", shape.batch},         {"est_query_len", shape.query_len},
            {"est_key_len", shape.key_len},     {"est_embed_dim", shape.embed_dim},
            {"est_heads", shape.num_heads}};
        for (const auto &[name, value] : estimates) {
            gen->set_generatorparam_value(name, std::to_string(value));
        }
        if (!autoscheduler.empty()) {
            gen->set_generatorparam_value("autoscheduler", autoscheduler);
        }
        Halide::Pipeline pipeline = gen->build_pipeline();
        if (!autoscheduler.empty()) {
            Halide::AutoschedulerParams params(autoscheduler, {{"parallelism", "2"}});
            pipeline.apply_autoscheduler(target, params);
        }
        args_ = pipeline.infer_arguments();
        for (const Halide::Func &out : pipeline.outputs()) {
            outputs_.push_back(out.name());
        }
        callable_ = pipeline.compile_to_callable(args_, target);
    }

    // Runs on `p`, writing `output`; returns Halide's result code.
    int run(const mha::reference::Problem &p, const mha::detail::PackedWeights &w,
            std::vector<float> &output) const {
        const Dims &d = p.dims;
        Halide::Runtime::Buffer<float> q(const_cast<float *>(p.query.data()),
                                         {int(d.embed_dim), int(d.query_len), int(d.batch)});
        Halide::Runtime::Buffer<float> k(const_cast<float *>(p.key.data()),
                                         {int(d.embed_dim), int(d.key_len), int(d.batch)});
        Halide::Runtime::Buffer<float> v(const_cast<float *>(p.value.data()),
                                         {int(d.embed_dim), int(d.key_len), int(d.batch)});
        Halide::Runtime::Buffer<float> out(output.data(),
                                           {int(d.embed_dim), int(d.query_len), int(d.batch)});
        int32_t head_dim = static_cast<int32_t>(d.head_dim());
        std::map<std::string, const void *> named = {
            {"query", q.raw_buffer()}, {"key", k.raw_buffer()}, {"value", v.raw_buffer()},
            {"head_dim", &head_dim}};
        for (const auto &view : w.views) {
            named[view.name] = view.view->raw();
        }
        Halide::JITUserContext context;
        Halide::JITUserContext *context_ptr = &context;
        std::vector<const void *> argv = {&context_ptr};
        for (const Halide::Argument &a : args_) {
            argv.push_back(named.at(a.name));
        }
        for (size_t o = 0; o < outputs_.size(); o++) {
            argv.push_back(out.raw_buffer());
        }
        return callable_.call_argv_fast(argv.size(), argv.data());
    }

private:
    std::vector<Halide::Argument> args_;
    std::vector<std::string> outputs_;
    Halide::Callable callable_;
};

// A problem and its packed weights, built once per shape.
struct Workload {
    mha::reference::Problem problem;
    std::unique_ptr<mha::detail::PackedWeights> weights;
    std::vector<float> output;
    explicit Workload(const Dims &d, uint64_t seed)
        : problem(mha::reference::random_problem(d, seed, d.query_len == d.key_len)),
          output(d.batch * d.query_len * d.embed_dim) {
        const std::array<mha::Linear, 4> lin = mha::reference::linears(problem);
        const mha::Linear *linears[4] = {&lin[0], &lin[1], &lin[2], &lin[3]};
        weights = std::make_unique<mha::detail::PackedWeights>(d.embed_dim, d.num_heads, linears,
                                                               mha::Device::cpu);
    }
};

// Median-free best-of timing from Halide's harness, in milliseconds.
double time_ms(const Candidate &c, Workload &w, double min_time) {
    Halide::Tools::BenchmarkConfig config;
    config.min_time = min_time;
    config.max_time = 4 * min_time;
    return 1e3 * Halide::Tools::benchmark([&] { c.run(w.problem, *w.weights, w.output); }, config)
                     .wall_time;
}

// How long Halide's harness times a shape: longer for the large ones, whose runs are few.
double min_time_for(const Dims &d) { return d.forward_flops() > 5e9 ? 0.4 : 0.15; }

// The median of a few timings (the middle one after sorting).
double median(std::vector<double> ms) {
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
}

bool same_shape(const Dims &a, const Dims &b) {
    return a.batch == b.batch && a.query_len == b.query_len && a.key_len == b.key_len &&
           a.embed_dim == b.embed_dim && a.num_heads == b.num_heads;
}

// Relative L2 error on a small awkward shape with the bucket's embedding.
double check_error(const Candidate &c, const Dims &bucket_shape, bool fused) {
    Dims d{2, 7, fused ? 7 : 11, bucket_shape.embed_dim, bucket_shape.num_heads};
    Workload w(d, 99);
    if (c.run(w.problem, *w.weights, w.output) != 0) {
        return INFINITY;
    }
    return mha::reference::relative_l2(w.output, mha::reference::forward(w.problem).output);
}

// The search space, per parameter, for a target with `lanes` f32 lanes and `registers` vector
// registers.
struct Space {
    std::map<std::string, std::vector<int>> values;
    int registers;
    Space(int lanes, int registers) : registers(registers) {
        std::vector<int> vectors;
        for (int v : {1, 2, 4, 8}) {
            if (mha::kMaxTile % (v * lanes) == 0) {
                vectors.push_back(v);
            }
        }
        values = {{"proj_vectors", vectors},         {"proj_rows", {2, 3, 4, 6, 8, 12, 14}},
                  {"proj_block_tiles", {4, 8, 16, 32, 64}}, {"attention_rows", {4, 8, 12, 16, 24}},
                  {"tasks_per_head", {1, 2, 4, 8}},  {"qk_vectors", vectors},
                  {"qk_rows", {1, 2, 3, 4, 6, 8, 12}}, {"pv_vectors", vectors},
                  {"pv_rows", {1, 2, 3, 4, 6, 8, 12}}, {"materialize_weights", {0, 1}}};
    }
    // Cost-model pruning: register tiles that spill are never worth compiling.
    bool plausible(const ScheduleParams &p) const {
        const int budget = registers - 2;
        return p.invalid_because().empty() && p.proj_vectors * p.proj_rows <= budget &&
               p.qk_vectors * p.qk_rows <= budget && p.pv_vectors * p.pv_rows <= budget;
    }
    ScheduleParams random(ScheduleParams p, std::mt19937_64 &rng) const {
        for (const auto &[name, field] : ScheduleParams::tunables()) {
            const auto &choices = values.at(name);
            p.*field = choices[rng() % choices.size()];
        }
        return p;
    }
    // One or two parameters moved to a neighbouring value.
    ScheduleParams neighbour(ScheduleParams p, std::mt19937_64 &rng) const {
        const auto &t = ScheduleParams::tunables();
        for (int moves = 1 + rng() % 2; moves > 0; moves--) {
            const auto &[name, field] = t[rng() % t.size()];
            const auto &choices = values.at(name);
            auto it = std::find(choices.begin(), choices.end(), p.*field);
            const int at = it == choices.end() ? 0 : int(it - choices.begin());
            const int step = (rng() % 2) ? 1 : -1;
            p.*field = choices[std::clamp(at + step, 0, int(choices.size()) - 1)];
        }
        return p;
    }
};

struct Tried {
    ScheduleParams params;
    double ms;           // INFINITY when it failed
    std::string failure;  // why, when it failed
};

std::string params_json(const ScheduleParams &p) {
    std::string out;
    for (const auto &[name, field] : ScheduleParams::tunables()) {
        out += fmt::format("{}\"{}\": {}", out.empty() ? "" : ", ", name, p.*field);
    }
    return "{" + out + "}";
}

std::string machine_description() {
    std::ifstream cpuinfo("/proc/cpuinfo");
    std::string line;
    while (std::getline(cpuinfo, line)) {
        if (line.rfind("model name", 0) == 0) {
            return fmt::format("{}, {} cores", line.substr(line.find(':') + 2),
                               std::thread::hardware_concurrency());
        }
    }
    return "unknown";
}

std::string isa_entry(const std::string &isa, const ScheduleParams &p) {
    return isa + "@" + p.to_string();
}

int tune(const Halide::Target &target, double budget_minutes, uint64_t seed,
         const std::string &out_path, const std::string &command) {
    const std::string isa = ScheduleParams::isa_of(target);
    const ScheduleParams defaults = ScheduleParams::for_target(target);
    const Space space(defaults.vector_lanes, target.has_feature(Halide::Target::AVX512) ? 32 : 16);
    std::mt19937_64 rng(seed);
    const auto start = Clock::now();
    const auto deadline = start + std::chrono::duration<double>(budget_minutes * 60);
    std::string buckets_json;
    for (size_t b = 0; b < std::size(kBuckets); b++) {
        const Bucket &bucket = kBuckets[b];
        const bool fused = bucket.shape.query_len == bucket.shape.key_len;
        // An equal share of what is left for each remaining bucket.
        const auto bucket_deadline =
            Clock::now() + (deadline - Clock::now()) / int(std::size(kBuckets) - b);
        Workload work(bucket.shape, seed);
        const double min_time = min_time_for(bucket.shape);
        std::vector<Tried> tried;
        const auto evaluate = [&](const ScheduleParams &p) {
            Tried t{p, INFINITY, ""};
            try {
                Candidate c(target, bucket.shape, isa_entry(isa, p));
                const double error = check_error(c, bucket.shape, fused);
                if (!(error < 1e-5)) {
                    t.failure = fmt::format("wrong answer: relative L2 {:.2e}", error);
                } else {
                    t.ms = time_ms(c, work, min_time);
                }
            } catch (const std::exception &e) {
                t.failure = fmt::format("failed to compile: {}", e.what());
            }
            tried.push_back(t);
            return t.ms;
        };
        const double default_ms = evaluate(defaults);
        Tried best = tried.back();
        int since_improvement = 0;
        const int random_phase = 16, patience = 40;
        for (int n = 1; Clock::now() < bucket_deadline && since_improvement < patience; n++) {
            ScheduleParams p;
            int attempts = 0;
            do {  // prune implausible candidates before spending a compile on them
                p = n <= random_phase ? space.random(defaults, rng) : space.neighbour(best.params, rng);
            } while (!space.plausible(p) && ++attempts < 1000);
            const double ms = evaluate(p);
            if (ms < best.ms) {
                best = tried.back();
                since_improvement = 0;
            } else if (n > random_phase) {
                since_improvement++;
            }
            const double left =
                std::max(0.0, std::chrono::duration<double>(deadline - Clock::now()).count());
            fmt::print(stderr,
                       "[{} {}/{}] candidate {}: {} | best {:.3f} ms ({:.2f}x default) | {}m{:02}s "
                       "left\n",
                       bucket.name, b + 1, std::size(kBuckets), n,
                       std::isfinite(ms) ? fmt::format("{:.3f} ms", ms) : tried.back().failure.substr(0, 60),
                       best.ms, default_ms / best.ms, int(left) / 60, int(left) % 60);
        }
        // Timing noise on a shared machine can crown a lucky candidate, and one tuning shape does
        // not speak for its whole bucket: re-time the winner against the defaults, interleaved,
        // on every shape of the benchmark sweep that falls in this bucket, and keep the defaults
        // unless the winner's geometric mean over them is still ahead.
        double verified_default = default_ms, verified_best = best.ms, verified_gain = 1;
        if (std::isfinite(best.ms) && !(best.params.to_string() == defaults.to_string())) {
            double log_gain = 0;
            int shapes = 0;
            for (const Dims &d : kSweep) {
                if (&bucket_for(d) != &bucket) {
                    continue;
                }
                Workload shape_work(d, seed);
                Candidate def(target, d, isa_entry(isa, defaults));
                Candidate win(target, d, isa_entry(isa, best.params));
                std::vector<double> d_samples, w_samples;
                for (int round = 0; round < 3; round++) {
                    d_samples.push_back(time_ms(def, shape_work, min_time_for(d)));
                    w_samples.push_back(time_ms(win, shape_work, min_time_for(d)));
                }
                const double d_ms = median(d_samples), w_ms = median(w_samples);
                if (same_shape(d, bucket.shape)) {
                    verified_default = d_ms;
                    verified_best = w_ms;
                }
                log_gain += std::log(d_ms / w_ms);
                shapes++;
                fmt::print(stderr, "[{}] verifying on ({}, {}, {}, {}, {}): default {:.3f} ms, "
                           "tuned {:.3f} ms\n", bucket.name, d.batch, d.query_len, d.key_len,
                           d.embed_dim, d.num_heads, d_ms, w_ms);
            }
            verified_gain = std::exp(log_gain / shapes);
            if (verified_gain < 1.02) {
                best = tried.front();  // the defaults
                verified_best = verified_default;
            }
        }
        fmt::print(stderr, "[{}] verified: default {:.3f} ms, tuned {:.3f} ms on the tuning shape; "
                   "{:.2f}x over the bucket's sweep shapes{}\n", bucket.name, verified_default,
                   verified_best, verified_gain, verified_gain < 1.02 ? ": defaults kept" : "");
        std::string failed;
        for (const Tried &t : tried) {
            if (!t.failure.empty()) {
                failed += fmt::format("{}\n        {{\"params\": {}, \"why\": {:?}}}",
                                      failed.empty() ? "" : ",", params_json(t.params), t.failure);
            }
        }
        buckets_json += fmt::format(
            "{}\n    {{\"name\": \"{}\", \"max_rows\": {}, \"shape\": [{}, {}, {}, {}, {}],\n"
            "     \"params\": {},\n     \"default_ms\": {:.4f}, \"tuned_ms\": {:.4f}, "
            "\"bucket_speedup\": {:.3f}, \"candidates\": {}, \"failed\": [{}]}}",
            b ? "," : "", bucket.name, bucket.max_rows, bucket.shape.batch, bucket.shape.query_len,
            bucket.shape.key_len, bucket.shape.embed_dim, bucket.shape.num_heads,
            params_json(best.params), verified_default, verified_best,
            verified_gain < 1.02 ? 1.0 : verified_gain, tried.size(), failed);
    }
    const std::time_t now = std::time(nullptr);
    char date[32];
    std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
    std::ofstream out(out_path);
    out << fmt::format(
        "{{\n  \"format\": \"mha-tuned-schedule/1\",\n  \"target\": \"{}\",\n  \"isa\": \"{}\",\n"
        "  \"date\": \"{}\",\n  \"machine\": {:?},\n  \"command\": {:?},\n  \"seed\": {},\n"
        "  \"buckets\": [{}\n  ]\n}}\n",
        target.to_string(), isa, date, machine_description(), command, seed, buckets_json);
    fmt::print(stderr, "wrote {} ({:.1f} minutes)\n", out_path,
               std::chrono::duration<double>(Clock::now() - start).count() / 60);
    return out ? 0 : 1;
}

// The tuned parameters of `bucket` in a tuned file, by a plain scan of its JSON.
std::optional<ScheduleParams> tuned_params(const std::string &path, const Halide::Target &target,
                                           const char *bucket) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    const std::string json = text.str();
    const size_t at = json.find(fmt::format("\"name\": \"{}\"", bucket));
    if (at == std::string::npos) {
        return std::nullopt;
    }
    const size_t open = json.find('{', json.find("\"params\"", at));
    const std::string body = json.substr(open + 1, json.find('}', open) - open - 1);
    std::string assignments;
    for (char c : body) {
        if (c != '"' && c != ' ' && c != '\n') {
            assignments += c;
        }
    }
    ScheduleParams p = ScheduleParams::for_target(target);
    p.apply(assignments);
    return p;
}

// One measurement of --compare: shape `index` of the sweep with `which` schedule (default,
// tuned, or an autoscheduler's name); prints milliseconds, or "wrong" / "failed".
int measure_one(const Halide::Target &target, const std::string &tuned_path, size_t index,
                const std::string &which) {
    const Dims &d = kSweep[index];
    Workload work(d, 5);
    std::string schedule, autoscheduler;
    if (which == "tuned") {
        if (auto tuned = tuned_params(tuned_path, target, bucket_for(d).name)) {
            schedule = isa_entry(ScheduleParams::isa_of(target), *tuned);
        }
    } else if (which != "default") {
        autoscheduler = which;
    }
    Candidate c(target, d, schedule, autoscheduler);
    const double error = check_error(c, d, d.query_len == d.key_len);
    if (!(error < 1e-5)) {
        fmt::print("wrong\n");
        return 0;
    }
    fmt::print("{:.4f}\n", time_ms(c, work, min_time_for(d)));
    return 0;
}

// Every measurement in a child process of its own, so that one autoscheduler's long search or
// compile is cut off at `limit_s` without stopping the comparison. The default and tuned
// schedules are timed `rounds` times, interleaved, and reported by their medians, so that the
// ratio between them is not one run's noise.
int compare(const std::string &self, const std::string &target_string,
            const std::string &tuned_path, int limit_s, int rounds) {
    const char *autoschedulers[] = {"Adams2019", "Mullapudi2016", "Li2018"};
    fmt::print("| shape (B, Sq, Sk, E, H) | default ms | tuned ms | Adams2019 ms | "
               "Mullapudi2016 ms | Li2018 ms | tuned × default | tuned × best autoscheduler |\n");
    fmt::print("|---|---|---|---|---|---|---|---|\n");
    // Milliseconds, or why there are none ("failed", "wrong", "> N s").
    const auto measure = [&](size_t i, const std::string &which) -> std::pair<double, std::string> {
        const std::string cmd =
            fmt::format("timeout {} '{}' --target {} --measure {} {} --compare '{}' 2>/dev/null",
                        limit_s, self, target_string, i, which, tuned_path);
        std::string out;
        if (FILE *pipe = popen(cmd.c_str(), "r")) {
            char buf[128];
            while (fgets(buf, sizeof buf, pipe)) {
                out += buf;
            }
            const int status = pclose(pipe);
            if (WIFEXITED(status) && WEXITSTATUS(status) == 124) {
                out = fmt::format("> {} s", limit_s);
            }
        }
        while (!out.empty() && std::isspace(static_cast<unsigned char>(out.back()))) {
            out.pop_back();
        }
        char *end = nullptr;
        const double value = std::strtod(out.c_str(), &end);
        if (!out.empty() && end && *end == '\0') {
            return {value, fmt::format("{:.3f}", value)};
        }
        return {INFINITY, out.empty() ? "failed" : out};
    };
    double log_speedup = 0;
    for (size_t i = 0; i < std::size(kSweep); i++) {
        const Dims &d = kSweep[i];
        std::map<std::string, std::pair<double, std::string>> result;
        std::map<std::string, std::vector<double>> samples;
        for (int round = 0; round < rounds; round++) {
            for (const char *which : {"default", "tuned"}) {
                const auto [ms, cell] = measure(i, which);
                samples[which].push_back(ms);
                result[which] = {ms, cell};
                fmt::print(stderr, "shape {}/{} {} round {}/{}: {}\n", i + 1, std::size(kSweep),
                           which, round + 1, rounds, cell);
            }
        }
        for (const char *which : {"default", "tuned"}) {
            const double ms = median(samples[which]);
            if (std::isfinite(ms)) {
                result[which] = {ms, fmt::format("{:.3f}", ms)};
            }
        }
        for (const char *which : autoschedulers) {
            result[which] = measure(i, which);
            fmt::print(stderr, "shape {}/{} {}: {}\n", i + 1, std::size(kSweep), which,
                       result[which].second);
        }
        const double tuned = result["tuned"].first;
        const double best_auto = std::min({result["Adams2019"].first,
                                           result["Mullapudi2016"].first, result["Li2018"].first});
        log_speedup += std::log(result["default"].first / tuned);
        fmt::print("| {}, {}, {}, {}, {} | {} | {} | {} | {} | {} | {:.2f} | {:.2f} |\n", d.batch,
                   d.query_len, d.key_len, d.embed_dim, d.num_heads, result["default"].second,
                   result["tuned"].second, result["Adams2019"].second,
                   result["Mullapudi2016"].second, result["Li2018"].second,
                   result["default"].first / tuned, best_auto / tuned);
        std::fflush(stdout);
    }
    fmt::print("\ngeometric mean over the sweep, tuned × default: {:.2f}\n",
               std::exp(log_speedup / std::size(kSweep)));
    return 0;
}

}  // namespace

int main(int argc, char **argv) {
    std::string target_string = "x86-64-linux-avx-avx2-f16c-fma-sse41";
    std::string out_path, tuned_path;
    double budget_minutes = 15;
    uint64_t seed = 1;
    bool comparing = false;
    int limit_s = 90;
    int rounds = 3;
    std::optional<std::pair<size_t, std::string>> one;
    std::string command = "mha-tune";
    for (int a = 1; a < argc; a++) {
        command += std::string(" ") + argv[a];
    }
    for (int a = 1; a < argc; a++) {
        const std::string arg = argv[a];
        const auto value = [&]() -> std::string {
            if (a + 1 >= argc) {
                fmt::print(stderr, "mha-tune: {} needs a value\n", arg);
                std::exit(2);
            }
            return argv[++a];
        };
        if (arg == "--target") {
            target_string = value();
        } else if (arg == "--budget-minutes") {
            budget_minutes = std::stod(value());
        } else if (arg == "--seed") {
            seed = std::stoull(value());
        } else if (arg == "--out") {
            out_path = value();
        } else if (arg == "--compare") {
            comparing = true;
            tuned_path = value();
        } else if (arg == "--limit-seconds") {
            limit_s = std::stoi(value());
        } else if (arg == "--rounds") {
            rounds = std::max(1, std::stoi(value()));
        } else if (arg == "--measure") {
            const size_t index = std::stoul(value());
            one = std::pair{index, value()};
        } else {
            fmt::print(stderr,
                       "usage: mha-tune [--target T] [--budget-minutes M] [--seed S] --out FILE\n"
                       "       mha-tune [--target T] [--limit-seconds S] [--rounds N] --compare TUNED_FILE\n");
            return 2;
        }
    }
    try {
        const Halide::Target target(target_string);
        Halide::load_plugin(MHA_ADAMS2019_PLUGIN);
        Halide::load_plugin(MHA_MULLAPUDI2016_PLUGIN);
        Halide::load_plugin(MHA_LI2018_PLUGIN);
        if (one) {
            return measure_one(target, tuned_path, one->first, one->second);
        }
        if (comparing) {
            return compare(std::filesystem::read_symlink("/proc/self/exe").string(), target_string,
                           tuned_path, limit_s, rounds);
        }
        if (out_path.empty()) {
            fmt::print(stderr, "mha-tune: --out FILE is required\n");
            return 2;
        }
        return tune(target, budget_minutes, seed, out_path, command);
    } catch (const std::exception &e) {
        fmt::print(stderr, "mha-tune: {}\n", e.what());
        return 1;
    }
}
