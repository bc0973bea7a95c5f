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

}  // namespace
