// The attention core (mha::attention) against the double-precision reference of
// F.scaled_dot_product_attention: every mask form and broadcast, causal orders, sliding windows,
// soft-capping, ALiBi, grouped-query heads, head dims to 256, both layouts, each dtype.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "attention_problems.h"
#include "reference.h"
#include "test_seed.h"

namespace {

using mha::Causal;
using mha::DType;
using mha::MaskConvention;
using mha::problems::AttentionProblem;
using mha::problems::AttentionShape;
using mha::problems::Layout;

// ||got - want|| / ||want|| over the finite entries, and every non-finite one the same.
double relative_l2(const std::vector<float> &got, const std::vector<double> &want) {
    double diff = 0, norm = 0;
    for (size_t n = 0; n < want.size(); n++) {
        if (!std::isfinite(want[n])) {
            const bool same = std::isnan(want[n]) ? std::isnan(got[n]) : double(got[n]) == want[n];
            if (!same) {
                return std::numeric_limits<double>::infinity();
            }
            continue;
        }
        diff += (got[n] - want[n]) * (got[n] - want[n]);
        norm += want[n] * want[n];
    }
    return norm == 0 ? std::sqrt(diff) : std::sqrt(diff / norm);
}

// The bound of the relative L2 error against the reference fed the same rounded inputs: f32
// arithmetic throughout, the output rounded to its dtype.
double tolerance(DType dtype) {
    return dtype == DType::bf16 ? 1e-2 : dtype == DType::f16 ? 2e-3 : 1e-5;
}

void expect_matches_reference(AttentionProblem p, Layout layout = Layout::heads_outer,
                              DType dtype = DType::f32) {
    for (std::vector<float> *x : {&p.query, &p.key, &p.value}) {
        *x = mha::reference::rounded(*x, dtype);
    }
    const mha::problems::AttentionOutputs got = mha::problems::run_attention(p, layout, dtype);
    const mha::reference::AttentionResult want = mha::reference::attention(p);
    EXPECT_LT(relative_l2(got.output, want.output), tolerance(dtype)) << "output";
    // The log-sum-exp is of f32 scores whatever the dtype: the inputs' rounding is the
    // reference's too.
    EXPECT_LT(relative_l2(got.lse, want.lse), 1e-5) << "lse";
}

std::vector<float> alibi_slopes(int64_t heads) {
    std::vector<float> slopes;
    for (int64_t h = 0; h < heads; h++) {
        slopes.push_back(std::pow(2.0f, -8.0f * float(h + 1) / float(heads)));
    }
    return slopes;
}

// One case: a shape and what the call adds to it.
struct Case {
    std::string name;
    AttentionShape shape;
    // A mask: none (empty shape), boolean or float.
    std::vector<int64_t> mask_shape;
    bool mask_is_bool = true;
    MaskConvention convention = MaskConvention::keep;
    Causal causal = Causal::none;
    int64_t window_left = -1, window_right = -1;
    double softcap = 0;
    bool alibi = false;
    Layout layout = Layout::heads_outer;
    DType dtype = DType::f32;
};

AttentionProblem problem_of(const Case &c) {
    AttentionProblem p =
        mha::problems::random_attention_problem(c.shape, mha::testing::next_seed());
    if (!c.mask_shape.empty()) {
        mha::problems::add_random_attention_mask(p, c.mask_is_bool, c.mask_shape,
                                                 mha::testing::next_seed(), c.convention);
    }
    p.causal = c.causal;
    p.window_left = c.window_left;
    p.window_right = c.window_right;
    p.softcap = c.softcap;
    if (c.alibi) {
        p.alibi_slopes = alibi_slopes(p.heads);
    }
    return p;
}

// B, H, Hkv, Sq, Sk, d, dv.
const AttentionShape kGqa{2, 4, 2, 37, 53, 64, 64};
const AttentionShape kSelf{1, 3, 3, 41, 41, 32, 32};

// A case of `shape`, changed by `change`.
template <typename Change>
Case make_case(std::string name, const AttentionShape &shape, Change change) {
    Case c;
    c.name = std::move(name);
    c.shape = shape;
    change(c);
    return c;
}
Case make_case(std::string name, const AttentionShape &shape) {
    return make_case(std::move(name), shape, [](Case &) {});
}

std::vector<Case> cases() {
    std::vector<Case> all;
    for (int64_t d : {17, 64, 72, 80, 96, 128, 256}) {
        all.push_back(make_case("head_dim_" + std::to_string(d), {2, 4, 2, 29, 43, d, d}));
    }
    all.push_back(make_case("value_dim_differs", {1, 2, 1, 13, 19, 24, 40}));
    all.push_back(make_case("all_ones", {1, 1, 1, 1, 1, 1, 1}));
    all.push_back(make_case("one_query_long_context", {1, 8, 2, 1, 301, 64, 64}));
    all.push_back(make_case("one_key", {2, 2, 2, 7, 1, 16, 16}));
    all.push_back(make_case("multi_query", {2, 6, 1, 11, 23, 48, 48}));
    all.push_back(
        make_case("heads_inner_layout", kGqa, [](Case &c) { c.layout = Layout::heads_inner; }));
    // Rows whose features are not contiguous: copied for the kernel, and the output copied out.
    const auto features_strided = [](Case &c) {
        c.layout = Layout::features_strided;
    };
    all.push_back(make_case("features_strided", kGqa, features_strided));
    all.push_back(make_case("step_features_strided", {2, 4, 2, 1, 53, 64, 64}, features_strided));
    // Masks of every rank, broadcast, boolean in both conventions and float.
    for (const auto &[name, shape] :
         std::vector<std::pair<std::string, std::vector<int64_t>>>{{"sq_sk", {37, 53}},
                                                                   {"padding", {2, 1, 1, 53}},
                                                                   {"per_head", {4, 37, 53}},
                                                                   {"full", {2, 4, 37, 53}},
                                                                   {"keys_only", {53}},
                                                                   {"single_element", {1}},
                                                                   {"per_query", {2, 1, 37, 1}}}) {
        all.push_back(make_case("bool_mask_" + name, kGqa, [&](Case &c) { c.mask_shape = shape; }));
        all.push_back(make_case("float_mask_" + name, kGqa, [&](Case &c) {
            c.mask_shape = shape;
            c.mask_is_bool = false;
        }));
    }
    all.push_back(make_case("bool_mask_block_convention", kGqa, [](Case &c) {
        c.mask_shape = {2, 1, 37, 53};
        c.convention = MaskConvention::block;
    }));
    // Causal orders and windows, with the key tiles skipped at both ends.
    for (Causal causal : {Causal::top_left, Causal::bottom_right}) {
        const std::string name = causal == Causal::top_left ? "top_left" : "bottom_right";
        all.push_back(make_case("causal_" + name, kGqa, [&](Case &c) { c.causal = causal; }));
        all.push_back(make_case("causal_" + name + "_more_queries", {1, 2, 2, 61, 29, 32, 32},
                                [&](Case &c) { c.causal = causal; }));
        all.push_back(make_case("causal_" + name + "_window_7", kGqa, [&](Case &c) {
            c.causal = causal;
            c.window_left = 7;
        }));
        all.push_back(make_case("causal_" + name + "_padding", kGqa, [&](Case &c) {
            c.causal = causal;
            c.mask_shape = {2, 1, 1, 53};
        }));
    }
    all.push_back(make_case("window_both_sides", kSelf, [](Case &c) {
        c.window_left = 5;
        c.window_right = 3;
    }));
    all.push_back(make_case("window_left_only", kGqa, [](Case &c) { c.window_left = 9; }));
    all.push_back(make_case("window_right_only", kGqa, [](Case &c) { c.window_right = 4; }));
    all.push_back(make_case("window_of_one_key", kSelf, [](Case &c) {
        c.causal = Causal::top_left;
        c.window_left = 0;
    }));
    all.push_back(make_case("long_window", {1, 2, 1, 300, 300, 64, 64}, [](Case &c) {
        c.causal = Causal::top_left;
        c.window_left = 100;
    }));
    // Soft-capping and ALiBi, alone and with the rest.
    all.push_back(make_case("softcap", kGqa, [](Case &c) { c.softcap = 0.5; }));
    all.push_back(make_case("alibi", kGqa, [](Case &c) { c.alibi = true; }));
    all.push_back(make_case("alibi_causal", kGqa, [](Case &c) {
        c.alibi = true;
        c.causal = Causal::bottom_right;
    }));
    all.push_back(make_case("gemma2_softcap_window_padding", kGqa, [](Case &c) {
        c.mask_shape = {2, 1, 1, 53};
        c.causal = Causal::bottom_right;
        c.window_left = 11;
        c.softcap = 0.5;
    }));
    all.push_back(make_case("everything", kGqa, [](Case &c) {
        c.mask_shape = {2, 4, 37, 53};
        c.mask_is_bool = false;
        c.causal = Causal::top_left;
        c.window_left = 13;
        c.softcap = 0.7;
        c.alibi = true;
        c.layout = Layout::heads_inner;
    }));
    // One query row per head (the single-query kernels, which read K and V where they lie):
    // head sizes off and on whole vectors, values of another size, every mask form, a decode
    // step's orders and windows, modified scores, transformers' layout and 16 bits.
    const AttentionShape kStep{2, 8, 2, 1, 1031, 64, 64};
    for (int64_t d : {17, 32, 128, 256}) {
        all.push_back(make_case("step_head_dim_" + std::to_string(d), {1, 4, 2, 1, 67, d, d}));
    }
    all.push_back(make_case("step_value_dim_differs", {1, 2, 1, 1, 19, 24, 40}));
    all.push_back(make_case("step_one_key", {3, 2, 2, 1, 1, 16, 16}));
    all.push_back(make_case("step_long_cache", kStep));
    all.push_back(make_case("step_padding", kStep, [](Case &c) {
        c.mask_shape = {2, 1, 1, 1031};
    }));
    all.push_back(make_case("step_float_mask_per_head", kStep, [](Case &c) {
        c.mask_shape = {8, 1, 1031};
        c.mask_is_bool = false;
    }));
    all.push_back(make_case("step_window_heads_inner", kStep, [](Case &c) {
        c.causal = Causal::bottom_right;
        c.window_left = 100;
        c.layout = Layout::heads_inner;
    }));
    all.push_back(make_case("step_softcap_alibi_padding", kStep, [](Case &c) {
        c.mask_shape = {2, 1, 1, 1031};
        c.causal = Causal::bottom_right;
        c.softcap = 0.5;
        c.alibi = true;
    }));
    // The query heads sharing a key/value head are the rows of the single-query kernels' tiles:
    // groups of 3 (rows past the group in a tile) and of 6 (one key/value head for all).
    all.push_back(
        make_case("step_group_of_3_per_head_mask_alibi", {2, 9, 3, 1, 77, 80, 80}, [](Case &c) {
            c.mask_shape = {9, 1, 77};
            c.alibi = true;
        }));
    all.push_back(make_case("step_multi_query_window", {2, 6, 1, 1, 45, 32, 32}, [](Case &c) {
        c.causal = Causal::bottom_right;
        c.window_left = 20;
    }));
    all.push_back(make_case("step_bf16", kStep, [](Case &c) { c.dtype = DType::bf16; }));
    // 16-bit tensors.
    for (DType dtype : {DType::bf16, DType::f16}) {
        const std::string name = dtype == DType::bf16 ? "bf16" : "f16";
        all.push_back(make_case(name, kGqa, [&](Case &c) { c.dtype = dtype; }));
        all.push_back(make_case(name + "_features_strided", kGqa, [&](Case &c) {
            c.dtype = dtype;
            c.layout = Layout::features_strided;
        }));
        all.push_back(make_case(name + "_causal_padding_heads_inner", kGqa, [&](Case &c) {
            c.dtype = dtype;
            c.mask_shape = {2, 1, 1, 53};
            c.causal = Causal::bottom_right;
            c.layout = Layout::heads_inner;
        }));
    }
    return all;
}

class AttentionCore : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionCore, MatchesReference) {
    const Case &c = GetParam();
    expect_matches_reference(problem_of(c), c.layout, c.dtype);
}

