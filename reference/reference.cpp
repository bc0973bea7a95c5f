#include "reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace mha::reference {

namespace {

// The reference's own conversions, independent of the library's: a 16-bit value's bits from an
// f32 rounded to the nearest even (NaN kept, quiet; f16 overflows to Inf), and back, exactly.
uint32_t f32_bits(float x) {
    uint32_t b;
    std::memcpy(&b, &x, sizeof b);
    return b;
}

float f32_from_bits(uint32_t b) {
    float x;
    std::memcpy(&x, &b, sizeof x);
    return x;
}

uint16_t bf16_bits(float x) {
    const uint32_t b = f32_bits(x);
    if (std::isnan(x)) {
        return uint16_t((b >> 16) | 0x40);
    }
    return uint16_t((b + 0x7fff + ((b >> 16) & 1)) >> 16);
}

uint16_t f16_bits(float x) {
    const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
    const double a = std::fabs(double(x));
    if (std::isnan(x)) {
        return sign | 0x7e00;
    }
    if (a >= 65520.0) {  // halfway above the largest, 65504, and past: Inf
        return sign | 0x7c00;
    }
    if (a <
        std::ldexp(1.0, -14)) {  // subnormal, in units of 2^-24 (1024 of them: the least normal)
        return sign | uint16_t(std::nearbyint(std::ldexp(a, 24)));
    }
    int e = 0;
    const double fraction = std::frexp(a, &e);  // a = fraction · 2^e, fraction in [0.5, 1)
    double mantissa = std::nearbyint((2 * fraction - 1) * 1024);
    int exponent = e - 1;
    if (mantissa == 1024) {
        mantissa = 0;
        exponent++;
    }
    return sign | uint16_t((exponent + 15) << 10) | uint16_t(mantissa);
}

double f16_value(uint16_t h) {
    const double sign = (h & 0x8000) ? -1.0 : 1.0;
    const int exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
    if (exponent == 0x1f) {
        return mantissa != 0 ? std::nan("") : sign * std::numeric_limits<double>::infinity();
    }
    if (exponent == 0) {
        return sign * std::ldexp(double(mantissa), -24);
    }
    return sign * std::ldexp(1.0 + mantissa / 1024.0, exponent - 15);
}

}  // namespace

std::vector<float> values_of(const std::vector<uint16_t> &bits, DType dtype) {
    std::vector<float> x(bits.size());
    for (size_t n = 0; n < bits.size(); n++) {
        x[n] = dtype == DType::bf16 ? f32_from_bits(uint32_t(bits[n]) << 16)
                                    : float(f16_value(bits[n]));
    }
    return x;
}

std::vector<float> rounded(const std::vector<float> &x, DType dtype) {
    return dtype == DType::f32 ? x : values_of(bits_of(x, dtype), dtype);
}

std::vector<uint16_t> bits_of(const std::vector<float> &x, DType dtype) {
    std::vector<uint16_t> bits(x.size());
    for (size_t n = 0; n < x.size(); n++) {
        bits[n] = dtype == DType::bf16 ? bf16_bits(x[n]) : f16_bits(x[n]);
    }
    return bits;
}

namespace {

// Each run of `group` values of x quantized to int8 with its own scale (the run's largest |x|
// mapping to 127, rounded to the nearest, ties to even) and scaled back.
std::vector<double> quantized_int8(const std::vector<float> &x, int64_t group) {
    std::vector<double> out(x.size());
    for (size_t start = 0; start < x.size(); start += size_t(group)) {
        float largest = 0;
        for (int64_t i = 0; i < group; i++) {
            largest = std::max(largest, std::abs(x[start + i]));
        }
        const double scale = double(largest / 127);
        for (int64_t i = 0; i < group; i++) {
            const double q = largest > 0 ? std::nearbyint(double(x[start + i]) * 127 / largest) : 0;
            out[start + i] = q * scale;
        }
    }
    return out;
}

}  // namespace

int64_t out_features(const Problem &p, int l) {
    return l == 1 || l == 2 ? p.kv_heads * p.dims.head_dim() : p.dims.embed_dim;
}

std::vector<double> linear(const std::vector<double> &x, int64_t rows, int64_t in,
                           const std::vector<float> &w, const std::vector<float> &b) {
    const int64_t out = int64_t(b.size());
    std::vector<double> y(rows * out);
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t o = 0; o < out; o++) {
            double acc = b[o];
            for (int64_t i = 0; i < in; i++) {
                acc += x[r * in + i] * static_cast<double>(w[o * in + i]);
            }
            y[r * out + o] = acc;
        }
    }
    return y;
}

