// The search of mha-tune: per shape bucket, random sampling then local refinement of the best,
// every candidate checked against the reference and timed against the defaults on the bucket's
// tuning shape and its benchmark-sweep shapes (its gain is the geometric mean over them); the
// best few re-timed, the winner verified the same way, and kept only if it beats the defaults
// by more than the noise. Every measurement goes to the tuning database as it is made;
// a run resumes where an earlier one with the same seed stopped.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "mha_contract.h"

namespace mha::tune {

struct TuneOptions {
    const contract::CpuIsa *isa = nullptr;
    std::vector<contract::ShapeBucket> buckets;  // in this order
    double budget_minutes = 13;                  // for all buckets together
    uint64_t seed = 1;
    int rounds = 5;                                      // of each interleaved comparison
    std::optional<contract::ProblemShape> tuning_shape;  // instead of each bucket's
    int max_candidates = 0;                              // per bucket; 0: until budget or patience
    bool sweep_shapes = true;  // time candidates on the bucket's sweep shapes too
    bool plot_only = false;    // only write the plot of the database's search
    std::string database, tuned_file, command;
};

// Tunes, appending to the database and rewriting the tuned file and the search's plot
// (search_plot.h) after each bucket; the exit code.
int tune(const TuneOptions &options);

// The machine, as records and tuned files name it: CPU model, vendor, family and model numbers
// (VMs often name only "AMD EPYC", which covers Zen 4 and Zen 5), the caches of core 0's level 2
// and 3, and the core count, e.g. "AMD EPYC (AuthenticAMD family 26 model 2; L2 1024K, L3
// 32768K), 2 cores". Records of another description are kept but not reused.
std::string machine_description();

}  // namespace mha::tune
