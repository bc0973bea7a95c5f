// Run by the configure step (cmake/MhaKernels.cmake): turns the contract and the tuned schedule
// files into the build's kernel rows and the runtime's kernel tables.
//
//   emit_kernels --arch x86-64 [--cpu-isas avx512,avx2] [--sanitizer-isa sse41]
//                --tuned-dir schedules/tuned --schedule-hash H --gpu 1 --out-dir <build>
//
// writes <out-dir>/kernels.cmake, one mha_kernel(...) row per kernel to compile for the CPU
// instruction sets of that architecture (all of them, or those of --cpu-isas) and the GPUs, and
// <out-dir>/<device>_kernels.cpp, the table of that device's kernels with a compile-time check
// that each takes the arguments the contract gives its variant. The kernels of --sanitizer-isa
// are marked SANITIZED (compiled again with Halide's asan feature; SANITIZED_ONLY, that alone,
// when --cpu-isas leaves the set out of the library) and have their own table,
// <out-dir>/cpu_sanitizer_kernels.cpp. On the CPU, the buckets of one
// instruction set that are tuned to the same parameters share one kernel. Prints "warning: ..."
// lines for the configure step to show; exits 1 with the reason when a tuned file is missing,
// malformed or mismatched.
#include <CLI/CLI.hpp>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "command_line.h"
#include "cpu_params.h"
#include "mha_contract.h"
#include "tuned_file.h"

