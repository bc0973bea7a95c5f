// The kernel contract, its second half: what each kernel takes. Every argument any kernel takes
// (kArgs: name, kind, element type, rank, layout), the arguments of a variant in call order
// (kernel_arguments), and the layout of the prepacked weights. The generators declare their
// Inputs and Outputs from it; the runtime's kernel tables check every generated kernel against
// it at compile time (kernel_table.h).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string_view>

#include "mha_variants.h"

namespace mha::contract {

// --- Kernel arguments ----------------------------------------------------------------------

enum class ArgKind { input_buffer, input_scalar, output_buffer };
// f16: a decode step's weights and cache only. u16: the bits of a bf16 or an f16 (the variant's
// dtype), which a GPU kernel widens to f32 exactly as it reads them. Halide's OpenCL kernels refuse
// 16-bit float types on devices without cl_khr_fp16 (PoCL has none), so its CUDA and OpenCL kernels
// read bits alike. i8: an int8 KV cache's keys and values.
enum class ElementType { f32, bf16, f16, u16, u8, i8, i32 };

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
    key_scales,
    value_scales,
    cached_lengths,
    new_counts,
    split_keys,
    cache_mask,
    output,
    weights,
    qkv_rows,
    // The weights averaged over heads.
    head_weights,
    averaged_weights,
    // The attention core's.
    q,
    k,
    v,
    scale,
    window_start,
    window_end,
    softcap,
    alibi_slopes,
    key_pages,
    value_pages,
    block_table,
    sequence_lengths,
    context,
    lse,
};
inline constexpr size_t kArgCount = size_t(ArgId::lse) + 1;

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
    {ArgId::key_cache, "key_cache", ArgKind::input_buffer, ElementType::f32, 5,
     "(jj, c, tile, h, b): tiles of kCacheKeyTile keys, each contiguous, its keys innermost"},
    {ArgId::value_cache, "value_cache", ArgKind::input_buffer, ElementType::f32, 4,
     "(c, j, h, b): features innermost, padded to kCacheValueFeatures"},
    {ArgId::key_scales, "key_scales", ArgKind::input_buffer, ElementType::f32, 3,
     "(j, h, b): an int8 cache's, key j of head h is key_cache times it"},
    {ArgId::value_scales, "value_scales", ArgKind::input_buffer, ElementType::f32, 3,
     "(j, h, b): an int8 cache's, value j of head h is value_cache times it"},
    {ArgId::cached_lengths, "cached_lengths", ArgKind::input_buffer, ElementType::i32, 1,
     "(b): tokens cached before this step"},
    {ArgId::new_counts, "new_counts", ArgKind::input_buffer, ElementType::i32, 1,
     "(b): new tokens of each row (the rest are padding)"},
    {ArgId::split_keys, "split_keys", ArgKind::input_scalar, ElementType::i32, 0,
     "keys per task of a key/value head, a multiple of kCacheKeyTile: the cache split among "
     "tasks, their results merged by log-sum-exp"},
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
    {ArgId::q, "q", ArgKind::input_buffer, ElementType::f32, 4,
     "(c, i, h, b): the queries, features dense, any other strides"},
    {ArgId::k, "k", ArgKind::input_buffer, ElementType::f32, 4,
     "(c, j, kv head, b): key/value heads dividing the query heads"},
    {ArgId::v, "v", ArgKind::input_buffer, ElementType::f32, 4, "(c, j, kv head, b)"},
    {ArgId::scale, "scale", ArgKind::input_scalar, ElementType::f32, 0, "of q·kᵀ"},
    {ArgId::window_start, "window_start", ArgKind::input_scalar, ElementType::i32, 0,
     "query i sees keys j >= i + window_start"},
    {ArgId::window_end, "window_end", ArgKind::input_scalar, ElementType::i32, 0,
     "query i sees keys j <= i + window_end"},
    {ArgId::softcap, "softcap", ArgKind::input_scalar, ElementType::f32, 0,
     "scores softcap · tanh(s / softcap); 0: none"},
    {ArgId::alibi_slopes, "alibi_slopes", ArgKind::input_buffer, ElementType::f32, 1,
     "(h): scores minus slope · |i + diagonal - j|; zeros: none"},
    {ArgId::key_pages, "key_pages", ArgKind::input_buffer, ElementType::f32, 4,
     "(c, kv head, slot, block): a paged cache's keys, features dense"},
    {ArgId::value_pages, "value_pages", ArgKind::input_buffer, ElementType::f32, 4,
     "(c, kv head, slot, block): its values, features dense"},
    {ArgId::block_table, "block_table", ArgKind::input_buffer, ElementType::i32, 2,
     "(n, b): block of each sequence's keys n · slots .. (n + 1) · slots - 1"},
    {ArgId::sequence_lengths, "sequence_lengths", ArgKind::input_buffer, ElementType::i32, 1,
     "(b): keys of each sequence in the paged cache, its query the last"},
    {ArgId::context, "context", ArgKind::output_buffer, ElementType::f32, 4,
     "(c, i, h, b): weights·V, features dense, any other strides"},
    {ArgId::lse, "lse", ArgKind::output_buffer, ElementType::f32, 3,
     "(i, h, b): log of the softmax's sum plus the row max; -inf where no key weighs"},
}};

