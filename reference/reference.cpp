#include "reference.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <type_traits>

namespace mha::reference {

namespace {

std::vector<float> uniform(size_t n, float bound, std::mt19937_64 &rng) {
    std::uniform_real_distribution<float> dist(-bound, bound);
    std::vector<float> v(n);
    for (float &x : v) {
        x = dist(rng);
    }
    return v;
}

int64_t product(const std::vector<int64_t> &shape) {
    int64_t n = 1;
    for (int64_t s : shape) {
        n *= s;
    }
    return n;
}

DType problem_dtype = DType::f32;

// x as a tensor of `dtype` holds it.
std::vector<float> rounded(const std::vector<float> &x, DType dtype) {
    std::vector<float> r(x.size());
    for (size_t n = 0; n < x.size(); n++) {
        r[n] = dtype == DType::bf16  ? to_float(to_bfloat16(x[n]))
               : dtype == DType::f16 ? to_float(to_float16(x[n]))
                                     : x[n];
    }
    return r;
}

}  // namespace

void set_problem_dtype(DType dtype) { problem_dtype = dtype; }

std::vector<uint16_t> bits_of(const std::vector<float> &x, DType dtype) {
    std::vector<uint16_t> bits(x.size());
    for (size_t n = 0; n < x.size(); n++) {
        bits[n] = dtype == DType::bf16 ? to_bfloat16(x[n]).bits : to_float16(x[n]).bits;
    }
    return bits;
}

namespace {

template <typename T>
TensorView<const T> typed_view(const std::vector<uint16_t> &bits, const Tensor &like) {
    static_assert(sizeof(T) == sizeof(uint16_t));
    return {reinterpret_cast<const T *>(bits.data()), like.shape};
}

}  // namespace

ProblemTensors::ProblemTensors(const Problem &p) : p_(p) {
    if (p.dtype != DType::f32) {
        query_ = bits_of(p.query, p.dtype);
        if (!p.self_attention) {
            key_ = bits_of(p.key, p.dtype);
            value_ = bits_of(p.value, p.dtype);
        }
    }
}

void ProblemTensors::forward(const MultiHeadAttention &module, const MutableTensor &output,
                             const ForwardOptions &options) const {
    const auto call = [&](auto type) {
        using T = decltype(type);
        const std::vector<uint16_t> &key = p_.self_attention ? query_ : key_;
        const std::vector<uint16_t> &value = p_.self_attention ? query_ : value_;
        module.forward(typed_view<T>(query_, query_view(p_)), typed_view<T>(key, key_view(p_)),
                       typed_view<T>(value, value_view(p_)), output, options);
    };
    if (p_.dtype == DType::bf16) {
        call(bfloat16{});
    } else if (p_.dtype == DType::f16) {
        call(float16{});
    } else {
        module.forward(query_view(p_), key_view(p_), value_view(p_), output, options);
    }
}

int64_t out_features(const Problem &p, int l) {
    return l == 1 || l == 2 ? p.kv_heads * p.dims.head_dim() : p.dims.embed_dim;
}

Problem random_problem(const Dims &dims, uint64_t seed, bool self_attention, int64_t kdim,
                       int64_t vdim, int64_t kv_heads) {
    std::mt19937_64 rng(seed);
    Problem p;
    p.dims = dims;
    p.self_attention = self_attention;
    p.dtype = problem_dtype;
    const int64_t E = dims.embed_dim;
    p.in_features = {E, kdim > 0 ? kdim : E, vdim > 0 ? vdim : E, E};
    p.kv_heads = kv_heads > 0 ? kv_heads : dims.num_heads;
    p.query = uniform(dims.batch * dims.query_len * E, 1.0f, rng);
    if (self_attention) {
        p.key = p.query;
        p.value = p.query;
    } else {
        p.key = uniform(dims.batch * dims.key_len * p.in_features[1], 1.0f, rng);
        p.value = uniform(dims.batch * dims.key_len * p.in_features[2], 1.0f, rng);
    }
    for (int l = 0; l < 4; l++) {
        // nn.Linear's default initialization bound, 1/sqrt(in_features).
        const float bound = 1.0f / std::sqrt(static_cast<float>(p.in_features[l]));
        p.weight[l] = uniform(out_features(p, l) * p.in_features[l], bound, rng);
        p.bias[l] = uniform(out_features(p, l), bound, rng);
    }
    return p;
}

void add_random_mask(Problem &p, MaskConvention convention, std::vector<int64_t> shape,
                     uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::bernoulli_distribution blocked(1.0 / 3.0);
    p.mask_convention = convention;
    p.mask_shape = std::move(shape);
    p.mask.resize(product(p.mask_shape));
    for (uint8_t &m : p.mask) {
        const bool block = blocked(rng);
        m = (convention == MaskConvention::keep) ? !block : block;
    }
}

void add_random_additive_mask(Problem &p, std::vector<int64_t> shape, bool only_0_or_minus_1e9,
                              uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::bernoulli_distribution blocked(1.0 / 3.0);
    std::uniform_real_distribution<float> value(-3.0f, 1.0f);
    p.additive_shape = std::move(shape);
    p.additive.resize(product(p.additive_shape));
    const int64_t keys = p.additive_shape.back();
    for (size_t n = 0; n < p.additive.size(); n++) {
        p.additive[n] = !only_0_or_minus_1e9            ? value(rng)
                        : n % keys != 0 && blocked(rng) ? -1e9f
                                                        : 0.0f;
    }
}

TorchMask random_torch_mask(bool is_bool, std::vector<int64_t> shape, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::bernoulli_distribution blocked(1.0 / 3.0);
    std::uniform_real_distribution<float> value(-3.0f, 1.0f);
    TorchMask m{is_bool, std::move(shape), {}, {}};
    const int64_t n = product(m.shape), keys = m.shape.back();
    if (is_bool) {
        m.bools.resize(n);
        for (int64_t e = 0; e < n; e++) {
            m.bools[e] = e % keys != 0 && blocked(rng);
        }
    } else {
        m.floats.resize(n);
        for (float &f : m.floats) {
            f = value(rng);
        }
    }
    return m;
}

std::array<Linear, 4> linears(const Problem &p) {
    std::array<Linear, 4> lin;
    for (int l = 0; l < 4; l++) {
        lin[l] = {Tensor{p.weight[l].data(), {out_features(p, l), p.in_features[l]}},
                  Tensor{p.bias[l].data(), {out_features(p, l)}}};
    }
    return lin;
}

MultiHeadAttention make_module(const Problem &p, Device device) {
    const std::array<Linear, 4> lin = linears(p);
    return MultiHeadAttention(p.dims.embed_dim, p.dims.num_heads, lin[0], lin[1], lin[2], lin[3],
                              device, p.dtype);
}

Outputs run_module(const MultiHeadAttention &module, const Problem &p, bool with_weights) {
    const Dims &d = p.dims;
    Outputs r;
    r.output.assign(d.batch * d.query_len * d.embed_dim, NAN);
    std::optional<MutableTensor> weights;
    if (with_weights && p.average_weights) {
        r.weights.assign(d.batch * d.query_len * d.key_len, NAN);
        weights = MutableTensor{r.weights.data(), {d.batch, d.query_len, d.key_len}};
    } else if (with_weights) {
        r.weights.assign(d.batch * d.num_heads * d.query_len * d.key_len, NAN);
        weights = MutableTensor{r.weights.data(), {d.batch, d.num_heads, d.query_len, d.key_len}};
    }
    ProblemTensors(p).forward(module, {r.output.data(), {d.batch, d.query_len, d.embed_dim}},
                              options_view(p, weights));
    return r;
}

Tensor query_view(const Problem &p) {
    return {p.query.data(), {p.dims.batch, p.dims.query_len, p.dims.embed_dim}};
}
Tensor key_view(const Problem &p) {
    return {(p.self_attention ? p.query : p.key).data(),
            {p.dims.batch, p.dims.key_len, p.in_features[1]}};
}
Tensor value_view(const Problem &p) {
    return {(p.self_attention ? p.query : p.value).data(),
            {p.dims.batch, p.dims.key_len, p.in_features[2]}};
}
std::optional<Mask> mask_view(const Problem &p) {
    if (!p.mask_convention) {
        return std::nullopt;
    }
    return Mask{{p.mask.data(), p.mask_shape}, *p.mask_convention};
}
ForwardOptions options_view(const Problem &p, const std::optional<MutableTensor> &weights) {
    ForwardOptions o;
    o.mask = mask_view(p);
    if (!p.additive_shape.empty()) {
        o.additive_mask = Tensor{p.additive.data(), p.additive_shape};
    }
    const auto torch_view = [](const TorchMask &m) -> MaskTensor {
        if (m.is_bool) {
            return BoolTensor{m.bools.data(), m.shape};
        }
        return Tensor{m.floats.data(), m.shape};
    };
    if (p.key_padding_mask) {
        o.key_padding_mask = torch_view(*p.key_padding_mask);
    }
    if (p.attn_mask) {
        o.attn_mask = torch_view(*p.attn_mask);
    }
    o.causal = p.causal;
    o.weights = weights;
    o.average_weights = p.average_weights;
    return o;
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
    const auto q = linear(to_double(p.query), B * Sq, E, p.weight[0], p.bias[0]);
    const auto k = linear(to_double(p.key), B * Sk, p.in_features[1], p.weight[1], p.bias[1]);
    const auto v = linear(to_double(p.value), B * Sk, p.in_features[2], p.weight[2], p.bias[2]);
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
                                   int64_t count, const std::vector<bool> &hidden) {
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
