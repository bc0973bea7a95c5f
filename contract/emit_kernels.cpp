// Run by the configure step (cmake/MhaKernels.cmake): turns the contract and the tuned schedule
// files into the build's kernel rows and the runtime's kernel tables.
//
//   emit_kernels --arch x86-64 [--cpu-isas avx512,avx2] [--sanitizer-isa sse41]
//                [--kernels-from <other build>]
//                --tuned-dir schedules/tuned --schedule-hash H --gpu 1 --out-dir <build>
//
// writes <out-dir>/kernels.cmake, one mha_kernel(...) row per kernel to compile for the CPU
// instruction sets of that architecture (all of them, or those of --cpu-isas) and the GPUs, and
// <out-dir>/<device>_kernels.cpp, the table of that device's kernels with a compile-time check
// that each takes the arguments the contract gives its variant. The kernels of --sanitizer-isa
// are marked SANITIZED (compiled again with Halide's asan feature; SANITIZED_ONLY, that alone,
// when --cpu-isas leaves the set out of the library) and have their own table,
// <out-dir>/cpu_sanitizer_kernels.cpp. On the CPU, an instruction set's kernels are compiled
// for its default parameters and for each tuned CPU's file (schedules/tuned/<isa>.<cpu>.json),
// per shape bucket; the (tuning, bucket) cells of the same parameters share one kernel, and the
// CPU table lists the tuned CPUs for dispatch to choose from. Prints "warning: ..."
// lines for the configure step to show; exits 1 with the reason when a tuned file is missing,
// malformed or mismatched. With --kernels-from, a row that the other build's kernels.cmake holds
// word for word, and whose object that build has made, is marked FROM_BUILD <its directory>:
// the same generators (the other build's, mha-halide_generators_ROOT) would make the same object.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "command_line.h"
#include "cpu_params.h"
#include "mha_contract.h"
#include "tuned_file.h"

namespace {

using namespace mha::contract;

// One way an instruction set's kernels are scheduled: its defaults, or a tuned CPU's file.
struct Tuning {
    std::string key;  // "defaults", or the CPU's (contract::cpu_key)
    std::optional<mha::cpu::TunedFile> file;

