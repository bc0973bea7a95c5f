// The kernel contract, on tuning: which CPU a tuned schedule file was measured on, how close a
// running CPU is to it, and which (tuning, shape bucket) pairs a CPU kernel serves. mha-tune
// writes the identity into schedules/tuned/<isa>.<cpu key>.json; the build compiles kernels for
// every tuned CPU's parameters and the defaults; dispatch picks the closest tuned CPU's
// (docs/tuning.md).
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>

#include "mha_variants.h"

namespace mha::contract {

struct CpuIdentity {
    std::string vendor;  // CPUID's: GenuineIntel, AuthenticAMD; empty where unknown
    int family = 0, model = 0;
    int64_t l2_kib = 0, l3_kib = 0;  // core 0's caches; 0 where unknown
    std::string name;                // the model name, e.g. "AMD EPYC" (VMs say little more)
};

// What file names and MHA_TUNED_CPU call a CPU: "intel-f6-m207", "amd-f26-m2".
inline std::string cpu_key(const CpuIdentity &cpu) {
    const std::string vendor = cpu.vendor == "GenuineIntel"   ? "intel"
                               : cpu.vendor == "AuthenticAMD" ? "amd"
                               : cpu.vendor.empty()           ? "unknown"
                                                              : cpu.vendor;
    return vendor + "-f" + std::to_string(cpu.family) + "-m" + std::to_string(cpu.model);
}

// "Intel(R) Xeon(R) Processor (GenuineIntel family 6 model 207; L2 2048K, L3 107520K)".
inline std::string describe(const CpuIdentity &cpu) {
    return cpu.name + " (" + cpu.vendor + " family " + std::to_string(cpu.family) + " model " +
           std::to_string(cpu.model) + "; L2 " + std::to_string(cpu.l2_kib) + "K, L3 " +
           std::to_string(cpu.l3_kib) + "K)";
}

// How close a tuned CPU is to the running one, for choosing among an instruction set's tuned
// files: none of another vendor (its cores may differ in everything the schedule depends on);
// then the same family and model before the same family before the vendor alone, and among
// equals the nearest caches (in factors of two).
struct CpuMatch {
    double score;     // larger is closer
    std::string why;  // "the same vendor, family and model"
};
inline std::optional<CpuMatch> cpu_match(const CpuIdentity &tuned, const CpuIdentity &running) {
    if (tuned.vendor.empty() || tuned.vendor != running.vendor) {
        return std::nullopt;
    }
    const int level = tuned.family != running.family ? 1 : tuned.model != running.model ? 2 : 3;
    const auto octaves = [](int64_t a, int64_t b) {
        return a > 0 && b > 0 ? std::fabs(std::log2(double(a) / double(b))) : 8.0;
    };
    const double cache_distance =
        octaves(tuned.l2_kib, running.l2_kib) + octaves(tuned.l3_kib, running.l3_kib);
    const char *why[] = {"", "the same vendor", "the same vendor and family",
                         "the same vendor, family and model"};
    return CpuMatch{level * 100 - cache_distance, why[level]};
}

// The (tuning, bucket) pairs one CPU kernel serves: bit `slot · buckets + bucket`. Slot 0 is an
// instruction set's default parameters, slot s > 0 its s-th tuned CPU (the kernel table lists
// them, kernel_table.h). GPU kernels, and CPU kernels whose parameters no tuning changes, serve
// every pair.
using ScheduleCells = uint64_t;
inline constexpr int kMaxTuningSlots = int(64 / kShapeBuckets.size());
inline constexpr ScheduleCells kAllCells = ~ScheduleCells(0);

constexpr ScheduleCells schedule_cell(int slot, ShapeBucket bucket) {
    return ScheduleCells(1) << (unsigned(slot) * kShapeBuckets.size() + unsigned(bucket));
}

// The buckets a kernel serves in any tuning.
constexpr BucketSet cell_buckets(ScheduleCells cells) {
    BucketSet buckets = 0;
    for (int slot = 0; slot < kMaxTuningSlots; slot++) {
        buckets |= BucketSet(cells >> (unsigned(slot) * kShapeBuckets.size())) & kAllBuckets;
    }
    return buckets;
}

// Whether a kernel serves tuning `slot` in some bucket.
constexpr bool serves_slot(ScheduleCells cells, int slot) {
    return ((cells >> (unsigned(slot) * kShapeBuckets.size())) & kAllBuckets) != 0;
}

}  // namespace mha::contract
