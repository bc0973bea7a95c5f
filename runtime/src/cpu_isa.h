// The CPU instruction sets this process runs the CPU kernels of.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

#include "kernel_table.h"
#include "mha/mha.h"

namespace mha::detail {

// Whether the build has kernels of instruction set `isa` (MHA_CPU_ISAS may leave some out),
// read from the kernel table once.
bool linked(size_t isa);

// The index in contract::kCpuIsas of the best f32 instruction set the CPU supports (as Halide's
// own target check decides it, through the multi-target probe kernel), capped by the
// environment's MHA_CPU_ISA when set, of those the build has kernels for (MHA_CPU_ISAS).
// Decided once per process; throws mha::Error naming the allowed values when MHA_CPU_ISA is not
// one of them, and the build's instruction sets when the CPU runs none of them.
size_t cpu_isa();

// What a call's bf16 kernels do with bf16 values: multiply them (a module's projections, the
// attention core's products of many query rows), or only read and widen them (one query row per
// head, whose step is bound by the bytes of K and V).
enum class Bf16Use { products, reads };

// The best instruction set whose kernels take `dtype` for `use` (bf16: AMX's tile products, or
// AVX512_BF16's dot products), when the CPU has it, the operating system lets this process use
// it (for AMX, Linux is asked for its tile state once, arch_prctl), MHA_CPU_ISA does not cap it
// away and the build has its kernels; none for f32 or otherwise. For products, AVX512_BF16's
// dot products only where they outrun the f32 FMAs (dot_pairs_outrun_fmas) or MHA_CPU_ISA
// names them; to read, its kernels wherever the CPU runs them, AMX's CPUs included.
std::optional<size_t> bf16_isa(DType dtype, Bf16Use use = Bf16Use::products);

// Which parameters instruction set `isa`'s kernels run here: those of the tuned CPU closest to
// this one (contract::cpu_match), or the defaults where no tuned CPU is of this vendor, or what
// MHA_TUNED_CPU names ("defaults" or a CPU key). Decided once per process; throws mha::Error
// when MHA_TUNED_CPU names none of the build's tuned CPUs.
struct ScheduleChoice {
    int slot;               // 0: the defaults
    const TunedCpu *tuned;  // null for the defaults
    std::string why;
};
const ScheduleChoice &schedule_choice(int isa);

// The CPU this process runs on (/proc/cpuinfo and core 0's caches in sysfs, on Linux; an empty
// vendor elsewhere).
const contract::CpuIdentity &this_cpu();

}  // namespace mha::detail