constexpr const ArgSpec &arg(ArgId id) { return kArgs[size_t(id)]; }

// An argument's element type in a variant on a device: a 16-bit kernel reads its activations
// and projection weights in 16 bits, biases and the rest in f32. On the CPU's matrix engine
// they are bf16 (the weights as its tiles, kBf16TileWidth), on GPUs their bits (u16; the
// weights in the f32 kernels' panels, kWeightPanel). A decode step's kernels (CPU only) read
// the weights' panels in their dtype and the cache in its own, the tokens and the rest in f32.
constexpr ElementType element_type(DType dtype) {
    return dtype == DType::f32    ? ElementType::f32
           : dtype == DType::bf16 ? ElementType::bf16
                                  : ElementType::f16;
}
constexpr ElementType element_type(CacheDType dtype) {
    return dtype == CacheDType::int8   ? ElementType::i8
           : dtype == CacheDType::f32  ? ElementType::f32
           : dtype == CacheDType::bf16 ? ElementType::bf16
                                       : ElementType::f16;
}
constexpr ElementType arg_type(ArgId id, const KernelVariant &v, Device device) {
    if (v.op == KernelOp::qkv_projection || v.op == KernelOp::decode) {
        switch (id) {
        case ArgId::qkv_weight:
        case ArgId::out_weight:
            return element_type(v.dtype);
        case ArgId::key_cache:
        case ArgId::value_cache:
            return element_type(v.cache);
        default:
            return arg(id).type;
        }
    }
    if (v.paged && (id == ArgId::q || id == ArgId::key_pages || id == ArgId::value_pages)) {
        return element_type(v.dtype);
    }
    if (v.dtype == DType::f32) {
        return arg(id).type;
    }
    switch (id) {
    case ArgId::query:
    case ArgId::key:
    case ArgId::value:
    case ArgId::q:
    case ArgId::k:
    case ArgId::v:
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
    constexpr void push(std::initializer_list<ArgId> list) {
        for (ArgId id : list) {
            push(id);
        }
    }
    // A mask kind's: the bytes and their convention, or the floats added.
    constexpr void push_mask(MaskKind mask) {
        if (mask == MaskKind::bytes) {
            push({ArgId::mask, ArgId::mask_blocks_nonzero});
        } else if (mask == MaskKind::additive) {
            push(ArgId::additive_mask);
        }
    }
};

constexpr ArgList kernel_arguments(const KernelVariant &v) {
    ArgList list;
    if (v.op == KernelOp::qkv_projection) {
        for (ArgId id : {ArgId::query, ArgId::qkv_weight, ArgId::qkv_bias, ArgId::qkv_rows}) {
            list.push(id);
        }
        return list;
    }
    if (v.op == KernelOp::attention && v.paged) {
        list.push({ArgId::q, ArgId::key_pages, ArgId::value_pages, ArgId::block_table,
                   ArgId::sequence_lengths, ArgId::scale, ArgId::window_start, ArgId::window_end,
                   ArgId::softcap, ArgId::alibi_slopes, ArgId::context, ArgId::lse});
        return list;
    }
    if (v.op == KernelOp::attention) {
        list.push({ArgId::q, ArgId::k, ArgId::v, ArgId::scale});
        list.push_mask(v.mask);
        if (v.causal) {
            list.push({ArgId::window_start, ArgId::window_end});
        }
        if (v.modified_scores) {
            list.push({ArgId::softcap, ArgId::alibi_slopes});
        }
        list.push({ArgId::context, ArgId::lse});
        return list;
    }
    if (v.op == KernelOp::average_heads) {
        list.push(ArgId::head_weights);
        list.push(ArgId::averaged_weights);
        return list;
    }
    if (v.op == KernelOp::decode) {
        list.push({ArgId::new_qkv, ArgId::head_dim, ArgId::kv_heads, ArgId::key_cache,
                   ArgId::value_cache});
        if (v.cache == CacheDType::int8) {
            list.push({ArgId::key_scales, ArgId::value_scales});
        }
        list.push({ArgId::cached_lengths, ArgId::new_counts, ArgId::split_keys, ArgId::out_weight,
                   ArgId::out_bias});
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
    list.push({ArgId::out_weight, ArgId::out_bias});
    list.push_mask(v.mask);
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
// It reads each key's values in whole vectors of features: the value cache holds them padded
// with zeros to a multiple of this (the widest vector's f32 lanes).
inline constexpr int kCacheValueFeatures = 16;
constexpr bool value_features_fill_vectors() {
    for (const CpuIsa &isa : kCpuIsas) {
        if (kCacheValueFeatures % isa.f32_lanes != 0) {
            return false;
        }
    }
    return true;
}
static_assert(value_features_fill_vectors(), "every instruction set's vectors tile a value row");

// The fused QKV weights stack Wq, Wk, Wv along the output features, Wq `padded_q` wide, Wk and
// Wv `padded_kv` (grouped-query heads have fewer key/value features): the first output feature
// of projection p (0 = q, 1 = k, 2 = v).
template <typename Int>
constexpr Int qkv_block_offset(int projection, Int padded_q, Int padded_kv) {
    return projection == 0 ? Int(0) : padded_q + padded_kv * (projection - 1);
}
inline constexpr int kQkvProjections = 3;

}  // namespace mha::contract
