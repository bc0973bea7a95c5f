#include "bf16_dot_peak.h"

#include "sum_over_threads.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace mha::bench {
namespace {

#if defined(__x86_64__)
// 16 accumulators: enough independent chains to cover the instruction's latency at two per cycle.
__attribute__((target("avx512f,avx512bf16"))) float chains(int64_t instructions) {
    constexpr int kChains = 16;
    __m512 acc[kChains];
    for (int c = 0; c < kChains; c++) {
        acc[c] = _mm512_set1_ps(float(c));
    }
    const __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80);  // pairs of 1.0
    const __m512bh b = (__m512bh)_mm512_set1_epi32(0x3c003c00);  // pairs of 2^-7
    for (int64_t i = 0; i < instructions / kChains; i++) {
        for (int c = 0; c < kChains; c++) {
            acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
        }
    }
    __m512 sum = acc[0];
    for (int c = 1; c < kChains; c++) {
        sum = _mm512_add_ps(sum, acc[c]);
    }
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, sum);
    float total = 0;
    for (float lane : lanes) {
        total += lane;
    }
    return total;
}
#else
float chains(int64_t) { return 0; }
#endif

}  // namespace

bool has_bf16_dot() {
#if defined(__x86_64__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16");
#else
    return false;
#endif
}

float bf16_dot_chains(int64_t instructions, int threads) {
    return sum_over_threads(threads, [&](int) { return chains(instructions); });
}

}  // namespace mha::bench
