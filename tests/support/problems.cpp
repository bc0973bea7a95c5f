#include "problems.h"

#include <cmath>
#include <random>

namespace mha::problems {
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

DType chosen_dtype = DType::f32;

template <typename T>
TensorView<const T> typed_view(const std::vector<uint16_t> &bits, const Tensor &like) {
    static_assert(sizeof(T) == sizeof(uint16_t));
    return {reinterpret_cast<const T *>(bits.data()), like.shape};
}

}  // namespace

void set_problem_dtype(DType dtype) { chosen_dtype = dtype; }
DType problem_dtype() { return chosen_dtype; }

ProblemTensors::ProblemTensors(const Problem &p) : p_(p) {
    if (p.dtype != DType::f32) {
        query_ = reference::bits_of(p.query, p.dtype);
        if (!p.self_attention) {
            key_ = reference::bits_of(p.key, p.dtype);
            value_ = reference::bits_of(p.value, p.dtype);
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

Problem random_problem(const Dims &dims, uint64_t seed, bool self_attention, int64_t kdim,
                       int64_t vdim, int64_t kv_heads) {
    std::mt19937_64 rng(seed);
    Problem p;
    p.dims = dims;
    p.self_attention = self_attention;
    p.dtype = chosen_dtype;
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
        p.weight[l] = uniform(reference::out_features(p, l) * p.in_features[l], bound, rng);
        p.bias[l] = uniform(reference::out_features(p, l), bound, rng);
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
        lin[l] = {Tensor{p.weight[l].data(), {reference::out_features(p, l), p.in_features[l]}},
                  Tensor{p.bias[l].data(), {reference::out_features(p, l)}}};
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

}  // namespace mha::problems
