// mha::rotary_embedding: rotary position embeddings applied in place, a plain loop over the
// caller's memory (T · rotary_dim / 2 angles, each used by every head of the token).
#include <fmt/format.h>

#include <array>
#include <cmath>

#include "checks.h"
#include "dtype.h"
#include "mha/mha.h"

namespace mha {
namespace {

// Rotates the pairs of one token's heads by angle (cos c, sin s): feature `first` with `second`.
template <typename T>
void rotate_pair(T *token, int64_t heads, int64_t head_stride, int64_t first, int64_t second,
                 float c, float s) {
    for (int64_t h = 0; h < heads; h++) {
        T &a = token[h * head_stride + first];
        T &b = token[h * head_stride + second];
        float x, y;
        detail::convert(&a, &x, 1);
        detail::convert(&b, &y, 1);
        const float rotated_x = x * c - y * s, rotated_y = y * c + x * s;
        detail::convert(&rotated_x, &a, 1);
        detail::convert(&rotated_y, &b, 1);
    }
}

}  // namespace

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
    const int64_t rotary_dim = options.rotary_dim == 0 ? d : options.rotary_dim;
    if (rotary_dim < 0 || rotary_dim > d || rotary_dim % 2 != 0) {
        throw Error(fmt::format("rotary_dim {} must be even and within the {} features (0: all)",
                                options.rotary_dim, d));
    }
    const int64_t pairs = rotary_dim / 2;
    if (options.cos.has_value() != options.sin.has_value()) {
        throw Error("cos and sin: give both tables or neither (theta then gives the angles)");
    }
    const bool tables = options.cos.has_value();
    int64_t table_rows = 0;
    std::array<int64_t, 2> cos_strides{pairs, 1}, sin_strides{pairs, 1};
    if (tables) {
        for (const auto &[name, table, strides] : {std::tuple{"cos", &*options.cos, &cos_strides},
                                                   {"sin", &*options.sin, &sin_strides}}) {
            if (table->data == nullptr || table->shape.size() != 2 || table->shape[1] != pairs ||
                table->shape[0] != options.cos->shape[0] ||
                (!table->strides.empty() && table->strides.size() != 2)) {
                throw Error(
                    fmt::format("{} has shape {} but must be [max_position, rotary_dim / "
                                "2 = {}], as the other table",
                                name, detail::shape_string(table->shape), pairs));
            }
            if (!table->strides.empty()) {
                *strides = {table->strides[0], table->strides[1]};
            }
        }
        table_rows = options.cos->shape[0];
    } else if (!(options.theta > 0 && std::isfinite(options.theta))) {
        throw Error(fmt::format("theta {} must be finite and > 0", options.theta));
    }
    for (int64_t t = 0; t < tokens && tables; t++) {  // every row a table lookup reads
        const int64_t p = positions.data[t * position_stride];
        if (p < 0 || p >= table_rows) {
            throw Error(fmt::format("positions[{}] is {}: the tables have positions 0 to {}", t, p,
                                    table_rows - 1));
        }
    }
    const bool half = options.style == RotaryStyle::rotate_half;
    for (int64_t t = 0; t < tokens; t++) {
        const int64_t p = positions.data[t * position_stride];
        for (int64_t i = 0; i < pairs; i++) {
            float c, s;
            if (tables) {
                c = options.cos->data[p * cos_strides[0] + i * cos_strides[1]];
                s = options.sin->data[p * sin_strides[0] + i * sin_strides[1]];
            } else {
                // In f32, as transformers' rotary embeddings compute them.
                const float inverse_frequency =
                    1.0f / std::pow(options.theta, float(2 * i) / float(rotary_dim));
                const float angle = float(p) * inverse_frequency;
                c = std::cos(angle);
                s = std::sin(angle);
            }
            const int64_t first = half ? i : 2 * i, second = half ? i + pairs : 2 * i + 1;
            rotate_pair(query.data + t * qs[0], query.shape[1], qs[1], first * qs[2],
                        second * qs[2], c, s);
            rotate_pair(key.data + t * ks[0], key.shape[1], ks[1], first * ks[2], second * ks[2], c,
                        s);
        }
    }
}

template void rotary_embedding(const StridedView<float> &, const StridedView<float> &,
                               const StridedView<const int64_t> &, const RotaryOptions &);
template void rotary_embedding(const StridedView<bfloat16> &, const StridedView<bfloat16> &,
                               const StridedView<const int64_t> &, const RotaryOptions &);
template void rotary_embedding(const StridedView<float16> &, const StridedView<float16> &,
                               const StridedView<const int64_t> &, const RotaryOptions &);

}  // namespace mha
