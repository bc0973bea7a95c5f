// mha::varlen_attention, sequences packed without padding (flash_attn_varlen_func), against the
// double-precision reference of each sequence alone: causal prefills of different lengths
// (one and none among them), chunks over longer keys, grouped heads, windows, soft-capping,
// ALiBi, the log-sum-exp, a fused QKV projection's output read in place, each dtype; and the
// checks of the packing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attention.h"
#include "dtype.h"
#include "mha/mha.h"
#include "reference.h"
#include "test_seed.h"

namespace {

using mha::Causal;
using mha::DType;
using mha::StridedView;

struct VarlenCase {
    std::string name;
    int64_t heads, kv_heads, head_dim, value_dim;
    std::vector<int64_t> query_lens, key_lens;
    Causal causal = Causal::none;
    int64_t window_left = -1, window_right = -1;
    double softcap = 0;
    bool alibi = false;
    // q, k and v as views of one [T, H + 2 Hkv, d] tensor, as a fused projection gives them.
    bool fused_qkv = false;
};

template <typename T>
T narrow(float x) {
    T out;
    mha::detail::convert(&x, &out, 1);
    return out;
}
template <typename T>
float widen(T x) {
    float out;
    mha::detail::convert(&x, &out, 1);
    return out;
}

std::vector<int32_t> offsets(const std::vector<int64_t> &lengths) {
    std::vector<int32_t> cu{0};
    for (int64_t n : lengths) {
        cu.push_back(cu.back() + int32_t(n));
    }
    return cu;
}

double tolerance(DType dtype) {
    return dtype == DType::bf16 ? 1e-2 : dtype == DType::f16 ? 2e-3 : 1e-5;
}

template <typename T>
void expect_matches_reference(const VarlenCase &c) {
    const DType dtype = mha::detail::dtype_of<T>();
    const int64_t H = c.heads, Hkv = c.kv_heads, d = c.head_dim, dv = c.value_dim;
    const std::vector<int32_t> cu_q = offsets(c.query_lens), cu_k = offsets(c.key_lens);
    const int64_t Tq = cu_q.back(), Tk = cu_k.back();
    // Row strides of q, k, v and where each starts in `memory`.
    int64_t q_row = H * d, k_row = Hkv * d, v_row = Hkv * dv;
    int64_t q_at = 0, k_at = Tq * H * d, v_at = k_at + Tk * Hkv * d;
    if (c.fused_qkv) {
        q_row = k_row = v_row = (H + 2 * Hkv) * d;
        q_at = 0;
        k_at = H * d;
        v_at = (H + Hkv) * d;
    }
    const int64_t size = c.fused_qkv ? Tq * q_row : v_at + Tk * Hkv * dv;
    std::vector<T> memory(static_cast<size_t>(size));
    std::mt19937_64 rng(mha::testing::next_seed());
    std::uniform_real_distribution<float> u(-1, 1);
    for (T &x : memory) {
        x = narrow<T>(u(rng));
    }
    const auto element = [&](int64_t at, int64_t row_stride, int64_t row, int64_t head,
                             int64_t features, int64_t f) {
        return widen(memory[size_t(at + row * row_stride + head * features + f)]);
    };
    std::vector<T> output(size_t(Tq * H * dv), narrow<T>(NAN));
    std::vector<float> lse(size_t(H * Tq), NAN);
    std::vector<float> slopes;
    for (int64_t h = 0; h < H && c.alibi; h++) {
        slopes.push_back(std::pow(2.0f, -8.0f * float(h + 1) / float(H)));
    }
    mha::AttentionOptions options;
    options.causal = c.causal;
    options.window_left = c.window_left;
    options.window_right = c.window_right;
    options.softcap = float(c.softcap);
    if (c.alibi) {
        options.alibi_slopes = StridedView<const float>{slopes.data(), {H}, {}};
    }
    options.lse = StridedView<float>{lse.data(), {H, Tq}, {}};
    mha::varlen_attention(StridedView<const T>{memory.data() + q_at, {Tq, H, d}, {q_row, d, 1}},
                          StridedView<const T>{memory.data() + k_at, {Tk, Hkv, d}, {k_row, d, 1}},
                          StridedView<const T>{memory.data() + v_at, {Tk, Hkv, dv}, {v_row, dv, 1}},
                          StridedView<const int32_t>{cu_q.data(), {int64_t(cu_q.size())}, {}},
                          StridedView<const int32_t>{cu_k.data(), {int64_t(cu_k.size())}, {}},
                          StridedView<T>{output.data(), {Tq, H, dv}, {}}, options);

    for (size_t b = 0; b + 1 < cu_q.size(); b++) {
        SCOPED_TRACE(::testing::Message() << "sequence " << b);
        const int64_t q0 = cu_q[b], Sq = cu_q[b + 1] - q0, k0 = cu_k[b], Sk = cu_k[b + 1] - k0;
        std::vector<float> got, got_lse;  // [H, Sq, dv] and [H, Sq]
        for (int64_t h = 0; h < H; h++) {
            for (int64_t i = 0; i < Sq; i++) {
                for (int64_t f = 0; f < dv; f++) {
                    got.push_back(widen(output[size_t(((q0 + i) * H + h) * dv + f)]));
                }
                got_lse.push_back(lse[size_t(h * Tq + q0 + i)]);
            }
        }
        if (Sq == 0) {
            continue;
        }
        if (Sk == 0) {
            EXPECT_TRUE(std::all_of(got.begin(), got.end(), [](float x) { return x == 0; }));
            EXPECT_TRUE(std::all_of(got_lse.begin(), got_lse.end(),
                                    [](float x) { return x == -INFINITY; }));
            continue;
        }
        mha::reference::AttentionProblem p;
        p.heads = H;
        p.kv_heads = Hkv;
        p.query_len = Sq;
        p.key_len = Sk;
        p.head_dim = d;
        p.value_dim = dv;
        p.causal = c.causal;
        p.window_left = c.window_left;
        p.window_right = c.window_right;
        p.softcap = c.softcap;
        p.alibi_slopes = slopes;
        for (int64_t h = 0; h < H; h++) {
            for (int64_t i = 0; i < Sq; i++) {
                for (int64_t f = 0; f < d; f++) {
                    p.query.push_back(element(q_at, q_row, q0 + i, h, d, f));
                }
            }
        }
        for (int64_t h = 0; h < Hkv; h++) {
            for (int64_t j = 0; j < Sk; j++) {
                for (int64_t f = 0; f < d; f++) {
                    p.key.push_back(element(k_at, k_row, k0 + j, h, d, f));
                }
                for (int64_t f = 0; f < dv; f++) {
                    p.value.push_back(element(v_at, v_row, k0 + j, h, dv, f));
                }
            }
        }
        const mha::reference::AttentionResult want = mha::reference::attention(p);
        EXPECT_LT(mha::reference::relative_l2(got, want.output), tolerance(dtype));
        EXPECT_LT(mha::reference::relative_l2(got_lse, want.lse), 1e-5);
    }
}

std::vector<VarlenCase> cases() {
    std::vector<VarlenCase> all = {
        {"causal_prefill_gqa",
         6,
         2,
         64,
         64,
         {37, 1, 13, 64},
         {37, 1, 13, 64},
         Causal::bottom_right},
        {"chunks_over_longer_keys", 3, 1, 17, 17, {9, 5, 40}, {30, 5, 71}, Causal::bottom_right},
        {"window_softcap_alibi", 4, 4, 128, 128, {50, 7}, {50, 7}, Causal::none, 8, 8, 30.0, true},
        {"empty_sequences", 2, 1, 32, 48, {0, 3, 4, 2}, {2, 0, 4, 9}},
        {"fused_qkv", 4, 2, 64, 64, {11, 29, 3}, {11, 29, 3}, Causal::bottom_right},
    };
    all.back().fused_qkv = true;
    return all;
}

class Varlen : public ::testing::TestWithParam<VarlenCase> {};

TEST_P(Varlen, EverySequenceMatchesTheReference) {
    {
        SCOPED_TRACE("f32");
        expect_matches_reference<float>(GetParam());
    }
    {
        SCOPED_TRACE("bf16");
        expect_matches_reference<mha::bfloat16>(GetParam());
    }
    {
        SCOPED_TRACE("f16");
        expect_matches_reference<mha::float16>(GetParam());
    }
}

INSTANTIATE_TEST_SUITE_P(Cases, Varlen, ::testing::ValuesIn(cases()),
                         [](const auto &info) { return info.param.name; });

// The packing's checks name the argument, and nothing is written when one fails.
TEST(VarlenErrors, PackingIsCheckedBeforeAnythingIsWritten) {
    std::vector<float> q(5 * 2 * 8, 0.5f), k(7 * 1 * 8, 0.25f), out(5 * 2 * 8, 7.0f);
    std::vector<float> lse(2 * 5);
    const auto expect_error = [&](const std::string &expected, std::vector<int32_t> cu_q,
                                  std::vector<int32_t> cu_k, mha::AttentionOptions options = {},
                                  std::vector<int64_t> out_shape = {5, 2, 8}) {
        try {
            mha::varlen_attention(
                StridedView<const float>{q.data(), {5, 2, 8}, {}},
                StridedView<const float>{k.data(), {7, 1, 8}, {}},
                StridedView<const float>{k.data(), {7, 1, 8}, {}},
                StridedView<const int32_t>{cu_q.data(), {int64_t(cu_q.size())}, {}},
                StridedView<const int32_t>{cu_k.data(), {int64_t(cu_k.size())}, {}},
                StridedView<float>{out.data(), out_shape, {}}, options);
            ADD_FAILURE() << "no error; expected: " << expected;
        } catch (const mha::Error &e) {
            EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
        }
        EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float x) { return x == 7.0f; }));
    };
    expect_error("cu_seqlens_q[0] is 1: the offsets start at 0", {1, 5}, {0, 7});
    expect_error("cu_seqlens_k[2] is 3, less than the 4 before it", {0, 2, 5}, {0, 4, 3, 7});
    expect_error("cu_seqlens_q[2] is 4 but query has 5 rows", {0, 2, 4}, {0, 3, 7});
    expect_error("cu_seqlens_k has 3 offsets but cu_seqlens_q 2", {0, 5}, {0, 3, 7});
    expect_error("output has shape [5, 2, 7] but must be [total_q, H, dv] = [5, 2, 8]", {0, 5},
                 {0, 7}, {}, {5, 2, 7});
    mha::AttentionOptions masked;
    std::vector<uint8_t> keep(35, 1);
    masked.mask = mha::AttentionMask{StridedView<const uint8_t>{keep.data(), {5, 7}, {}}};
    expect_error("varlen_attention takes no mask", {0, 5}, {0, 7}, masked);
    mha::AttentionOptions bad_lse;
    bad_lse.lse = StridedView<float>{lse.data(), {5, 2}, {}};
    expect_error("lse has shape [5, 2] but must be [H, total_q] = [2, 5]", {0, 5}, {0, 7}, bad_lse);
    // A later sequence's options fail its own check (a causal window past the diagonal) before
    // the first is computed.
    mha::AttentionOptions past;
    past.causal = Causal::bottom_right;
    past.window_right = 2;
    expect_error("window_right 2 with causal attention", {0, 2, 5}, {0, 0, 7}, past);
}

}  // namespace
