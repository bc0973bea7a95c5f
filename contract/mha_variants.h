// The kernel contract, its first half: which kernels exist. The devices, element types, CPU
// instruction sets and shape buckets, and the variant table (kKernelVariants) whose every row is
// compiled for each device, instruction set and bucket group it runs on. What each takes is the
// second half, mha_arguments.h; mha_contract.h includes both.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string_view>

#include "mha/types.h"

namespace mha::contract {

// --- Devices -----------------------------------------------------------------------------

inline constexpr std::array kDevices = {Device::cpu, Device::cuda, Device::opencl};

constexpr std::string_view device_name(Device device) {
    switch (device) {
    case Device::cpu:
        return "cpu";
    case Device::cuda:
        return "cuda";
    case Device::opencl:
        return "opencl";
    }
    return "unknown";
}

// A GPU device's kernels: one Halide target, and the driver library its runtime loads.
struct GpuTarget {
    Device device;
    std::string_view halide_target;
    std::string_view driver_library;  // what Halide's runtime dlopens
};
// CUDA kernels are PTX for compute capability 8.0 (A100; H100 and H200 JIT-compile it).
inline constexpr std::array kGpuTargets = {
    GpuTarget{Device::cuda, "x86-64-linux-cuda-cuda_capability_80", "libcuda.so.1"},
    GpuTarget{Device::opencl, "x86-64-linux-opencl", "libOpenCL.so.1"},
};

// --- Element types -------------------------------------------------------------------------

// What `mha --dtype` and the benchmarks call them, as PyTorch does (float32 is f32).
constexpr std::string_view dtype_name(DType dtype) {
    switch (dtype) {
    case DType::f32:
        return "f32";
    case DType::bf16:
        return "bf16";
    case DType::f16:
        return "f16";
    }
    return "unknown";
}
inline constexpr std::array kDTypes = {DType::f32, DType::bf16, DType::f16};

constexpr std::optional<DType> dtype_named(std::string_view name) {
    for (DType dtype : kDTypes) {
        if (dtype_name(dtype) == name) {
            return dtype;
        }
    }
    return std::nullopt;
}

// What a KV cache stores (CacheDType): a DType, or int8 with its scales.
constexpr CacheDType cache_dtype(DType dtype) {
    return dtype == DType::f32    ? CacheDType::f32
           : dtype == DType::bf16 ? CacheDType::bf16
                                  : CacheDType::f16;
}
constexpr std::string_view cache_dtype_name(CacheDType dtype) {
    return dtype == CacheDType::int8   ? "int8"
           : dtype == CacheDType::f32  ? "f32"
           : dtype == CacheDType::bf16 ? "bf16"
                                       : "f16";
}
inline constexpr std::array kCacheDTypes = {CacheDType::f32, CacheDType::bf16, CacheDType::f16,
                                            CacheDType::int8};

constexpr std::optional<CacheDType> cache_dtype_named(std::string_view name) {
    for (CacheDType dtype : kCacheDTypes) {
        if (cache_dtype_name(dtype) == name) {
            return dtype;
        }
    }
    return std::nullopt;
}

// --- CPU instruction sets ----------------------------------------------------------------

// The CPU architectures kernels are built for: a build compiles those of one (its compiler's).
enum class CpuArch { x86_64, arm64 };

constexpr std::string_view cpu_arch_name(CpuArch arch) {
    return arch == CpuArch::x86_64 ? "x86-64" : "arm64";
}

inline constexpr std::array kCpuArches = {CpuArch::x86_64, CpuArch::arm64};

// How an instruction set's bf16 kernels multiply: tile products on the matrix engine (x86 AMX,
// whose tile state a process must ask Linux for), or vdpbf16ps dot products of pairs of bf16
// values into f32 vector lanes (AVX512_BF16), in the same tiles and the same weight layout.
enum class Bf16Products { none, amx_tiles, dot_pairs };

// One set of CPU kernels. The runtime runs the first one of its architecture this CPU supports
// (asking Halide's own target check, through a probe kernel built for all of them), capped by
// MHA_CPU_ISA.
struct CpuIsa {
    CpuArch arch;
    std::string_view name;           // what MHA_CPU_ISA, dispatched_isa() and file names use
    std::string_view halide_target;  // features written out, never `host`
    int f32_lanes;                   // f32 lanes of one vector register
    int vector_registers;
    // schedules/tuned/<name>.<cpu>.json must exist for one CPU at least (mha-tune writes it); an
    // untuned instruction set reads those present. Kernels are also compiled with the
    // schedule's defaults for its registers, which CPUs of no tuned file's vendor run.
    bool tuned;
    // What its forward kernels take: f32, or bf16 as tile products (whose other stages run in
    // f32 as on the f32 instruction set below it). A module runs the best instruction set of
    // its dtype the CPU supports; one without (a bf16 module elsewhere) converts to f32.
    DType dtype = DType::f32;
    Bf16Products bf16_products = Bf16Products::none;
};
// Per architecture best first; the last f32 one of each is the fallback that any CPU of that
// architecture runs.
inline constexpr std::array kCpuIsas = {
    // AMX-BF16 (Intel Sapphire Rapids and later): the projections as bf16 tile products.
    CpuIsa{CpuArch::x86_64, "amx",
           "x86-64-linux-avx-avx2-avx512-avx512_cannonlake-avx512_sapphirerapids-avx512_skylake-"
           "avxvnni-f16c-fma-sse41",
           16, 32, false, DType::bf16, Bf16Products::amx_tiles},
    // AVX512_BF16 without the matrix engine (AMD Zen 4 and 5; Intel CPUs with AMX run it by
    // name): the same tile products as vdpbf16ps dot products. Halide emits those for its
    // avx512_zen4 feature, which also asks for Ice Lake's AVX-512 extensions (not Cooper Lake).
    CpuIsa{CpuArch::x86_64, "avx512bf16",
           "x86-64-linux-avx-avx2-avx512-avx512_cannonlake-avx512_skylake-avx512_zen4-f16c-fma-"
           "sse41",
           16, 32, false, DType::bf16, Bf16Products::dot_pairs},
    CpuIsa{CpuArch::x86_64, "avx512", "x86-64-linux-avx-avx2-avx512-avx512_skylake-f16c-fma-sse41",
           16, 32, true},
    CpuIsa{CpuArch::x86_64, "avx2", "x86-64-linux-avx-avx2-f16c-fma-sse41", 8, 16, true},
    CpuIsa{CpuArch::x86_64, "sse41", "x86-64-linux-sse41", 4, 16, false},
    // Every arm64 CPU (ARMv8-A: Graviton, Ampere, Apple, phones). The f32 kernels use none of
    // the dot-product or fp16 extensions, so one instruction set serves them all.
    CpuIsa{CpuArch::arm64, "neon", "arm-64-linux", 4, 32, false},
};
inline constexpr size_t kCpuIsaCount = kCpuIsas.size();

constexpr std::optional<size_t> cpu_isa_index(std::string_view name) {
    for (size_t i = 0; i < kCpuIsas.size(); i++) {
        if (kCpuIsas[i].name == name) {
            return i;
        }
    }
    return std::nullopt;
}

// The architecture this code is compiled for, when kernels are built for it.
constexpr std::optional<CpuArch> compiled_cpu_arch() {
#if defined(__x86_64__)
    return CpuArch::x86_64;
#elif defined(__aarch64__)
    return CpuArch::arm64;
#else
    return std::nullopt;
#endif
}

// Every kernel takes a user_context, through which the runtime routes Halide's errors and
// allocations for that call (and only that call) to itself.
inline constexpr std::string_view kKernelTargetFeatures = "user_context";

// --- Shape buckets -----------------------------------------------------------------------

// A problem: query [B, Sq, E], key and value [B, Sk, E], H heads of E / H features.
struct ProblemShape {
    int64_t batch, query_len, key_len, embed_dim, num_heads;

