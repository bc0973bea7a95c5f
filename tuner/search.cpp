#include "search.h"
#include "search_plot.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <thread>

#include <unistd.h>

#include "cpu_isa.h"
#include "measurement.h"
#include "search_space.h"
#include "sweeps.h"
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

// A bucket's shapes, its workloads and the defaults compiled for them: what every candidate is
// timed on. The tuning shape comes first; then, unless told otherwise, every shape of the
// benchmark sweep in the bucket (one shape does not speak for a bucket).
class BucketBench {
public:
    BucketBench(const TuneOptions &o, const BucketSpec &spec)
        : isa_(*o.isa),
          bucket_(spec.bucket),
          rounds_(o.rounds),
          defaults_(ScheduleParams::defaults(*o.isa)) {
        shapes_.push_back(o.tuning_shape.value_or(spec.tuning_shape));
        for (const ProblemShape &s : bench::kBenchmarkSweep) {
            if (o.sweep_shapes && contract::shape_bucket(s.token_rows()) == spec.bucket &&
                !(s == shapes_.front())) {
                shapes_.push_back(s);
            }
        }
        for (const ProblemShape &s : shapes_) {
            works_.emplace_back(s, o.seed, isa_);
            if (baselines_.count(fused(s)) == 0) {
                baselines_.emplace(fused(s), Candidate(isa_, s, defaults_.to_string()));
            }
        }
    }

    const std::vector<ProblemShape> &shapes() const { return shapes_; }
    const ScheduleParams &defaults() const { return defaults_; }

    // The timing noise on the tuning shape (the defaults against themselves).
    double noise() { return measure_noise(baselines_.at(fused(shapes_[0])), works_[0], rounds_); }

    // `params` on every shape, each against the defaults: earlier measurements of the same
    // thing from the database, the others compiled (once per QKV form), checked against the
    // reference and timed now, and recorded as they are made. The gain is the geometric mean
    // over the shapes, 0 when one failed.
    struct Result {
        std::vector<Measurement> shapes;
        double gain = 0;
        bool resumed = true;  // every shape came from the database
        std::string failure;
    };
    Result measure(TuningDb &db, const std::string &role, const ScheduleParams &params) {
        Result r;
        std::map<bool, std::optional<Candidate>> compiled;
        double log_gain = 0;
        for (size_t i = 0; i < shapes_.size(); i++) {
            const ProblemShape &s = shapes_[i];
            std::optional<Measurement> m = db.earlier(role, bucket_, s, params);
            if (!m) {
                r.resumed = false;
                m = measure_now(role, params, i, compiled[fused(s)]);
                db.append(*m);
            }
            if (!m->result && r.failure.empty()) {
                r.failure = m->failure;
            }
            log_gain += m->result ? std::log(m->result->gain) : -INFINITY;
            r.shapes.push_back(*m);
        }
        r.gain = r.failure.empty() ? std::exp(log_gain / double(shapes_.size())) : 0;
        return r;
    }

private:
    static bool fused(const ProblemShape &s) { return s.query_len == s.key_len; }

    Measurement measure_now(const std::string &role, const ScheduleParams &params, size_t i,
                            std::optional<Candidate> &candidate) {
        const ProblemShape &s = shapes_[i];
        Measurement m{role, bucket_, s, params, std::nullopt, "", 0};
        if (!candidate) {
            try {
                candidate.emplace(isa_, s, params.to_string());
            } catch (const std::exception &e) {
                m.failure = fmt::format("does not compile: {}", e.what());
                return m;
            }
            double error = 0;
            if (!accurate(*candidate, isa_, s, error)) {
                candidate.reset();
                m.failure = fmt::format("wrong answer: relative L2 {:.2e}", error);
                return m;
            }
        }
        m.result = compare_interleaved(baselines_.at(fused(s)), *candidate, works_[i], rounds_);
        if (!m.result) {
            m.failure = "a call failed";
        }
        return m;
    }

    const contract::CpuIsa &isa_;
    contract::ShapeBucket bucket_;
    int rounds_;
    ScheduleParams defaults_;
    std::vector<ProblemShape> shapes_;
    std::vector<Workload> works_;
    std::map<bool, Candidate> baselines_;  // by QKV form
};

