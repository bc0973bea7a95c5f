// The CPU instruction set this process runs the CPU kernels of.
#pragma once

#include <cstddef>

namespace mha::detail {

// The index in contract::kCpuIsas of the best instruction set the CPU supports (as Halide's own
// target check decides it, through the multi-target probe kernel), capped by the environment's
// MHA_CPU_ISA when set. Decided once per process; throws mha::Error naming the allowed values
// when MHA_CPU_ISA is not one of them.
size_t cpu_isa();

}  // namespace mha::detail
