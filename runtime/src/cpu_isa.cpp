#include "cpu_isa.h"

#include <fmt/format.h>

#if defined(__x86_64__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <algorithm>
#include <array>
#include <cstdlib>
#include <optional>
#include <string>

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

// Whether the build has kernels of instruction set `isa` (MHA_CPU_ISAS may leave some out),
// read from the kernel table once.
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

}  // namespace mha::detail