namespace {

using namespace mha::contract;

// One kernel to compile.
struct KernelRow {
    std::string name;
    mha::Device device;
    int isa = -1;  // index into kCpuIsas, -1 on GPUs
    BucketSet buckets = kAllBuckets;
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

std::string kernel_name(const std::string &where, BucketSet buckets, const KernelVariant &v) {
    std::string name =
        "mha_" + std::string(op_name(v.op)) + "_" + where + "_" + bucket_names(buckets);
    if (v.op == KernelOp::qkv_projection || v.op == KernelOp::average_heads) {
        return name;
    }
    name += "_" + std::string(mask_kind_name(v.mask)) + "_mask";
    if (v.op == KernelOp::decode) {
        return name;
    }
    if (v.op == KernelOp::attention) {
        return name + (v.causal ? "_window" : "") + (v.modified_scores ? "_softcap_alibi" : "") +
               (v.single_query ? "_one_query" : "") + dtype_suffix(v.dtype);
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
    if (v.op == KernelOp::attention) {
        params += " window=" + bool_name(v.causal) +
                  " modified_scores=" + bool_name(v.modified_scores) +
                  " single_query=" + bool_name(v.single_query) +
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

// The CPU kernel groups of one instruction set: buckets tuned to the same parameters share one.
std::vector<std::pair<BucketSet, mha::cpu::ScheduleParams>> cpu_groups(
    const CpuIsa &isa, const std::string &tuned_dir, const std::string &schedule_hash,
    std::vector<std::string> &warnings) {
    std::vector<std::pair<BucketSet, mha::cpu::ScheduleParams>> groups;
    std::optional<mha::cpu::TunedFile> tuned;
    const std::string path = mha::cpu::tuned_file_path(tuned_dir, isa);
    if (isa.tuned || std::ifstream(path)) {
        tuned = mha::cpu::read_tuned_file(path, isa);
        std::string stale;
        for (const mha::cpu::TunedBucket &b : tuned->buckets) {
            if (b.schedule_hash != schedule_hash) {
                stale += (stale.empty() ? "" : ", ") + std::string(bucket_spec(b.bucket).name) +
                         " (code " + b.schedule_hash + ")";
            }
        }
        if (!stale.empty()) {
            warnings.push_back(path + " tuned buckets " + stale +
                               " on other schedule code than today's (" + schedule_hash +
                               "): the kernels are correct, but re-run mha-tune --isa " +
                               std::string(isa.name) + " to tune them for this code");
        }
    }
    for (const BucketSpec &b : kShapeBuckets) {
        const mha::cpu::ScheduleParams params = tuned ? tuned->effective_params(isa, b.bucket)
                                                      : mha::cpu::ScheduleParams::defaults(isa);
        auto same = std::find_if(groups.begin(), groups.end(),
                                 [&](const auto &g) { return g.second == params; });
        if (same == groups.end()) {
            groups.push_back({bucket_bit(b.bucket), params});
        } else {
            same->first |= bucket_bit(b.bucket);
        }
    }
    return groups;
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
        const auto groups = cpu_groups(isa, tuned_dir, schedule_hash, warnings);
        for (const auto &[buckets, params] : groups) {
            for (const KernelVariant &v : kKernelVariants) {
                if (v.op == KernelOp::forward && v.compiled_for(isa)) {
                    rows.push_back({kernel_name("cpu_" + std::string(isa.name), buckets, v),
                                    mha::Device::cpu, int(i), buckets, v,
                                    with_kernel_features(isa.halide_target), params.to_string()});
                }
            }
        }
        // The decode steps' and the averaging kernels serve every size, with the parameters of the
        // smallest bucket (a step's new tokens are few); the attention kernels with their own
        // (ScheduleParams::attention_defaults).
        const mha::cpu::ScheduleParams attention =
            mha::cpu::ScheduleParams::attention_defaults(isa);
        for (const KernelVariant &v : kKernelVariants) {
            if (v.op != KernelOp::forward && v.compiled_for(isa)) {
                const auto &params =
                    v.op == KernelOp::attention ? attention : groups.front().second;
                rows.push_back({kernel_name("cpu_" + std::string(isa.name), kAllBuckets, v),
                                mha::Device::cpu, int(i), kAllBuckets, v,
                                with_kernel_features(isa.halide_target), params.to_string()});
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
                rows.push_back({kernel_name(std::string(device_name(g.device)), kAllBuckets, v),
                                g.device, -1, kAllBuckets, v, with_kernel_features(g.halide_target),
                                ""});
            }
        }
    }
    return rows;
}

std::string cmake_rows(CpuArch arch, const std::vector<KernelRow> &rows, bool gpu) {
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
        out << "mha_kernel(" << r.name << " DEVICE " << device_name(r.device) << " GENERATOR "
            << generator_name(r.variant.op) << " TARGET " << r.target << "\n    PARAMS"
            << generator_params(r.variant, r.schedule)
            << (r.sanitized ? (r.shipped ? " SANITIZED" : " SANITIZED_ONLY") : "") << ")\n";
    }
    return out.str();
}

std::string variant_initializer(const KernelVariant &v) {
    return "{contract::KernelOp::" + std::string(op_name(v.op)) +
           ", contract::MaskKind::" + std::string(mask_kind_name(v.mask)) + ", " +
           bool_name(v.returns_weights) + ", " + bool_name(v.fused_qkv) + ", " +
           bool_name(v.causal) + ", DType::" + std::string(dtype_name(v.dtype)) + ", " +
           bool_name(v.modified_scores) + ", " + bool_name(v.single_query) + "}";
}

// The table of `device`'s kernels; on the CPU, with `sanitized_only`, of the SANITIZED ones (the
// ASan test library's).
std::string device_table(const std::vector<KernelRow> &rows, mha::Device device,
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
        entries << "    {\"" << r.name << "\", Device::" << dev << ", " << r.isa << ", "
                << r.buckets << ", " << variant_initializer(r.variant) << ", &" << r.name
                << "_argv},\n";
    }
    out << "\nnamespace mha::detail {\n\n"
        << checks.str() << "\nnamespace {\n"
        << "const CompiledKernel kKernels[] = {\n"
        << entries.str() << "};\n}  // namespace\n\n";
    if (device == mha::Device::cpu) {
        out << "const KernelComponent &cpu_kernels() {\n"
               "    static const KernelComponent component{Device::cpu, kKernels, "
               "std::size(kKernels), nullptr};\n    return component;\n}\n\n"
               "}  // namespace mha::detail\n";
    } else {
        out << "}  // namespace mha::detail\n\n"
            << "extern \"C\" const mha::detail::KernelComponent *mha_detail_" << dev
            << "_kernels() {\n    static const mha::detail::KernelComponent component{"
            << "mha::Device::" << dev
            << ", mha::detail::kKernels, std::size(mha::detail::kKernels), "
            << "&halide_" << dev << "_device_interface};\n    return &component;\n}\n";
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
    std::string tuned_dir, schedule_hash, out_dir, sanitizer_isa;
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
        const std::vector<KernelRow> rows =
            kernel_rows(arch, selected_isas(arch, cpu_isas), sanitizer_isa, tuned_dir,
                        schedule_hash, gpu, selected_gpu_dtypes(gpu_dtypes), warnings);
        write(out_dir + "/kernels.cmake", cmake_rows(arch, rows, gpu));
        write(out_dir + "/cpu_kernels.cpp", device_table(rows, mha::Device::cpu));
        if (!sanitizer_isa.empty()) {
            write(out_dir + "/cpu_sanitizer_kernels.cpp",
                  device_table(rows, mha::Device::cpu, true));
        }
        for (const GpuTarget &g : kGpuTargets) {
            if (gpu) {
                write(out_dir + "/" + std::string(device_name(g.device)) + "_kernels.cpp",
                      device_table(rows, g.device));
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