namespace {

// Calls f(tokens, heads) with the index of every element in the token layout [B, S, H·d] and in
// the head layout [B, H, S, d].
template <typename F>
void for_each_head_element(int64_t B, int64_t S, int64_t H, int64_t d, F f) {
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t s = 0; s < S; s++)
                for (int64_t c = 0; c < d; c++)
                    f((b * S + s) * H * d + h * d + c, ((b * H + h) * S + s) * d + c);
}

}  // namespace

std::vector<double> rotated(const std::vector<double> &x, int64_t positions, int64_t heads,
                            int64_t d, const Rotary &r) {
    const int64_t rotary_dim = r.rotary_dim == 0 ? d : r.rotary_dim, pairs = rotary_dim / 2;
    const int64_t rows = int64_t(x.size()) / (heads * d);
    std::vector<double> out = x;
    for (int64_t t = 0; t < rows; t++) {
        const int64_t position = t % positions;
        for (int64_t i = 0; i < pairs; i++) {
            const double angle =
                double(position) * std::pow(r.theta, -double(2 * i) / double(rotary_dim));
            const double c = r.cos.empty() ? std::cos(angle) : r.cos[position * pairs + i];
            const double s = r.sin.empty() ? std::sin(angle) : r.sin[position * pairs + i];
            for (int64_t h = 0; h < heads; h++) {
                const int64_t a = (t * heads + h) * d + (r.interleaved ? 2 * i : i);
                const int64_t b = a + (r.interleaved ? 1 : pairs);
                out[a] = x[a] * c - x[b] * s;
                out[b] = x[b] * c + x[a] * s;
            }
        }
    }
    return out;
}

std::vector<double> split_heads(const std::vector<double> &x, int64_t B, int64_t S, int64_t H,
                                int64_t d) {
    std::vector<double> y(x.size());
    for_each_head_element(B, S, H, d, [&](int64_t tokens, int64_t heads) { y[heads] = x[tokens]; });
    return y;
}

std::vector<double> merge_heads(const std::vector<double> &x, int64_t B, int64_t S, int64_t H,
                                int64_t d) {
    std::vector<double> y(x.size());
    for_each_head_element(B, S, H, d, [&](int64_t tokens, int64_t heads) { y[tokens] = x[heads]; });
    return y;
}

std::vector<double> scaled_scores(const std::vector<double> &q, const std::vector<double> &k,
                                  int64_t BH, int64_t Sq, int64_t Sk, int64_t d) {
    std::vector<double> scores(BH * Sq * Sk);
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    for (int64_t n = 0; n < BH; n++)
        for (int64_t i = 0; i < Sq; i++)
            for (int64_t j = 0; j < Sk; j++) {
                double dot = 0;
                for (int64_t c = 0; c < d; c++) {
                    dot += q[(n * Sq + i) * d + c] * k[(n * Sk + j) * d + c];
                }
                scores[(n * Sq + i) * Sk + j] = dot * scale;
            }
    return scores;
}

namespace {

// Element (b, h, i, j) of a tensor whose shape broadcasts to [B, H, Sq, Sk], right-aligned: a
// size-1 dimension reads index 0.
int64_t broadcast_index(const std::vector<int64_t> &shape, int64_t b, int64_t h, int64_t i,
                        int64_t j) {
    const int64_t index4[4] = {b, h, i, j};
    const size_t offset = 4 - shape.size();
    int64_t flat = 0;
    for (size_t d = 0; d < shape.size(); d++) {
        flat = flat * shape[d] + (shape[d] == 1 ? 0 : index4[offset + d]);
    }
    return flat;
}

// The softmax of each row of scores [B, H, Sq, Sk] over the first visible(i) keys, after `mask`
// (b, h, i, j); keys past those weigh 0.
template <typename MaskAt, typename Visible>
std::vector<double> softmax_rows(const std::vector<double> &scores, const Dims &dims, MaskAt mask,
                                 Visible visible) {
    const int64_t Sq = dims.query_len, Sk = dims.key_len;
    std::vector<double> weights(scores.size(), 0.0);
    std::vector<double> row(Sk);
    for (int64_t b = 0; b < dims.batch; b++)
        for (int64_t h = 0; h < dims.num_heads; h++)
            for (int64_t i = 0; i < Sq; i++) {
                const int64_t base = ((b * dims.num_heads + h) * Sq + i) * Sk;
                const int64_t keys = visible(i);
                if (keys == 0) {
                    continue;
                }
                for (int64_t j = 0; j < keys; j++) {
                    const ScoreMask m = mask(b, h, i, j);
                    row[j] = m.blocked ? -1e9 : scores[base + j] + m.added;
                }
                const double max = *std::max_element(row.begin(), row.begin() + keys);
                double sum = 0;
                for (int64_t j = 0; j < keys; j++) {
                    row[j] = std::exp(row[j] - max);
                    sum += row[j];
                }
                for (int64_t j = 0; j < keys; j++) {
                    weights[base + j] = row[j] / sum;
                }
            }
    return weights;
}

}  // namespace

