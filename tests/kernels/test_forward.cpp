// The whole forward pass against the double-precision reference.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <thread>

#include "problems.h"
#include "test_seed.h"

namespace {

using mha::MaskConvention;
using mha::reference::Dims;
using mha::reference::Problem;

using ForwardResult = mha::problems::Outputs;

// Runs the library's forward pass on `p`, with or without the weights.
ForwardResult run_forward(const Problem &p, bool with_weights) {
    return mha::problems::run_module(mha::problems::make_module(p), p, with_weights);
}

void expect_matches_reference(const Problem &p, bool with_weights) {
    const ForwardResult got = run_forward(p, with_weights);
    const auto want = mha::reference::forward(p);
    EXPECT_LT(mha::reference::relative_l2(got.output, want.output),
              mha::reference::output_tolerance(p));
    if (with_weights) {
        EXPECT_LT(mha::reference::relative_l2(got.weights, want.weights),
                  mha::reference::weights_tolerance(p));
    }
}

TEST(SeedExample, ShapesAndValuesMatchTheArticle) {
    // batch 2, sequence 5, embed 512, 8 heads: output [2, 5, 512], weights [2, 8, 5, 5].
    const Problem p =
        mha::problems::random_problem({2, 5, 5, 512, 8}, mha::testing::next_seed(), true);
    const ForwardResult got = run_forward(p, true);
    ASSERT_EQ(got.output.size(), 2u * 5 * 512);
    ASSERT_EQ(got.weights.size(), 2u * 8 * 5 * 5);
    const auto want = mha::reference::forward(p);
    EXPECT_LT(mha::reference::relative_l2(got.output, want.output),
              mha::reference::output_tolerance(p));
    EXPECT_LT(mha::reference::relative_l2(got.weights, want.weights),
              mha::reference::weights_tolerance(p));
}

// Awkward sizes: 1, primes, E not a multiple of the vector width, H = 1 (d = E), d = 1.
struct ShapeCase {
    const char *name;
    Dims dims;
};
const ShapeCase kShapes[] = {
    {"all_ones", {1, 1, 1, 1, 1}},
    {"single_query_long_context", {1, 1, 37, 16, 4}},
    {"e12_h3_self", {2, 7, 7, 12, 3}},
    {"e12_h3_cross", {3, 5, 11, 12, 3}},
    {"one_head_d_equals_e", {2, 13, 13, 20, 1}},
    {"one_head_cross", {1, 3, 17, 9, 1}},
    {"head_dim_one", {2, 11, 5, 7, 7}},
    {"primes", {3, 13, 17, 30, 5}},
    {"many_keys_few_queries", {1, 2, 61, 24, 2}},
    {"seed_width_cross", {2, 5, 9, 512, 8}},
    {"head_dim_96", {1, 19, 23, 192, 2}},
};

class ForwardShapes : public ::testing::TestWithParam<ShapeCase> {};

TEST_P(ForwardShapes, MatchesReferenceWithWeights) {
    const Dims d = GetParam().dims;
    expect_matches_reference(mha::problems::random_problem(d, mha::testing::next_seed()), true);
}

TEST_P(ForwardShapes, MatchesReferenceWithoutWeights) {
    const Dims d = GetParam().dims;
    expect_matches_reference(mha::problems::random_problem(d, mha::testing::next_seed()), false);
}

TEST_P(ForwardShapes, SelfAttentionMatchesReference) {
    Dims d = GetParam().dims;
    d.key_len = d.query_len;
    expect_matches_reference(mha::problems::random_problem(d, mha::testing::next_seed(), true),
                             true);
}

TEST_P(ForwardShapes, OutputIsTheSameWithAndWithoutWeights) {
    const Problem p = mha::problems::random_problem(GetParam().dims, mha::testing::next_seed());
    const ForwardResult with = run_forward(p, true);
    const ForwardResult without = run_forward(p, false);
    ASSERT_EQ(with.output.size(), without.output.size());
    for (size_t n = 0; n < with.output.size(); n++) {
        ASSERT_NEAR(with.output[n], without.output[n], 1e-6 * (1 + std::abs(with.output[n])))
            << "at " << n;
    }
}

TEST_P(ForwardShapes, WeightRowsSumToOne) {
    const Problem p = mha::problems::random_problem(GetParam().dims, mha::testing::next_seed());
    const ForwardResult got = run_forward(p, true);
    const int64_t Sk = p.dims.key_len;
    for (size_t row = 0; row < got.weights.size() / Sk; row++) {
        double sum = 0;
        for (int64_t j = 0; j < Sk; j++) {
            ASSERT_GE(got.weights[row * Sk + j], 0.0f);
            sum += got.weights[row * Sk + j];
        }
        ASSERT_NEAR(sum, 1.0, 1e-5) << "row " << row;
    }
}

INSTANTIATE_TEST_SUITE_P(Awkward, ForwardShapes, ::testing::ValuesIn(kShapes),
                         [](const auto &info) { return std::string(info.param.name); });

// Every projection row count from 1 to 17, and primes past it: the projections fit their
// register tiles to calls with fewer rows than a tile (1, 2 or 4 rows), and a call's rows are
// batch rows, query tokens or both. E = 40 (H = 5, d = 8) is not a multiple of any vector width.
class TokenRowCounts : public ::testing::TestWithParam<int64_t> {};

TEST_P(TokenRowCounts, BatchOfSingleTokensMatchesReference) {
    const int64_t rows = GetParam();
    expect_matches_reference(
        mha::problems::random_problem({rows, 1, 1, 40, 5}, mha::testing::next_seed(), true), false);
}

TEST_P(TokenRowCounts, OneSequenceMatchesReference) {
    const int64_t rows = GetParam();
    expect_matches_reference(
        mha::problems::random_problem({1, rows, rows, 40, 5}, mha::testing::next_seed(), true),
        true);
}

// Few queries against a context long enough for the medium bucket's kernels (65+ key rows),
// whose query and output projections still see only `rows` rows.
TEST_P(TokenRowCounts, FewQueriesAgainstALongContextMatchReference) {
    const int64_t rows = GetParam();
    expect_matches_reference(
        mha::problems::random_problem({1, rows, 101, 40, 5}, mha::testing::next_seed()), false);
}

INSTANTIATE_TEST_SUITE_P(OneToSeventeenAndPrimes, TokenRowCounts,
                         ::testing::Values(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16,
                                           17, 23, 31, 67));

// Both mask conventions at every broadcast shape (a seed mask has four dimensions).
enum class MaskShape { sq_sk, key_padding, b1_sq_sk, full, per_query_row, keys_only };

// The mask's own shape, which broadcasts to [B, H, Sq, Sk].
std::vector<int64_t> mask_shape(MaskShape shape, const Dims &d) {
    switch (shape) {
    case MaskShape::sq_sk:
        return {1, 1, d.query_len, d.key_len};
    case MaskShape::key_padding:
        return {d.batch, 1, 1, d.key_len};
    case MaskShape::b1_sq_sk:
        return {d.batch, 1, d.query_len, d.key_len};
    case MaskShape::full:
        return {d.batch, d.num_heads, d.query_len, d.key_len};
    case MaskShape::per_query_row:
        return {1, 1, d.query_len, 1};
    case MaskShape::keys_only:
        return {1, 1, 1, d.key_len};
    }
    return {};
}

struct MaskCase {
    const char *name;
    MaskConvention convention;
    MaskShape shape;
};
const MaskCase kMasks[] = {
    {"keep_sq_sk", MaskConvention::keep, MaskShape::sq_sk},
    {"block_sq_sk", MaskConvention::block, MaskShape::sq_sk},
    {"keep_padding", MaskConvention::keep, MaskShape::key_padding},
    {"block_padding", MaskConvention::block, MaskShape::key_padding},
    {"keep_b1_sq_sk", MaskConvention::keep, MaskShape::b1_sq_sk},
    {"block_b1_sq_sk", MaskConvention::block, MaskShape::b1_sq_sk},
    {"keep_full", MaskConvention::keep, MaskShape::full},
    {"block_full", MaskConvention::block, MaskShape::full},
    {"keep_per_query_row", MaskConvention::keep, MaskShape::per_query_row},
    {"block_keys_only", MaskConvention::block, MaskShape::keys_only},
};

class ForwardMasks : public ::testing::TestWithParam<MaskCase> {};

TEST_P(ForwardMasks, MatchesReference) {
    for (const Dims d : {Dims{2, 7, 11, 12, 3}, Dims{3, 5, 5, 40, 4}, Dims{1, 1, 13, 8, 2}}) {
        Problem p = mha::problems::random_problem(d, mha::testing::next_seed());
        mha::problems::add_random_mask(p, GetParam().convention, mask_shape(GetParam().shape, d),
                                       mha::testing::next_seed());
        SCOPED_TRACE(::testing::Message() << "B " << d.batch << " Sq " << d.query_len);
        expect_matches_reference(p, true);
        expect_matches_reference(p, false);
    }
}

INSTANTIATE_TEST_SUITE_P(BothConventions, ForwardMasks, ::testing::ValuesIn(kMasks),
                         [](const auto &info) { return std::string(info.param.name); });

// The same blocked positions in both conventions give the same result.
TEST(ForwardMaskConventions, KeepAndBlockAreComplements) {
    const Dims d{2, 6, 9, 16, 4};
    Problem keep = mha::problems::random_problem(d, mha::testing::next_seed());
    mha::problems::add_random_mask(keep, MaskConvention::keep, {d.batch, 1, d.query_len, d.key_len},
                                   mha::testing::next_seed());
    Problem block = keep;
    block.mask_convention = MaskConvention::block;
    for (uint8_t &m : block.mask) {
        m = m == 0 ? 1 : 0;
    }
    const ForwardResult a = run_forward(keep, true), b = run_forward(block, true);
    EXPECT_EQ(a.output, b.output);
    EXPECT_EQ(a.weights, b.weights);
}

TEST(ForwardMaskConventions, FullyMaskedRowGivesUniformWeights) {
    const Dims d{2, 4, 7, 12, 3};
    for (MaskConvention convention : {MaskConvention::keep, MaskConvention::block}) {
        Problem p = mha::problems::random_problem(d, mha::testing::next_seed());
        mha::problems::add_random_mask(p, convention, {1, 1, d.query_len, d.key_len},
                                       mha::testing::next_seed());
        const uint8_t blocked = convention == MaskConvention::keep ? 0 : 1;
        for (int64_t j = 0; j < d.key_len; j++) {
            p.mask[2 * d.key_len + j] = blocked;  // query row 2 sees no key
        }
        const ForwardResult got = run_forward(p, true);
        for (int64_t bh = 0; bh < d.batch * d.num_heads; bh++) {
            for (int64_t j = 0; j < d.key_len; j++) {
                const float w = got.weights[(bh * d.query_len + 2) * d.key_len + j];
                EXPECT_NEAR(w, 1.0 / d.key_len, 1e-7);
            }
        }
        for (float o : got.output) {
            ASSERT_TRUE(std::isfinite(o));
        }
        const auto want = mha::reference::forward(p);
        EXPECT_LT(mha::reference::relative_l2(got.output, want.output),
                  mha::reference::output_tolerance(p));
    }
}

TEST(ForwardConcurrency, ManyThreadsShareOneModule) {
    const Dims d{2, 9, 14, 24, 3};
    const Problem shared = mha::problems::random_problem(d, mha::testing::next_seed());
    const auto module = mha::problems::make_module(shared);
    constexpr int kThreads = 6;
    std::vector<Problem> problems;
    for (int t = 0; t < kThreads; t++) {
        Problem p = mha::problems::random_problem(d, mha::testing::next_seed());
        for (int l = 0; l < 4; l++) {  // same module weights, fresh inputs
            p.weight[l] = shared.weight[l];
            p.bias[l] = shared.bias[l];
        }
        if (t % 2 == 1) {
            mha::problems::add_random_mask(p, MaskConvention::keep, {1, 1, d.query_len, d.key_len},
                                           mha::testing::next_seed());
        }
        problems.push_back(std::move(p));
    }
    std::vector<ForwardResult> runs(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; t++) {
        threads.emplace_back([&, t] {
            const Problem &p = problems[t];
            ForwardResult &r = runs[t];
            r.output.assign(d.batch * d.query_len * d.embed_dim, NAN);
            r.weights.assign(d.batch * d.num_heads * d.query_len * d.key_len, NAN);
            for (int repeat = 0; repeat < 20; repeat++) {
                module.forward(mha::problems::query_view(p), mha::problems::key_view(p),
                               mha::problems::value_view(p),
                               {r.output.data(), {d.batch, d.query_len, d.embed_dim}},
                               mha::problems::mask_view(p),
                               mha::MutableTensor{r.weights.data(),
                                                  {d.batch, d.num_heads, d.query_len, d.key_len}});
            }
        });
    }
    for (auto &t : threads) {
        t.join();
    }
    for (int t = 0; t < kThreads; t++) {
        const auto want = mha::reference::forward(problems[t]);
        EXPECT_LT(mha::reference::relative_l2(runs[t].output, want.output),
                  mha::reference::output_tolerance(problems[t]));
        EXPECT_LT(mha::reference::relative_l2(runs[t].weights, want.weights),
                  mha::reference::weights_tolerance(problems[t]));
    }
}

// nn.MultiheadAttention's kdim and vdim: keys and values with their own features, at awkward
// sizes (1, primes, d = 96 with one head), with masks, causal order and the weights.
TEST(ForwardFeatures, KdimAndVdimMatchReference) {
    struct Case {
        Dims dims;
        int64_t kdim, vdim;
    };
    for (const Case &c : {Case{{2, 5, 7, 12, 3}, 7, 20}, Case{{1, 3, 11, 12, 4}, 1, 13},
                          Case{{2, 9, 4, 96, 1}, 33, 96}, Case{{3, 6, 6, 8, 2}, 5, 5}}) {
        Problem p =
            mha::problems::random_problem(c.dims, mha::testing::next_seed(), false, c.kdim, c.vdim);
        const auto module = mha::problems::make_module(p);
        ASSERT_EQ(module.kdim(), c.kdim);
        ASSERT_EQ(module.vdim(), c.vdim);
        SCOPED_TRACE(::testing::Message() << "kdim " << c.kdim << " vdim " << c.vdim);
        expect_matches_reference(p, true);
        p.causal = mha::Causal::bottom_right;
        mha::problems::add_random_mask(p, MaskConvention::keep,
                                       {c.dims.batch, 1, 1, c.dims.key_len},
                                       mha::testing::next_seed());
        expect_matches_reference(p, false);
    }
}

// PyTorch's packed in_proj_weight [3E, E] and in_proj_bias [3E] are Wq, Wk, Wv stacked.
TEST(ForwardFeatures, PackedInProjEqualsThreeLinears) {
    const Dims d{2, 6, 6, 20, 4};
    const Problem p = mha::problems::random_problem(d, mha::testing::next_seed(), true);
    std::vector<float> in_proj_weight, in_proj_bias;
    for (int l = 0; l < 3; l++) {
        in_proj_weight.insert(in_proj_weight.end(), p.weight[l].begin(), p.weight[l].end());
        in_proj_bias.insert(in_proj_bias.end(), p.bias[l].begin(), p.bias[l].end());
    }
    const auto packed = mha::MultiHeadAttention::from_in_proj(
        d.embed_dim, d.num_heads, {in_proj_weight.data(), {3 * d.embed_dim, d.embed_dim}},
        mha::Tensor{in_proj_bias.data(), {3 * d.embed_dim}}, mha::problems::linears(p)[3],
        mha::Device::cpu, p.dtype);
    EXPECT_EQ(mha::problems::run_module(packed, p, true).output, run_forward(p, true).output);
}

// Each projection's bias is optional, and a missing one is zero.
TEST(ForwardFeatures, MissingBiasIsZero) {
    const Dims d{2, 5, 8, 12, 3};
    Problem p = mha::problems::random_problem(d, mha::testing::next_seed());
    std::array<mha::Linear, 4> linears = mha::problems::linears(p);
    linears[1].bias.reset();
    linears[3].bias.reset();
    const mha::MultiHeadAttention module(d.embed_dim, d.num_heads, linears[0], linears[1],
                                         linears[2], linears[3], mha::Device::cpu, p.dtype);
    std::fill(p.bias[1].begin(), p.bias[1].end(), 0.0f);
    std::fill(p.bias[3].begin(), p.bias[3].end(), 0.0f);
    const auto got = mha::problems::run_module(module, p, false);
    EXPECT_LT(mha::reference::relative_l2(got.output, mha::reference::forward(p).output),
              mha::reference::output_tolerance(p));
}

// PyTorch's average_attn_weights=True: the weights [B, Sq, Sk] averaged over heads, computed by
// the library (an averaging kernel over the per-head weights), with masks and causal order.
TEST(ForwardFeatures, AveragedWeightsMatchTheReferenceMean) {
    for (const Dims &d : {Dims{2, 5, 7, 12, 3}, Dims{1, 9, 9, 8, 1}, Dims{3, 4, 17, 30, 5}}) {
        Problem p =
            mha::problems::random_problem(d, mha::testing::next_seed(), d.query_len == d.key_len);
        mha::problems::add_random_mask(p, MaskConvention::block, {d.batch, 1, 1, d.key_len},
                                       mha::testing::next_seed());
        p.causal = mha::Causal::bottom_right;
        p.average_weights = true;
        expect_matches_reference(p, true);
    }
}

// Grouped-query and multi-query heads (kv_heads dividing H; SDPA's enable_gqa semantics: query
// head h attends with key/value head h / (H / kv_heads)): self-attention (fused QKV) and
// cross-attention, with masks, causal order and the weights, per head and averaged.
TEST(ForwardFeatures, GroupedQueryHeadsMatchReference) {
    struct Case {
        Dims dims;
        int64_t kv_heads;
    };
    for (const Case &c :
         {Case{{2, 7, 7, 24, 6}, 2}, Case{{2, 5, 11, 16, 4}, 1}, Case{{1, 9, 9, 192, 2}, 1},
          Case{{3, 4, 13, 32, 8}, 4}, Case{{1, 33, 33, 12, 3}, 3}, Case{{2, 6, 6, 4, 4}, 2}}) {
        const bool self = c.dims.query_len == c.dims.key_len;
        Problem p = mha::problems::random_problem(c.dims, mha::testing::next_seed(), self, 0, 0,
                                                  c.kv_heads);
        ASSERT_EQ(mha::problems::make_module(p).num_kv_heads(), c.kv_heads);
        SCOPED_TRACE(::testing::Message()
                     << "H " << c.dims.num_heads << " kv_heads " << c.kv_heads);
        expect_matches_reference(p, true);
        expect_matches_reference(p, false);
        mha::problems::add_random_mask(p, MaskConvention::keep,
                                       {c.dims.batch, 1, 1, c.dims.key_len},
                                       mha::testing::next_seed());
        p.causal = mha::Causal::top_left;
        p.average_weights = true;
        expect_matches_reference(p, true);
    }
}

}  // namespace
