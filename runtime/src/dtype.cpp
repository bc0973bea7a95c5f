#include "dtype.h"

#include <fmt/format.h>
#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include <cmath>
#include <cstring>

#include "scratch_pool.h"

namespace mha {
namespace {

uint32_t bits_of(float x) {
    uint32_t u;
    std::memcpy(&u, &x, sizeof u);
    return u;
}

float float_of(uint32_t u) {
    float x;
    std::memcpy(&x, &u, sizeof x);
    return x;
}

// Round to nearest even on the dropped 16 bits; a NaN keeps a set mantissa bit (quiet).
uint16_t bfloat16_bits(float x) {
    const uint32_t u = bits_of(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return uint16_t((u >> 16) | 0x40);
    }
    return uint16_t((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

// IEEE binary16 <-> binary32 in software, for CPUs without F16C.
float half_to_float(uint16_t h) {
    const uint32_t sign = uint32_t(h & 0x8000) << 16, exponent = (h >> 10) & 0x1f;
    const uint32_t mantissa = h & 0x3ff;
    if (exponent == 0x1f) {  // Inf, NaN
        return float_of(sign | 0x7f800000u | (mantissa << 13));
    }
    if (exponent == 0) {  // zero, subnormal: mantissa x 2^-24
        const float magnitude = std::ldexp(float(mantissa), -24);
        return sign ? -magnitude : magnitude;
    }
    return float_of(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

uint16_t float_to_half(float x) {
    const uint32_t u = bits_of(x), sign = (u >> 16) & 0x8000;
    const uint32_t magnitude = u & 0x7fffffffu;
    if (magnitude > 0x7f800000u) {  // NaN: quiet, top mantissa bits kept
        return uint16_t(sign | 0x7e00 | ((magnitude >> 13) & 0x3ff));
    }
    if (magnitude >= 0x477ff000u) {  // rounds to 65520 or more: Inf
        return uint16_t(sign | 0x7c00);
    }
    if (magnitude < 0x38800000u) {  // below 2^-14: a subnormal or zero, in units of 2^-24
        const float scaled = float_of(magnitude) * 16777216.0f;    // exact
        return uint16_t(sign | uint32_t(std::nearbyint(scaled)));  // nearest even (default mode)
    }
    const uint32_t rounded = magnitude + 0xfffu + ((magnitude >> 13) & 1);
    return uint16_t(sign | ((rounded - 0x38000000u) >> 13));
}

#if defined(__x86_64__)
// F16C converts eight at a time, rounding to nearest even; most x86-64 CPUs of interest have it.
__attribute__((target("avx,f16c"))) void half_to_float_hardware(const uint16_t *in, float *out,
                                                                int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i *>(in + i));
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
    }
    for (; i < n; i++) {
        out[i] = half_to_float(in[i]);
    }
}

__attribute__((target("avx,f16c"))) void float_to_half_hardware(const float *in, uint16_t *out,
                                                                int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128(reinterpret_cast<__m128i *>(out + i), h);
    }
    for (; i < n; i++) {
        out[i] = float_to_half(in[i]);
    }
}

// F16C and AVX, and the OS saving the AVX state (CPUID leaf 1, XGETBV), as GCC's and clang's
// __builtin_cpu_supports would say where they know "f16c" (clang 14 does not).
bool has_half_conversion() {
    static const bool f16c = [] {
        unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
        if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0 || (ecx & bit_OSXSAVE) == 0) {
            return false;
        }
        unsigned xcr0 = 0, xcr0_high = 0;
        __asm__("xgetbv" : "=a"(xcr0), "=d"(xcr0_high) : "c"(0));
        return (xcr0 & 6) == 6 && (ecx & bit_AVX) != 0 && (ecx & bit_F16C) != 0;
    }();
    return f16c;
}

#elif defined(__aarch64__)
// ARMv8-A converts in hardware (FCVT, vectorized as FCVTL / FCVTN), rounding to nearest even.
bool has_half_conversion() { return true; }

void half_to_float_hardware(const uint16_t *in, float *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        __fp16 h;
        std::memcpy(&h, in + i, sizeof h);
        out[i] = float(h);
    }
}

void float_to_half_hardware(const float *in, uint16_t *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const __fp16 h = __fp16(in[i]);
        std::memcpy(out + i, &h, sizeof h);
    }
}
#endif

}  // namespace

float to_float(bfloat16 x) { return float_of(uint32_t(x.bits) << 16); }
float to_float(float16 x) { return half_to_float(x.bits); }
bfloat16 to_bfloat16(float x) { return bfloat16{bfloat16_bits(x)}; }
float16 to_float16(float x) { return float16{float_to_half(x)}; }

namespace detail {

void convert(const bfloat16 *in, float *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        out[i] = float_of(uint32_t(in[i].bits) << 16);
    }
}

void convert(const float *in, bfloat16 *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        out[i].bits = bfloat16_bits(in[i]);
    }
}

void convert(const float16 *in, float *out, int64_t n) {
    static_assert(sizeof(float16) == sizeof(uint16_t));
    const uint16_t *bits = reinterpret_cast<const uint16_t *>(in);
    if (has_half_conversion()) {
        half_to_float_hardware(bits, out, n);
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        out[i] = half_to_float(bits[i]);
    }
}

void convert(const float *in, float16 *out, int64_t n) {
    uint16_t *bits = reinterpret_cast<uint16_t *>(out);
    if (has_half_conversion()) {
        float_to_half_hardware(in, bits, n);
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        bits[i] = float_to_half(in[i]);
    }
}

void round_to(DType dtype, float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        if (dtype == DType::bf16) {
            x[i] = to_float(to_bfloat16(x[i]));
        } else if (dtype == DType::f16) {
            x[i] = to_float(to_float16(x[i]));
        }
    }
}

void *scratch_or_throw(size_t bytes) {
    void *block = scratch_allocate(bytes);
    if (block == nullptr) {
        throw Error(fmt::format("Out of memory: {} bytes for a converted tensor", bytes));
    }
    return block;
}

void scratch_free(void *block) { scratch_release(block); }

}  // namespace detail
}  // namespace mha
