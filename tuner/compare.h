// mha-tune --compare: on every shape of the benchmark sweep, the tuned parameters and Halide's
// Adams2019, Mullapudi2016 and Li2018 autoschedulers, each timed against the defaults in
// interleaved rounds (measurement.h), each in a child process of its own that is cut off after
// a time limit (an autoscheduler's search or compile can take minutes).
#pragma once

#include <string>

#include "mha_contract.h"

namespace mha::tune {

inline const char *const kAutoschedulers[] = {"Adams2019", "Mullapudi2016", "Li2018"};

struct CompareOptions {
    const contract::CpuIsa *isa = nullptr;
    std::string tuned_file;  // whose parameters "tuned" is
    int rounds = 5;
    int limit_seconds = 90;
    bool with_autoschedulers = true;
    std::string self;  // this program, to run the children
};

// Prints the comparison table (markdown) and per-bucket summary; the exit code.
int compare(const CompareOptions &o);

// A child of compare(): sweep shape `shape_index`, `contender` ("tuned" or an autoscheduler)
// against the defaults; prints one line: "ok <gain> <candidate ms> <baseline ms>", or
// "failed ..." / "wrong ...". The exit code.
int measure_contender(const CompareOptions &o, size_t shape_index, const std::string &contender);

}  // namespace mha::tune
