// The benchmark shapes: what mha_bench, mha_gpu_bench and mha-tune's verification and comparison
// run. Kept out of the kernel contract, so that adding a shape rebuilds no kernel.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "mha_contract.h"

namespace mha::bench {

using contract::ProblemShape;

// (B, Sq, Sk, E, H): the seed example, one token (E = 384 and 768), a batch of short
// sequences, self-attention from 128 to 2048 tokens, cross-attention, and one query against a
// long context. Sq = Sk is run as self-attention on one tensor (the
// fused QKV kernels). The CPU benchmarks, the GPU benchmark and mha-tune's verification and
// comparison all take their shapes from here.
inline constexpr std::array kBenchmarkSweep = {
    ProblemShape{2, 5, 5, 512, 8},       ProblemShape{1, 1, 1, 384, 12},
    ProblemShape{1, 1, 1, 768, 12},      ProblemShape{8, 32, 32, 384, 12},
    ProblemShape{1, 128, 128, 512, 8},   ProblemShape{4, 256, 256, 512, 8},
    ProblemShape{1, 512, 512, 768, 12},  ProblemShape{1, 1024, 1024, 1024, 16},
    ProblemShape{1, 2048, 2048, 512, 8}, ProblemShape{1, 64, 2048, 512, 8},
    ProblemShape{1, 1, 4096, 512, 8},
};
// A decode step: `batch` rows, each appending one token to a KV cache that holds `cached`;
// `kv_heads` key/value heads (0: num_heads).
struct DecodeShape {
    int64_t batch, cached, embed_dim, num_heads, kv_heads = 0;

    constexpr int64_t key_value_heads() const { return kv_heads == 0 ? num_heads : kv_heads; }
    // What a step must read at least: the four projections' weights and every cached key and
    // value (the new token's own projections and outputs are negligible).
    constexpr double bytes_read() const {
        const int64_t kv_features = key_value_heads() * (embed_dim / num_heads);
        return 4.0 *
               (2 * embed_dim * (embed_dim + kv_features) + 2 * batch * (cached + 1) * kv_features);
    }
};
// Decode steps against 128, 1024 and 4096 cached tokens (E = 512, H = 8) and 2048 (E = 768,
// H = 12), and grouped-query steps of LLM shapes (d = 128, 4 and 2 key/value heads; one row and
// a batch of 4): the CPU benchmarks time them.
inline constexpr std::array kDecodeSweep = {
    DecodeShape{1, 128, 512, 8},       DecodeShape{1, 1024, 512, 8},
    DecodeShape{1, 4096, 512, 8},      DecodeShape{1, 2048, 768, 12},
    DecodeShape{1, 4096, 2048, 16, 4}, DecodeShape{4, 2048, 1024, 8, 2},
};

// Causal self-attention, timed three ways (implicit causal, an explicit [Sq, Sk] mask, no mask)
// against PyTorch's scaled_dot_product_attention(is_causal=True): the sweep's long sequence, and
// the same with a narrower embedding, where attention rather than the projections dominates.
inline constexpr std::array kCausalSweep = {
    ProblemShape{1, 2048, 2048, 512, 8},
    ProblemShape{1, 2048, 2048, 256, 4},
};
// How a causal benchmark gets its causality.
enum class CausalMode { implicit, explicit_mask, none };
constexpr std::string_view causal_mode_name(CausalMode mode) {
    switch (mode) {
    case CausalMode::implicit:
        return "implicit";
    case CausalMode::explicit_mask:
        return "explicit_mask";
    case CausalMode::none:
        return "none";
    }
    return "unknown";
}
inline constexpr std::array kCausalModes = {CausalMode::implicit, CausalMode::explicit_mask,
                                            CausalMode::none};

// Grouped-query self-attention (kv_heads dividing H) against SDPA's enable_gqa: Llama-style
// groups of 4, and multi-query attention.
struct GqaShape {
    ProblemShape shape;
    int64_t kv_heads;
};
inline constexpr std::array kGqaSweep = {
    GqaShape{{1, 1024, 1024, 1024, 16}, 4},
    GqaShape{{1, 1024, 1024, 1024, 16}, 1},
};

// Self-attention timed in every dtype (kDTypes) against PyTorch's module and F.linear + SDPA in
// that dtype (and, for bf16, its f32 module under autocast): short sequences, where the
// projections are most of the work, and long ones.
inline constexpr std::array kDtypeSweep = {
    ProblemShape{1, 128, 128, 512, 8},   ProblemShape{8, 128, 128, 512, 8},
    ProblemShape{4, 256, 256, 512, 8},   ProblemShape{1, 512, 512, 512, 8},
    ProblemShape{1, 1024, 1024, 512, 8}, ProblemShape{1, 2048, 2048, 512, 8},
};

// Added on GPUs, which have room for them.
inline constexpr std::array kGpuExtraShapes = {
    ProblemShape{8, 1024, 1024, 1024, 16},
    ProblemShape{1, 4096, 4096, 1024, 16},
};

}  // namespace mha::bench