    mha::cpu::ScheduleParams params(const CpuIsa &isa, ShapeBucket bucket) const {
        return file ? file->effective_params(isa, bucket) : mha::cpu::ScheduleParams::defaults(isa);
    }
};

// A tuned CPU of an instruction set, for the runtime's table.
struct TunedCpuRow {
    int isa;
    int slot;
    CpuIdentity cpu;
};

// One kernel to compile.
struct KernelRow {
    std::string name;
    mha::Device device;
    int isa = -1;  // index into kCpuIsas, -1 on GPUs
    ScheduleCells cells = kAllCells;
    KernelVariant variant;
    std::string target;      // Halide target, kernel features included
    std::string schedule;    // CPU schedule parameters, "name:value,..."
    bool sanitized = false;  // compiled again with Halide's asan feature, for the ASan tests
    bool shipped = true;     // in the library (false: a sanitized row of an ISA not selected)
};

std::string bool_name(bool b) { return b ? "true" : "false"; }

std::string bucket_names(BucketSet set) {
    if (set == kAllBuckets) {
        return std::string(kAnyBucket);
    }
    std::string out;
    for (const BucketSpec &b : kShapeBuckets) {
        if (set & bucket_bit(b.bucket)) {
            out += (out.empty() ? "" : "_") + std::string(b.name);
        }
    }
    return out;
}

// What a kernel's name ends with: nothing for f32, else its dtype.
std::string dtype_suffix(mha::DType dtype) {
    return dtype == mha::DType::f32 ? "" : "_" + std::string(dtype_name(dtype));
}

// `served`: what cells_name() says of a CPU kernel's cells; "any" on GPUs.
std::string kernel_name(const std::string &where, const std::string &served,
                        const KernelVariant &v) {
    std::string name = "mha_" + std::string(op_name(v.op)) + "_" + where + "_" + served;
    if (v.op == KernelOp::qkv_projection || v.op == KernelOp::average_heads) {
        return name + dtype_suffix(v.dtype);
    }
    name += "_" + std::string(mask_kind_name(v.mask)) + "_mask";
    if (v.op == KernelOp::decode) {
        return name + dtype_suffix(v.dtype) +
               (v.cache == mha::CacheDType::f32
                    ? ""
                    : "_cache_" + std::string(cache_dtype_name(v.cache)));
    }
    if (v.op == KernelOp::attention) {
        return name + (v.causal ? "_window" : "") + (v.modified_scores ? "_softcap_alibi" : "") +
               (v.paged          ? "_paged"
                : v.single_query ? "_one_query"
                                 : "") +
               dtype_suffix(v.dtype);
    }
    return name + (v.causal ? "_causal" : "") + (v.fused_qkv ? "_fused" : "_separate") +
           (v.returns_weights ? "_weights" : "") + dtype_suffix(v.dtype);
}

// The generator of each op (generators/mha_generators.cpp).
std::string generator_name(KernelOp op) { return "mha_" + std::string(op_name(op)); }

// Generator params: the variant's axes that its op has, and the CPU schedule.
std::string generator_params(const KernelVariant &v, const std::string &schedule) {
    std::string params;
    if (v.op == KernelOp::forward || v.op == KernelOp::decode || v.op == KernelOp::attention) {
        params += " mask_kind=" + std::string(mask_kind_name(v.mask));
    }
    if (v.op == KernelOp::qkv_projection || v.op == KernelOp::decode) {
        params += " dtype=" + std::string(dtype_name(v.dtype));
    }
    if (v.op == KernelOp::decode) {
        params += " cache=" + std::string(cache_dtype_name(v.cache));
    }
    if (v.op == KernelOp::attention) {
        params += " window=" + bool_name(v.causal) +
                  " modified_scores=" + bool_name(v.modified_scores) +
                  " single_query=" + bool_name(v.single_query) + " paged=" + bool_name(v.paged) +
                  " dtype=" + std::string(dtype_name(v.dtype));
    }
    if (v.op == KernelOp::forward) {
        params += " return_weights=" + bool_name(v.returns_weights) +
                  " fused_qkv=" + bool_name(v.fused_qkv) + " causal=" + bool_name(v.causal) +
                  " dtype=" + std::string(dtype_name(v.dtype));
    }
    if (!schedule.empty()) {
        params += " \"schedule=" + schedule + "\"";
    }
    return params;
}

std::string with_kernel_features(std::string_view target) {
    return std::string(target) + "-" + std::string(kKernelTargetFeatures);
}

// The tunings of one instruction set, slot 0 its defaults, then each tuned CPU's file (an
// instruction set marked tuned must have one); stale files are warnings.
std::vector<Tuning> tunings(const CpuIsa &isa, const std::string &tuned_dir,
                            const std::string &schedule_hash, std::vector<std::string> &warnings) {
    std::vector<Tuning> out{{"defaults", std::nullopt}};
    for (mha::cpu::TunedFile &file : mha::cpu::read_tuned_files(tuned_dir, isa)) {
        const std::string path = mha::cpu::tuned_file_path(tuned_dir, isa, file.cpu);
        std::string stale;
        for (const mha::cpu::TunedBucket &b : file.buckets) {
            if (b.schedule_hash != schedule_hash) {
                stale += (stale.empty() ? "" : ", ") + std::string(bucket_spec(b.bucket).name) +
                         " (code " + b.schedule_hash + ")";
            }
        }
        if (!stale.empty()) {
            warnings.push_back(
                path + " tuned buckets " + stale + " on other schedule code than today's (" +
                schedule_hash + "): the kernels are correct, but re-run mha-tune --isa " +
                std::string(isa.name) + " on a " + file.cpu.name + " to tune them for this code");
        }
        out.push_back({cpu_key(file.cpu), std::move(file)});
    }
    if (isa.tuned && out.size() == 1) {
        throw std::runtime_error("tuned schedule file " + tuned_dir + "/" + std::string(isa.name) +
                                 ".<cpu>.json: missing: the " + std::string(isa.name) +
                                 " kernels are built from one at least (run mha-tune --isa " +
                                 std::string(isa.name) + ")");
    }
    if (out.size() > size_t(kMaxTuningSlots)) {
        throw std::runtime_error(std::string(isa.name) + " has " + std::to_string(out.size() - 1) +
                                 " tuned files in " + tuned_dir + ", more than the " +
                                 std::to_string(kMaxTuningSlots - 1) + " a build takes");
    }
    return out;
}

// The kernel groups of one op of one instruction set: the (tuning, bucket) cells whose
// parameters, `params_of(tuning, bucket)`, are the same share one kernel.
template <typename ParamsOf>
std::vector<std::pair<ScheduleCells, mha::cpu::ScheduleParams>> cell_groups(
    const std::vector<Tuning> &tunings, ParamsOf params_of) {
    std::vector<std::pair<ScheduleCells, mha::cpu::ScheduleParams>> groups;
    for (size_t slot = 0; slot < tunings.size(); slot++) {
        for (const BucketSpec &b : kShapeBuckets) {
            const mha::cpu::ScheduleParams params = params_of(tunings[slot], b.bucket);
            const ScheduleCells cell = schedule_cell(int(slot), b.bucket);
            auto same = std::find_if(groups.begin(), groups.end(),
                                     [&](const auto &g) { return g.second == params; });
            if (same == groups.end()) {
                groups.push_back({cell, params});
            } else {
                same->first |= cell;
            }
        }
    }
    if (groups.size() == 1) {
        groups.front().first = kAllCells;  // one kernel for all: named "any", as on GPUs
    }
    return groups;
}

// What a CPU kernel's name says it serves: its buckets ("any" for all), each followed by the
// tunings that run it there when not all of its instruction set's tunings do:
// "small_medium_large_and_token_for_defaults", "token_for_intel_f6_m207", "any".
std::string cells_name(ScheduleCells cells, const std::vector<Tuning> &tunings) {
    // The tunings served in each bucket, as bits of slots; the buckets of each such set.
    std::vector<std::pair<uint32_t, BucketSet>> parts;
    for (const BucketSpec &b : kShapeBuckets) {
        uint32_t slots = 0;
        for (size_t slot = 0; slot < tunings.size(); slot++) {
            slots |= (cells & schedule_cell(int(slot), b.bucket)) ? 1u << slot : 0u;
        }
        if (slots == 0) {
            continue;
        }
        const auto part = std::find_if(parts.begin(), parts.end(),
                                       [&](const auto &p) { return p.first == slots; });
        if (part == parts.end()) {
            parts.push_back({slots, bucket_bit(b.bucket)});
        } else {
            part->second |= bucket_bit(b.bucket);
        }
    }
    const uint32_t every_tuning = (1u << tunings.size()) - 1;
    std::stable_partition(parts.begin(), parts.end(),
                          [&](const auto &p) { return p.first == every_tuning; });
    std::string name;
    for (const auto &[slots, buckets] : parts) {
        name += (name.empty() ? "" : "_and_") + bucket_names(buckets);
        if (slots != every_tuning) {
            name += "_for";
            for (size_t slot = 0; slot < tunings.size(); slot++) {
                name += (slots & (1u << slot)) ? "_" + tunings[slot].key : "";
            }
        }
    }
    std::replace(name.begin(), name.end(), '-', '_');
    return name;
}

// Which of the architecture's instruction sets the library has kernels for: `names`, or all
// when empty. At least one f32 set, since every module runs f32 stages.
std::vector<bool> selected_isas(CpuArch arch, const std::vector<std::string> &names) {
    std::vector<bool> selected(kCpuIsas.size(), false);
    std::string allowed;
    for (size_t i = 0; i < kCpuIsas.size(); i++) {
        if (kCpuIsas[i].arch == arch) {
            selected[i] = names.empty();
            allowed += (allowed.empty() ? "" : ", ") + std::string(kCpuIsas[i].name);
        }
    }
    for (const std::string &name : names) {
        const std::optional<size_t> i = cpu_isa_index(name);
        if (!i || kCpuIsas[*i].arch != arch) {
            throw std::runtime_error("MHA_CPU_ISAS names '" + name + "', which is not one of " +
                                     allowed + " (the " + std::string(cpu_arch_name(arch)) +
                                     " instruction sets)");
        }
        selected[*i] = true;
    }
    bool any_f32 = false;
    for (size_t i = 0; i < kCpuIsas.size(); i++) {
        any_f32 = any_f32 || (selected[i] && kCpuIsas[i].dtype == mha::DType::f32);
    }
    if (!any_f32) {
        throw std::runtime_error(
            "MHA_CPU_ISAS selects no f32 instruction set, whose kernels "
            "every module needs: add one of " +
            allowed);
    }
    return selected;
}

// Which dtypes the GPU libraries have forward kernels of: `names`, or all when empty. f32 at
// least, which f32 modules run (a 16-bit module without its kernels runs them too).
std::array<bool, kDTypes.size()> selected_gpu_dtypes(const std::vector<std::string> &names) {
    std::array<bool, kDTypes.size()> selected{};
    selected.fill(names.empty());
    for (const std::string &name : names) {
        const std::optional<mha::DType> dtype = dtype_named(name);
        if (!dtype) {
            throw std::runtime_error("MHA_GPU_DTYPES names '" + name +
                                     "', which is not one of f32, bf16, f16");
        }
        selected[size_t(*dtype)] = true;
    }
    if (!selected[size_t(mha::DType::f32)]) {
        throw std::runtime_error(
            "MHA_GPU_DTYPES leaves out f32, whose kernels every GPU library needs");
    }
    return selected;
}

// The rows of the selected instruction sets' kernels, and of `sanitizer_isa`'s (marked
// sanitized; if it is not selected, in the ASan test library alone); with `gpu`, the GPU
// kernels of the `gpu_dtypes` selected.
std::vector<KernelRow> kernel_rows(CpuArch arch, const std::vector<bool> &selected,
                                   const std::string &sanitizer_isa, const std::string &tuned_dir,
                                   const std::string &schedule_hash, bool gpu,
                                   const std::array<bool, kDTypes.size()> &gpu_dtypes,
                                   std::vector<TunedCpuRow> &tuned_cpus,
                                   std::vector<std::string> &warnings) {
    if (!sanitizer_isa.empty()) {
        const std::optional<size_t> i = cpu_isa_index(sanitizer_isa);
        if (!i || kCpuIsas[*i].arch != arch || kCpuIsas[*i].dtype != mha::DType::f32) {
            throw std::runtime_error("--sanitizer-isa " + sanitizer_isa +
                                     " is not an f32 instruction set of " +
                                     std::string(cpu_arch_name(arch)));
        }
    }
    std::vector<KernelRow> rows;
    for (size_t i = 0; i < kCpuIsas.size(); i++) {
        const CpuIsa &isa = kCpuIsas[i];
        const bool sanitized = isa.name == sanitizer_isa;
        if (!selected[i] && !sanitized) {
            continue;
        }
        const size_t first_row = rows.size();
        const std::vector<Tuning> isa_tunings = tunings(isa, tuned_dir, schedule_hash, warnings);
        for (size_t slot = 1; slot < isa_tunings.size(); slot++) {
            tuned_cpus.push_back({int(i), int(slot), isa_tunings[slot].file->cpu});
        }
        // Forward kernels take each bucket's parameters; a step's QKV projection and the
        // averaging kernels serve every size with the smallest bucket's (a step's new tokens are
        // few). The kernels the tuner does not time take hand-written parameters, one kernel for
        // every tuning: the decode steps the defaults (the token bucket's, tuned for a forward
        // pass, were no faster there: bench/RESULTS.md), the attention kernels their own
        // (ScheduleParams::attention_defaults).
        const auto forward_groups = cell_groups(
            isa_tunings, [&](const Tuning &t, ShapeBucket b) { return t.params(isa, b); });
        const auto step_groups = cell_groups(isa_tunings, [&](const Tuning &t, ShapeBucket) {
            return t.params(isa, kShapeBuckets.front().bucket);
        });
        const auto decode_groups = cell_groups(isa_tunings, [&](const Tuning &, ShapeBucket) {
            return mha::cpu::ScheduleParams::defaults(isa);
        });
        const auto attention_groups = cell_groups(isa_tunings, [&](const Tuning &, ShapeBucket) {
            return mha::cpu::ScheduleParams::attention_defaults(isa);
        });
        for (const KernelVariant &v : kKernelVariants) {
            if (!v.compiled_for(isa)) {
                continue;
            }
            const auto &groups = v.op == KernelOp::forward     ? forward_groups
                                 : v.op == KernelOp::attention ? attention_groups
                                 : v.op == KernelOp::decode    ? decode_groups
                                                               : step_groups;
            for (size_t g = 0; g < groups.size(); g++) {
                const auto &[cells, params] = groups[g];
                std::string name =
                    kernel_name("cpu_" + std::string(isa.name), cells_name(cells, isa_tunings), v);
                // Two groups of the same buckets and tunings, in other pairs (rare): numbered.
                const bool taken = std::any_of(rows.begin() + long(first_row), rows.end(),
                                               [&](const KernelRow &r) { return r.name == name; });
                rows.push_back({taken ? name + "_" + std::to_string(g) : name, mha::Device::cpu,
                                int(i), cells, v, with_kernel_features(isa.halide_target),
                                params.to_string()});
            }
        }
        for (size_t r = first_row; r < rows.size(); r++) {
            rows[r].sanitized = sanitized;
            rows[r].shipped = selected[i];
        }
    }
    for (const GpuTarget &g : kGpuTargets) {
        if (!gpu) {
            break;
        }
        for (const KernelVariant &v : kKernelVariants) {
            if (v.runs_on(g.device) && gpu_dtypes[size_t(v.dtype)]) {
                rows.push_back(
                    {kernel_name(std::string(device_name(g.device)), std::string(kAnyBucket), v),
                     g.device, -1, kAllCells, v, with_kernel_features(g.halide_target), ""});
            }
        }
    }
    return rows;
}

std::string cmake_rows(CpuArch arch, const std::vector<KernelRow> &rows, bool gpu,
                       const std::string &kernels_from) {
    std::string kernels_from_rows;
    if (!kernels_from.empty()) {
        std::ifstream in(kernels_from + "/kernels/kernels.cmake");
        if (!in) {
            throw std::runtime_error("--kernels-from " + kernels_from +
                                     ": no kernels/kernels.cmake (not a configured build)");
        }
        std::stringstream text;
        text << in.rdbuf();
        kernels_from_rows = text.str();
    }
    std::ostringstream out;
    out << "# Generated by contract/emit_kernels.cpp from contract/mha_contract.h and "
           "schedules/tuned: do not edit.\n";
    out << "set(MHA_KERNEL_DEVICES cpu";
    for (const GpuTarget &g : kGpuTargets) {
        out << (gpu ? " " + std::string(device_name(g.device)) : "");
    }
    out << ")\nset(MHA_CPU_ISA_TARGETS";
    for (const CpuIsa &isa : kCpuIsas) {
        out << (isa.arch == arch ? " " + std::string(isa.halide_target) : "");
    }
    out << ")\n";
    for (const KernelRow &r : rows) {
        const std::string row = "mha_kernel(" + r.name + " DEVICE " +
                                std::string(device_name(r.device)) + " GENERATOR " +
                                std::string(generator_name(r.variant.op)) + " TARGET " + r.target +
                                "\n    PARAMS" + generator_params(r.variant, r.schedule) +
                                (r.sanitized ? (r.shipped ? " SANITIZED" : " SANITIZED_ONLY") : "");
        const std::string from_dir = kernels_from + "/runtime";
        const bool copied = !kernels_from.empty() &&
                            kernels_from_rows.find(row + ")\n") != std::string::npos &&
                            std::filesystem::exists(from_dir + "/" + r.name + ".o");
        out << row << (copied ? " FROM_BUILD " + from_dir : "") << ")\n";
    }
    return out.str();
}

std::string variant_initializer(const KernelVariant &v) {
    return "{contract::KernelOp::" + std::string(op_name(v.op)) +
           ", contract::MaskKind::" + std::string(mask_kind_name(v.mask)) + ", " +
           bool_name(v.returns_weights) + ", " + bool_name(v.fused_qkv) + ", " +
           bool_name(v.causal) + ", DType::" + std::string(dtype_name(v.dtype)) + ", " +
           bool_name(v.modified_scores) + ", " + bool_name(v.single_query) +
           ", CacheDType::" + std::string(cache_dtype_name(v.cache)) + ", " + bool_name(v.paged) +
           "}";
}

// The table of `device`'s kernels; on the CPU, with `sanitized_only`, of the SANITIZED ones (the
// ASan test library's).
std::string device_table(const std::vector<KernelRow> &rows,
                         const std::vector<TunedCpuRow> &tuned_cpus, mha::Device device,
                         bool sanitized_only = false) {
    const std::string dev(device_name(device));
    std::ostringstream out;
    out << "// Generated by contract/emit_kernels.cpp from contract/mha_contract.h and "
           "schedules/tuned: do not edit.\n// The "
        << dev << (sanitized_only ? " kernels of the sanitizer tests" : " kernels of the build")
        << ".\n#include \"kernel_table.h\"\n";
    if (device != mha::Device::cpu) {
        out << "#include \"HalideRuntime" << (device == mha::Device::cuda ? "Cuda" : "OpenCL")
            << ".h\"\n";
    }
    std::ostringstream checks, entries;
    for (const KernelRow &r : rows) {
        if (r.device != device || (sanitized_only ? !r.sanitized : !r.shipped)) {
            continue;
        }
        // The ASan library's kernels have headers of their own (an instruction set the library
        // leaves out has no others).
        const std::string header = r.name + (sanitized_only ? "_asan" : "");
        out << "#include \"" << header << ".h\"\n#include \"" << header << ".function_info.h\"\n";
        checks << "static_assert(takes_contract_arguments(" << r.name << "_argument_info(), "
               << variant_initializer(r.variant) << ", Device::" << dev
               << "),\n              \"kernel " << r.name
               << " does not take the arguments contract/mha_contract.h gives its variant\");\n";
        entries << "    {\"" << r.name << "\", Device::" << dev << ", " << r.isa << ", " << r.cells
                << "u, " << variant_initializer(r.variant) << ", &" << r.name << "_argv},\n";
    }
    out << "\nnamespace mha::detail {\n\n"
        << checks.str() << "\nnamespace {\n"
        << "const CompiledKernel kKernels[] = {\n"
        << entries.str() << "};\n}  // namespace\n\n";
    if (device == mha::Device::cpu) {
        out << "const KernelComponent &cpu_kernels() {\n"
               "    // Each instruction set's tuned CPUs (contract/tuned_cpus.h).\n"
               "    static const TunedCpu tuned_cpus[] = {\n";
        for (const TunedCpuRow &t : tuned_cpus) {
            out << "        {" << t.isa << ", " << t.slot << ", {" << nlohmann::json(t.cpu.vendor)
                << ", " << t.cpu.family << ", " << t.cpu.model << ", " << t.cpu.l2_kib << ", "
                << t.cpu.l3_kib << ", " << nlohmann::json(t.cpu.name) << "}},\n";
        }
        out << "        {-1, 0, {}},  // the end\n    };\n"
               "    static const KernelComponent component{Device::cpu, kKernels, "
               "std::size(kKernels), nullptr, tuned_cpus};\n    return component;\n}\n\n"
               "}  // namespace mha::detail\n";
    } else {
        out << "}  // namespace mha::detail\n\n"
            << "extern \"C\" const mha::detail::KernelComponent *mha_detail_" << dev
            << "_kernels() {\n    static const mha::detail::KernelComponent component{"
            << "mha::Device::" << dev
            << ", mha::detail::kKernels, std::size(mha::detail::kKernels), "
            << "&halide_" << dev << "_device_interface, nullptr};\n    return &component;\n}\n";
    }
    return out.str();
}

void write(const std::string &path, const std::string &text) {
    // Rewritten only when it changes, so that a re-configure does not rebuild the tables.
    std::ifstream old(path);
    std::stringstream existing;
    existing << old.rdbuf();
    if (old && existing.str() == text) {
        return;
    }
    std::ofstream out(path);
    out << text;
    if (!out) {
        throw std::runtime_error("could not write " + path);
    }
}

}  // namespace

