// Both mask families of ForwardOptions against the double-precision reference, and the
// semantics the API documents for them (PyTorch's where PyTorch has the argument).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "mask_setups.h"
#include "problems.h"
#include "test_seed.h"

namespace {

using mha::MaskConvention;
using mha::reference::Dims;
using mha::reference::Problem;
using mha::testing::MaskSetup;

// Awkward sizes: Sq != Sk, one query, one head with d = 96, d = 1, self-attention (fused QKV),
// batch rows with different key padding (random per row).
const Dims kDims[] = {
    {2, 7, 11, 12, 3}, {3, 5, 5, 40, 4}, {1, 1, 13, 8, 2}, {2, 4, 9, 96, 1}, {3, 6, 6, 7, 7}};

class MaskFamilies : public ::testing::TestWithParam<MaskSetup> {};

TEST_P(MaskFamilies, MatchReference) {
    for (const Dims &d : kDims) {
        const bool self = d.query_len == d.key_len;
        Problem p = mha::problems::random_problem(d, mha::testing::next_seed(), self);
        mha::testing::apply_masks(GetParam(), p, mha::testing::next_seed());
        const auto module = mha::problems::make_module(p);
        const auto want = mha::reference::forward(p);
        for (bool with_weights : {false, true}) {
            SCOPED_TRACE(::testing::Message()
                         << "B " << d.batch << " Sq " << d.query_len << " Sk " << d.key_len << " E "
                         << d.embed_dim << " H " << d.num_heads << " weights " << with_weights);
            const auto got = mha::problems::run_module(module, p, with_weights);
            EXPECT_LT(mha::reference::relative_l2(got.output, want.output),
                      mha::reference::output_tolerance(p));
            if (with_weights) {
                EXPECT_LT(mha::reference::relative_l2(got.weights, want.weights),
                          mha::reference::weights_tolerance(p));
            }
        }
    }
}

INSTANTIATE_TEST_SUITE_P(SeedAndPyTorch, MaskFamilies,
                         ::testing::ValuesIn(mha::testing::kMaskSetups),
                         [](const auto &info) { return std::string(info.param.name); });

// Causal attention in both alignments, alone and under masks of each family, with Sq < Sk,
// Sq == Sk (self-attention, fused QKV), Sq > Sk (bottom-right: the first rows see no key), and
// sequences of several key and query tiles.
struct CausalCase {
    const char *name;
    mha::Causal causal;
};
const CausalCase kCausalCases[] = {{"top_left", mha::Causal::top_left},
                                   {"bottom_right", mha::Causal::bottom_right}};

class CausalAttention : public ::testing::TestWithParam<CausalCase> {};

TEST_P(CausalAttention, MatchesReference) {
    const Dims dims[] = {{2, 7, 11, 12, 3},   {1, 11, 7, 12, 3},   {2, 70, 70, 32, 2},
                         {1, 40, 100, 24, 4}, {1, 100, 40, 96, 1}, {3, 9, 9, 7, 7}};
    for (const Dims &d : dims) {
        for (const char *name : {"none", "seed_keep", "key_padding_bool", "attn_float"}) {
            const MaskSetup &m = mha::testing::mask_setup(name);
            const bool self = d.query_len == d.key_len;
            Problem p = mha::problems::random_problem(d, mha::testing::next_seed(), self);
            mha::testing::apply_masks(m, p, mha::testing::next_seed());
            p.causal = GetParam().causal;
            const auto module = mha::problems::make_module(p);
            const auto want = mha::reference::forward(p);
            for (bool with_weights : {false, true}) {
                SCOPED_TRACE(::testing::Message()
                             << "B " << d.batch << " Sq " << d.query_len << " Sk " << d.key_len
                             << " E " << d.embed_dim << " H " << d.num_heads << " mask " << m.name
                             << " weights " << with_weights);
                const auto got = mha::problems::run_module(module, p, with_weights);
                EXPECT_LT(mha::reference::relative_l2(got.output, want.output),
                          mha::reference::output_tolerance(p));
                if (with_weights) {
                    EXPECT_LT(mha::reference::relative_l2(got.weights, want.weights),
                              mha::reference::weights_tolerance(p));
                }
            }
        }
    }
}

INSTANTIATE_TEST_SUITE_P(BothAlignments, CausalAttention, ::testing::ValuesIn(kCausalCases),
                         [](const auto &info) { return std::string(info.param.name); });

// PyTorch's is_causal=True is its boolean attn_mask of ones above the diagonal (torch.triu(...,
// diagonal=1)), which every row sees key 0 of; bottom-right shifts that diagonal by Sk - Sq.
TEST(CausalSemantics, EqualsTheTriangularMask) {
    for (const auto &[causal, shift] :
         {std::pair{mha::Causal::top_left, 0}, {mha::Causal::bottom_right, 9}}) {
        const Dims d{2, 13, 22, 16, 2};
        Problem p = mha::problems::random_problem(d, mha::testing::next_seed());
        p.causal = causal;
        const auto implicit = mha::problems::run_module(mha::problems::make_module(p), p, true);
        p.causal = mha::Causal::none;
        p.attn_mask = mha::reference::TorchMask{true, {d.query_len, d.key_len}, {}, {}};
        for (int64_t i = 0; i < d.query_len; i++) {
            for (int64_t j = 0; j < d.key_len; j++) {
                p.attn_mask->bools.push_back(j > i + shift);
            }
        }
        const auto explicit_mask =
            mha::problems::run_module(mha::problems::make_module(p), p, true);
        EXPECT_LT(mha::reference::relative_l2(implicit.output,
                                              mha::reference::to_double(explicit_mask.output)),
                  1e-6);
        EXPECT_LT(mha::reference::relative_l2(implicit.weights,
                                              mha::reference::to_double(explicit_mask.weights)),
                  1e-6);
    }
}

struct MaskSemantics : ::testing::Test {
    // B == Sq, where a [B, Sk] key padding would broadcast as an [Sq, Sk] mask.
    const Dims d{3, 3, 5, 12, 2};
    Problem p = mha::problems::random_problem(d, mha::testing::next_seed());
    std::vector<float> output = std::vector<float>(d.batch * d.query_len * d.embed_dim);
    mha::MutableTensor output_view{output.data(), {d.batch, d.query_len, d.embed_dim}};
    std::vector<float> weights =
        std::vector<float>(d.batch * d.num_heads * d.query_len * d.key_len);
    mha::MutableTensor weights_view{weights.data(), {d.batch, d.num_heads, d.query_len, d.key_len}};

