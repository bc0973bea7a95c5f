// How mha-tune times: always a candidate against a baseline (the default schedule), in
// interleaved rounds on the same workload, so that a slower or faster machine moment affects
// both and the gain between them is what is compared. The search, the choice among its
// finalists, the verification and --compare all use compare_interleaved().
#pragma once

#include <optional>
#include <vector>

#include "candidate.h"

namespace mha::tune {

// The median of `values` (the mean of the middle two for an even count).
double median(std::vector<double> values);

struct Comparison {
    double gain = 0;          // median over rounds of baseline time / candidate time
    double candidate_ms = 0;  // median per-call times
    double baseline_ms = 0;
    std::vector<double> round_gains;

    // The standard error of log(gain), from the spread of the rounds: 1.25 σ / √rounds (σ of
    // the per-round log gains; 1.25 for a median). 0 with fewer than two rounds.
    double standard_error() const;
};

// `rounds` rounds, each timing baseline and candidate once (in alternating order), every timing
// a sample of at least 3 calls and 20 ms after a warm-up call. Returns nullopt when a call fails.
std::optional<Comparison> compare_interleaved(const Candidate &baseline, const Candidate &candidate,
                                              Workload &work, int rounds);

// The timing noise of a Comparison's gain of `rounds` rounds before any candidate is measured:
// the baseline timed against itself (over more rounds, for a steadier σ), as a standard error.
double measure_noise(const Candidate &baseline, Workload &work, int rounds);

// Whether two gains of the same pair, measured apart, agree within the noise (two standard
// errors of their difference, each gain's standard error being `noise`).
bool agree_within_noise(double a, double b, double noise);

}  // namespace mha::tune
