// Each stage's own generated library against the reference's same stage: shapes and values.
#include <gtest/gtest.h>

#include <random>

#include "HalideBuffer.h"
#include "mha_attend_values.h"
#include "mha_linear_projection.h"
#include "mha_masked_softmax.h"
#include "mha_masked_softmax_none.h"
#include "mha_merge_heads.h"
#include "mha_scaled_scores.h"
#include "mha_split_heads.h"
#include "reference.h"
#include "test_seed.h"

namespace {

using Halide::Runtime::Buffer;
using mha::reference::Dims;

constexpr double kTolerance = 1e-5;

std::vector<float> random_floats(size_t n, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
    std::vector<float> v(n);
    for (float &x : v) {
        x = dist(rng);
    }
    return v;
}

// A Halide view of a row-major tensor: Halide lists the dimensions innermost first.
template <typename T>
Buffer<T> view(std::vector<T> &data, std::vector<int> torch_shape) {
    std::vector<int> halide_shape(torch_shape.rbegin(), torch_shape.rend());
    return Buffer<T>(data.data(), halide_shape);
}

const Dims kStageDims[] = {
    {1, 1, 1, 1, 1}, {2, 5, 7, 12, 3}, {3, 13, 11, 20, 4}, {1, 17, 3, 9, 1}, {2, 6, 19, 64, 2}};

class Stages : public ::testing::TestWithParam<Dims> {};

TEST_P(Stages, LinearProjection) {
    const Dims d = GetParam();
    const int64_t E = d.embed_dim, rows = d.batch * d.query_len;
    auto x = random_floats(rows * E, mha::testing::next_seed());
    auto w = random_floats(E * E, mha::testing::next_seed());  // [out, in]
    auto bias = random_floats(E, mha::testing::next_seed());
    std::vector<float> w_t(E * E);
    for (int64_t o = 0; o < E; o++)
        for (int64_t i = 0; i < E; i++)
            w_t[i * E + o] = w[o * E + i];
    std::vector<float> y(rows * E);
    auto xb = view(x, {int(d.batch), int(d.query_len), int(E)});
    auto wb = view(w_t, {int(E), int(E)});
    auto bb = view(bias, {int(E)});
    auto yb = view(y, {int(d.batch), int(d.query_len), int(E)});
    ASSERT_EQ(mha_linear_projection(xb, wb, bb, yb), 0);
    EXPECT_LT(mha::reference::relative_l2(
                  y, mha::reference::linear(mha::reference::to_double(x), rows, E, w, bias)),
              kTolerance);
}

TEST_P(Stages, SplitHeadsLayoutIsBHSd) {
    const Dims d = GetParam();
    const int64_t B = d.batch, S = d.query_len, H = d.num_heads, hd = d.head_dim();
    auto x = random_floats(B * S * d.embed_dim, mha::testing::next_seed());
    std::vector<float> heads(x.size());
    auto xb = view(x, {int(B), int(S), int(d.embed_dim)});
    auto hb = view(heads, {int(B), int(H), int(S), int(hd)});
    ASSERT_EQ(mha_split_heads(xb, int(H), hb), 0);
    const auto want = mha::reference::split_heads(mha::reference::to_double(x), B, S, H, hd);
    for (size_t n = 0; n < want.size(); n++) {
        ASSERT_EQ(heads[n], want[n]) << "at " << n;  // a pure permutation: exact
    }
    // Spot-check the article's view/permute: feature h*d + c of token s is head h, row s, col c.
    const int64_t b = B - 1, s = S - 1, h = H - 1, c = hd - 1;
    EXPECT_EQ(heads[((b * H + h) * S + s) * hd + c], x[(b * S + s) * d.embed_dim + h * hd + c]);
}

TEST_P(Stages, MergeHeadsIsTheInverseOfSplit) {
    const Dims d = GetParam();
    const int64_t B = d.batch, S = d.query_len, H = d.num_heads, hd = d.head_dim();
    auto heads = random_floats(B * H * S * hd, mha::testing::next_seed());
    std::vector<float> merged(heads.size());
    auto hb = view(heads, {int(B), int(H), int(S), int(hd)});
    auto mb = view(merged, {int(B), int(S), int(d.embed_dim)});
    ASSERT_EQ(mha_merge_heads(hb, mb), 0);
    const auto want = mha::reference::merge_heads(mha::reference::to_double(heads), B, S, H, hd);
    for (size_t n = 0; n < want.size(); n++) {
        ASSERT_EQ(merged[n], want[n]) << "at " << n;
    }
    const auto round_trip =
        mha::reference::split_heads(mha::reference::to_double(merged), B, S, H, hd);
    EXPECT_EQ(round_trip, mha::reference::to_double(heads));
}

TEST_P(Stages, ScaledScores) {
    const Dims d = GetParam();
    const int64_t B = d.batch, H = d.num_heads, Sq = d.query_len, Sk = d.key_len;
    const int64_t hd = d.head_dim();
    auto q = random_floats(B * H * Sq * hd, mha::testing::next_seed());
    auto k = random_floats(B * H * Sk * hd, mha::testing::next_seed());
    std::vector<float> scores(B * H * Sq * Sk);
    auto qb = view(q, {int(B), int(H), int(Sq), int(hd)});
    auto kb = view(k, {int(B), int(H), int(Sk), int(hd)});
    auto sb = view(scores, {int(B), int(H), int(Sq), int(Sk)});
    ASSERT_EQ(mha_scaled_scores(qb, kb, sb), 0);
    EXPECT_LT(
        mha::reference::relative_l2(
            scores, mha::reference::scaled_scores(mha::reference::to_double(q),
                                                  mha::reference::to_double(k), B * H, Sq, Sk, hd)),
        kTolerance);
}

TEST_P(Stages, MaskedSoftmaxEveryKind) {
    const Dims d = GetParam();
    const int64_t B = d.batch, H = d.num_heads, Sq = d.query_len, Sk = d.key_len;
    auto scores = random_floats(B * H * Sq * Sk, mha::testing::next_seed());
    for (float &s : scores) {
        s *= 10;  // a wide range exercises the max subtraction
    }
    std::vector<uint8_t> mask(Sq * Sk);
    std::mt19937_64 rng(mha::testing::next_seed());
    for (uint8_t &m : mask) {
        m = rng() % 3 == 0;
    }
    // The stage library takes the mask as [B, H, Sq, Sk]; broadcast [Sq, Sk] with zero strides.
    const halide_dimension_t mask_dims[4] = {
        {0, int(Sk), 1, 0}, {0, int(Sq), int(Sk), 0}, {0, int(H), 0, 0}, {0, int(B), 0, 0}};
    Buffer<uint8_t> mb(mask.data(), 4, mask_dims);
    auto sb = view(scores, {int(B), int(H), int(Sq), int(Sk)});
    const auto want_for = [&](std::optional<mha::MaskConvention> c) {
        return mha::reference::masked_softmax(mha::reference::to_double(scores), d, c, {Sq, Sk},
                                              mask);
    };
    std::vector<float> weights(scores.size());
    auto wb = view(weights, {int(B), int(H), int(Sq), int(Sk)});

    ASSERT_EQ(mha_masked_softmax_none(sb, wb), 0);
    EXPECT_LT(mha::reference::relative_l2(weights, want_for(std::nullopt)), kTolerance);
    ASSERT_EQ(mha_masked_softmax(sb, mb, /*blocks_nonzero=*/0, wb), 0);
    EXPECT_LT(mha::reference::relative_l2(weights, want_for(mha::MaskConvention::keep)),
              kTolerance);
    ASSERT_EQ(mha_masked_softmax(sb, mb, /*blocks_nonzero=*/1, wb), 0);
    EXPECT_LT(mha::reference::relative_l2(weights, want_for(mha::MaskConvention::block)),
              kTolerance);
}

TEST_P(Stages, AttendValues) {
    const Dims d = GetParam();
    const int64_t B = d.batch, H = d.num_heads, Sq = d.query_len, Sk = d.key_len;
    const int64_t hd = d.head_dim();
    auto w = random_floats(B * H * Sq * Sk, mha::testing::next_seed());
    auto v = random_floats(B * H * Sk * hd, mha::testing::next_seed());
    std::vector<float> context(B * H * Sq * hd);
    auto wb = view(w, {int(B), int(H), int(Sq), int(Sk)});
    auto vb = view(v, {int(B), int(H), int(Sk), int(hd)});
    auto cb = view(context, {int(B), int(H), int(Sq), int(hd)});
    ASSERT_EQ(mha_attend_values(wb, vb, cb), 0);
    EXPECT_LT(
        mha::reference::relative_l2(context, mha::reference::attend_values(
                                                 mha::reference::to_double(w),
                                                 mha::reference::to_double(v), B * H, Sq, Sk, hd)),
        kTolerance);
}

INSTANTIATE_TEST_SUITE_P(Awkward, Stages, ::testing::ValuesIn(kStageDims), [](const auto &info) {
    const Dims &d = info.param;
    return "B" + std::to_string(d.batch) + "_Sq" + std::to_string(d.query_len) + "_Sk" +
           std::to_string(d.key_len) + "_E" + std::to_string(d.embed_dim) + "_H" +
           std::to_string(d.num_heads);
});

}  // namespace
