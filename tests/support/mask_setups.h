// The masks tests put on a problem, of both families (mha::ForwardOptions): the seeds' byte
// masks and additive masks, and PyTorch's key_padding_mask and attn_mask, boolean or float,
// alone and together. The reference applies each by its documented semantics.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "problems.h"

namespace mha::testing {

enum class TorchKind { none, boolean, floating };

struct MaskSetup {
    const char *name;
    std::optional<MaskConvention> seed_mask;  // [B, 1, Sq, Sk]
    bool additive = false;                    // [B, 1, 1, Sk]: 0 or -1e9, the TF article's
    TorchKind key_padding = TorchKind::none;  // [B, Sk]
    TorchKind attn = TorchKind::none;         // [Sq, Sk], or [B·H, Sq, Sk] when per head
    bool attn_per_head = false;
};

inline void apply_masks(const MaskSetup &m, reference::Problem &p, uint64_t seed) {
    const reference::Dims &d = p.dims;
    if (m.seed_mask) {
        problems::add_random_mask(p, *m.seed_mask, {d.batch, 1, d.query_len, d.key_len}, seed);
    }
    if (m.additive) {
        problems::add_random_additive_mask(p, {d.batch, 1, 1, d.key_len}, true, seed + 1);
    }
    if (m.key_padding != TorchKind::none) {
        p.key_padding_mask = problems::random_torch_mask(m.key_padding == TorchKind::boolean,
                                                         {d.batch, d.key_len}, seed + 2);
    }
    if (m.attn != TorchKind::none) {
        std::vector<int64_t> shape = {d.query_len, d.key_len};
        if (m.attn_per_head) {
            shape.insert(shape.begin(), d.batch * d.num_heads);
        }
        p.attn_mask = problems::random_torch_mask(m.attn == TorchKind::boolean, shape, seed + 3);
    }
}

// Every family and combination the API takes; PyTorch's masks as its
// torch.nn.MultiheadAttention documents them (bool True = not attended, float added, both
// masks merged).
inline constexpr TorchKind kBool = TorchKind::boolean, kFloat = TorchKind::floating;
inline const MaskSetup kMaskSetups[] = {
    {"none", std::nullopt},
    {"seed_keep", MaskConvention::keep},
    {"seed_block", MaskConvention::block},
    {"seed_additive", std::nullopt, true},
    {"key_padding_bool", std::nullopt, false, kBool},
    {"key_padding_float", std::nullopt, false, kFloat},
    {"attn_bool", std::nullopt, false, TorchKind::none, kBool},
    {"attn_float", std::nullopt, false, TorchKind::none, kFloat},
    {"attn_per_head_bool", std::nullopt, false, TorchKind::none, kBool, true},
    {"attn_per_head_float", std::nullopt, false, TorchKind::none, kFloat, true},
    {"both_bool", std::nullopt, false, kBool, kBool},
    {"key_padding_bool_attn_float", std::nullopt, false, kBool, kFloat},
    {"key_padding_float_attn_per_head_bool", std::nullopt, false, kFloat, kBool, true},
    {"both_float_per_head", std::nullopt, false, kFloat, kFloat, true},
};

// The setup of kMaskSetups named `name`.
inline const MaskSetup &mask_setup(std::string_view name) {
    for (const MaskSetup &m : kMaskSetups) {
        if (name == m.name) {
            return m;
        }
    }
    throw std::invalid_argument("no mask setup named " + std::string(name));
}

}  // namespace mha::testing