bool is_blocked(MaskConvention convention, const std::vector<int64_t> &mask_shape,
                const std::vector<uint8_t> &mask, int64_t b, int64_t h, int64_t i, int64_t j) {
    const bool nonzero = mask[broadcast_index(mask_shape, b, h, i, j)] != 0;
    return convention == MaskConvention::keep ? !nonzero : nonzero;
}

ScoreMask score_mask(const Problem &p, int64_t b, int64_t h, int64_t i, int64_t j) {
    ScoreMask m;
    if (p.mask_convention) {
        m.blocked = is_blocked(*p.mask_convention, p.mask_shape, p.mask, b, h, i, j);
    }
    if (!p.additive_shape.empty()) {
        m.added += p.additive[broadcast_index(p.additive_shape, b, h, i, j)];
    }
    // PyTorch's masks: a boolean True blocks; combined with a float mask it is -inf, added.
    const Dims &d = p.dims;
    const bool any_float = (p.key_padding_mask && !p.key_padding_mask->is_bool) ||
                           (p.attn_mask && !p.attn_mask->is_bool);
    const auto apply = [&](const TorchMask &t, int64_t flat) {
        if (!t.is_bool) {
            m.added += t.floats[flat];
        } else if (t.bools[flat] != 0) {
            if (any_float) {
                m.added += -std::numeric_limits<double>::infinity();
            } else {
                m.blocked = true;
            }
        }
    };
    if (p.key_padding_mask) {
        apply(*p.key_padding_mask, b * d.key_len + j);
    }
    if (p.attn_mask) {
        const bool per_head = p.attn_mask->shape.size() == 3;
        apply(*p.attn_mask,
              ((per_head ? b * d.num_heads + h : 0) * d.query_len + i) * d.key_len + j);
    }
    return m;
}

int64_t visible_keys(const Problem &p, int64_t i) {
    const int64_t Sk = p.dims.key_len;
    switch (p.causal) {
    case Causal::none:
        return Sk;
    case Causal::top_left:
        return std::min(i + 1, Sk);
    case Causal::bottom_right:
        return std::clamp<int64_t>(i + 1 + Sk - p.dims.query_len, 0, Sk);
    }
    return Sk;
}

std::vector<double> masked_softmax(const std::vector<double> &scores, const Problem &p) {
    return softmax_rows(
        scores, p.dims,
        [&](int64_t b, int64_t h, int64_t i, int64_t j) { return score_mask(p, b, h, i, j); },
        [&](int64_t i) { return visible_keys(p, i); });
}

std::vector<double> masked_softmax(const std::vector<double> &scores, const Dims &dims,
                                   const std::optional<MaskConvention> &convention,
                                   const std::vector<int64_t> &mask_shape,
                                   const std::vector<uint8_t> &mask) {
    return softmax_rows(
        scores, dims,
        [&](int64_t b, int64_t h, int64_t i, int64_t j) {
            return ScoreMask{convention && is_blocked(*convention, mask_shape, mask, b, h, i, j),
                             0};
        },
        [&](int64_t) { return dims.key_len; });
}

std::vector<double> attend_values(const std::vector<double> &weights, const std::vector<double> &v,
                                  int64_t BH, int64_t Sq, int64_t Sk, int64_t d) {
    std::vector<double> out(BH * Sq * d, 0.0);
    for (int64_t n = 0; n < BH; n++)
        for (int64_t i = 0; i < Sq; i++)
            for (int64_t j = 0; j < Sk; j++)
                for (int64_t c = 0; c < d; c++)
                    out[(n * Sq + i) * d + c] +=
                        weights[(n * Sq + i) * Sk + j] * v[(n * Sk + j) * d + c];
    return out;
}

