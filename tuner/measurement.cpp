#include "measurement.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>

namespace mha::tune {

double median(std::vector<double> values) {
    std::sort(values.begin(), values.end());
    const size_t n = values.size();
    return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

namespace {

using Clock = std::chrono::steady_clock;

// Milliseconds per call over one sample; nullopt when a call fails.
std::optional<double> time_per_call(const Candidate &c, Workload &work) {
    constexpr int kMinCalls = 3;
    constexpr double kMinSeconds = 0.02;
    const auto start = Clock::now();
    int calls = 0;
    double seconds = 0;
    while (calls < kMinCalls || seconds < kMinSeconds) {
        if (c.run(work) != 0) {
            return std::nullopt;
        }
        calls++;
        seconds = std::chrono::duration<double>(Clock::now() - start).count();
    }
    return 1e3 * seconds / calls;
}

// σ of the logs of `gains`.
double log_spread(const std::vector<double> &gains) {
    if (gains.size() < 2) {
        return 0;
    }
    double mean = 0, squares = 0;
    for (double g : gains) {
        mean += std::log(g);
    }
    mean /= double(gains.size());
    for (double g : gains) {
        squares += (std::log(g) - mean) * (std::log(g) - mean);
    }
    return std::sqrt(squares / double(gains.size() - 1));
}

}  // namespace

std::optional<Comparison> compare_interleaved(const Candidate &baseline, const Candidate &candidate,
                                              Workload &work, int rounds) {
    // Warm-up: first-call costs (thread pool, scratch blocks, caches) are not a schedule's.
    if (baseline.run(work) != 0 || candidate.run(work) != 0) {
        return std::nullopt;
    }
    Comparison c;
    std::vector<double> baseline_ms, candidate_ms;
    for (int r = 0; r < rounds; r++) {
        std::optional<double> b, t;
        if (r % 2 == 0) {
            b = time_per_call(baseline, work);
            t = time_per_call(candidate, work);
        } else {
            t = time_per_call(candidate, work);
            b = time_per_call(baseline, work);
        }
        if (!b || !t) {
            return std::nullopt;
        }
        baseline_ms.push_back(*b);
        candidate_ms.push_back(*t);
        c.round_gains.push_back(*b / *t);
    }
    c.gain = median(c.round_gains);
    c.baseline_ms = median(baseline_ms);
    c.candidate_ms = median(candidate_ms);
    return c;
}

double Comparison::standard_error() const {
    return round_gains.empty()
               ? 0
               : 1.25 * log_spread(round_gains) / std::sqrt(double(round_gains.size()));
}

double measure_noise(const Candidate &baseline, Workload &work, int rounds) {
    const std::optional<Comparison> self =
        compare_interleaved(baseline, baseline, work, std::max(9, 2 * rounds));
    return self ? 1.25 * log_spread(self->round_gains) / std::sqrt(double(rounds)) : 0;
}

bool agree_within_noise(double a, double b, double noise) {
    return std::abs(std::log(a / b)) <= 2 * std::sqrt(2.0) * noise;
}

}  // namespace mha::tune
