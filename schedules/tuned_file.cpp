#include "tuned_file.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace mha::cpu {
namespace {

using json = nlohmann::ordered_json;

std::string describe(const std::string &path, const std::string &problem) {
    return "tuned schedule file " + path + ": " + problem;
}

// The value at `key` of `object`, which must have the JSON type `type` (e.g. is_string);
// errors start with `where`.
const json &member(const json &object, const char *key, bool (json::*type)() const,
                   const char *type_name, const std::string &where) {
    const auto it = object.find(key);
    if (it == object.end()) {
        throw TunedFileError(where + "has no \"" + key + "\"");
    }
    if (!((*it).*type)()) {
        throw TunedFileError(where + "\"" + key + "\" is " + it->dump() + ", not " + type_name);
    }
    return *it;
}

std::string text(const json &object, const char *key, const std::string &where) {
    return member(object, key, &json::is_string, "a string", where).get<std::string>();
}

}  // namespace

json params_to_json(const ScheduleParams &p) {
    json out = json::object();
    for (const auto &[name, field] : ScheduleParams::kTunables) {
        out[std::string(name)] = p.*field;
    }
    return out;
}

ScheduleParams params_from_json(const json &params, const contract::CpuIsa &isa,
                                const std::string &where) {
    ScheduleParams p = ScheduleParams::defaults(isa);
    for (const auto &[name, value] : params.items()) {
        if (ScheduleParams::field(name) == nullptr) {
            throw TunedFileError(where + "unknown parameter \"" + name + "\" (the parameters are " +
                                 ScheduleParams().to_string() + ")");
        }
        if (!value.is_number_integer()) {
            throw TunedFileError(where + "parameter " + name + " is " + value.dump() +
                                 ", not a whole number");
        }
        p.set(name, value.get<int>());
    }
    const std::string why = p.invalid_because();
    if (!why.empty()) {
        throw TunedFileError(where + "parameters " + p.to_string() + " are invalid: " + why);
    }
    return p;
}

json tuned_bucket_to_json(const TunedBucket &t) {
    return {{"params", params_to_json(t.params)},
            {"kept_defaults", t.kept_defaults},
            {"search_gain", t.search_gain},
            {"verified_gain", t.verified_gain},
            {"bucket_gain", t.bucket_gain},
            {"noise", t.noise},
            {"candidates", t.candidates},
            {"schedule_hash", t.schedule_hash},
            {"date", t.date},
            {"machine", t.machine}};
}

TunedBucket tuned_bucket_from_json(const json &entry, contract::ShapeBucket bucket,
                                   const contract::CpuIsa &isa, const std::string &where) {
    if (!entry.is_object()) {
        throw TunedFileError(where + "not an object");
    }
    TunedBucket t;
    t.bucket = bucket;
    t.params =
        params_from_json(member(entry, "params", &json::is_object, "an object", where), isa, where);
    t.kept_defaults =
        member(entry, "kept_defaults", &json::is_boolean, "true or false", where).get<bool>();
    for (auto [key, field] : {std::pair{"search_gain", &t.search_gain},
                              {"verified_gain", &t.verified_gain},
                              {"bucket_gain", &t.bucket_gain},
                              {"noise", &t.noise}}) {
        *field = member(entry, key, &json::is_number, "a number", where).get<double>();
    }
    t.candidates =
        member(entry, "candidates", &json::is_number_integer, "a whole number", where).get<int>();
    t.schedule_hash = text(entry, "schedule_hash", where);
    t.date = text(entry, "date", where);
    t.machine = text(entry, "machine", where);
    return t;
}

const TunedBucket *TunedFile::find(contract::ShapeBucket b) const {
    for (const TunedBucket &t : buckets) {
        if (t.bucket == b) {
            return &t;
        }
    }
    return nullptr;
}

ScheduleParams TunedFile::effective_params(const contract::CpuIsa &isa,
                                           contract::ShapeBucket b) const {
    const TunedBucket *t = find(b);
    return t != nullptr && !t->kept_defaults ? t->params : ScheduleParams::defaults(isa);
}

std::string tuned_file_path(const std::string &dir, const contract::CpuIsa &isa,
                            const contract::CpuIdentity &cpu) {
    return dir + "/" + std::string(isa.name) + "." + contract::cpu_key(cpu) + ".json";
}

