#include "cpu_isa.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#if defined(__x86_64__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <algorithm>
#include <array>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "HalideBuffer.h"
#include "kernel_table.h"
#include "mha/mha.h"
#include "mha_contract.h"
#include "mha_cpu_isa_probe.h"

namespace mha::detail {
namespace {

// The build's kernels are those of the architecture it is compiled for.
constexpr contract::CpuArch kArch = *contract::compiled_cpu_arch();

struct IsaChoice {
    std::optional<size_t> isa;
    std::string error;
};

IsaChoice choose() {
    auto probed = Halide::Runtime::Buffer<int32_t, 0>::make_scalar();
    if (mha_cpu_isa_probe(probed) != 0) {
        return {std::nullopt, "the CPU instruction set probe failed"};
    }
    const size_t best = size_t(probed());
    const char *cap = std::getenv("MHA_CPU_ISA");
    if (cap == nullptr) {
        return {best, ""};
    }
    const std::optional<size_t> capped = contract::cpu_isa_index(cap);
    if (!capped || contract::kCpuIsas[*capped].arch != kArch) {
        std::string allowed;
        for (const contract::CpuIsa &isa : contract::kCpuIsas) {
            if (isa.arch == kArch) {
                allowed += fmt::format("{}{}", allowed.empty() ? "" : ", ", isa.name);
            }
        }
        return {std::nullopt,
                fmt::format("MHA_CPU_ISA is '{}', which is not one of {}", cap, allowed)};
    }
    // Instruction sets are listed best first: the cap can only lower the choice.
    return {std::max(best, *capped), ""};
}

// The choice's instruction set, or mha::Error with its reason.
size_t chosen(const IsaChoice &choice) {
    if (!choice.isa) {
        throw Error(choice.error);
    }
    return *choice.isa;
}

// The best f32 instruction set at or below `best` (those below it are supported whenever it
// is) that the build has kernels of.
IsaChoice linked_f32_isa(size_t best) {
    std::string names;
    for (size_t isa = 0; isa < contract::kCpuIsas.size(); isa++) {
        if (isa >= best && linked(isa) && contract::kCpuIsas[isa].dtype == DType::f32) {
            return {isa, ""};
        }
        if (linked(isa)) {
            names += fmt::format("{}{}", names.empty() ? "" : ", ", contract::kCpuIsas[isa].name);
        }
    }
    return {std::nullopt,
            fmt::format("this build's CPU kernels are for {} (its MHA_CPU_ISAS), none of which "
                        "this CPU runs: its best instruction set{} is {}",
                        names, std::getenv("MHA_CPU_ISA") ? " under MHA_CPU_ISA" : "",
                        contract::kCpuIsas[best].name)};
}

// The best instruction set the CPU supports and the cap allows, of any dtype.
size_t best_isa() {
    static const IsaChoice choice = choose();
    return chosen(choice);
}

// Linux gives a process AMX's tile data state only when asked (ARCH_REQ_XCOMP_PERM for
// XFEATURE_XTILEDATA); a tile instruction without it is an illegal instruction.
bool amx_permitted() {
#if defined(__x86_64__)
    static const bool permitted = [] {
        constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
        return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
    }();
    return permitted;
#else
    return false;
#endif
}

// Whether vdpbf16ps multiplies bf16 faster than the FMAs multiply f32, which makes the bf16
// kernels of dot products worth their roundings: on AMD's cores (Zen 5: 982 GFLOP/s against
// sgemm's 454, two threads), not on Intel's (Emerald Rapids with its AMX hidden by a VM: 86
// GFLOP/s per core against 174 of f32 FMAs, and bf16 modules at 0.64-0.70x the f32 ones;
// bench/RESULTS.md). The vendor is CPUID's.
bool dot_pairs_outrun_fmas() {
#if defined(__x86_64__)
    static const bool amd = [] {
        unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
        __get_cpuid(0, &eax, &ebx, &ecx, &edx);
        return ebx == 0x68747541 && edx == 0x69746e65 && ecx == 0x444d4163;  // "AuthenticAMD"
    }();
    return amd;
#else
    return false;
#endif
}

}  // namespace

bool linked(size_t isa) {
    static const std::array<bool, contract::kCpuIsaCount> has_kernels = [] {
        std::array<bool, contract::kCpuIsaCount> has{};
        const KernelComponent &component = cpu_kernels();
        for (size_t k = 0; k < component.count; k++) {
            has[size_t(component.kernels[k].isa)] = true;
        }
        return has;
    }();
    return has_kernels[isa];
}

size_t cpu_isa() {
    static const IsaChoice choice = linked_f32_isa(best_isa());
    return chosen(choice);
}

std::optional<size_t> bf16_isa(DType dtype, Bf16Use use) {
    if (dtype == DType::f32) {
        return std::nullopt;
    }
    const char *cap = std::getenv("MHA_CPU_ISA");
    for (size_t isa = best_isa(); isa < contract::kCpuIsas.size(); isa++) {
        const contract::CpuIsa &candidate = contract::kCpuIsas[isa];
        const bool dot_pairs = candidate.bf16_products == contract::Bf16Products::dot_pairs;
        const bool named = cap != nullptr && candidate.name == cap;
        // Reading takes AVX512_BF16's kernels; products AMX's, or the dot products where they
        // outrun the FMAs or MHA_CPU_ISA names them.
        bool usable = dot_pairs;
        if (use == Bf16Use::products) {
            usable = candidate.bf16_products == contract::Bf16Products::amx_tiles
                         ? amx_permitted()
                         : dot_pairs && (dot_pairs_outrun_fmas() || named);
        }
        if (candidate.arch == kArch && candidate.dtype == dtype && linked(isa) && usable) {
            return isa;
        }
    }
    return std::nullopt;
}

namespace {

// Sizes as sysfs writes them ("2048K", "105M"), in KiB.
int64_t kib(const std::string &size) {
    const int64_t n = std::atoll(size.c_str());
    return size.empty() ? 0 : size.back() == 'M' ? n * 1024 : size.back() == 'K' ? n : n / 1024;
}

contract::CpuIdentity read_this_cpu() {
    // The first core's fields of /proc/cpuinfo, by name.
    std::map<std::string, std::string> fields;
    std::ifstream cpuinfo("/proc/cpuinfo");
    for (std::string line; std::getline(cpuinfo, line) && !line.empty();) {
        const size_t colon = line.find(':');
        if (colon != std::string::npos && colon > 0) {
            const size_t end = line.find_last_not_of(" \t", colon - 1);
            fields.emplace(line.substr(0, end == std::string::npos ? 0 : end + 1),
                           colon + 2 <= line.size() ? line.substr(colon + 2) : "");
        }
    }
    contract::CpuIdentity cpu;
    cpu.vendor = fields["vendor_id"];
    cpu.family = std::atoi(fields["cpu family"].c_str());
    cpu.model = std::atoi(fields["model"].c_str());
    cpu.name = fields.count("model name") ? fields["model name"] : "unknown CPU";
    for (int index = 0; index < 8; index++) {
        const std::string dir = fmt::format("/sys/devices/system/cpu/cpu0/cache/index{}/", index);
        std::ifstream level_file(dir + "level"), size_file(dir + "size");
        int level = 0;
        std::string size;
        if (!(level_file >> level && size_file >> size)) {
            continue;
        }
        if (level == 2) {
            cpu.l2_kib = kib(size);
        }
        if (level == 3) {
            cpu.l3_kib = kib(size);
        }
    }
    return cpu;
}

// The choice of every instruction set, or the error of an MHA_TUNED_CPU naming none.
struct ScheduleChoices {
    std::array<ScheduleChoice, contract::kCpuIsaCount> of_isa;
    std::string error;
};

ScheduleChoices choose_schedules() {
    ScheduleChoices choices;
    const char *named = std::getenv("MHA_TUNED_CPU");
    std::vector<std::string> keys = {"defaults"};
    bool found = named != nullptr && keys.front() == named;
    for (size_t isa = 0; isa < contract::kCpuIsaCount; isa++) {
        ScheduleChoice &choice = choices.of_isa[isa];
        choice = {0, nullptr, ""};
        bool any_tuned = false;
        double best_score = 0;
        for (const TunedCpu *t = cpu_kernels().tuned_cpus; t->isa >= 0; t++) {
            if (t->isa != int(isa)) {
                continue;
            }
            any_tuned = true;
            const std::string key = contract::cpu_key(t->cpu);
            if (std::find(keys.begin(), keys.end(), key) == keys.end()) {
                keys.push_back(key);
            }
            if (named != nullptr) {
                if (key == named) {
                    choice = {t->slot, t, fmt::format("MHA_TUNED_CPU is {}", named)};
                    found = true;
                }
            } else if (const auto match = contract::cpu_match(t->cpu, this_cpu());
                       match && (choice.tuned == nullptr || match->score > best_score)) {
                choice = {t->slot, t, "tuned on a CPU of " + match->why};
                best_score = match->score;
            }
        }
        if (choice.tuned == nullptr) {
            choice.why = named != nullptr ? fmt::format("MHA_TUNED_CPU is {}", named)
                         : any_tuned
                             ? fmt::format("none of its tuned CPUs is of this CPU's vendor ({})",
                                           this_cpu().vendor)
                             : "no CPU is tuned for it";
        }
    }
    if (named != nullptr && !found) {
        choices.error = fmt::format("MHA_TUNED_CPU is '{}', which is not one of {}", named,
                                    fmt::join(keys, ", "));
    }
    return choices;
}

}  // namespace

const contract::CpuIdentity &this_cpu() {
    static const contract::CpuIdentity cpu = read_this_cpu();
    return cpu;
}

const ScheduleChoice &schedule_choice(int isa) {
    static const ScheduleChoices choices = choose_schedules();
    if (!choices.error.empty()) {
        throw Error(choices.error);
    }
    return choices.of_isa[size_t(isa)];
}

}  // namespace mha::detail
