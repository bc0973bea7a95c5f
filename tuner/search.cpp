#include "search.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <random>
#include <set>
#include <thread>

#include <unistd.h>

#include "measurement.h"
#include "search_space.h"
#include "tuning_db.h"

namespace mha::tune {
namespace {

using Clock = std::chrono::steady_clock;
using contract::BucketSpec;
using contract::ProblemShape;
using cpu::ScheduleParams;

constexpr int kRandomPhase = 16;   // random candidates before local refinement
constexpr int kPatience = 40;      // refinement steps without improvement before stopping
constexpr int kFinalists = 3;      // re-timed before the winner is chosen
constexpr double kMinGain = 1.02;  // a winner must beat the defaults by at least this much

std::string shape_text(const ProblemShape &s) {
    return fmt::format("({}, {}, {}, {}, {})", s.batch, s.query_len, s.key_len, s.embed_dim,
                       s.num_heads);
}

std::string utc_date() {
    const std::time_t now = std::time(nullptr);
    char text[32];
    std::strftime(text, sizeof text, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
    return text;
}

// `params` compiled, checked against the reference and timed against `baseline` on `work`.
Measurement measure(const std::string &role, contract::ShapeBucket bucket,
                    const contract::CpuIsa &isa, const ScheduleParams &params,
                    const Candidate &baseline, Workload &work, int rounds) {
    const ProblemShape &shape = work.problem.dims;
    Measurement m{role, bucket, shape, params, std::nullopt, "", 0};
    try {
        const Candidate candidate(isa, shape, params.to_string());
        const double error = check_error(candidate, shape);
        if (!(error < 1e-5)) {
            m.failure = fmt::format("wrong answer: relative L2 {:.2e}", error);
        } else if (!(m.result = compare_interleaved(baseline, candidate, work, rounds))) {
            m.failure = "a call failed";
        }
    } catch (const std::exception &e) {
        m.failure = fmt::format("does not compile: {}", e.what());
    }
    return m;
}

// An earlier run's measurement of the same thing, or a new one, recorded as it is made.
Measurement measure_once(TuningDb &db, const std::string &role, contract::ShapeBucket bucket,
                         const contract::CpuIsa &isa, const ScheduleParams &params,
                         const Candidate &baseline, Workload &work, int rounds, bool &resumed) {
    if (std::optional<Measurement> earlier = db.earlier(role, bucket, work.problem.dims, params)) {
        resumed = true;
        return *earlier;
    }
    resumed = false;
    Measurement m = measure(role, bucket, isa, params, baseline, work, rounds);
    db.append(m);
    return m;
}

double gain_of(const Measurement &m) { return m.result ? m.result->gain : 0; }

cpu::TunedBucket tune_bucket(const TuneOptions &o, const BucketSpec &spec, TuningDb &db,
                             Clock::time_point deadline, const std::string &label) {
    const contract::CpuIsa &isa = *o.isa;
    const ProblemShape shape = o.tuning_shape.value_or(spec.tuning_shape);
    const ScheduleParams defaults = ScheduleParams::defaults(isa);
    Workload work(shape, o.seed);
    const Candidate baseline(isa, shape, defaults.to_string());
    const double noise = measure_noise(baseline, work, o.rounds);
    db.append(Measurement{"noise", spec.bucket, shape, defaults, std::nullopt, "", noise});
    fmt::print(stderr, "[{}] tuning on {}; timing noise of one comparison ±{:.1f}%\n", label,
               shape_text(shape), 100 * noise);

    // The search. Its random draws depend only on the seed and on the gains seen, and an
    // earlier run's gains come back from the database, so a resumed run retraces the earlier
    // one without measuring again, then goes on.
    const SearchSpace space(isa);
    std::mt19937_64 rng(o.seed * 1000003 + uint64_t(spec.bucket));
    std::vector<Measurement> tried;
    std::set<std::string> seen = {defaults.to_string()};
    ScheduleParams best = defaults;
    double best_gain = 1;
    int since_improvement = 0, resumed_count = 0;
    for (int step = 1; step < 10000 && since_improvement < kPatience; step++) {
        if ((o.max_candidates > 0 && int(tried.size()) >= o.max_candidates) ||
            Clock::now() >= deadline) {
            break;
        }
        const bool random_phase = int(tried.size()) < kRandomPhase;
        const ScheduleParams p = space.plausible_draw(
            [&] { return random_phase ? space.random(rng) : space.neighbour(best, rng); });
        if (!seen.insert(p.to_string()).second) {
            since_improvement += random_phase ? 0 : 1;
            continue;
        }
        bool resumed = false;
        tried.push_back(
            measure_once(db, "search", spec.bucket, isa, p, baseline, work, o.rounds, resumed));
        resumed_count += resumed;
        const Measurement &m = tried.back();
        if (gain_of(m) > best_gain) {
            best = p;
            best_gain = gain_of(m);
            since_improvement = 0;
        } else if (!random_phase) {
            since_improvement++;
        }
        const double left =
            std::max(0.0, std::chrono::duration<double>(deadline - Clock::now()).count());
        fmt::print(stderr, "[{}] candidate {}: {}{} | best {:.2f}x | {}m{:02}s left\n", label,
                   tried.size(),
                   m.result ? fmt::format("{:.3f} ms, {:.2f}x the defaults", m.result->candidate_ms,
                                          m.result->gain)
                            : m.failure.substr(0, 70),
                   resumed ? " (recorded earlier)" : "", best_gain, int(left) / 60, int(left) % 60);
    }
    if (resumed_count > 0) {
        fmt::print(stderr, "[{}] resumed {} candidates from {}\n", label, resumed_count,
                   o.database);
    }

    // The finalists, re-timed: the search's best gain is the luckiest of many noisy ones.
    std::vector<const Measurement *> ranked;
    for (const Measurement &m : tried) {
        if (gain_of(m) > 1) {
            ranked.push_back(&m);
        }
    }
    std::sort(ranked.begin(), ranked.end(),
              [](const Measurement *a, const Measurement *b) { return gain_of(*a) > gain_of(*b); });
    ranked.resize(std::min<size_t>(ranked.size(), kFinalists));
    cpu::TunedBucket t;
    t.bucket = spec.bucket;
    t.params = defaults;
    t.noise = noise;
    t.candidates = int(tried.size());
    t.date = utc_date();
    t.machine = db.context().machine;
    t.schedule_hash = db.context().schedule_hash;
    std::optional<Measurement> winner;  // the finalist that held up best when re-timed
    for (const Measurement *finalist : ranked) {
        bool resumed = false;
        const Measurement again = measure_once(db, "finalist", spec.bucket, isa, finalist->params,
                                               baseline, work, o.rounds, resumed);
        fmt::print(stderr, "[{}] finalist {}: {:.2f}x in the search, {:.2f}x re-timed\n", label,
                   finalist->params.to_string(), gain_of(*finalist), gain_of(again));
        if (gain_of(again) > (winner ? gain_of(*winner) : 1.0)) {
            winner = again;
        }
    }
    if (winner) {
        t.params = winner->params;
        t.search_gain = gain_of(*winner);
        t.noise = std::max(t.noise, winner->result->standard_error());
    }

    // The winner verified, timed the same way, on the tuning shape and on the bucket's sweep
    // shapes: one shape does not speak for a bucket.
    std::vector<std::pair<ProblemShape, double>> verified;
    if (!(t.params == defaults)) {
        std::vector<ProblemShape> shapes = {shape};
        for (const ProblemShape &s : contract::kBenchmarkSweep) {
            if (o.verify_on_sweep && contract::shape_bucket(s.token_rows()) == spec.bucket &&
                !(s == shape)) {
                shapes.push_back(s);
            }
        }
        for (const ProblemShape &s : shapes) {
            std::optional<Workload> other_work;
            std::optional<Candidate> other_baseline;
            if (!(s == shape)) {
                other_work.emplace(s, o.seed);
                other_baseline.emplace(isa, s, defaults.to_string());
            }
            bool resumed = false;
            const Measurement m = measure_once(db, "verify", spec.bucket, isa, t.params,
                                               other_baseline ? *other_baseline : baseline,
                                               other_work ? *other_work : work, o.rounds, resumed);
            verified.push_back({s, gain_of(m)});
            if (s == shape && m.result) {
                t.noise = std::max(t.noise, m.result->standard_error());
            }
            fmt::print(stderr, "[{}] verified on {}: {}\n", label, shape_text(s),
                       m.result ? fmt::format("{:.3f} ms against {:.3f} ms, {:.2f}x",
                                              m.result->candidate_ms, m.result->baseline_ms,
                                              m.result->gain)
                                : m.failure);
        }
        double log_gain = 0;
        for (const auto &[s, gain] : verified) {
            log_gain += gain > 0 ? std::log(gain) : -INFINITY;
        }
        t.verified_gain = verified.front().second;
        t.bucket_gain = std::exp(log_gain / double(verified.size()));
        t.kept_defaults =
            !(t.bucket_gain >= std::max(kMinGain, 1 + 2 * t.noise) && t.verified_gain > 1);
    }
    fmt::print(
        stderr,
        "[{}] search {:.2f}x, verification {:.2f}x on the tuning shape ({} within the "
        "noise, ±{:.1f}%), {:.2f}x over {} shape(s): {}\n",
        label, t.search_gain, t.verified_gain,
        agree_within_noise(t.search_gain, t.verified_gain, t.noise) ? "agree" : "do not agree",
        100 * t.noise, t.bucket_gain, std::max<size_t>(1, verified.size()),
        t.kept_defaults ? "defaults kept" : "tuned parameters kept");
    if (t.kept_defaults) {
        t.params = defaults;
    }
    db.append(Decision{t, shape, verified});
    return t;
}

// The tuned file with the database's decisions for this schedule code, over what the file had.
void update_tuned_file(const TuneOptions &o, const TuningDb &db) {
    cpu::TunedFile file;
    try {
        file = cpu::read_tuned_file(o.tuned_file, *o.isa);
    } catch (const cpu::TunedFileError &) {
        file = {};  // no complete file yet: it starts from the decisions
    }
    file.isa = std::string(o.isa->name);
    file.target = std::string(o.isa->halide_target);
    file.command = o.command;
    for (const auto &[bucket, decided] : db.decisions()) {
        auto same = std::find_if(file.buckets.begin(), file.buckets.end(),
                                 [&](const cpu::TunedBucket &t) { return t.bucket == bucket; });
        if (same == file.buckets.end()) {
            file.buckets.push_back(decided);
        } else {
            *same = decided;
        }
    }
    std::sort(file.buckets.begin(), file.buckets.end(),
              [](const auto &a, const auto &b) { return a.bucket < b.bucket; });
    cpu::write_tuned_file(o.tuned_file, file);
}

}  // namespace

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

int tune(const TuneOptions &o) {
    const auto start = Clock::now();
    const auto deadline = start + std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(o.budget_minutes * 60));
    TuningDb db(o.database,
                {std::string(o.isa->name), std::string(o.isa->halide_target), MHA_SCHEDULE_HASH,
                 machine_description(), fmt::format("{}-{}", utc_date(), ::getpid()), o.command});
    fmt::print(stderr, "tuning database {}: {} earlier records{}\n", o.database, db.loaded(),
               db.skipped() ? fmt::format(" ({} unreadable lines skipped)", db.skipped()) : "");
    for (size_t b = 0; b < o.buckets.size(); b++) {
        const BucketSpec &spec = contract::bucket_spec(o.buckets[b]);
        const std::string label = fmt::format("{} {}/{}", spec.name, b + 1, o.buckets.size());
        // An equal share of what is left for each remaining bucket.
        const auto bucket_deadline =
            Clock::now() + (deadline - Clock::now()) / int(o.buckets.size() - b);
        tune_bucket(o, spec, db, bucket_deadline, label);
        update_tuned_file(o, db);
    }
    update_tuned_file(o, db);
    fmt::print(stderr, "wrote {} ({:.1f} minutes)\n", o.tuned_file,
               std::chrono::duration<double>(Clock::now() - start).count() / 60);
    return 0;
}

}  // namespace mha::tune
