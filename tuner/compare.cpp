#include "compare.h"

#include <fmt/format.h>

#include <sys/wait.h>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>

#include "measurement.h"
#include "sweeps.h"
#include "tuned_file.h"

namespace mha::tune {
namespace {

// A child's answer: the comparison, or why there is none.
struct Outcome {
    std::optional<Comparison> result;
    std::string why;  // "failed", "wrong answer", "> N s"
};

Outcome run_child(const CompareOptions &o, size_t shape_index, const std::string &contender) {
    const std::string command = fmt::format(
        "timeout {} '{}' --isa {} --tuned '{}' --rounds {} --compare --measure-shape {} "
        "--measure-contender {} 2>/dev/null",
        o.limit_seconds, o.self, o.isa->name, o.tuned_file, o.rounds, shape_index, contender);
    std::string out;
    FILE *pipe = popen(command.c_str(), "r");
    if (pipe == nullptr) {
        return {std::nullopt, "failed"};
    }
    char buffer[512];
    while (fgets(buffer, sizeof buffer, pipe)) {
        out += buffer;
    }
    const int status = pclose(pipe);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 124) {
        return {std::nullopt, fmt::format("> {} s", o.limit_seconds)};
    }
    // "ok <gain> <candidate ms> <baseline ms>", or "failed|wrong <why>".
    std::istringstream answer(out);
    std::string word;
    Comparison c;
    if (answer >> word && word == "ok" && answer >> c.gain >> c.candidate_ms >> c.baseline_ms) {
        return {c, ""};
    }
    return {std::nullopt, word == "wrong" ? "wrong" : "failed"};
}

std::string cell(const Outcome &outcome) {
    return outcome.result ? fmt::format("{:.3f}", outcome.result->candidate_ms) : outcome.why;
}

}  // namespace

int measure_contender(const CompareOptions &o, size_t shape_index, const std::string &contender) {
    const contract::ProblemShape &shape = bench::kBenchmarkSweep.at(shape_index);
    const cpu::ScheduleParams defaults = cpu::ScheduleParams::defaults(*o.isa);
    Workload work(shape, 5, *o.isa);
    const Candidate baseline(*o.isa, shape, defaults.to_string());
    std::optional<Candidate> candidate;
    try {
        if (contender == "tuned") {
            const cpu::TunedFile tuned = cpu::read_tuned_file(o.tuned_file, *o.isa);
            const auto params =
                tuned.effective_params(*o.isa, contract::shape_bucket(shape.token_rows()));
            candidate.emplace(*o.isa, shape, params.to_string());
        } else {
            candidate.emplace(*o.isa, shape, "", contender);
        }
    } catch (const std::exception &e) {
        fmt::print("failed {}\n", e.what());
        return 0;
    }
    if (double error = 0; !accurate(*candidate, *o.isa, shape, error)) {
        fmt::print("wrong answer\n");
        return 0;
    }
    const std::optional<Comparison> c = compare_interleaved(baseline, *candidate, work, o.rounds);
    if (!c) {
        fmt::print("failed: a call failed\n");
        return 0;
    }
    fmt::print("ok {} {} {}\n", c->gain, c->candidate_ms, c->baseline_ms);
    return 0;
}

int compare(const CompareOptions &o) {
    const cpu::TunedFile tuned_file = cpu::read_tuned_file(o.tuned_file, *o.isa);
    fmt::print(
        "| shape (B, Sq, Sk, E, H) | bucket | tuned parameters | default ms | tuned ms | "
        "Adams2019 ms | Mullapudi2016 ms | Li2018 ms | tuned × default | "
        "tuned × best autoscheduler |\n");
    fmt::print("|---|---|---|---|---|---|---|---|---|---|\n");
    std::map<std::string, std::vector<double>> bucket_gains;
    for (size_t i = 0; i < bench::kBenchmarkSweep.size(); i++) {
        const contract::ProblemShape &s = bench::kBenchmarkSweep[i];
        const contract::ShapeBucket b = contract::shape_bucket(s.token_rows());
        const std::string bucket(contract::bucket_spec(b).name);
        const cpu::TunedBucket *decided = tuned_file.find(b);
        // With the defaults kept, "tuned" times the defaults against themselves: the noise.
        const char *parameters =
            decided == nullptr || decided->kept_defaults ? "= defaults" : "tuned";
        const Outcome tuned = run_child(o, i, "tuned");
        fmt::print(stderr, "shape {}/{} tuned: {}\n", i + 1, bench::kBenchmarkSweep.size(),
                   tuned.result ? fmt::format("{:.2f}x", tuned.result->gain) : tuned.why);
        std::map<std::string, Outcome> autos;
        double best_auto_gain = 0;  // autoscheduled against the same defaults
        for (const char *a : kAutoschedulers) {
            if (!o.with_autoschedulers) {
                autos[a] = {std::nullopt, "-"};
                continue;
            }
            autos[a] = run_child(o, i, a);
            fmt::print(stderr, "shape {}/{} {}: {}\n", i + 1, bench::kBenchmarkSweep.size(), a,
                       cell(autos[a]));
            if (autos[a].result) {
                best_auto_gain = std::max(best_auto_gain, autos[a].result->gain);
            }
        }
        const double gain = tuned.result ? tuned.result->gain : NAN;
        if (tuned.result) {
            bucket_gains[bucket].push_back(gain);
        }
        fmt::print("| {}, {}, {}, {}, {} | {} | {} | {} | {} | {} | {} | {} | {:.2f} | {} |\n",
                   s.batch, s.query_len, s.key_len, s.embed_dim, s.num_heads, bucket, parameters,
                   tuned.result ? fmt::format("{:.3f}", tuned.result->baseline_ms) : tuned.why,
                   cell(tuned), cell(autos["Adams2019"]), cell(autos["Mullapudi2016"]),
                   cell(autos["Li2018"]), gain,
                   best_auto_gain > 0 ? fmt::format("{:.2f}", gain / best_auto_gain) : "-");
        std::fflush(stdout);
    }
    fmt::print(
        "\n| bucket | tuned × default (geometric mean over its sweep shapes) | "
        "parameters |\n|---|---|---|\n");
    for (const contract::BucketSpec &b : contract::kShapeBuckets) {
        const std::vector<double> &gains = bucket_gains[std::string(b.name)];
        double log_sum = 0;
        for (double g : gains) {
            log_sum += std::log(g);
        }
        const cpu::TunedBucket *t = tuned_file.find(b.bucket);
        fmt::print("| {} | {} | {} |\n", b.name,
                   gains.empty() ? "-" : fmt::format("{:.2f}", std::exp(log_sum / gains.size())),
                   t == nullptr || t->kept_defaults ? "defaults kept" : "tuned");
    }
    return 0;
}

}  // namespace mha::tune