    constexpr int64_t head_dim() const { return embed_dim / num_heads; }
    // The token rows of the largest projection: what the CPU kernels are bucketed by.
    constexpr int64_t token_rows() const { return batch * std::max(query_len, key_len); }
    // FLOPs of one forward pass, 2 per multiply-add: the Q and output projections over Sq rows,
    // the K and V projections over Sk rows, then Q·Kᵀ and weights·V.
    constexpr double forward_flops() const {
        const double B = batch, Sq = query_len, Sk = key_len, E = embed_dim;
        return 2 * E * E * B * (2 * Sq + 2 * Sk) + 2 * 2 * B * Sq * Sk * E;
    }
    constexpr bool operator==(const ProblemShape &o) const {
        return batch == o.batch && query_len == o.query_len && key_len == o.key_len &&
               embed_dim == o.embed_dim && num_heads == o.num_heads;
    }
    constexpr bool operator!=(const ProblemShape &o) const { return !(*this == o); }
};

// CPU kernels are compiled (and tuned) per bucket of ProblemShape::token_rows(): a single
// query against a long context is a large K/V GEMM, not a small one. Up to 4 token rows (a
// single token's call, a few sequences' or tokens' worth) are their own bucket: weight-streaming,
// microseconds long, where forking the small stages onto other cores may cost more than they
// take (its kernels, tuned on one token, ran 2 to 4 rows 1.1-2.7x faster than the small
// bucket's; at 8 rows AVX-512's were even or slower: bench/RESULTS.md). GPU kernels serve any.
enum class ShapeBucket { token, small, medium, large };
struct BucketSpec {
    ShapeBucket bucket;
    std::string_view name;
    int64_t max_token_rows;     // inclusive
    ProblemShape tuning_shape;  // what mha-tune searches on
};
inline constexpr std::array kShapeBuckets = {
    BucketSpec{ShapeBucket::token, "token", 4, {1, 1, 1, 384, 12}},
    BucketSpec{ShapeBucket::small, "small", 64, {2, 5, 5, 512, 8}},
    BucketSpec{ShapeBucket::medium, "medium", 1024, {4, 256, 256, 512, 8}},
    BucketSpec{
        ShapeBucket::large, "large", std::numeric_limits<int64_t>::max(), {1, 2048, 2048, 512, 8}},
};
// The name of a kernel that serves every bucket.
inline constexpr std::string_view kAnyBucket = "any";

constexpr const BucketSpec &bucket_spec(ShapeBucket b) { return kShapeBuckets[size_t(b)]; }

constexpr ShapeBucket shape_bucket(int64_t token_rows) {
    for (const BucketSpec &b : kShapeBuckets) {
        if (token_rows <= b.max_token_rows) {
            return b.bucket;
        }
    }
    return kShapeBuckets.back().bucket;
}

constexpr std::optional<ShapeBucket> bucket_named(std::string_view name) {
    for (const BucketSpec &b : kShapeBuckets) {
        if (b.name == name) {
            return b.bucket;
        }
    }
    return std::nullopt;
}

// A set of buckets (one bit per bucket) that one kernel serves.
using BucketSet = uint32_t;
constexpr BucketSet bucket_bit(ShapeBucket b) { return BucketSet(1) << unsigned(b); }
inline constexpr BucketSet kAllBuckets = (BucketSet(1) << kShapeBuckets.size()) - 1;

// --- Forward-kernel variants -------------------------------------------------------------

// The mask conventions of the public API, by name: what `mha --mask` takes. One kernel serves
// both (its mask_blocks_nonzero argument says which), so they are not a variant axis.
constexpr std::string_view mask_convention_name(MaskConvention convention) {
    switch (convention) {
    case MaskConvention::keep:
        return "keep";
    case MaskConvention::block:
        return "block";
    }
    return "unknown";
}
inline constexpr std::array kMaskConventions = {MaskConvention::keep, MaskConvention::block};

// The causal alignments of the public API, by name: what `mha --causal` takes. One causal
// kernel serves both (its causal_offset argument says which).
constexpr std::string_view causal_name(Causal causal) {
    switch (causal) {
    case Causal::none:
        return "none";
    case Causal::top_left:
        return "top_left";
    case Causal::bottom_right:
        return "bottom_right";
    }
    return "unknown";
}
inline constexpr std::array kCausalAlignments = {Causal::none, Causal::top_left,
                                                 Causal::bottom_right};

// What a kernel does.
enum class KernelOp {
    forward,         // the whole pass, torch.nn.MultiheadAttention's forward
    qkv_projection,  // a decode step's first half: the new tokens' fused QKV projection
    decode,          // its second half: the new tokens' attention over a KV cache, output
                     // projection included
    average_heads,   // the attention weights averaged over heads (average_attn_weights=True)
    attention,       // the attention core on projected heads: F.scaled_dot_product_attention's
};

constexpr std::string_view op_name(KernelOp op) {
    switch (op) {
    case KernelOp::forward:
        return "forward";
    case KernelOp::qkv_projection:
        return "qkv_projection";
    case KernelOp::decode:
        return "decode";
    case KernelOp::average_heads:
        return "average_heads";
    case KernelOp::attention:
        return "attention";
    }
    return "unknown";
}

// The mask a kernel reads. Every mask of the public API reaches a kernel as one of these, its
// broadcasting as zero strides: the seeds' byte masks and PyTorch's boolean ones block
// positions (their score becomes exactly -1e9, as in the seed); the TF article's mask·(-1e9),
// BERT's extended attention mask and PyTorch's float masks are added to the scores.
enum class MaskKind { none, bytes, additive };
inline constexpr std::array kMaskKinds = {MaskKind::none, MaskKind::bytes, MaskKind::additive};

constexpr std::string_view mask_kind_name(MaskKind kind) {
    switch (kind) {
    case MaskKind::none:
        return "none";
    case MaskKind::bytes:
        return "bytes";
    case MaskKind::additive:
        return "additive";
    }
    return "unknown";
}

constexpr std::optional<MaskKind> mask_kind_named(std::string_view name) {
    for (MaskKind kind : kMaskKinds) {
        if (mask_kind_name(kind) == name) {
            return kind;
        }
    }
    return std::nullopt;
}

// What one kernel computes; each variant is compiled ahead of time for every device it runs on
// (and, on the CPU, every instruction set and group of shape buckets).
struct KernelVariant {
    KernelOp op = KernelOp::forward;
    MaskKind mask = MaskKind::none;  // for decode, a key-padding mask over the cache
    bool returns_weights = false;
    bool fused_qkv = false;  // self-attention, query = key = value: one QKV projection
    // Query i sees keys j <= i + causal_offset only (a run-time argument: PyTorch's top-left
    // alignment and FlashAttention's bottom-right are offsets of one kernel); the key tiles past
    // a query tile's last visible key are never computed. An attention kernel's: query i sees
    // keys i + window_start <= j <= i + window_end, a causal order, a sliding window or both,
    // the key tiles outside never computed.
    bool causal = false;
    // The element type of the activations and weights it reads (forward and attention kernels),
    // or of the projection weights a decode step streams (its qkv_projection and decode kernels,
    // which widen them as they read them).
    DType dtype = DType::f32;
    // Attention kernels: the scores soft-capped and ALiBi's biases added (a run-time softcap of
    // 0 and slopes of 0 leave them as they are).
    bool modified_scores = false;
    // Attention kernels: one query row per head (a decode step's), K and V read where they lie;
    // a copy of them into the layout that tiles of many rows want would cost more than the step.
    bool single_query = false;
    // Decode kernels: the element type of the KV cache, widened as it is read (int8: then
    // scaled, each score by its key's scale and each weight by its value's).
    CacheDType cache = CacheDType::f32;
    // Attention kernels: K and V in a paged cache (FlashAttention's and vLLM's block tables), one
    // query row per head at the end of each sequence, in a window, with modified scores; Q, K
    // and V of `dtype`, widened as they are read.
    bool paged = false;

