#include "product_peaks.h"

#include "sum_over_threads.h"

#if defined(__x86_64__)
#include <immintrin.h>
// GCC 12 takes the undefined upper lanes of its own extract intrinsics for uninitialized values.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace mha::bench {
namespace {

#if defined(__x86_64__)
constexpr int kChains = 16;

__attribute__((target("avx512f"))) float lanes_sum(const __m512 *acc) {
    __m512 sum = acc[0];
    for (int c = 1; c < kChains; c++) {
        sum = _mm512_add_ps(sum, acc[c]);
    }
    return _mm512_reduce_add_ps(sum);
}

__attribute__((target("avx512f"))) void start(__m512 *acc) {
    for (int c = 0; c < kChains; c++) {
        acc[c] = _mm512_set1_ps(float(c));
    }
}

__attribute__((target("avx512f,fma"))) float fma_chains(int64_t steps) {
    __m512 acc[kChains];
    start(acc);
    const __m512 a = _mm512_set1_ps(1.0f), b = _mm512_set1_ps(0x1p-7f);
    for (int64_t i = 0; i < 2 * steps / kChains; i++) {
        for (int c = 0; c < kChains; c++) {
            acc[c] = _mm512_fmadd_ps(a, b, acc[c]);
        }
    }
    return lanes_sum(acc);
}

__attribute__((target("avx512f,avx512bf16"))) float bf16_dot_chains(int64_t steps) {
    __m512 acc[kChains];
    start(acc);
    const __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80);  // pairs of 1.0
    const __m512bh b = (__m512bh)_mm512_set1_epi32(0x3c003c00);  // pairs of 2^-7
    for (int64_t i = 0; i < steps / kChains; i++) {
        for (int c = 0; c < kChains; c++) {
            acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
        }
    }
    return lanes_sum(acc);
}

__attribute__((target("avx512f,avx512fp16"))) float f16_widened_chains(int64_t steps) {
    __m512 acc[kChains];
    start(acc);
    __m512h a = _mm512_set1_ph(_Float16(1.0f));
    const __m512h b = _mm512_set1_ph(_Float16(0x1p-7f));
    // Each step: 32 f16 products, widened in two halves and added into two accumulators. The
    // empty asm makes `a` a new value each step, so that the products are not hoisted.
    for (int64_t i = 0; i < steps / (kChains / 2); i++) {
        for (int c = 0; c < kChains; c += 2) {
            asm volatile("" : "+v"(a));
            const __m512h products = _mm512_mul_ph(a, b);
            const __m512i bits = _mm512_castph_si512(products);
            acc[c] = _mm512_add_ps(
                acc[c], _mm512_cvtxph_ps(_mm256_castsi256_ph(_mm512_castsi512_si256(bits))));
            acc[c + 1] = _mm512_add_ps(
                acc[c + 1],
                _mm512_cvtxph_ps(_mm256_castsi256_ph(_mm512_extracti64x4_epi64(bits, 1))));
        }
    }
    return lanes_sum(acc);
}
#endif

}  // namespace

bool has_products(Products products) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    switch (products) {
    case Products::f32_fma:
        return __builtin_cpu_supports("avx512f");
    case Products::bf16_dot:
        return __builtin_cpu_supports("avx512bf16");
    case Products::f16_widened:
        return __builtin_cpu_supports("avx512fp16");
    }
#endif
    return false;
}

float product_chains(Products products, int64_t steps, int threads) {
#if defined(__x86_64__)
    return sum_over_threads(threads, [&](int) {
        switch (products) {
        case Products::f32_fma:
            return fma_chains(steps);
        case Products::bf16_dot:
            return bf16_dot_chains(steps);
        case Products::f16_widened:
            return f16_widened_chains(steps);
        }
        return 0.0f;
    });
#else
    return 0.0f;
#endif
}

}  // namespace mha::bench
