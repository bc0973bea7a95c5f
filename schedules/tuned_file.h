// Tuned CPU schedule files, schedules/tuned/<isa>.<cpu key>.json: the parameters mha-tune chose
// for each shape bucket of one instruction set on one CPU, with the evidence for the choice.
// mha-tune derives the file from its tuning database (<isa>.records.jsonl, every CPU's records)
// and the build reads every CPU's files. Halide-free.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu_params.h"
#include "mha_contract.h"

namespace mha::cpu {

inline constexpr const char *kTunedFileFormat = "mha-tuned-schedule/3";

// What the tuner decided for one bucket.
struct TunedBucket {
    contract::ShapeBucket bucket;
    ScheduleParams params;      // the winner, or the defaults it was measured against
    bool kept_defaults = true;  // no candidate beat the defaults by more than the noise
    double search_gain = 1;     // winner over defaults on the tuning shape, during the search
    double verified_gain = 1;   // the same, re-measured in the verification
    double bucket_gain = 1;     // geometric mean over the bucket's verification shapes
    double noise = 0;           // spread of defaults against themselves, as a fraction
    int candidates = 0;         // measured in the search
    std::string schedule_hash;  // of the schedule code it was measured on
    std::string date, machine;
};

struct TunedFile {
    std::string isa, target;
    contract::CpuIdentity cpu;  // what it was tuned on
    std::string command;        // the mha-tune command that wrote it
    std::vector<TunedBucket> buckets;

    const TunedBucket *find(contract::ShapeBucket b) const;
    // The parameters a bucket's kernels are built with: the tuned ones, or today's defaults.
    ScheduleParams effective_params(const contract::CpuIsa &isa, contract::ShapeBucket b) const;
};

// A missing, malformed or mismatched tuned file.
class TunedFileError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

// Reads and checks a tuned file for `isa`: format, instruction set and target, every bucket
// present once, every parameter known and valid. Errors name the file.
TunedFile read_tuned_file(const std::string &path, const contract::CpuIsa &isa);

void write_tuned_file(const std::string &path, const TunedFile &file);

// Parameters as a JSON object {"proj_vectors": 2, ...}, and back: every name known, every value
// a whole number, the set valid for `isa`; errors (TunedFileError) start with `where`.
nlohmann::ordered_json params_to_json(const ScheduleParams &params);
ScheduleParams params_from_json(const nlohmann::ordered_json &object, const contract::CpuIsa &isa,
                                const std::string &where);

// One bucket's entry as JSON (what a tuned file holds under the bucket's name, and what a
// decision record of the tuning database carries), and back.
nlohmann::ordered_json tuned_bucket_to_json(const TunedBucket &bucket);
TunedBucket tuned_bucket_from_json(const nlohmann::ordered_json &entry,
                                   contract::ShapeBucket bucket, const contract::CpuIsa &isa,
                                   const std::string &where);

// The path of an instruction set's tuned file for `cpu` in `dir`.
std::string tuned_file_path(const std::string &dir, const contract::CpuIsa &isa,
                            const contract::CpuIdentity &cpu);

// Every tuned file of `isa` in `dir`, read and checked, in the order of their names; each file's
// name must be its CPU's (tuned_file_path).
std::vector<TunedFile> read_tuned_files(const std::string &dir, const contract::CpuIsa &isa);

}  // namespace mha::cpu