    constexpr bool operator==(const KernelVariant &o) const {
        return op == o.op && mask == o.mask && returns_weights == o.returns_weights &&
               fused_qkv == o.fused_qkv && causal == o.causal && dtype == o.dtype &&
               modified_scores == o.modified_scores && single_query == o.single_query &&
               cache == o.cache && paged == o.paged;
    }
    // Which CPU instruction sets compile it: those of its dtype. The attention core's bf16
    // kernels of many query rows are tile products on AMX, dot products of pairs elsewhere; of
    // one query row (bound by the bytes of K and V), avx512bf16's serve CPUs with AMX too. A
    // decode step is bound by the bytes of its weights and cache, which every f32 instruction
    // set reads in each dtype, widening them to f32 as it reads; so is a step over a paged cache.
    constexpr bool compiled_for(const CpuIsa &isa) const {
        if (op == KernelOp::qkv_projection || op == KernelOp::decode || paged) {
            return isa.dtype == DType::f32;
        }
        return isa.dtype == dtype &&
               (op != KernelOp::attention || dtype == DType::f32 ||
                isa.bf16_products == Bf16Products::dot_pairs || !single_query);
    }
    // Decode steps and attention kernels run on the CPU only; forward kernels of every dtype on
    // GPUs, and on the CPU those of a dtype an instruction set computes in (f32, and bf16 as
    // tile products).
    constexpr bool runs_on(Device device) const {
        if (device != Device::cpu) {
            return op != KernelOp::qkv_projection && op != KernelOp::decode &&
                   op != KernelOp::attention;
        }
        for (const CpuIsa &isa : kCpuIsas) {
            if (compiled_for(isa)) {
                return true;
            }
        }
        return false;
    }
};

// Forward: every mask kind x weights or not x separate or fused QKV x causal or not, in every
// dtype (bf16 for the CPU's bf16 instruction sets and GPUs, f16 for GPUs). A decode step (causal
// within its new tokens by definition): one fused QKV projection, and an attention with a byte
// key-padding mask over the cache or none, in each dtype of the weights, over a cache of the
// weights' dtype, f32 or int8 (f32 weights: of each dtype). The weights averaged over heads. The
// attention core: every mask kind x within a window or not x modified scores or not x one query row
// or any, in f32 and in bf16 (AMX's tile products or AVX512_BF16's dot products, reading 16-bit
// Q, K and V in place); over a paged cache, in each dtype.
inline constexpr std::array<KernelVariant, 147> kKernelVariants = [] {
    std::array<KernelVariant, 147> all{};
    size_t n = 0;
    for (DType dtype : kDTypes) {
        for (MaskKind mask : kMaskKinds) {
            for (bool weights : {false, true}) {
                for (bool fused : {false, true}) {
                    for (bool causal : {false, true}) {
                        all[n++] = {KernelOp::forward, mask, weights, fused, causal, dtype};
                    }
                }
            }
        }
    }
    for (DType weights : kDTypes) {
        all[n++] = {KernelOp::qkv_projection, MaskKind::none, false, true, false, weights};
        for (CacheDType cache : kCacheDTypes) {
            if (weights == DType::f32 || cache == cache_dtype(weights) ||
                cache == CacheDType::f32 || cache == CacheDType::int8) {
                for (MaskKind mask : {MaskKind::none, MaskKind::bytes}) {
                    all[n++] = {KernelOp::decode, mask,  false, true, false,
                                weights,          false, false, cache};
                }
            }
        }
    }
    all[n++] = {KernelOp::average_heads};
    for (DType dtype : {DType::f32, DType::bf16}) {
        for (MaskKind mask : kMaskKinds) {
            for (bool window : {false, true}) {
                for (bool modified : {false, true}) {
                    for (bool single : {false, true}) {
                        all[n++] = {KernelOp::attention,
                                    mask,
                                    false,
                                    false,
                                    window,
                                    dtype,
                                    modified,
                                    single};
                    }
                }
            }
        }
    }
    for (DType dtype : kDTypes) {
        all[n++] = {KernelOp::attention,
                    MaskKind::none,
                    false,
                    false,
                    true,
                    dtype,
                    true,
                    true,
                    CacheDType::f32,
                    true};
    }
    return all;
}();

}  // namespace mha::contract
