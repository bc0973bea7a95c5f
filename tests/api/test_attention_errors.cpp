// mha::attention's argument checks: each bad shape, stride or option raises mha::Error naming
// the argument, before anything is read.
#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "mha/mha.h"

namespace {

using mha::StridedView;

struct Tensors {
    // q [1, 4, 3, 8], k and v [1, 2, 5, 8], out [1, 4, 3, 8].
    std::vector<float> q = std::vector<float>(96, 0.5f), k = std::vector<float>(80, 0.25f),
                       v = std::vector<float>(80, 1.0f), out = std::vector<float>(96);
    StridedView<const float> query{q.data(), {1, 4, 3, 8}, {}};
    StridedView<const float> key{k.data(), {1, 2, 5, 8}, {}};
    StridedView<const float> value{v.data(), {1, 2, 5, 8}, {}};
    StridedView<float> output{out.data(), {1, 4, 3, 8}, {}};
};

void expect_error(const std::string &expected, const std::function<void(Tensors &)> &change,
                  mha::AttentionOptions options = {}) {
    Tensors t;
    change(t);
    try {
        mha::attention(t.query, t.key, t.value, t.output, options);
        FAIL() << "no error; expected: " << expected;
    } catch (const mha::Error &e) {
        EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
}

TEST(AttentionErrors, ShapesNameTheArgument) {
    expect_error("query has shape [4, 3, 8] but must have 4 dimensions", [](Tensors &t) {
        t.query.shape = {4, 3, 8};
    });
    expect_error("key has 3 features but query has 8", [](Tensors &t) {
        t.key.shape = {1, 2, 5, 3};
    });
    expect_error("value has 4 positions but key has 5", [](Tensors &t) {
        t.value.shape = {1, 2, 4, 8};
    });
    expect_error("query has 4 heads, not a multiple of key's 3", [](Tensors &t) {
        t.key.shape = {1, 3, 5, 8};
        t.value.shape = {1, 3, 5, 8};
    });
    expect_error("output has shape [1, 4, 3, 7] but must be [B, H, Sq, dv] = [1, 4, 3, 8]",
                 [](Tensors &t) {
                     t.output.shape = {1, 4, 3, 7};
                 });
    expect_error("query has shape [1, 4, 0, 8]: dimension 2 is 0, must be >= 1", [](Tensors &t) {
        t.query.shape = {1, 4, 0, 8};
    });
    expect_error("key has a null data pointer", [](Tensors &t) { t.key.data = nullptr; });
}

TEST(AttentionErrors, StridesNameTheArgument) {
    expect_error("query has 3 strides for its 4 dimensions", [](Tensors &t) {
        t.query.strides = {1, 2, 3};
    });
    expect_error("key has stride -8 in dimension 2: strides must be >= 0", [](Tensors &t) {
        t.key.strides = {80, 40, -8, 1};
    });
    expect_error("output has strides [96, 24, 4, 1] over shape [1, 4, 3, 8]: its elements overlap",
                 [](Tensors &t) {
                     t.output.strides = {96, 24, 4, 1};
                 });
    expect_error("output has strides [96, 0, 8, 1] over shape [1, 4, 3, 8]: its elements overlap",
                 [](Tensors &t) {
                     t.output.strides = {96, 0, 8, 1};
                 });
    expect_error("spans more than the 2147483647 bytes", [](Tensors &t) {
        t.key.strides = {1, int64_t(1) << 40, 8, 1};
    });
}

TEST(AttentionErrors, OptionsNameThemselves) {
    const auto none = [](Tensors &) {
    };
    mha::AttentionOptions o;
    o.scale = std::numeric_limits<float>::infinity();
    expect_error("scale inf is not finite", none, o);
    o = {};
    o.window_left = -2;
    expect_error("window_left -2 must be -1 (unbounded) or >= 0", none, o);
    o = {};
    o.causal = mha::Causal::top_left;
    o.window_right = 2;
    expect_error("window_right 2 with causal attention", none, o);
    o = {};
    o.causal = static_cast<mha::Causal>(7);
    expect_error("causal 7 is none of none, top_left and bottom_right", none, o);
    o = {};
    o.softcap = -1;
    expect_error("softcap -1 must be finite and >= 0", none, o);
    o = {};
    std::vector<float> slopes(3);
    o.alibi_slopes = StridedView<const float>{slopes.data(), {3}, {}};
    expect_error("alibi_slopes has 3 heads but query has 4", none, o);
    o = {};
    std::vector<float> lse(12);
    o.lse = StridedView<float>{lse.data(), {1, 4, 2}, {}};
    expect_error("lse has shape [1, 4, 2] but must be [B, H, Sq] = [1, 4, 3]", none, o);
}

TEST(AttentionErrors, MasksBroadcastRightAligned) {
    const auto none = [](Tensors &) {
    };
    std::vector<uint8_t> bytes(100);
    mha::AttentionOptions o;
    o.mask = mha::AttentionMask{StridedView<const uint8_t>{bytes.data(), {4, 5}, {}}};
    expect_error(
        "mask has shape [4, 5] which does not broadcast to [B, H, Sq, Sk] = [1, 4, 3, 5]: "
        "dimension 0 is 4, but query length is 3",
        none, o);
    o.mask = mha::AttentionMask{StridedView<const uint8_t>{bytes.data(), {1, 1, 1, 1, 5}, {}}};
    expect_error("mask has shape [1, 1, 1, 1, 5] but must have 1 to 4 dimensions", none, o);
    o.mask = mha::AttentionMask{StridedView<const uint8_t>{bytes.data(), {3, 5}, {}},
                                static_cast<mha::MaskConvention>(9)};
    expect_error("mask has convention 9", none, o);
    // Every broadcast that torch accepts is accepted.
    Tensors t;
    for (const std::vector<int64_t> &shape : std::vector<std::vector<int64_t>>{
             {1}, {5}, {3, 5}, {4, 3, 5}, {1, 4, 1, 5}, {1, 1, 3, 1}}) {
        o.mask = mha::AttentionMask{StridedView<const uint8_t>{bytes.data(), shape, {}}};
        EXPECT_NO_THROW(mha::attention(t.query, t.key, t.value, t.output, o));
    }
}

}  // namespace