INSTANTIATE_TEST_SUITE_P(Cases, AttentionCore, ::testing::ValuesIn(cases()),
                         [](const auto &info) { return info.param.name; });

// Every f32 case again in bf16: the bf16 kernels (AMX's tile products, or products of bf16
// pairs) where the CPU has a bf16 instruction set, the f32 ones on widened tensors elsewhere.
std::vector<Case> bf16_cases() {
    std::vector<Case> all;
    for (Case c : cases()) {
        if (c.dtype == DType::f32) {
            c.dtype = DType::bf16;
            all.push_back(c);
        }
    }
    return all;
}
INSTANTIATE_TEST_SUITE_P(Bf16Cases, AttentionCore, ::testing::ValuesIn(bf16_cases()),
                         [](const auto &info) { return info.param.name; });

// The semantics below hold in every dtype the kernels read.
class AttentionSemantics : public ::testing::TestWithParam<DType> {};

// A row that no key weighs gets a zero output and a log-sum-exp of -inf, as SDPA gives: every key
// left out by a boolean mask, -inf added by a float mask, or outside its window.
TEST_P(AttentionSemantics, RowsNoKeyWeighsAreZero) {
    AttentionProblem p = mha::problems::random_attention_problem(kSelf, mha::testing::next_seed());
    mha::problems::add_random_attention_mask(p, true, {41, 41}, mha::testing::next_seed());
    for (int64_t j = 0; j < 41; j++) {
        p.bools[3 * 41 + j] = 0;  // query 3 keeps no key
    }
    expect_matches_reference(p, Layout::heads_outer, GetParam());
    const auto got = mha::problems::run_attention(p, Layout::heads_outer, GetParam());
    for (int64_t c = 0; c < 32; c++) {
        EXPECT_EQ(got.output[3 * 32 + c], 0.0f);
    }
    EXPECT_EQ(got.lse[3], -std::numeric_limits<float>::infinity());

    AttentionProblem floats =
        mha::problems::random_attention_problem(kSelf, mha::testing::next_seed());
    mha::problems::add_random_attention_mask(floats, false, {41, 41}, mha::testing::next_seed());
    for (int64_t j = 0; j < 41; j++) {
        floats.floats[5 * 41 + j] = -std::numeric_limits<float>::infinity();
    }
    expect_matches_reference(floats, Layout::heads_outer, GetParam());

    // Queries before the first key in a bottom-right order (Sq > Sk) see none.
    AttentionProblem early = mha::problems::random_attention_problem({1, 2, 2, 19, 7, 16, 16},
                                                                     mha::testing::next_seed());
    early.causal = Causal::bottom_right;
    expect_matches_reference(early, Layout::heads_outer, GetParam());

    // A decode step (the single-query kernels) whose batch row 1 keeps no key.
    AttentionProblem step = mha::problems::random_attention_problem({2, 2, 1, 1, 33, 16, 16},
                                                                    mha::testing::next_seed());
    mha::problems::add_random_attention_mask(step, true, {2, 1, 1, 33}, mha::testing::next_seed());
    for (int64_t j = 0; j < 33; j++) {
        step.bools[33 + j] = 0;
    }
    expect_matches_reference(step, Layout::heads_outer, GetParam());
    const auto step_got = mha::problems::run_attention(step, Layout::heads_outer, GetParam());
    for (int64_t n = 2 * 16; n < 4 * 16; n++) {
        EXPECT_EQ(step_got.output[n], 0.0f) << "element " << n;
    }
    EXPECT_EQ(step_got.lse[2], -std::numeric_limits<float>::infinity());
    EXPECT_EQ(step_got.lse[3], -std::numeric_limits<float>::infinity());
}

