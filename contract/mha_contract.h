// The kernel contract: every fact that the build, the generators, the runtime, the tuner, the
// tests and the benchmarks share, written once in plain C++ (no Halide):
//   - the variant axes of the forward kernels (devices, CPU instruction sets, shape buckets,
//     the kind of mask, causal or not, weights returned or not, separate or fused QKV
//     projection);
//   - which arguments each variant takes, in call order, with their names, types and ranks;
//   - the layout of the prepacked weights.
// The build runs contract/emit_kernels.cpp on it to write the add_halide_library rows and the
// runtime's kernel tables; the generators declare their Inputs and Outputs from
// kernel_arguments(); the runtime checks at compile time that every generated kernel takes
// exactly those arguments (kernel_table.h), so a renamed or reordered Input fails the build.
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

// --- CPU instruction sets ----------------------------------------------------------------

// The CPU architectures kernels are built for: a build compiles those of one (its compiler's).
enum class CpuArch { x86_64, arm64 };

constexpr std::string_view cpu_arch_name(CpuArch arch) {
    return arch == CpuArch::x86_64 ? "x86-64" : "arm64";
}

inline constexpr std::array kCpuArches = {CpuArch::x86_64, CpuArch::arm64};

// One set of CPU kernels. The runtime runs the first one of its architecture this CPU supports
// (asking Halide's own target check, through a probe kernel built for all of them), capped by
// MHA_CPU_ISA.
struct CpuIsa {
    CpuArch arch;
    std::string_view name;           // what MHA_CPU_ISA, dispatched_isa() and file names use
    std::string_view halide_target;  // features written out, never `host`
    int f32_lanes;                   // f32 lanes of one vector register
    int vector_registers;
    // schedules/tuned/<name>.json must exist (mha-tune writes it); an untuned instruction set
    // reads it when present, and the schedule's defaults for its registers otherwise.
    bool tuned;
    // What its forward kernels take: f32, or bf16 on a matrix engine (whose other stages run in
    // f32 as on the f32 instruction set below it). A module runs the best instruction set of
    // its dtype the CPU supports; one without (a bf16 module elsewhere) converts to f32.
    DType dtype = DType::f32;
};
// Per architecture best first; the last f32 one of each is the fallback that any CPU of that
// architecture runs.
inline constexpr std::array kCpuIsas = {
    // AMX-BF16 (Intel Sapphire Rapids and later): the projections as bf16 tile products.
    CpuIsa{CpuArch::x86_64, "amx",
           "x86-64-linux-avx-avx2-avx512-avx512_cannonlake-avx512_sapphirerapids-avx512_skylake-"
           "avxvnni-f16c-fma-sse41",
           16, 32, false, DType::bf16},
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
    // a query tile's last visible key are never computed.
    bool causal = false;
    // The element type of the activations and weights it reads (forward kernels only).
    DType dtype = DType::f32;

    constexpr bool operator==(const KernelVariant &o) const {
        return op == o.op && mask == o.mask && returns_weights == o.returns_weights &&
               fused_qkv == o.fused_qkv && causal == o.causal && dtype == o.dtype;
    }
    // Which CPU instruction sets compile it: forward kernels those of their dtype, the others
    // the f32 ones.
    constexpr bool compiled_for(const CpuIsa &isa) const { return isa.dtype == dtype; }
    // Decode steps run on the CPU only; forward kernels of every dtype on GPUs, and on the CPU
    // those of a dtype an instruction set computes in (f32, and bf16 on the matrix engine).
    constexpr bool runs_on(Device device) const {
        if (device != Device::cpu) {
            return op != KernelOp::qkv_projection && op != KernelOp::decode;
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
// dtype (bf16 for the CPU's matrix engine and GPUs, f16 for GPUs). A decode step (causal within
// its new tokens by definition): one fused QKV projection, and an attention with a byte
// key-padding mask over the cache or none. The weights averaged over heads.
inline constexpr std::array<KernelVariant, 76> kKernelVariants = [] {
    std::array<KernelVariant, 76> all{};
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
    all[n++] = {KernelOp::qkv_projection, MaskKind::none, false, true};
    for (MaskKind mask : {MaskKind::none, MaskKind::bytes}) {
        all[n++] = {KernelOp::decode, mask, false, true};
    }
    all[n++] = {KernelOp::average_heads};
    return all;
}();

// --- Kernel arguments ----------------------------------------------------------------------

enum class ArgKind { input_buffer, input_scalar, output_buffer };
// u16: the bits of a bf16 or an f16 (the variant's dtype), which a GPU kernel widens to f32
// exactly as it reads them. Halide's OpenCL kernels refuse 16-bit float types on devices
// without cl_khr_fp16 (PoCL has none), so its CUDA and OpenCL kernels read bits alike.
enum class ElementType { f32, bf16, u16, u8, i32 };

// Every argument any kernel takes. Halide lists dimensions innermost first, so a PyTorch tensor
// [B, S, E] is the buffer (e, s, b).
enum class ArgId {
    query,
    key,
    value,
    head_dim,
    kv_heads,
    q_weight,
    q_bias,
    k_weight,
    k_bias,
    v_weight,
    v_bias,
    qkv_weight,
    qkv_bias,
    out_weight,
    out_bias,
    mask,
    mask_blocks_nonzero,
    additive_mask,
    causal_offset,
    // A decode step's.
    new_qkv,
    key_cache,
    value_cache,
    cached_lengths,
    new_counts,
    cache_mask,
    output,
    weights,
    qkv_rows,
    // The weights averaged over heads.
    head_weights,
    averaged_weights,
};
inline constexpr size_t kArgCount = size_t(ArgId::averaged_weights) + 1;

struct ArgSpec {
    ArgId id;
    std::string_view name;  // the generator's Input / Output name
    ArgKind kind;
    ElementType type;
    int rank;                  // 0 for scalars
    std::string_view meaning;  // dimensions innermost first
};

inline constexpr std::array<ArgSpec, kArgCount> kArgs = {{
    {ArgId::query, "query", ArgKind::input_buffer, ElementType::f32, 3, "(e, sq, b)"},
    {ArgId::key, "key", ArgKind::input_buffer, ElementType::f32, 3, "(kdim, sk, b)"},
    {ArgId::value, "value", ArgKind::input_buffer, ElementType::f32, 3, "(vdim, sk, b)"},
    {ArgId::head_dim, "head_dim", ArgKind::input_scalar, ElementType::i32, 0, "E / H"},
    {ArgId::kv_heads, "kv_heads", ArgKind::input_scalar, ElementType::i32, 0,
     "key/value heads, dividing H: query head h reads kv head h / (H / kv_heads)"},
    {ArgId::q_weight, "q_weight", ArgKind::input_buffer, ElementType::f32, 3, "Wqᵀ panels"},
    {ArgId::q_bias, "q_bias", ArgKind::input_buffer, ElementType::f32, 1, "(padded out)"},
    {ArgId::k_weight, "k_weight", ArgKind::input_buffer, ElementType::f32, 3, "Wkᵀ panels"},
    {ArgId::k_bias, "k_bias", ArgKind::input_buffer, ElementType::f32, 1, "(padded out)"},
    {ArgId::v_weight, "v_weight", ArgKind::input_buffer, ElementType::f32, 3, "Wvᵀ panels"},
    {ArgId::v_bias, "v_bias", ArgKind::input_buffer, ElementType::f32, 1, "(padded out)"},
    {ArgId::qkv_weight, "qkv_weight", ArgKind::input_buffer, ElementType::f32, 3,
     "[Wq; Wk; Wv]ᵀ panels"},
    {ArgId::qkv_bias, "qkv_bias", ArgKind::input_buffer, ElementType::f32, 1, "(3 x padded out)"},
    {ArgId::out_weight, "out_weight", ArgKind::input_buffer, ElementType::f32, 3, "Woᵀ panels"},
    {ArgId::out_bias, "out_bias", ArgKind::input_buffer, ElementType::f32, 1, "(padded out)"},
    {ArgId::mask, "mask", ArgKind::input_buffer, ElementType::u8, 4, "(j, i, h, b), broadcast"},
    {ArgId::mask_blocks_nonzero, "mask_blocks_nonzero", ArgKind::input_scalar, ElementType::i32, 0,
     "1: nonzero blocks (block), 0: zero blocks (keep)"},
    {ArgId::additive_mask, "additive_mask", ArgKind::input_buffer, ElementType::f32, 4,
     "(j, i, h, b), broadcast, added to the scores"},
    {ArgId::causal_offset, "causal_offset", ArgKind::input_scalar, ElementType::i32, 0,
     "query i sees keys j <= i + causal_offset"},
    {ArgId::new_qkv, "new_qkv", ArgKind::input_buffer, ElementType::f32, 3,
     "(f, i, b): the new tokens' qkv_rows"},
    {ArgId::key_cache, "key_cache", ArgKind::input_buffer, ElementType::f32, 4,
     "(j, c, h, b): keys innermost"},
    {ArgId::value_cache, "value_cache", ArgKind::input_buffer, ElementType::f32, 4,
     "(c, j, h, b): features innermost"},
    {ArgId::cached_lengths, "cached_lengths", ArgKind::input_buffer, ElementType::i32, 1,
     "(b): tokens cached before this step"},
    {ArgId::new_counts, "new_counts", ArgKind::input_buffer, ElementType::i32, 1,
     "(b): new tokens of each row (the rest are padding)"},
    {ArgId::cache_mask, "cache_mask", ArgKind::input_buffer, ElementType::u8, 2,
     "(j, b): key padding over the cache"},
    {ArgId::output, "output", ArgKind::output_buffer, ElementType::f32, 3, "(e, sq, b)"},
    {ArgId::weights, "weights", ArgKind::output_buffer, ElementType::f32, 4, "(j, i, h, b)"},
    {ArgId::qkv_rows, "qkv_rows", ArgKind::output_buffer, ElementType::f32, 3,
     "(f, i, b): q, k, v stacked as in qkv_weight"},
    {ArgId::head_weights, "head_weights", ArgKind::input_buffer, ElementType::f32, 4,
     "(j, i, h, b): the weights of each head"},
    {ArgId::averaged_weights, "averaged_weights", ArgKind::output_buffer, ElementType::f32, 3,
     "(j, i, b): their mean over heads"},
}};

constexpr const ArgSpec &arg(ArgId id) { return kArgs[size_t(id)]; }

// An argument's element type in a variant on a device: a 16-bit kernel reads its activations
// and projection weights in 16 bits, biases and the rest in f32. On the CPU's matrix engine
// they are bf16 (the weights as its tiles, kBf16TileWidth), on GPUs their bits (u16; the
// weights in the f32 kernels' panels, kWeightPanel).
constexpr ElementType arg_type(ArgId id, const KernelVariant &v, Device device) {
    if (v.dtype == DType::f32) {
        return arg(id).type;
    }
    switch (id) {
    case ArgId::query:
    case ArgId::key:
    case ArgId::value:
    case ArgId::q_weight:
    case ArgId::k_weight:
    case ArgId::v_weight:
    case ArgId::qkv_weight:
    case ArgId::out_weight:
        return device == Device::cpu ? ElementType::bf16 : ElementType::u16;
    default:
        return arg(id).type;
    }
}

// The arguments of one variant, in call order (after the user_context): inputs, then outputs.
struct ArgList {
    std::array<ArgId, kArgCount> ids{};
    size_t count = 0;

    constexpr const ArgId *begin() const { return ids.data(); }
    constexpr const ArgId *end() const { return ids.data() + count; }
    constexpr size_t size() const { return count; }
    constexpr ArgId operator[](size_t i) const { return ids[i]; }
    constexpr void push(ArgId id) { ids[count++] = id; }
};

constexpr ArgList kernel_arguments(const KernelVariant &v) {
    ArgList list;
    if (v.op == KernelOp::qkv_projection) {
        for (ArgId id : {ArgId::query, ArgId::qkv_weight, ArgId::qkv_bias, ArgId::qkv_rows}) {
            list.push(id);
        }
        return list;
    }
    if (v.op == KernelOp::average_heads) {
        list.push(ArgId::head_weights);
        list.push(ArgId::averaged_weights);
        return list;
    }
    if (v.op == KernelOp::decode) {
        for (ArgId id : {ArgId::new_qkv, ArgId::head_dim, ArgId::kv_heads, ArgId::key_cache,
                         ArgId::value_cache, ArgId::cached_lengths, ArgId::new_counts,
                         ArgId::out_weight, ArgId::out_bias}) {
            list.push(id);
        }
        if (v.mask == MaskKind::bytes) {
            list.push(ArgId::cache_mask);
            list.push(ArgId::mask_blocks_nonzero);
        }
        list.push(ArgId::output);
        return list;
    }
    list.push(ArgId::query);
    if (!v.fused_qkv) {
        list.push(ArgId::key);
        list.push(ArgId::value);
    }
    list.push(ArgId::head_dim);
    list.push(ArgId::kv_heads);
    if (v.fused_qkv) {
        list.push(ArgId::qkv_weight);
        list.push(ArgId::qkv_bias);
    } else {
        for (ArgId id : {ArgId::q_weight, ArgId::q_bias, ArgId::k_weight, ArgId::k_bias,
                         ArgId::v_weight, ArgId::v_bias}) {
            list.push(id);
        }
    }
    list.push(ArgId::out_weight);
    list.push(ArgId::out_bias);
    if (v.mask == MaskKind::bytes) {
        list.push(ArgId::mask);
        list.push(ArgId::mask_blocks_nonzero);
    } else if (v.mask == MaskKind::additive) {
        list.push(ArgId::additive_mask);
    }
    if (v.causal) {
        list.push(ArgId::causal_offset);
    }
    list.push(ArgId::output);
    if (v.returns_weights) {
        list.push(ArgId::weights);
    }
    return list;
}

// --- Prepacked weights ---------------------------------------------------------------------

// Widest tile, in features, that a schedule may round a head or a projection up to; tiles over
// features must divide it.
inline constexpr int kMaxTile = 64;

// Prepacked weights are Wᵀ in panels of this many output features: buffer (lane, in, panel)
// holds output feature panel·kWeightPanel + lane, contiguously over every input feature.
inline constexpr int kWeightPanel = 32;
static_assert(kMaxTile % kWeightPanel == 0, "panels must tile the widest feature tile");

// A bf16 kernel's projection weights, as the matrix engine reads them (x86 AMX): tiles of
// kBf16TileDepth input features x kBf16TileWidth output features, each contiguous with pairs of
// input features innermost. Buffer (pair, lane, panel x pairs + p) holds W[panel x 16 + lane]
// [2 p + pair], pairs = bf16_tile_pairs(in) per panel of 16 output features; input features
// past `in` and the padded output features are zero.
inline constexpr int kBf16TileWidth = 16;
inline constexpr int kBf16TileDepth = 32;
static_assert(kWeightPanel % kBf16TileWidth == 0, "padded features fill whole tiles");

// The product of `factors`, or none when it leaves int64: sizes computed from a caller's
// extents never wrap around.
inline std::optional<int64_t> checked_product(std::initializer_list<int64_t> factors) {
    int64_t product = 1;
    for (int64_t f : factors) {
        if (__builtin_mul_overflow(product, f, &product)) {
            return std::nullopt;
        }
    }
    return product;
}

// The bytes of a buffer of `extents` (any range of them) and `element_bytes` each, or none when
// the count leaves int64.
template <typename Extents>
std::optional<int64_t> checked_bytes(const Extents &extents, int64_t element_bytes) {
    std::optional<int64_t> bytes = element_bytes;
    for (int64_t extent : extents) {
        bytes = bytes ? checked_product({*bytes, extent}) : std::nullopt;
    }
    return bytes;
}

// Works for integers and for Halide::Expr alike, so the generators and the runtime share it.
template <typename Int>
constexpr Int round_up(Int x, int multiple) {
    return (x + (multiple - 1)) / multiple * multiple;
}

// Output features each prepacked projection Wᵀ (and bias) is zero-padded to, so that a schedule
// may compute whole tiles past its `features` (E, or kv_heads · d for K and V): far enough for
// the last head rounded up to a whole tile, itself rounded up to a whole tile.
template <typename Int>
constexpr Int padded_features(Int features, Int head_dim) {
    return round_up(features - head_dim + round_up(head_dim, kMaxTile), kMaxTile);
}

// Pairs of input features per 16-wide panel of bf16 tiles (see kBf16TileDepth).
template <typename Int>
constexpr Int bf16_tile_pairs(Int in_features) {
    return round_up(in_features, kBf16TileDepth) / 2;
}

// A decode kernel reads the key cache in whole tiles of this many keys: caches hold a multiple
// of it, and the runtime passes them cropped to one.
inline constexpr int kCacheKeyTile = 64;

// The fused QKV weights stack Wq, Wk, Wv along the output features, Wq `padded_q` wide, Wk and
// Wv `padded_kv` (grouped-query heads have fewer key/value features): the first output feature
// of projection p (0 = q, 1 = k, 2 = v).
template <typename Int>
constexpr Int qkv_block_offset(int projection, Int padded_q, Int padded_kv) {
    return projection == 0 ? Int(0) : padded_q + padded_kv * (projection - 1);
}
inline constexpr int kQkvProjections = 3;

}  // namespace mha::contract
