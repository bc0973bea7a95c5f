#include "tuning_db.h"

#include <ctime>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

namespace mha::tune {
namespace {

using json = nlohmann::ordered_json;

json shape_json(const contract::ProblemShape &s) {
    return {s.batch, s.query_len, s.key_len, s.embed_dim, s.num_heads};
}

contract::ProblemShape shape_from(const json &j) {
    return {j.at(0).get<int64_t>(), j.at(1).get<int64_t>(), j.at(2).get<int64_t>(),
            j.at(3).get<int64_t>(), j.at(4).get<int64_t>()};
}

std::string utc_now() {
    const std::time_t now = std::time(nullptr);
    char text[32];
    std::strftime(text, sizeof text, "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&now));
    return text;
}

std::string bucket_name(contract::ShapeBucket b) {
    return std::string(contract::bucket_spec(b).name);
}

const contract::CpuIsa &isa_named(const std::string &name) {
    return contract::kCpuIsas[*contract::cpu_isa_index(name)];
}

}  // namespace

TuningDb::TuningDb(std::string path, RunContext context)
    : path_(std::move(path)), context_(std::move(context)) {
    std::ifstream in(path_);
    std::string line;
    while (std::getline(in, line)) {
        try {
            records_.push_back(json::parse(line));
        } catch (const json::parse_error &) {
            skipped_++;
        }
    }
}

TuningDb::~TuningDb() = default;

size_t TuningDb::loaded() const { return records_.size(); }

bool TuningDb::comparable(const json &r) const {
    return r.value("isa", "") == context_.isa && r.value("target", "") == context_.target &&
           r.value("schedule_hash", "") == context_.schedule_hash &&
           r.value("machine", "") == context_.machine &&
           r.value("thread_pool", "halide") == context_.thread_pool;
}

std::optional<Measurement> TuningDb::earlier(const std::string &role, contract::ShapeBucket bucket,
                                             const contract::ProblemShape &shape,
                                             const cpu::ScheduleParams &params) const {
    const json want_params = cpu::params_to_json(params);
    for (auto r = records_.rbegin(); r != records_.rend(); ++r) {
        try {
            if (r->value("kind", "") != "measurement" || r->value("role", "") != role ||
                !comparable(*r) || r->value("bucket", "") != bucket_name(bucket) ||
                shape_from(r->at("shape")) != shape || r->at("params") != want_params) {
                continue;
            }
            Measurement m{role, bucket, shape, params, std::nullopt, r->value("failure", ""), 0};
            if (m.failure.empty()) {
                m.result =
                    Comparison{r->at("gain").get<double>(), r->at("candidate_ms").get<double>(),
                               r->at("baseline_ms").get<double>(),
                               r->at("round_gains").get<std::vector<double>>()};
            }
            return m;
        } catch (const json::exception &) {
            continue;  // a record of another shape of the format: not this one
        }
    }
    return std::nullopt;
}

std::map<contract::ShapeBucket, cpu::TunedBucket> TuningDb::decisions() const {
    std::map<contract::ShapeBucket, cpu::TunedBucket> latest;
    const contract::CpuIsa &isa = isa_named(context_.isa);
    for (const json &r : records_) {
        try {
            if (r.value("kind", "") != "decision" || !comparable(r)) {
                continue;
            }
            const cpu::TunedBucket t = cpu::tuned_bucket_from_json(
                r, *contract::bucket_named(r.at("bucket").get<std::string>()), isa, path_ + ": ");
            latest[t.bucket] = t;
        } catch (const std::exception &) {
            continue;
        }
    }
    return latest;
}

void TuningDb::write(json record) {
    json line = {{"kind", record.at("kind")},   {"run", context_.run},
                 {"date", utc_now()},           {"isa", context_.isa},
                 {"target", context_.target},   {"schedule_hash", context_.schedule_hash},
                 {"machine", context_.machine}, {"thread_pool", context_.thread_pool}};
    for (auto &[key, value] : record.items()) {
        line[key] = value;
    }
    // One write per line, flushed: a run killed at any moment leaves whole lines, or at worst
    // a last partial line that the next load skips.
    std::ofstream out(path_, std::ios::app);
    out << line.dump() << "\n";
    out.flush();
    if (!out) {
        throw std::runtime_error("could not append to the tuning database " + path_);
    }
    records_.push_back(std::move(line));
}

std::vector<json> TuningDb::comparable_records() const {
    std::vector<json> result;
    std::copy_if(records_.begin(), records_.end(), std::back_inserter(result),
                 [&](const json &r) { return comparable(r); });
    return result;
}

void TuningDb::append(const Measurement &m) {
    json r = {{"kind", "measurement"},
              {"role", m.role},
              {"bucket", bucket_name(m.bucket)},
              {"shape", shape_json(m.shape)},
              {"params", cpu::params_to_json(m.params)}};
    if (m.role == "noise") {
        r["noise"] = m.noise;
    } else if (m.result) {
        r["gain"] = m.result->gain;
        r["candidate_ms"] = m.result->candidate_ms;
        r["baseline_ms"] = m.result->baseline_ms;
        r["round_gains"] = m.result->round_gains;
    } else {
        r["failure"] = m.failure;
    }
    write(std::move(r));
}

void TuningDb::append(const Decision &d) {
    const cpu::TunedBucket &t = d.tuned;
    json verified = json::array();
    for (const auto &[shape, gain] : d.verified_on) {
        verified.push_back({{"shape", shape_json(shape)}, {"gain", gain}});
    }
    json record = cpu::tuned_bucket_to_json(t);
    record["kind"] = "decision";
    record["bucket"] = bucket_name(t.bucket);
    record["shape"] = shape_json(d.shape);
    record["verified_on"] = verified;
    record["command"] = context_.command;
    write(std::move(record));
}

}  // namespace mha::tune