// NaN reaches what it touches: a NaN query makes its row NaN; a NaN key every row that sees it.
TEST_P(AttentionSemantics, NanPropagatesAsInSdpa) {
    AttentionProblem p = mha::problems::random_attention_problem(kSelf, mha::testing::next_seed());
    p.query[7 * 32 + 3] = std::nanf("");
    p.key[(1 * 41 + 20) * 32 + 5] = std::nanf("");  // head 1, key 20
    p.causal = Causal::top_left;
    const auto got = mha::problems::run_attention(p, Layout::heads_outer, GetParam());
    const auto want = mha::reference::attention(p);
    for (size_t n = 0; n < want.output.size(); n++) {
        ASSERT_EQ(std::isnan(got.output[n]), std::isnan(want.output[n])) << "element " << n;
    }
    EXPECT_TRUE(std::isnan(got.output[7 * 32]));

    // One query row: a NaN key makes the rows of its head NaN, and only those.
    AttentionProblem step = mha::problems::random_attention_problem({1, 4, 2, 1, 29, 16, 16},
                                                                    mha::testing::next_seed());
    step.key[(1 * 29 + 11) * 16 + 2] = std::nanf("");  // key head 1 (query heads 2, 3), key 11
    const auto step_got = mha::problems::run_attention(step, Layout::heads_outer, GetParam());
    for (int64_t h = 0; h < 4; h++) {
        EXPECT_EQ(std::isnan(step_got.output[h * 16]), h >= 2) << "head " << h;
    }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, AttentionSemantics, ::testing::Values(DType::f32, DType::bf16),
                         [](const auto &info) {
                             return std::string(mha::contract::dtype_name(info.param));
                         });

}  // namespace