double gain_of(const Measurement &m) { return m.result ? m.result->gain : 0; }

// The standard error of a result's gain, the geometric mean of its shapes' gains: from theirs,
// independent, sqrt(sum of squares) / shapes.
double gain_error(const BucketBench::Result &r) {
    double squares = 0;
    for (const Measurement &m : r.shapes) {
        const double e = m.result ? m.result->standard_error() : 0.0;
        squares += e * e;
    }
    return std::sqrt(squares) / double(r.shapes.size());
}

cpu::TunedBucket tune_bucket(const TuneOptions &o, const BucketSpec &spec, TuningDb &db,
                             Clock::time_point deadline, const std::string &label) {
    const contract::CpuIsa &isa = *o.isa;
    BucketBench bench(o, spec);
    const ScheduleParams &defaults = bench.defaults();
    // The defaults against themselves on the tuning shape, taken as every shape's noise: the
    // standard error of a gain over the bucket's shapes.
    const double comparison_noise = bench.noise();
    const double noise = comparison_noise / std::sqrt(double(bench.shapes().size()));
    db.append(
        Measurement{"noise", spec.bucket, bench.shapes()[0], defaults, std::nullopt, "", noise});
    std::string shape_list;
    for (const ProblemShape &s : bench.shapes()) {
        shape_list += (shape_list.empty() ? "" : ", ") + shape_text(s);
    }
    fmt::print(stderr, "[{}] tuning on {}; timing noise of a gain over them ±{:.1f}%\n", label,
               shape_list, 100 * noise);

    // The search. Its random draws depend only on the seed and on the gains seen, and an
    // earlier run's gains come back from the database, so a resumed run retraces the earlier
    // one without measuring again, then goes on.
    const SearchSpace space(isa);
    std::mt19937_64 rng(o.seed * 1000003 + uint64_t(spec.bucket));
    std::vector<std::pair<ScheduleParams, double>> tried;  // params, gain over the bucket
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
        const BucketBench::Result r = bench.measure(db, "search", p);
        tried.push_back({p, r.gain});
        resumed_count += r.resumed;
        if (r.gain > best_gain) {
            best = p;
            best_gain = r.gain;
            since_improvement = 0;
        } else if (!random_phase) {
            since_improvement++;
        }
        const double left =
            std::max(0.0, std::chrono::duration<double>(deadline - Clock::now()).count());
        fmt::print(stderr, "[{}] candidate {}: {}{} | best {:.2f}x | {}m{:02}s left\n", label,
                   tried.size(),
                   r.failure.empty() ? fmt::format("{:.2f}x the defaults", r.gain)
                                     : r.failure.substr(0, 70),
                   r.resumed ? " (recorded earlier)" : "", best_gain, int(left) / 60,
                   int(left) % 60);
    }
    if (resumed_count > 0) {
        fmt::print(stderr, "[{}] resumed {} candidates from {}\n", label, resumed_count,
                   o.database);
    }

    // The finalists, re-timed: the search's best gain is the luckiest of many noisy ones.
    std::sort(tried.begin(), tried.end(),
              [](const auto &a, const auto &b) { return a.second > b.second; });
    cpu::TunedBucket t;
    t.bucket = spec.bucket;
    t.params = defaults;
    t.noise = noise;
    t.candidates = int(tried.size());
    t.date = utc_date();
    t.machine = db.context().machine;
    t.schedule_hash = db.context().schedule_hash;
    std::optional<BucketBench::Result> winner;  // the finalist that held up best when re-timed
    for (size_t f = 0; f < tried.size() && f < size_t(kFinalists) && tried[f].second > 1; f++) {
        BucketBench::Result again = bench.measure(db, "finalist", tried[f].first);
        fmt::print(stderr, "[{}] finalist {}: {:.2f}x in the search, {:.2f}x re-timed\n", label,
                   tried[f].first.to_string(), tried[f].second, again.gain);
        if (again.gain > (winner ? winner->gain : 1.0)) {
            t.params = tried[f].first;
            winner = std::move(again);
        }
    }

    // The winner verified: timed again, the same way, on the same shapes.
    std::vector<std::pair<ProblemShape, double>> verified;
    if (winner) {
        t.search_gain = winner->gain;
        const BucketBench::Result v = bench.measure(db, "verify", t.params);
        for (const Measurement &m : v.shapes) {
            verified.push_back({m.shape, gain_of(m)});
            fmt::print(stderr, "[{}] verified on {}: {}\n", label, shape_text(m.shape),
                       m.result ? fmt::format("{:.3f} ms against {:.3f} ms, {:.2f}x",
                                              m.result->candidate_ms, m.result->baseline_ms,
                                              m.result->gain)
                                : m.failure);
        }
        t.verified_gain = verified.front().second;
        t.bucket_gain = v.gain;
        t.noise = std::max({t.noise, gain_error(*winner), gain_error(v)});
        // A bucket's parameters serve all of its shapes: none may lose beyond one comparison's
        // noise, whatever the mean gains.
        double worst_shape_gain = 1;
        for (const auto &[shape, gain] : verified) {
            worst_shape_gain = std::min(worst_shape_gain, gain);
        }
        const bool a_shape_loses = worst_shape_gain < 1 - 2 * comparison_noise;
        t.kept_defaults = !(t.bucket_gain >= std::max(kMinGain, 1 + 2 * t.noise)) || a_shape_loses;
        if (a_shape_loses) {
            fmt::print(stderr, "[{}] one of its shapes runs {:.2f}x the defaults\n", label,
                       worst_shape_gain);
        }
    }
    fmt::print(stderr,
               "[{}] search {:.2f}x and verification {:.2f}x over the bucket's {} shape(s) ({} "
               "within the noise, ±{:.1f}%): {}\n",
               label, t.search_gain, t.bucket_gain, bench.shapes().size(),
               agree_within_noise(t.search_gain, t.bucket_gain, t.noise) ? "agree" : "do not agree",
               100 * t.noise, t.kept_defaults ? "defaults kept" : "tuned parameters kept");
    if (t.kept_defaults) {
        t.params = defaults;
    }
    db.append(Decision{t, bench.shapes().front(), verified});
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
    file.cpu = detail::this_cpu();
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
    return fmt::format("{}, {} cores", contract::describe(detail::this_cpu()),
                       std::thread::hardware_concurrency());
}

