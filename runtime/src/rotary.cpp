// mha::rotary_embedding: rotary position embeddings applied in place, a plain loop over the
// caller's memory (T · rotary_dim / 2 angles, each used by every head of the token).
#include <fmt/format.h>

#include <array>
#include <cmath>
#include <tuple>

#include "checks.h"
#include "dtype.h"
#include "mha/mha.h"
#include "rotary.h"

namespace mha {
namespace detail {
namespace {

// Rotates the pairs of one token's heads by angle (cos c, sin s): feature `first` with `second`.
template <typename T>
void rotate_pair(const TokenHeads<T> &token, int64_t first, int64_t second, float c, float s) {
    for (int64_t h = 0; h < token.heads; h++) {
        T &a = token.data[h * token.head_stride + first * token.feature_stride];
        T &b = token.data[h * token.head_stride + second * token.feature_stride];
        float x, y;
        convert(&a, &x, 1);
        convert(&b, &y, 1);
        const float rotated_x = x * c - y * s, rotated_y = y * c + x * s;
        convert(&rotated_x, &a, 1);
        convert(&rotated_y, &b, 1);
    }
}

}  // namespace

RotaryParams check_rotary(const RotaryOptions &options, int64_t head_dim) {
    RotaryParams r;
    r.rotate_half = options.style == RotaryStyle::rotate_half;
    r.rotary_dim = options.rotary_dim == 0 ? head_dim : options.rotary_dim;
    if (r.rotary_dim < 0 || r.rotary_dim > head_dim || r.rotary_dim % 2 != 0) {
        throw Error(fmt::format("rotary_dim {} must be even and within the {} features (0: all)",
                                options.rotary_dim, head_dim));
    }
    r.pairs = r.rotary_dim / 2;
    r.theta = options.theta;
    if (options.cos.has_value() != options.sin.has_value()) {
        throw Error("cos and sin: give both tables or neither (theta then gives the angles)");
    }
    if (!options.cos.has_value()) {
        if (!(options.theta > 0 && std::isfinite(options.theta))) {
            throw Error(fmt::format("theta {} must be finite and > 0", options.theta));
        }
        return r;
    }
    for (const auto &[name, table, data, strides] :
         {std::tuple{"cos", &*options.cos, &r.cos, &r.cos_strides},
          {"sin", &*options.sin, &r.sin, &r.sin_strides}}) {
        if (table->data == nullptr || table->shape.size() != 2 || table->shape[1] != r.pairs ||
            table->shape[0] != options.cos->shape[0] ||
            (!table->strides.empty() && table->strides.size() != 2)) {
            throw Error(
                fmt::format("{} has shape {} but must be [max_position, rotary_dim / "
                            "2 = {}], as the other table",
                            name, shape_string(table->shape), r.pairs));
        }
        *data = table->data;
        *strides = table->strides.empty()
                       ? std::array<int64_t, 2>{r.pairs, 1}
                       : std::array<int64_t, 2>{table->strides[0], table->strides[1]};
    }
    r.table_rows = options.cos->shape[0];
    return r;
}

bool rotary_position_valid(const RotaryParams &r, int64_t position) {
    return r.cos == nullptr || (position >= 0 && position < r.table_rows);
}

template <typename T>
void rotate_token(const RotaryParams &r, int64_t position,
                  std::initializer_list<TokenHeads<T>> tokens) {
    for (int64_t i = 0; i < r.pairs; i++) {
        float c, s;
        if (r.cos != nullptr) {
            c = r.cos[position * r.cos_strides[0] + i * r.cos_strides[1]];
            s = r.sin[position * r.sin_strides[0] + i * r.sin_strides[1]];
        } else {
            // In f32, as transformers' rotary embeddings compute them.
            const float inverse_frequency =
                1.0f / std::pow(r.theta, float(2 * i) / float(r.rotary_dim));
            const float angle = float(position) * inverse_frequency;
            c = std::cos(angle);
            s = std::sin(angle);
        }
        const int64_t first = r.rotate_half ? i : 2 * i;
        const int64_t second = r.rotate_half ? i + r.pairs : 2 * i + 1;
        for (const TokenHeads<T> &token : tokens) {
            rotate_pair(token, first, second, c, s);
        }
    }
}

OwnedRotary::OwnedRotary(const RotaryOptions &options, int64_t head_dim)
    : params(check_rotary(options, head_dim)) {
    if (params.cos == nullptr) {
        return;
    }
    const int64_t rows = params.table_rows, pairs = params.pairs;
    cos.resize(size_t(rows * pairs));
    sin.resize(size_t(rows * pairs));
    for (int64_t p = 0; p < rows; p++) {
        for (int64_t i = 0; i < pairs; i++) {
            cos[size_t(p * pairs + i)] =
                params.cos[p * params.cos_strides[0] + i * params.cos_strides[1]];
            sin[size_t(p * pairs + i)] =
                params.sin[p * params.sin_strides[0] + i * params.sin_strides[1]];
        }
    }
    params.cos = cos.data();
    params.sin = sin.data();
    params.cos_strides = params.sin_strides = {pairs, 1};
}

}  // namespace detail

template <typename T>
void rotary_embedding(const StridedView<T> &query, const StridedView<T> &key,
                      const StridedView<const int64_t> &positions, const RotaryOptions &options) {
    detail::check_rank("query", query, 3, "[tokens, heads, features]");
    detail::check_rank("key", key, 3, "[tokens, heads, features]");
    detail::check_rank("positions", positions, 1, "[tokens]");
    const std::array<int64_t, 4> qs = detail::strides_of(query), ks = detail::strides_of(key);
    const int64_t tokens = query.shape[0], d = query.shape[2];
    const int64_t position_stride = detail::strides_of(positions)[0];
    if (key.shape[0] != tokens || positions.shape[0] != tokens) {
        throw Error(
            fmt::format("query, key and positions have {}, {} and {} tokens: they must "
                        "agree",
                        tokens, key.shape[0], positions.shape[0]));
    }
    if (key.shape[2] != d) {
        throw Error(fmt::format("key has {} features but query has {}", key.shape[2], d));
    }
    const detail::RotaryParams r = detail::check_rotary(options, d);
    for (int64_t t = 0; t < tokens; t++) {  // every position, before anything is written
        const int64_t p = positions.data[t * position_stride];
        if (!detail::rotary_position_valid(r, p)) {
            throw Error(fmt::format("positions[{}] is {}: the tables have positions 0 to {}", t, p,
                                    r.table_rows - 1));
        }
    }
    for (int64_t t = 0; t < tokens; t++) {
        detail::rotate_token(
            r, positions.data[t * position_stride],
            {detail::TokenHeads<T>{query.data + t * qs[0], query.shape[1], qs[1], qs[2]},
             detail::TokenHeads<T>{key.data + t * ks[0], key.shape[1], ks[1], ks[2]}});
    }
}

#define MHA_ROTARY(T)                                                                          \
    template void rotary_embedding(const StridedView<T> &, const StridedView<T> &,             \
                                   const StridedView<const int64_t> &, const RotaryOptions &); \
    template void detail::rotate_token(const detail::RotaryParams &, int64_t,                  \
                                       std::initializer_list<detail::TokenHeads<T>>);
MHA_ROTARY(float)
MHA_ROTARY(bfloat16)
MHA_ROTARY(float16)
#undef MHA_ROTARY

}  // namespace mha
