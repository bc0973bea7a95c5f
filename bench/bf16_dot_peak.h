// The machine's bf16 dot-product peak, the ceiling of the avx512bf16 kernels' products:
// vdpbf16ps (32 bf16 multiply-adds into 16 f32 lanes) on independent accumulators.
#pragma once

#include <cstdint>

namespace mha::bench {

// Whether this CPU has vdpbf16ps (AVX512_BF16).
bool has_bf16_dot();

// Runs `instructions` vdpbf16ps on each of `threads` threads; returns a value that depends on
// every one. Each instruction is 64 FLOPs.
float bf16_dot_chains(int64_t instructions, int threads);

}  // namespace mha::bench