Result forward(const Problem &given) {
    // The inputs, weights and biases as tensors of the problem's dtype hold them.
    Problem p = given;
    for (std::vector<float> *x : {&p.query, &p.key, &p.value}) {
        *x = rounded(*x, p.dtype);
    }
    for (int l = 0; l < 4; l++) {
        p.weight[l] = rounded(p.weight[l], p.dtype);
        p.bias[l] = rounded(p.bias[l], p.dtype);
    }
    const Dims &m = p.dims;
    const int64_t B = m.batch, Sq = m.query_len, Sk = m.key_len, E = m.embed_dim;
    const int64_t H = m.num_heads, d = m.head_dim();
    const auto maybe_rotated = [&](std::vector<double> x, int64_t positions, int64_t heads) {
        return p.rotary ? rotated(x, positions, heads, d, *p.rotary) : x;
    };
    const auto q =
        maybe_rotated(linear(to_double(p.query), B * Sq, E, p.weight[0], p.bias[0]), Sq, H);
    // The projected keys and values as the cache holds them: rounded to f32, then to kv_dtype.
    const auto as_cached = [&](const std::vector<double> &x) {
        const std::vector<float> f32(x.begin(), x.end());
        switch (p.kv_dtype) {
        case CacheDType::f32:
            return x;
        case CacheDType::int8:
            return quantized_int8(f32, d);
        case CacheDType::bf16:
            return to_double(rounded(f32, DType::bf16));
        case CacheDType::f16:
            return to_double(rounded(f32, DType::f16));
        }
        return x;
    };
    const auto k = as_cached(
        maybe_rotated(linear(to_double(p.key), B * Sk, p.in_features[1], p.weight[1], p.bias[1]),
                      Sk, p.kv_heads));
    const auto v =
        as_cached(linear(to_double(p.value), B * Sk, p.in_features[2], p.weight[2], p.bias[2]));
    // Each query head's key/value head: h / (H / kv_heads), repeated for the group.
    const auto per_query_head = [&](const std::vector<double> &x) {
        const int64_t Hkv = p.kv_heads, group = H / Hkv;
        const std::vector<double> heads = split_heads(x, B, Sk, Hkv, d);
        std::vector<double> repeated(B * H * Sk * d);
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++)
                std::copy_n(heads.begin() + ((b * Hkv + h / group) * Sk) * d, Sk * d,
                            repeated.begin() + ((b * H + h) * Sk) * d);
        return repeated;
    };
    const auto scores =
        scaled_scores(split_heads(q, B, Sq, H, d), per_query_head(k), B * H, Sq, Sk, d);
    Result r;
    r.weights = masked_softmax(scores, p);
    const auto context = attend_values(r.weights, per_query_head(v), B * H, Sq, Sk, d);
    r.output = linear(merge_heads(context, B, Sq, H, d), B * Sq, E, p.weight[3], p.bias[3]);
    if (p.average_weights) {
        std::vector<double> mean(B * Sq * Sk, 0.0);
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t ij = 0; ij < Sq * Sk; ij++)
                    mean[b * Sq * Sk + ij] += r.weights[(b * H + h) * Sq * Sk + ij] / double(H);
        r.weights = std::move(mean);
    }
    return r;
}

std::vector<double> decode_outputs(const Problem &module, const std::vector<float> &sequence,
                                   int64_t count, const std::vector<bool> &hidden,
                                   CacheDType cache_dtype) {
    const int64_t E = module.dims.embed_dim, T = int64_t(sequence.size()) / E;
    Problem p = module;
    p.dims = {1, T, T, E, module.dims.num_heads};
    p.self_attention = true;
    p.query = p.key = p.value = sequence;
    p.mask_convention.reset();
    p.additive_shape.clear();
    p.key_padding_mask.reset();
    p.attn_mask.reset();
    p.average_weights = false;
    p.causal = Causal::top_left;
    p.kv_dtype = cache_dtype;
    if (!hidden.empty()) {
        p.mask_convention = MaskConvention::keep;
        p.mask_shape = {1, 1, 1, T};
        p.mask.resize(T);
        for (int64_t j = 0; j < T; j++) {
            p.mask[j] = !hidden[j];
        }
    }
    const std::vector<double> all = forward(p).output;
    return std::vector<double>(all.end() - count * E, all.end());
}

std::vector<double> to_double(const std::vector<float> &x) {
    return std::vector<double>(x.begin(), x.end());
}

double output_tolerance(const Problem &p) { return p.dtype == DType::bf16 ? 1e-2 : 1e-5; }

double weights_tolerance(const Problem &p) { return output_tolerance(p); }

double relative_l2(const std::vector<float> &got, const std::vector<double> &want) {
    double diff = 0, norm = 0;
    for (size_t n = 0; n < want.size(); n++) {
        diff += (got[n] - want[n]) * (got[n] - want[n]);
        norm += want[n] * want[n];
    }
    return norm == 0 ? std::sqrt(diff) : std::sqrt(diff / norm);
}

double max_relative_error(const std::vector<float> &got, const std::vector<double> &want) {
    double diff = 0, scale = 0;
    for (size_t n = 0; n < want.size(); n++) {
        diff = std::max(diff, std::abs(got[n] - want[n]));
        scale = std::max(scale, std::abs(want[n]));
    }
    return scale == 0 ? diff : diff / scale;
}

}  // namespace mha::reference