    void forward(const mha::ForwardOptions &options) {
        mha::problems::make_module(p).forward(mha::problems::query_view(p),
                                              mha::problems::key_view(p),
                                              mha::problems::value_view(p), output_view, options);
    }
    std::string error_of(const mha::ForwardOptions &options) {
        try {
            forward(options);
        } catch (const mha::Error &e) {
            return e.what();
        }
        return "no error";
    }
};

// The mix-up of PyTorch's [B, Sk] key padding with a seed mask cannot happen: a seed mask has
// four dimensions, and key_padding_mask is its own argument that masks keys per batch row.
// Seed masks broadcast right-aligned, as the seed's masked_fill reads them: a [B, Sk]-shaped
// byte mask is an [Sq, Sk] mask (PyTorch's key padding goes in key_padding_mask), the same as
// [1, 1, Sq, Sk] bit for bit; a key padding is [B, 1, 1, Sk], the same as key_padding_mask.
TEST_F(MaskSemantics, SeedMasksBroadcastRightAligned) {
    std::vector<uint8_t> padding(d.batch * d.key_len, 0);
    padding[0 * d.key_len + 4] = padding[1 * d.key_len + 3] = padding[1 * d.key_len + 4] = 1;
    ASSERT_EQ(d.batch, d.query_len);  // so that [B, Sk] is an [Sq, Sk] shape too
    mha::ForwardOptions two_dimensional;
    two_dimensional.mask =
        mha::Mask{{padding.data(), {d.query_len, d.key_len}}, MaskConvention::block};
    forward(two_dimensional);
    const std::vector<float> as_sq_sk = output;
    mha::ForwardOptions four_dimensional;
    four_dimensional.mask =
        mha::Mask{{padding.data(), {1, 1, d.query_len, d.key_len}}, MaskConvention::block};
    forward(four_dimensional);
    EXPECT_EQ(output, as_sq_sk);

    p.key_padding_mask = mha::reference::TorchMask{true, {d.batch, d.key_len}, padding, {}};
    forward(mha::problems::options_view(p));
    EXPECT_LT(mha::reference::relative_l2(output, mha::reference::forward(p).output),
              mha::reference::output_tolerance(p));
    // The same as the seed's [B, 1, 1, Sk] padding mask, bit for bit.
    const std::vector<float> with_key_padding = output;
    p.key_padding_mask.reset();
    p.mask_convention = MaskConvention::block;
    p.mask_shape = {d.batch, 1, 1, d.key_len};
    p.mask = padding;
    forward(mha::problems::options_view(p));
    EXPECT_EQ(output, with_key_padding);
    // One element, and [H, Sq, Sk], broadcast as well.
    for (const std::vector<int64_t> &shape :
         std::vector<std::vector<int64_t>>{{1}, {d.num_heads, d.query_len, d.key_len}}) {
        p.mask_shape = shape;
        p.mask.assign(size_t(d.num_heads * d.query_len * d.key_len), 0);
        p.mask[1] = 1;
        forward(mha::problems::options_view(p));
        EXPECT_LT(mha::reference::relative_l2(output, mha::reference::forward(p).output),
                  mha::reference::output_tolerance(p));
    }
}

// A boolean row blocked everywhere behaves as the seed's -1e9 (uniform weights, finite output);
// PyTorch gives NaN there (it blocks with -inf).
TEST_F(MaskSemantics, FullyBlockedBooleanRowIsUniform) {
    std::vector<uint8_t> attn(d.query_len * d.key_len, 0);
    for (int64_t j = 0; j < d.key_len; j++) {
        attn[1 * d.key_len + j] = 1;  // query 1 sees no key
    }
    mha::ForwardOptions o;
    o.attn_mask = mha::BoolTensor{attn.data(), {d.query_len, d.key_len}};
    o.weights = weights_view;
    forward(o);
    for (int64_t bh = 0; bh < d.batch * d.num_heads; bh++) {
        for (int64_t j = 0; j < d.key_len; j++) {
            EXPECT_NEAR(weights[(bh * d.query_len + 1) * d.key_len + j], 1.0 / d.key_len, 1e-7);
        }
    }
    for (float x : output) {
        ASSERT_TRUE(std::isfinite(x));
    }
}

// Float masks are added as given (PyTorch's float attn_mask): -inf weighs a key exactly 0, and a
// row that is -inf everywhere is NaN, as in PyTorch.
TEST_F(MaskSemantics, MinusInfinityFloatMask) {
    const float inf = std::numeric_limits<float>::infinity();
    std::vector<float> attn(d.query_len * d.key_len, 0.0f);
    attn[0 * d.key_len + 2] = -inf;
    for (int64_t j = 0; j < d.key_len; j++) {
        attn[2 * d.key_len + j] = -inf;  // query 2 sees no key
    }
    mha::ForwardOptions o;
    o.attn_mask = mha::Tensor{attn.data(), {d.query_len, d.key_len}};
    o.weights = weights_view;
    forward(o);
    for (int64_t bh = 0; bh < d.batch * d.num_heads; bh++) {
        EXPECT_EQ(weights[(bh * d.query_len + 0) * d.key_len + 2], 0.0f);
        EXPECT_TRUE(std::isnan(weights[(bh * d.query_len + 2) * d.key_len]));
    }
    for (int64_t b = 0; b < d.batch; b++) {
        EXPECT_TRUE(std::isfinite(output[(b * d.query_len + 0) * d.embed_dim]));
        EXPECT_TRUE(std::isnan(output[(b * d.query_len + 2) * d.embed_dim]));
    }
}

// The TF article's logits += mask·(-1e9), passed precomputed as an additive mask, matches its
// byte mask in the block convention.
TEST_F(MaskSemantics, TfAdditiveMaskMatchesTheBlockConvention) {
    mha::problems::add_random_additive_mask(p, {d.batch, 1, 1, d.key_len}, true,
                                            mha::testing::next_seed());
    forward(mha::problems::options_view(p));
    const std::vector<float> additive = output;
    std::vector<uint8_t> blocked(p.additive.size());
    for (size_t n = 0; n < blocked.size(); n++) {
        blocked[n] = p.additive[n] != 0.0f;
    }
    mha::ForwardOptions o;
    o.mask = mha::Mask{{blocked.data(), p.additive_shape}, MaskConvention::block};
    forward(o);
    EXPECT_LT(mha::reference::relative_l2(additive, mha::reference::to_double(output)), 1e-6);
}

TEST_F(MaskSemantics, BadMasksAreErrors) {
    std::vector<uint8_t> bytes(d.batch * d.num_heads * d.query_len * d.key_len, 0);
    std::vector<float> floats(bytes.size(), 0.0f);
    const auto expect_error = [&](const mha::ForwardOptions &o, const std::string &message) {
        EXPECT_NE(error_of(o).find(message), std::string::npos) << error_of(o);
    };
    mha::ForwardOptions o;
    o.mask = mha::Mask{{bytes.data(), {1, 1, d.query_len, d.key_len}}, MaskConvention::keep};
    o.key_padding_mask = mha::BoolTensor{bytes.data(), {d.batch, d.key_len}};
    expect_error(o, "a call takes one mask family");
    o = {};
    o.mask = mha::Mask{{bytes.data(), {1, 1, d.query_len, d.key_len}}, MaskConvention::keep};
    o.additive_mask = mha::Tensor{floats.data(), {1, 1, d.query_len, d.key_len}};
    expect_error(o, "a call takes one mask family");
    o = {};
    o.key_padding_mask = mha::BoolTensor{bytes.data(), {d.batch, d.key_len - 1}};
    expect_error(o, "key_padding_mask has shape [3, 4] but must be [3, 5]");
    o = {};
    o.attn_mask = mha::Tensor{floats.data(), {d.key_len, d.query_len}};
    expect_error(o, "attn_mask has shape [5, 3] but must be [3, 5]");
    o = {};
    o.attn_mask = mha::Tensor{floats.data(), {d.batch, d.query_len, d.key_len}};
    expect_error(o, "attn_mask has shape [3, 3, 5] but must be [6, 3, 5]");
    o = {};
    o.additive_mask = mha::Tensor{floats.data(), {1, 1, 1, d.query_len, d.key_len}};
    expect_error(o, "additive_mask has shape [1, 1, 1, 3, 5] but must have 1 to 4 dimensions");
    o = {};
    o.key_padding_mask = mha::Tensor{nullptr, {d.batch, d.key_len}};
    expect_error(o, "key_padding_mask has a null data pointer");
}

}  // namespace