std::vector<TunedFile> read_tuned_files(const std::string &dir, const contract::CpuIsa &isa) {
    std::vector<std::string> paths;
    const std::string prefix = std::string(isa.name) + ".";
    std::error_code error;
    for (const auto &entry : std::filesystem::directory_iterator(dir, error)) {
        const std::string name = entry.path().filename().string();
        if (name.rfind(prefix, 0) == 0 && entry.path().extension() == ".json") {
            paths.push_back(entry.path().string());
        }
    }
    std::sort(paths.begin(), paths.end());
    std::vector<TunedFile> files;
    for (const std::string &path : paths) {
        files.push_back(read_tuned_file(path, isa));
        const std::string expected = tuned_file_path(dir, isa, files.back().cpu);
        if (std::filesystem::path(path).filename() != std::filesystem::path(expected).filename()) {
            throw TunedFileError(describe(
                path, "was tuned on " + contract::cpu_key(files.back().cpu) + ", so its name is " +
                          std::filesystem::path(expected).filename().string()));
        }
    }
    return files;
}

TunedFile read_tuned_file(const std::string &path, const contract::CpuIsa &isa) {
    std::ifstream in(path);
    if (!in) {
        throw TunedFileError(describe(path, "missing: the " + std::string(isa.name) +
                                                " kernels are built from it (run mha-tune --isa " +
                                                std::string(isa.name) + ")"));
    }
    json doc;
    try {
        doc = json::parse(in);
    } catch (const json::parse_error &e) {
        throw TunedFileError(describe(path, std::string("malformed JSON: ") + e.what()));
    }
    if (!doc.is_object()) {
        throw TunedFileError(describe(path, "not a JSON object"));
    }
    TunedFile file;
    const std::string where = describe(path, "");
    const std::string format = text(doc, "format", where);
    if (format != kTunedFileFormat) {
        throw TunedFileError(
            describe(path, "format is \"" + format + "\", expected \"" + kTunedFileFormat + "\""));
    }
    file.isa = text(doc, "isa", where);
    file.target = text(doc, "target", where);
    if (file.isa != isa.name || file.target != isa.halide_target) {
        throw TunedFileError(describe(
            path, "tunes " + file.isa + " (" + file.target + ") but the build reads it for " +
                      std::string(isa.name) + " (" + std::string(isa.halide_target) + ")"));
    }
    file.command = text(doc, "command", where);
    const json &cpu = member(doc, "cpu", &json::is_object, "an object", where);
    const std::string cpu_where = describe(path, "cpu: ");
    file.cpu.vendor = text(cpu, "vendor", cpu_where);
    file.cpu.name = text(cpu, "name", cpu_where);
    for (auto [key, field] : {std::pair{"family", &file.cpu.family}, {"model", &file.cpu.model}}) {
        *field = member(cpu, key, &json::is_number_integer, "a whole number", cpu_where).get<int>();
    }
    for (auto [key, field] :
         {std::pair{"l2_kib", &file.cpu.l2_kib}, {"l3_kib", &file.cpu.l3_kib}}) {
        *field =
            member(cpu, key, &json::is_number_integer, "a whole number", cpu_where).get<int64_t>();
    }
    const json &buckets = member(doc, "buckets", &json::is_object, "an object", where);
    for (const auto &[name, entry] : buckets.items()) {
        const auto bucket = contract::bucket_named(name);
        if (!bucket) {
            throw TunedFileError(describe(path, "unknown bucket \"" + name + "\""));
        }
        file.buckets.push_back(
            tuned_bucket_from_json(entry, *bucket, isa, describe(path, "bucket " + name + ": ")));
    }
    for (const contract::BucketSpec &b : contract::kShapeBuckets) {
        if (file.find(b.bucket) == nullptr) {
            throw TunedFileError(describe(path, "bucket " + std::string(b.name) +
                                                    " is not tuned (run mha-tune --isa " +
                                                    file.isa + " to finish it)"));
        }
    }
    return file;
}

void write_tuned_file(const std::string &path, const TunedFile &file) {
    json doc = {{"format", kTunedFileFormat},
                {"isa", file.isa},
                {"target", file.target},
                {"command", file.command},
                {"cpu",
                 {{"vendor", file.cpu.vendor},
                  {"family", file.cpu.family},
                  {"model", file.cpu.model},
                  {"l2_kib", file.cpu.l2_kib},
                  {"l3_kib", file.cpu.l3_kib},
                  {"name", file.cpu.name}}},
                {"buckets", json::object()}};
    for (const TunedBucket &t : file.buckets) {
        doc["buckets"][std::string(contract::bucket_spec(t.bucket).name)] = tuned_bucket_to_json(t);
    }
    // Written whole to a temporary, then renamed: a reader never sees half a file.
    const std::string temporary = path + ".tmp";
    {
        std::ofstream out(temporary);
        out << doc.dump(2) << "\n";
        if (!out) {
            throw TunedFileError(describe(path, "could not be written"));
        }
    }
    if (std::rename(temporary.c_str(), path.c_str()) != 0) {
        throw TunedFileError(describe(path, "could not be replaced"));
    }
}

}  // namespace mha::cpu
