// Rotary position embeddings inside the library: RotaryOptions checked once into RotaryParams
// (as rotary_embedding() checks them), then tokens rotated in place, with no allocation, by
// rotary_embedding() and by the decode steps of a module whose cache carries a rotation.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "mha/mha.h"

namespace mha::detail {

struct RotaryParams {
    bool rotate_half = true;
    int64_t rotary_dim = 0, pairs = 0;
    float theta = 10000;
    // Caller-given tables [table_rows, pairs] (null: the angles from theta).
    const float *cos = nullptr, *sin = nullptr;
    std::array<int64_t, 2> cos_strides{}, sin_strides{};
    int64_t table_rows = 0;
};

// Checks `options` for heads of `head_dim` features; raises mha::Error naming the option.
RotaryParams check_rotary(const RotaryOptions &options, int64_t head_dim);

// Whether rotate_token can take `position`: any without tables, one of their rows with them.
bool rotary_position_valid(const RotaryParams &r, int64_t position);

// The heads of one token: heads x features at data[h · head_stride + f · feature_stride].
template <typename T>
struct TokenHeads {
    T *data;
    int64_t heads, head_stride, feature_stride;
};

// Rotates the heads of one token (its query's and key's, or either) by the angles of
// `position` (checked), computed once for all.
template <typename T>
void rotate_token(const RotaryParams &r, int64_t position,
                  std::initializer_list<TokenHeads<T>> tokens);

// A rotation that owns its tables: a cache's, which outlives the caller's options.
struct OwnedRotary {
    OwnedRotary(const RotaryOptions &options, int64_t head_dim);
    OwnedRotary(const OwnedRotary &) = delete;
    OwnedRotary &operator=(const OwnedRotary &) = delete;

    std::vector<float> cos, sin;  // [table_rows, pairs], dense
    RotaryParams params;          // its tables point into cos and sin
};

}  // namespace mha::detail
