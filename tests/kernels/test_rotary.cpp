// mha::rotary_embedding against a double-precision rotation: both pair layouts, partial rotary
// dims, positions from theta and from tables, strided views, each dtype; and its checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "dtype.h"
#include "mha/mha.h"
#include "reference.h"
#include "test_seed.h"

namespace {

using mha::RotaryStyle;
using mha::StridedView;

// x [T, heads, d] rotated in f64: the first rotary_dim features, pair i by position · inv_i.
std::vector<double> rotated(const std::vector<float> &x, int64_t heads, int64_t d,
                            int64_t rotary_dim, RotaryStyle style,
                            const std::vector<int64_t> &positions, double theta) {
    std::vector<double> out(x.begin(), x.end());
    const int64_t pairs = rotary_dim / 2;
    for (size_t t = 0; t < positions.size(); t++) {
        for (int64_t h = 0; h < heads; h++) {
            for (int64_t i = 0; i < pairs; i++) {
                const double angle =
                    double(positions[t]) * std::pow(theta, -double(2 * i) / double(rotary_dim));
                const bool half = style == RotaryStyle::rotate_half;
                const size_t row = (t * size_t(heads) + size_t(h)) * size_t(d);
                const size_t a = row + size_t(half ? i : 2 * i);
                const size_t b = row + size_t(half ? i + pairs : 2 * i + 1);
                out[a] = x[a] * std::cos(angle) - x[b] * std::sin(angle);
                out[b] = x[b] * std::cos(angle) + x[a] * std::sin(angle);
            }
        }
    }
    return out;
}

struct RotaryCase {
    std::string name;
    int64_t heads, kv_heads, d, rotary_dim;
    RotaryStyle style;
    bool tables;
};

template <typename T>
void expect_rotation(const RotaryCase &c, double tolerance) {
    constexpr int64_t T_ = 29;
    constexpr double theta = 10000;
    std::mt19937_64 rng(mha::testing::next_seed());
    std::uniform_real_distribution<float> u(-1, 1);
    std::vector<int64_t> positions(T_);
    for (int64_t &p : positions) {
        p = int64_t(rng() % 4096);
    }
    const auto make = [&](int64_t heads) {
        std::vector<float> x(size_t(T_ * heads * c.d));
        for (float &v : x) {
            v = u(rng);
        }
        return mha::reference::rounded(x, mha::detail::dtype_of<T>());
    };
    const std::vector<float> q = make(c.heads), k = make(c.kv_heads);
    // The key inside a wider [T, 2 Hkv, d] tensor (a key-value projection's), read in place.
    std::vector<T> q_bits(q.size()), kv_bits(2 * k.size());
    mha::detail::convert(q.data(), q_bits.data(), int64_t(q.size()));
    for (int64_t t = 0; t < T_; t++) {
        mha::detail::convert(k.data() + t * c.kv_heads * c.d,
                             kv_bits.data() + t * 2 * c.kv_heads * c.d, c.kv_heads * c.d);
    }
    const int64_t rotary_dim = c.rotary_dim == 0 ? c.d : c.rotary_dim;
    std::vector<float> cos_table, sin_table;
    mha::RotaryOptions options;
    options.style = c.style;
    options.rotary_dim = c.rotary_dim;
    if (c.tables) {
        for (int64_t p = 0; p < 4096; p++) {
            for (int64_t i = 0; i < rotary_dim / 2; i++) {
                const double angle = double(p) * std::pow(theta, -double(2 * i) / rotary_dim);
                cos_table.push_back(float(std::cos(angle)));
                sin_table.push_back(float(std::sin(angle)));
            }
        }
        options.cos = StridedView<const float>{cos_table.data(), {4096, rotary_dim / 2}, {}};
        options.sin = StridedView<const float>{sin_table.data(), {4096, rotary_dim / 2}, {}};
    }
    mha::rotary_embedding(
        StridedView<T>{q_bits.data(), {T_, c.heads, c.d}, {}},
        StridedView<T>{kv_bits.data(), {T_, c.kv_heads, c.d}, {2 * c.kv_heads * c.d, c.d, 1}},
        StridedView<const int64_t>{positions.data(), {T_}, {}}, options);
    std::vector<float> got_q(q.size()), got_k(k.size());
    mha::detail::convert(q_bits.data(), got_q.data(), int64_t(q.size()));
    for (int64_t t = 0; t < T_; t++) {
        mha::detail::convert(kv_bits.data() + t * 2 * c.kv_heads * c.d,
                             got_k.data() + t * c.kv_heads * c.d, c.kv_heads * c.d);
        // The values beside the keys are untouched.
        for (int64_t f = c.kv_heads * c.d; f < 2 * c.kv_heads * c.d; f++) {
            float untouched;
            mha::detail::convert(&kv_bits[size_t(t * 2 * c.kv_heads * c.d + f)], &untouched, 1);
            ASSERT_EQ(untouched, 0.0f);
        }
    }
    EXPECT_LT(mha::reference::relative_l2(
                  got_q, rotated(q, c.heads, c.d, rotary_dim, c.style, positions, theta)),
              tolerance);
    EXPECT_LT(mha::reference::relative_l2(
                  got_k, rotated(k, c.kv_heads, c.d, rotary_dim, c.style, positions, theta)),
              tolerance);
}

class Rotary : public ::testing::TestWithParam<RotaryCase> {};

// f32 angles at positions up to 4096 are off by up to 4096 · 2^-24 radians: 2e-4 at most.
TEST_P(Rotary, MatchesTheRotationInDoubles) {
    expect_rotation<float>(GetParam(), 3e-4);
    expect_rotation<mha::bfloat16>(GetParam(), 1e-2);
    expect_rotation<mha::float16>(GetParam(), 2e-3);
}

INSTANTIATE_TEST_SUITE_P(Cases, Rotary,
                         ::testing::Values(RotaryCase{"llama_rotate_half", 8, 2, 64, 0,
                                                      RotaryStyle::rotate_half, false},
                                           RotaryCase{"gptj_interleaved_partial", 4, 4, 80, 32,
                                                      RotaryStyle::interleaved, false},
                                           RotaryCase{"tables_partial_odd_heads", 3, 1, 34, 18,
                                                      RotaryStyle::rotate_half, true}),
                         [](const auto &info) { return info.param.name; });

TEST(RotaryErrors, NameTheArgumentAndWriteNothing) {
    std::vector<float> q(2 * 2 * 8, 1.0f), k(2 * 1 * 8, 1.0f), table(3 * 4, 0.5f);
    std::vector<int64_t> positions{0, 5};
    const auto expect_error = [&](const std::string &expected, mha::RotaryOptions options,
                                  std::vector<int64_t> key_shape = {2, 1, 8}) {
        try {
            mha::rotary_embedding(StridedView<float>{q.data(), {2, 2, 8}, {}},
                                  StridedView<float>{k.data(), key_shape, {}},
                                  StridedView<const int64_t>{positions.data(), {2}, {}}, options);
            ADD_FAILURE() << "no error; expected: " << expected;
        } catch (const mha::Error &e) {
            EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
        }
        EXPECT_TRUE(std::all_of(q.begin(), q.end(), [](float x) { return x == 1.0f; }));
    };
    mha::RotaryOptions odd;
    odd.rotary_dim = 5;
    expect_error("rotary_dim 5 must be even and within the 8 features", odd);
    expect_error("key has 4 features but query has 8", {}, {2, 2, 4});
    expect_error("query, key and positions have 2, 3 and 2 tokens", {}, {3, 1, 8});
    mha::RotaryOptions tables;
    tables.cos = StridedView<const float>{table.data(), {3, 4}, {}};
    expect_error("cos and sin: give both tables or neither", tables);
    tables.sin = tables.cos;
    expect_error("positions[1] is 5: the tables have positions 0 to 2", tables);
    mha::RotaryOptions theta;
    theta.theta = 0;
    expect_error("theta 0 must be finite and > 0", theta);
}

// --- The rotation as an option of attention(), varlen_attention() and paged_attention() --------

// [B, heads, S, d] random values of T.
template <typename T>
std::vector<T> random_heads(int64_t B, int64_t heads, int64_t S, int64_t d, std::mt19937_64 &rng) {
    std::uniform_real_distribution<float> u(-1, 1);
    std::vector<T> x(size_t(B * heads * S * d));
    for (T &v : x) {
        const float f = u(rng);
        mha::detail::convert(&f, &v, 1);
    }
    return x;
}

// Rotates [B, heads, S, d] in place with rotary_embedding, row i of each batch row at first + i.
template <typename T>
void rotate_rows(std::vector<T> &x, int64_t B, int64_t heads, int64_t S, int64_t d, int64_t first,
                 const mha::RotaryOptions &options) {
    std::vector<int64_t> positions(static_cast<size_t>(S));
    for (int64_t i = 0; i < S; i++) {
        positions[size_t(i)] = first + i;
    }
    std::vector<T> none(
        static_cast<size_t>(S * d));  // rotary_embedding rotates a key too: an unused one
    for (int64_t b = 0; b < B; b++) {
        mha::rotary_embedding(
            StridedView<T>{x.data() + b * heads * S * d, {S, heads, d}, {d, S * d, 1}},
            StridedView<T>{none.data(), {S, 1, d}, {}},
            StridedView<const int64_t>{positions.data(), {S}, {}}, options);
    }
}

struct AttentionRotaryCase {
    const char *name;
    int64_t B, heads, kv_heads, Sq, Sk, d, rotary_dim;
    RotaryStyle style;
    mha::Causal causal;
};

class AttentionRotary : public ::testing::TestWithParam<AttentionRotaryCase> {};

// attention() with `rotary` gives what rotary_embedding of copies of Q (rows at Sk - Sq + i) and
// K (at j), then attention() without it, give; the caller's Q and K stay as they were.
template <typename T>
void expect_rotated_attention(const AttentionRotaryCase &c, float tolerance) {
    std::mt19937_64 rng(mha::testing::next_seed());
    const std::vector<T> q = random_heads<T>(c.B, c.heads, c.Sq, c.d, rng);
    const std::vector<T> k = random_heads<T>(c.B, c.kv_heads, c.Sk, c.d, rng);
    const std::vector<T> v = random_heads<T>(c.B, c.kv_heads, c.Sk, c.d, rng);
    mha::RotaryOptions rotary;
    rotary.style = c.style;
    rotary.rotary_dim = c.rotary_dim;
    rotary.theta = 500;
    const auto view = [](const std::vector<T> &x, int64_t heads, int64_t S, int64_t d, int64_t B) {
        return StridedView<const T>{x.data(), {B, heads, S, d}, {}};
    };
    const int64_t out_size = c.B * c.heads * c.Sq * c.d;
    std::vector<T> got(static_cast<size_t>(out_size)), want(got.size());
    mha::AttentionOptions options;
    options.causal = c.causal;
    options.rotary = rotary;
    mha::attention(view(q, c.heads, c.Sq, c.d, c.B), view(k, c.kv_heads, c.Sk, c.d, c.B),
                   view(v, c.kv_heads, c.Sk, c.d, c.B),
                   StridedView<T>{got.data(), {c.B, c.heads, c.Sq, c.d}, {}}, options);
    std::vector<T> rotated_q = q, rotated_k = k;
    rotate_rows(rotated_q, c.B, c.heads, c.Sq, c.d, c.Sk - c.Sq, rotary);
    rotate_rows(rotated_k, c.B, c.kv_heads, c.Sk, c.d, 0, rotary);
    options.rotary.reset();
    mha::attention(view(rotated_q, c.heads, c.Sq, c.d, c.B),
                   view(rotated_k, c.kv_heads, c.Sk, c.d, c.B), view(v, c.kv_heads, c.Sk, c.d, c.B),
                   StridedView<T>{want.data(), {c.B, c.heads, c.Sq, c.d}, {}}, options);
    std::vector<float> got_f(got.size()), want_f(want.size());
    mha::detail::convert(got.data(), got_f.data(), out_size);
    mha::detail::convert(want.data(), want_f.data(), out_size);
    EXPECT_LT(mha::reference::relative_l2(got_f, mha::reference::to_double(want_f)), tolerance);
    EXPECT_GT(mha::reference::relative_l2(
                  got_f, mha::reference::to_double(std::vector<float>(got_f.size(), 0.0f))),
              0.0);
}

TEST_P(AttentionRotary, IsRotaryEmbeddingThenAttention) {
    expect_rotated_attention<float>(GetParam(), 1e-6f);
    // rotary_embedding rounds the rotated values to bf16; the call does where its kernel reads
    // bf16 (tile products), and keeps them in f32 where it reads f32.
    expect_rotated_attention<mha::bfloat16>(GetParam(), 1e-2f);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, AttentionRotary,
    ::testing::Values(AttentionRotaryCase{"decode_chunk_bottom_right", 2, 4, 2, 5, 37, 16, 0,
                                          RotaryStyle::rotate_half, mha::Causal::bottom_right},
                      AttentionRotaryCase{"prefill_interleaved_partial", 1, 3, 3, 33, 33, 10, 6,
                                          RotaryStyle::interleaved, mha::Causal::top_left},
                      AttentionRotaryCase{"one_query_head_dim_128", 3, 8, 1, 1, 70, 128, 64,
                                          RotaryStyle::rotate_half, mha::Causal::none}),
    [](const auto &info) { return info.param.name; });

// paged_attention() with `rotary` rotates the query at its sequence's last position: what
// rotary_embedding of the query there, then paged_attention() without it, give.
TEST(PagedAttentionRotary, RotatesTheQueryAtItsSequencesLastKey) {
    constexpr int64_t B = 3, H = 4, Hkv = 2, d = 16, bs = 16, blocks = 8;
    std::mt19937_64 rng(mha::testing::next_seed());
    const std::vector<float> q = random_heads<float>(B, 1, H, d, rng);  // [B, 1, H, d]
    const std::vector<float> pool = random_heads<float>(blocks, bs, Hkv, d, rng);
    std::vector<int32_t> table{0, 1, 2, 3, 4, 5, 6, 7, 0}, lengths{17, 0, 30};
    mha::RotaryOptions rotary;
    rotary.theta = 10000;
    mha::AttentionOptions options;
    options.rotary = rotary;
    const mha::PagedKvCache<float> cache{{pool.data(), {blocks, bs, Hkv, d}, {}},
                                         {pool.data(), {blocks, bs, Hkv, d}, {}},
                                         {table.data(), {B, 3}, {}},
                                         {lengths.data(), {B}, {}}};
    std::vector<float> got(static_cast<size_t>(B * H * d)), want(got.size());
    mha::paged_attention(StridedView<const float>{q.data(), {B, 1, H, d}, {}}, cache,
                         StridedView<float>{got.data(), {B, 1, H, d}, {}}, options);
    std::vector<float> rotated_q = q;
    for (int64_t b = 0; b < B; b++) {
        if (lengths[size_t(b)] > 0) {
            std::vector<float> row(rotated_q.begin() + b * H * d,
                                   rotated_q.begin() + (b + 1) * H * d);
            rotate_rows(row, 1, H, 1, d, lengths[size_t(b)] - 1, rotary);
            std::copy(row.begin(), row.end(), rotated_q.begin() + b * H * d);
        }
    }
    options.rotary.reset();
    mha::paged_attention(StridedView<const float>{rotated_q.data(), {B, 1, H, d}, {}}, cache,
                         StridedView<float>{want.data(), {B, 1, H, d}, {}}, options);
    EXPECT_EQ(got, want);
    EXPECT_NE(q, rotated_q);
}

// Tables too short for the positions a call rotates raise mha::Error naming them.
TEST(AttentionRotaryErrors, PositionsPastTheTablesNameThemselves) {
    std::vector<float> x(1 * 2 * 9 * 8, 0.5f), out(1 * 2 * 4 * 8), table(6 * 4, 0.5f);
    mha::AttentionOptions options;
    options.rotary = mha::RotaryOptions{};
    options.rotary->cos = StridedView<const float>{table.data(), {6, 4}, {}};
    options.rotary->sin = options.rotary->cos;
    try {
        mha::attention(StridedView<const float>{x.data(), {1, 2, 4, 8}, {}},
                       StridedView<const float>{x.data(), {1, 2, 9, 8}, {}},
                       StridedView<const float>{x.data(), {1, 2, 9, 8}, {}},
                       StridedView<float>{out.data(), {1, 2, 4, 8}, {}}, options);
        ADD_FAILURE() << "no error";
    } catch (const mha::Error &e) {
        EXPECT_STREQ(e.what(),
                     "rotary tables of positions 0 to 5: the queries and keys take positions 0 "
                     "to 8 (query i at Sk - Sq + i, key j at j)");
    }
}

}  // namespace