int main(int argc, char **argv) {
    CLI::App app("Writes the build's kernel rows and the runtime's kernel tables", "emit_kernels");
    std::string tuned_dir, schedule_hash, out_dir, sanitizer_isa, kernels_from;
    std::vector<std::string> cpu_isas, gpu_dtypes;
    CpuArch arch = CpuArch::x86_64;
    bool gpu = true;
    std::map<std::string, CpuArch> arch_names;
    for (CpuArch a : kCpuArches) {
        arch_names.emplace(cpu_arch_name(a), a);
    }
    app.add_option("--arch", arch, "the CPU architecture of the build's kernels")
        ->transform(CLI::CheckedTransformer(arch_names));
    app.add_option("--cpu-isas", cpu_isas,
                   "the instruction sets to compile kernels for (default: all of the architecture)")
        ->delimiter(',');
    app.add_option("--sanitizer-isa", sanitizer_isa,
                   "the instruction set whose kernels the ASan tests run, compiled with asan");
    app.add_option("--kernels-from", kernels_from,
                   "a build of the same sources and generators whose kernels to copy");
    app.add_option("--tuned-dir", tuned_dir, "schedules/tuned")->required();
    app.add_option("--schedule-hash", schedule_hash, "hash of the schedule code")->required();
    app.add_option("--gpu", gpu, "emit the CUDA and OpenCL kernels (0 or 1)");
    app.add_option("--gpu-dtypes", gpu_dtypes,
                   "the dtypes of the GPU forward kernels (default: all; f32 among them)")
        ->delimiter(',');
    app.add_option("--out-dir", out_dir, "where to write")->required();
    if (const auto code = mha::tools::parse_command_line(app, argc, argv)) {
        return *code;
    }
    try {
        if (gpu && arch != CpuArch::x86_64) {
            throw std::runtime_error(
                "the GPU kernels' host code is built for x86-64 only "
                "(contract kGpuTargets): configure an " +
                std::string(cpu_arch_name(arch)) + " build with -DMHA_GPU_KERNELS=OFF");
        }
        std::vector<std::string> warnings;
        std::vector<TunedCpuRow> tuned_cpus;
        const std::vector<KernelRow> rows =
            kernel_rows(arch, selected_isas(arch, cpu_isas), sanitizer_isa, tuned_dir,
                        schedule_hash, gpu, selected_gpu_dtypes(gpu_dtypes), tuned_cpus, warnings);
        write(out_dir + "/kernels.cmake", cmake_rows(arch, rows, gpu, kernels_from));
        write(out_dir + "/cpu_kernels.cpp", device_table(rows, tuned_cpus, mha::Device::cpu));
        if (!sanitizer_isa.empty()) {
            write(out_dir + "/cpu_sanitizer_kernels.cpp",
                  device_table(rows, tuned_cpus, mha::Device::cpu, true));
        }
        for (const GpuTarget &g : kGpuTargets) {
            if (gpu) {
                write(out_dir + "/" + std::string(device_name(g.device)) + "_kernels.cpp",
                      device_table(rows, tuned_cpus, g.device));
            }
        }
        for (const std::string &w : warnings) {
            std::cout << "warning: " << w << "\n";
        }
    } catch (const std::exception &e) {
        std::cout << e.what() << "\n";
        return 1;
    }
    return 0;
}
