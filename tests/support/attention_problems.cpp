#include "attention_problems.h"

#include <cmath>
#include <random>

#include "reference.h"

namespace mha::problems {
namespace {

std::vector<float> uniform(int64_t n, std::mt19937_64 &rng) {
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<float> v(static_cast<size_t>(n));
    for (float &x : v) {
        x = dist(rng);
    }
    return v;
}

// The strides of [B, H, S, d] over memory in `layout`.
std::vector<int64_t> strides_of(Layout layout, int64_t H, int64_t S, int64_t d) {
    switch (layout) {
    case Layout::heads_outer:
        return {H * S * d, S * d, d, 1};
    case Layout::heads_inner:
        return {S * H * d, d, H * d, 1};
    case Layout::features_strided:
        break;
    }
    return {2 * H * S * d, 2 * S * d, 2 * d, 2};
}

// Elements of memory that `layout` spreads `dense` elements over.
size_t spread(Layout layout, size_t dense) {
    return layout == Layout::features_strided ? 2 * dense : dense;
}

// `dense` [B, H, S, d] copied into memory of `layout` (what lies between the elements: NaN).
std::vector<float> laid_out(const std::vector<float> &dense, Layout layout, int64_t B, int64_t H,
                            int64_t S, int64_t d) {
    std::vector<float> out(spread(layout, dense.size()), NAN);
    const std::vector<int64_t> st = strides_of(layout, H, S, d);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t s = 0; s < S; s++)
                for (int64_t c = 0; c < d; c++) {
                    out[b * st[0] + h * st[1] + s * st[2] + c * st[3]] =
                        dense[((b * H + h) * S + s) * d + c];
                }
    return out;
}

template <typename T>
void run_typed(const AttentionProblem &p, Layout layout, DType dtype, AttentionOutputs &r) {
    const int64_t B = p.batch, H = p.heads, Hkv = p.kv_heads;
    const auto storage = [&](const std::vector<float> &dense, int64_t heads, int64_t S, int64_t d) {
        const std::vector<float> x = laid_out(dense, layout, B, heads, S, d);
        if constexpr (std::is_same_v<T, float>) {
            return x;
        } else {
            return reference::bits_of(x, dtype);
        }
    };
    const auto q = storage(p.query, H, p.query_len, p.head_dim);
    const auto k = storage(p.key, Hkv, p.key_len, p.head_dim);
    const auto v = storage(p.value, Hkv, p.key_len, p.value_dim);
    const auto view = [&](const auto &data, int64_t heads, int64_t S, int64_t d) {
        return StridedView<const T>{reinterpret_cast<const T *>(data.data()),
                                    {B, heads, S, d},
                                    strides_of(layout, heads, S, d)};
    };
    std::vector<std::conditional_t<std::is_same_v<T, float>, float, uint16_t>> out(
        spread(layout, size_t(B * H * p.query_len * p.value_dim)));
    r.lse.assign(size_t(B * H * p.query_len), NAN);
    AttentionOptions options = attention_options(p);
    options.lse = StridedView<float>{r.lse.data(), {B, H, p.query_len}, {}};
    attention(view(q, H, p.query_len, p.head_dim), view(k, Hkv, p.key_len, p.head_dim),
              view(v, Hkv, p.key_len, p.value_dim),
              {reinterpret_cast<T *>(out.data()),
               {B, H, p.query_len, p.value_dim},
               strides_of(layout, H, p.query_len, p.value_dim)},
              options);
    std::vector<float> widened;
    if constexpr (std::is_same_v<T, float>) {
        widened = out;
    } else {
        widened = reference::values_of(out, dtype);
    }
    // Back to dense [B, H, Sq, dv].
    const std::vector<int64_t> st = strides_of(layout, H, p.query_len, p.value_dim);
    r.output.resize(size_t(B * H * p.query_len * p.value_dim));
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < p.query_len; i++)
                for (int64_t c = 0; c < p.value_dim; c++) {
                    r.output[((b * H + h) * p.query_len + i) * p.value_dim + c] =
                        widened[b * st[0] + h * st[1] + i * st[2] + c * st[3]];
                }
}

}  // namespace

AttentionProblem random_attention_problem(const AttentionShape &s, uint64_t seed) {
    std::mt19937_64 rng(seed);
    AttentionProblem p;
    p.batch = s.batch;
    p.heads = s.heads;
    p.kv_heads = s.kv_heads;
    p.query_len = s.query_len;
    p.key_len = s.key_len;
    p.head_dim = s.head_dim;
    p.value_dim = s.value_dim;
    p.query = uniform(s.batch * s.heads * s.query_len * s.head_dim, rng);
    p.key = uniform(s.batch * s.kv_heads * s.key_len * s.head_dim, rng);
    p.value = uniform(s.batch * s.kv_heads * s.key_len * s.value_dim, rng);
    return p;
}

void add_random_attention_mask(AttentionProblem &p, bool is_bool, std::vector<int64_t> shape,
                               uint64_t seed, MaskConvention convention) {
    std::mt19937_64 rng(seed);
    std::bernoulli_distribution left_out(1.0 / 3.0);
    std::uniform_real_distribution<float> value(-3.0f, 1.0f);
    int64_t n = 1;
    for (int64_t e : shape) {
        n *= e;
    }
    p.mask_shape = std::move(shape);
    p.mask_is_bool = is_bool;
    p.convention = convention;
    const int64_t keys = p.mask_shape.back();
    if (is_bool) {
        p.bools.resize(size_t(n));
        for (int64_t e = 0; e < n; e++) {
            const bool out = (keys == 1 || e % keys != 0) && left_out(rng);
            p.bools[size_t(e)] = (convention == MaskConvention::keep) != out;
        }
    } else {
        p.floats.resize(size_t(n));
        for (float &f : p.floats) {
            f = value(rng);
        }
    }
}

AttentionOptions attention_options(const AttentionProblem &p) {
    AttentionOptions o;
    if (p.scale) {
        o.scale = float(*p.scale);
    }
    if (!p.mask_shape.empty()) {
        o.mask = p.mask_is_bool
                     ? AttentionMask{StridedView<const uint8_t>{p.bools.data(), p.mask_shape, {}},
                                     p.convention}
                     : AttentionMask{StridedView<const float>{p.floats.data(), p.mask_shape, {}},
                                     p.convention};
    }
    o.causal = p.causal;
    o.window_left = p.window_left;
    o.window_right = p.window_right;
    o.softcap = float(p.softcap);
    if (!p.alibi_slopes.empty()) {
        o.alibi_slopes = StridedView<const float>{p.alibi_slopes.data(), {p.heads}, {}};
    }
    return o;
}

AttentionOutputs run_attention(const AttentionProblem &p, Layout layout, DType dtype) {
    AttentionOutputs r;
    if (dtype == DType::bf16) {
        run_typed<bfloat16>(p, layout, dtype, r);
    } else if (dtype == DType::f16) {
        run_typed<float16>(p, layout, dtype, r);
    } else {
        run_typed<float>(p, layout, dtype, r);
    }
    return r;
}

}  // namespace mha::problems