int tune(const TuneOptions &o) {
    const auto start = Clock::now();
    const auto deadline = start + std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(o.budget_minutes * 60));
    TuningDb db(o.database, {std::string(o.isa->name), std::string(o.isa->halide_target),
                             MHA_SCHEDULE_HASH, machine_description(), kCandidateThreadPool,
                             fmt::format("{}-{}", utc_date(), ::getpid()), o.command});
    fmt::print(stderr, "tuning database {}: {} earlier records{}\n", o.database, db.loaded(),
               db.skipped() ? fmt::format(" ({} unreadable lines skipped)", db.skipped()) : "");
    if (o.plot_only) {
        write_search_plot(db, search_plot_path(o.tuned_file));
        fmt::print(stderr, "wrote {}\n", search_plot_path(o.tuned_file));
        return 0;
    }
    for (size_t b = 0; b < o.buckets.size(); b++) {
        const BucketSpec &spec = contract::bucket_spec(o.buckets[b]);
        const std::string label = fmt::format("{} {}/{}", spec.name, b + 1, o.buckets.size());
        // An equal share of what is left for each remaining bucket.
        const auto bucket_deadline =
            Clock::now() + (deadline - Clock::now()) / int(o.buckets.size() - b);
        tune_bucket(o, spec, db, bucket_deadline, label);
        update_tuned_file(o, db);
        write_search_plot(db, search_plot_path(o.tuned_file));
    }
    update_tuned_file(o, db);
    write_search_plot(db, search_plot_path(o.tuned_file));
    fmt::print(stderr, "wrote {} and the search's plot {} ({:.1f} minutes)\n", o.tuned_file,
               search_plot_path(o.tuned_file),
               std::chrono::duration<double>(Clock::now() - start).count() / 60);
    return 0;
}

}  // namespace mha::tune
