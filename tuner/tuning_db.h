// The tuning database, in the manner of TVM's: JSON lines appended as each measurement is made
// (schedules/tuned/<isa>.records.jsonl), so that a run can be interrupted and resumed and the
// history is kept. Every record names the instruction set, target, schedule code (a hash of
// it), machine and run it was measured in; a run reuses only records of the same instruction
// set, target, schedule code and machine. The tuned file the build reads is derived from the
// decision records (tuned_file.h).
#pragma once

#include <map>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "measurement.h"
#include "tuned_file.h"

namespace mha::tune {

// What every record of one run carries. thread_pool: what ran the candidates' parallel loops,
// "library" (the library's pool, as its kernels run); records without it ran on Halide's own.
struct RunContext {
    std::string isa, target, schedule_hash, machine, thread_pool, run, command;
};

struct Measurement {
    std::string role;  // noise | search | finalist | verify
    contract::ShapeBucket bucket;
    contract::ProblemShape shape;
    cpu::ScheduleParams params;
    std::optional<Comparison> result;  // against the defaults; none when it failed
    std::string failure;               // why it failed
    double noise = 0;                  // role noise: measure_noise()
};

struct Decision {
    cpu::TunedBucket tuned;
    contract::ProblemShape shape;                                        // tuned on
    std::vector<std::pair<contract::ProblemShape, double>> verified_on;  // shape, gain
};

class TuningDb {
public:
    // Loads the records already in `path` (creating nothing yet); a line that does not parse,
    // such as the last line of a run killed while writing, is counted and skipped.
    TuningDb(std::string path, RunContext context);
    ~TuningDb();

    // The last earlier measurement in `role` of these parameters, on this bucket and shape, made
    // as this run makes them (comparable).
    std::optional<Measurement> earlier(const std::string &role, contract::ShapeBucket bucket,
                                       const contract::ProblemShape &shape,
                                       const cpu::ScheduleParams &params) const;
    // The last decision per bucket made as this run makes them (comparable): this CPU's.
    std::map<contract::ShapeBucket, cpu::TunedBucket> decisions() const;

    void append(const Measurement &m);
    void append(const Decision &d);

    // The records this run could reuse (comparable).
    std::vector<nlohmann::ordered_json> comparable_records() const;

    const RunContext &context() const { return context_; }
    size_t loaded() const;
    size_t skipped() const { return skipped_; }

private:
    void write(nlohmann::ordered_json record);
    // Whether a stored record has this run's instruction set, target, schedule code, machine
    // and thread pool.
    bool comparable(const nlohmann::ordered_json &record) const;

    std::string path_;
    RunContext context_;
    std::vector<nlohmann::ordered_json> records_;
    size_t skipped_ = 0;
};

}  // namespace mha::tune
