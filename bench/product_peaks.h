// The machine's peaks for the products its kernels could use, on independent accumulators: f32
// FMAs (the f32 kernels'), vdpbf16ps (AVX512_BF16: the avx512bf16 kernels'), and f16 products
// accumulated in f32 (AVX512_FP16's vmulph, whose 32 products are widened and added into two f32
// vectors: the form an f16 kernel would take, since the extension has no mixed-precision dot).
#pragma once

#include <cstdint>

namespace mha::bench {

// The products; each step is 64 FLOPs (an FMA step is two vfmadd231ps).
enum class Products { f32_fma, bf16_dot, f16_widened };

// Whether this CPU has the instructions of `products`.
bool has_products(Products products);

// Runs `steps` steps of `products` on each of `threads` threads; returns a value that depends on
// every one.
float product_chains(Products products, int64_t steps, int threads);

}  // namespace mha::bench
