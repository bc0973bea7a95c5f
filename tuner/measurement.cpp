#include "measurement.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>

namespace mha::tune {
namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> values) {
    std::sort(values.begin(), values.end());
    const size_t n = values.size();
    return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

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

double measure_noise(const Candidate &baseline, Workload &work, int rounds) {
    // More rounds than one comparison takes, for a steadier estimate of the spread.
    const int sample_rounds = std::max(9, 2 * rounds);
    const std::optional<Comparison> self =
        compare_interleaved(baseline, baseline, work, sample_rounds);
    if (!self || self->round_gains.size() < 2) {
        return 0;
    }
    double mean = 0, squares = 0;
    for (double g : self->round_gains) {
        mean += std::log(g);
    }
    mean /= self->round_gains.size();
    for (double g : self->round_gains) {
        squares += (std::log(g) - mean) * (std::log(g) - mean);
    }
    const double sigma = std::sqrt(squares / (self->round_gains.size() - 1));
    return 1.25 * sigma / std::sqrt(double(rounds));
}

bool agree_within_noise(double a, double b, double noise) {
    return std::abs(std::log(a / b)) <= 2 * std::sqrt(2.0) * noise;
}

}  // namespace mha::tune
