// Bad input raises mha::Error naming the argument and its value; the module keeps working.
#include <gtest/gtest.h>

#include "HalideBuffer.h"
#include "checks.h"
#include "cpu_isa.h"
#include "halide_calls.h"
#include "problems.h"
#include "scratch_pool.h"

namespace {

using mha::MaskConvention;
using mha::reference::Dims;
using mha::reference::Problem;

// Expects `f` to throw mha::Error whose message contains `expected`.
template <typename F>
void expect_error(F &&f, const std::string &expected) {
    try {
        f();
        ADD_FAILURE() << "no mha::Error; expected \"" << expected << "\"";
    } catch (const mha::Error &e) {
        EXPECT_NE(std::string(e.what()).find(expected), std::string::npos)
            << "message: " << e.what() << "\nexpected to contain: " << expected;
    }
}

class ModuleErrors : public ::testing::Test {
protected:
    const Dims d{2, 5, 7, 12, 3};
    const Problem p = mha::problems::random_problem(d, 7);
    std::vector<float> output = std::vector<float>(d.batch * d.query_len * d.embed_dim);
    std::vector<float> weights =
        std::vector<float>(d.batch * d.num_heads * d.query_len * d.key_len);

    mha::Linear linear(int l) const {
        return {{p.weight[l].data(), {d.embed_dim, d.embed_dim}},
                mha::Tensor{p.bias[l].data(), {d.embed_dim}}};
    }
    mha::MutableTensor output_view() {
        return {output.data(), {d.batch, d.query_len, d.embed_dim}};
    }
    mha::MutableTensor weights_view() {
        return {weights.data(), {d.batch, d.num_heads, d.query_len, d.key_len}};
    }
    // Runs forward with the problem's tensors, replacing some by the caller's.
    void forward(const mha::Tensor &q, const mha::Tensor &k, const mha::Tensor &v,
                 const std::optional<mha::Mask> &mask = std::nullopt) {
        mha::problems::make_module(p).forward(q, k, v, output_view(), mask, weights_view());
    }
    mha::Tensor q() const { return mha::problems::query_view(p); }
    mha::Tensor k() const { return mha::problems::key_view(p); }
    mha::Tensor v() const { return mha::problems::value_view(p); }
};

TEST_F(ModuleErrors, EmbedDimNotDivisibleByHeads) {
    std::vector<float> w(510 * 510);
    const mha::Linear l{{w.data(), {510, 510}}, std::nullopt};
    expect_error([&] { mha::MultiHeadAttention(510, 8, l, l, l, l); },
                 "embed_dim 510 is not divisible by num_heads 8");
}

TEST_F(ModuleErrors, NonPositiveSizes) {
    const mha::Linear l = linear(0);
    expect_error([&] { mha::MultiHeadAttention(12, 0, l, l, l, l); }, "num_heads 0 must be >= 1");
    expect_error([&] { mha::MultiHeadAttention(-4, 2, l, l, l, l); }, "embed_dim -4 must be >= 1");
}

TEST_F(ModuleErrors, WeightAndBiasShapes) {
    // k_proj and v_proj may take other input features (kdim, vdim), q_proj and out_proj not.
    const mha::Linear bad_weight{{p.weight[2].data(), {8, 12}}, std::nullopt};
    expect_error(
        [&] { mha::MultiHeadAttention(12, 3, linear(0), linear(1), bad_weight, linear(3)); },
        "v_proj.weight has shape [8, 12] but must be [12, 12]");
    // 8 key/value features: not a whole number of heads of 4.
    const mha::Linear odd_kv{{p.weight[1].data(), {6, 12}}, std::nullopt};
    expect_error([&] { mha::MultiHeadAttention(12, 3, linear(0), odd_kv, odd_kv, linear(3)); },
                 "k_proj.weight has 6 output features: must be kv_heads x head_dim (4) with "
                 "kv_heads dividing num_heads 3");
    const mha::Linear narrow{{p.weight[0].data(), {12, 11}}, std::nullopt};
    expect_error([&] { mha::MultiHeadAttention(12, 3, narrow, linear(1), linear(2), linear(3)); },
                 "q_proj.weight has shape [12, 11] but must be [12, 12]");
    expect_error(
        [&] {
            mha::MultiHeadAttention::from_in_proj(12, 3, {p.weight[0].data(), {24, 12}},
                                                  std::nullopt, linear(3));
        },
        "in_proj_weight has shape [24, 12] but must be [36, 12]");
    mha::Linear bad_bias = linear(3);
    bad_bias.bias = mha::Tensor{p.bias[3].data(), {13}};
    expect_error([&] { mha::MultiHeadAttention(12, 3, linear(0), linear(1), linear(2), bad_bias); },
                 "out_proj.bias has shape [13] but must be [12]");
    const mha::Linear null_weight{{nullptr, {12, 12}}, std::nullopt};
    expect_error(
        [&] { mha::MultiHeadAttention(12, 3, null_weight, linear(1), linear(2), linear(3)); },
        "q_proj.weight has a null data pointer");
}

TEST_F(ModuleErrors, KeyAndValueRowsDiffer) {
    const mha::Tensor short_value{p.value.data(), {2, 6, 12}};
    expect_error([&] { forward(q(), k(), short_value); }, "key has 7 rows but value has 6");
}

TEST_F(ModuleErrors, BatchMismatch) {
    const mha::Tensor one_batch_key{p.key.data(), {1, 7, 12}};
    expect_error([&] { forward(q(), one_batch_key, v()); },
                 "key has batch 1 but query has batch 2");
}

TEST_F(ModuleErrors, EmbedDimMismatch) {
    const mha::Tensor wide_query{p.query.data(), {2, 2, 15}};
    expect_error([&] { forward(wide_query, k(), v()); },
                 "query has 15 features but the module's embed_dim is 12");
}

TEST_F(ModuleErrors, WrongRankAndEmptyDimensions) {
    const mha::Tensor flat{p.query.data(), {10, 12}};
    expect_error([&] { forward(flat, k(), v()); },
                 "query has shape [10, 12] but must have 3 dimensions");
    const mha::Tensor empty{p.query.data(), {2, 0, 12}};
    expect_error([&] { forward(empty, k(), v()); }, "query has shape [2, 0, 12]: dimension 1 is 0");
    const mha::Tensor null_key{nullptr, {2, 7, 12}};
    expect_error([&] { forward(q(), null_key, v()); }, "key has a null data pointer");
}

TEST_F(ModuleErrors, TooLargeForTheKernels) {
    const mha::Tensor huge{p.query.data(), {1 << 20, 1 << 20, 12}};
    expect_error([&] { forward(huge, k(), v()); }, "more than the 2147483647 bytes");
}

// Sizes at the kernels' addressing limit (2^31 - 1 bytes) and past int64, checked before
// anything is allocated or read: the tensors here point at memory that is never touched.
namespace limits {

const float *untouched = reinterpret_cast<const float *>(uintptr_t(64));
const uint8_t *untouched_bytes = reinterpret_cast<const uint8_t *>(uintptr_t(64));
constexpr int64_t k2_31 = int64_t(1) << 31, k2_32 = int64_t(1) << 32;

mha::Linear square(int64_t E) { return {{untouched, {E, E}}, std::nullopt}; }

TEST(SizeLimits, CheckedProducts) {
    using mha::contract::checked_product;
    EXPECT_EQ(checked_product({k2_31 - 1}), k2_31 - 1);
    EXPECT_EQ(checked_product({k2_32, k2_31 - 1}), k2_32 * (k2_31 - 1));
    EXPECT_EQ(checked_product({3037000499, 3037000499}), int64_t(3037000499) * 3037000499);
    EXPECT_EQ(checked_product({3037000500, 3037000500}), std::nullopt);  // past 2^63 - 1
    EXPECT_EQ(checked_product({k2_32, k2_31}), std::nullopt);            // 2^63
    EXPECT_EQ(checked_product({k2_32, k2_32, 0}), std::nullopt);         // wraps before the 0
}

TEST(SizeLimits, KernelBuffers) {
    const auto named = [] {
        return std::string("a buffer");
    };
    mha::detail::check_kernel_buffer({k2_31 - 1}, 1, named);
    expect_error([&] { mha::detail::check_kernel_buffer({k2_31}, 1, named); },
                 "a buffer is 2147483648 x 1 bytes = 2147483648 bytes, more than the 2147483647");
    expect_error(
        [&] {
            mha::detail::check_kernel_buffer({k2_32, k2_31}, 4, named);
        },
        "= over 2^63 bytes");
}

TEST(SizeLimits, EmbedDimAtAndPastTheLimit) {
    for (int64_t E : {k2_31 - 1, k2_31, k2_32}) {
        expect_error(
            [&] { mha::MultiHeadAttention(E, 1, square(E), square(E), square(E), square(E)); },
            "more than the 2147483647 bytes a kernel addresses");
    }
    const int64_t E = int64_t(1) << 62;  // 3·E would not fit int64
    expect_error(
        [&] {
            mha::MultiHeadAttention::from_in_proj(E, 1, {untouched, {3, 3}}, std::nullopt,
                                                  square(E));
        },
        "embed_dim 4611686018427387904 must be in [1, 2147483647]");
}

// A query of 1 GiB whose fused Q, K and V projection (three times its width) would be 3 GiB.
TEST(SizeLimits, PaddedProjection) {
    std::vector<float> w(64 * 64, 0.0f);
    const mha::Linear l{{w.data(), {64, 64}}, std::nullopt};
    const mha::MultiHeadAttention module(64, 1, l, l, l, l);
    const mha::Tensor query{untouched, {1, int64_t(1) << 22, 64}};
    const mha::MutableTensor output{const_cast<float *>(untouched), {1, int64_t(1) << 22, 64}};
    expect_error([&] { module.forward(query, query, query, output); },
                 "the Q, K and V projections of query [1, 4194304, 64], rows x padded features, "
                 "is 4194304 x 192 x 4 bytes = 3221225472 bytes");
}

// A 16 KiB key-padding mask that the kernels read at [B, H, Sq, Sk]: 2^31 bytes.
TEST(SizeLimits, MaskAtItsFullExtent) {
    std::vector<float> w(8 * 8, 0.0f);
    const mha::Linear l{{w.data(), {8, 8}}, std::nullopt};
    const mha::MultiHeadAttention module(8, 8, l, l, l, l);
    const mha::Tensor tokens{untouched, {1, 16384, 8}};
    mha::ForwardOptions options;
    options.key_padding_mask = mha::BoolTensor{untouched_bytes, {1, 16384}};
    expect_error(
        [&] {
            module.forward(tokens, tokens, tokens, {const_cast<float *>(untouched), {1, 16384, 8}},
                           options);
        },
        "key_padding_mask, which the kernels read at [B, H, Sq, Sk] = [1, 8, 16384, 16384], is 1 "
        "x 8 x 16384 x 16384 x 1 bytes = 2147483648 bytes");
    // The per-head weights an average is taken over: [1, 8, 2^14, 2^14] floats.
    mha::ForwardOptions averaged;
    averaged.weights = mha::MutableTensor{const_cast<float *>(untouched), {1, 16384, 16384}};
    averaged.average_weights = true;
    expect_error(
        [&] {
            module.forward(tokens, tokens, tokens, {const_cast<float *>(untouched), {1, 16384, 8}},
                           averaged);
        },
        "the per-head weights [B, H, Sq, Sk] they average is 1 x 8 x 16384 x 16384 x 4 bytes");
}

TEST(SizeLimits, KvCache) {
    std::vector<float> w(8 * 8, 0.0f);
    const mha::Linear l{{w.data(), {8, 8}}, std::nullopt};
    const mha::MultiHeadAttention module(8, 2, l, l, l, l);
    expect_error([&] { module.make_cache(int64_t(1) << 40, int64_t(1) << 40); },
                 "= over 2^63 bytes");
    expect_error([&] { module.make_cache(1, k2_31 / 8); },
                 "a cache of batch 1 and capacity 268435456 (its values, [batch, kv_heads, "
                 "capacity rounded up to 64, head_dim rounded up to 16]) is 1 x 2 x 268435456 "
                 "x 16 x 4 bytes");
}

}  // namespace limits

TEST_F(ModuleErrors, OutputAndWeightsShapes) {
    const auto module = mha::problems::make_module(p);
    const mha::MutableTensor small_output{output.data(), {2, 4, 12}};
    expect_error([&] { module.forward(q(), k(), v(), small_output); },
                 "output has shape [2, 4, 12] but must be [2, 5, 12]");
    const mha::MutableTensor bad_weights{weights.data(), {2, 3, 5, 6}};
    expect_error([&] { module.forward(q(), k(), v(), output_view(), std::nullopt, bad_weights); },
                 "weights has shape [2, 3, 5, 6] but must be [2, 3, 5, 7]");
    mha::ForwardOptions averaged;
    averaged.weights = mha::MutableTensor{weights.data(), {2, 3, 5, 7}};
    averaged.average_weights = true;
    expect_error([&] { module.forward(q(), k(), v(), output_view(), averaged); },
                 "weights has shape [2, 3, 5, 7] but must have 3 dimensions [batch, query length, "
                 "key length]");
}

TEST_F(ModuleErrors, MaskThatDoesNotBroadcast) {
    std::vector<uint8_t> m(2 * 3 * 5 * 7, 1);
    expect_error(
        [&] {
            forward(q(), k(), v(), mha::Mask{{m.data(), {1, 1, 5, 6}}, MaskConvention::keep});
        },
        "mask has shape [1, 1, 5, 6] which does not broadcast to [B, H, Sq, Sk] = [2, 3, 5, 7]: "
        "dimension 3 is 6, but key length is 7");
    expect_error(
        [&] {
            forward(q(), k(), v(), mha::Mask{{m.data(), {3, 1, 1, 7}}, MaskConvention::block});
        },
        "dimension 0 is 3, but batch is 2");
    expect_error(
        [&] {
            forward(q(), k(), v(), mha::Mask{{m.data(), {1, 2, 3, 5, 7}}, MaskConvention::keep});
        },
        "mask has shape [1, 2, 3, 5, 7] but must have 1 to 4 dimensions");
    expect_error(
        [&] {
            forward(q(), k(), v(), mha::Mask{{nullptr, {1, 1, 5, 7}}, MaskConvention::keep});
        },
        "mask has a null data pointer");
}

// A decode step's arguments: a module of E = 12, its cache of one row of 4 tokens (empty), one
// token, its output and a key padding that hides nothing.
struct OneTokenStep {
    mha::MultiHeadAttention module =
        mha::problems::make_module(mha::problems::random_problem({1, 1, 1, 12, 3}, 8));
    mha::KvCache cache = module.make_cache(1, 4);
    std::vector<float> token = std::vector<float>(12), out = std::vector<float>(12);
    std::vector<uint8_t> keep = std::vector<uint8_t>(4, 1);
};

// The module copies its weights from host memory on every device, and decode steps run on the
// CPU: a device handle there is an error, not a pointer read (tests/fuzz found both).
TEST_F(ModuleErrors, DeviceHandlesWhereTheHostIsRead) {
    mha::Linear on_device = linear(1);
    on_device.weight = {nullptr, {12, 12}, 0x1234};
    expect_error(
        [&] { mha::MultiHeadAttention(12, 3, linear(0), on_device, linear(2), linear(3)); },
        "k_proj.weight has a device_handle but weights are read from host memory");
    mha::Linear bias_on_device = linear(3);
    bias_on_device.bias = mha::Tensor{p.bias[3].data(), {12}, 0x1234};
    expect_error(
        [&] { mha::MultiHeadAttention(12, 3, linear(0), linear(1), linear(2), bias_on_device); },
        "out_proj.bias has a device_handle but weights are read from host memory");
    expect_error(
        [&] {
            mha::MultiHeadAttention::from_in_proj(12, 3, {nullptr, {36, 12}, 0x1234}, std::nullopt,
                                                  linear(3));
        },
        "in_proj_weight has a device_handle but weights are read from host memory");

    OneTokenStep s;
    expect_error(
        [&] {
            s.module.decode({nullptr, {1, 1, 12}, 0x1234}, s.cache, {s.out.data(), {1, 1, 12}});
        },
        "tokens has a device_handle but decode steps run on the cpu");
    expect_error(
        [&] {
            s.module.decode({s.token.data(), {1, 1, 12}}, s.cache, {nullptr, {1, 1, 12}, 0x1234});
        },
        "output has a device_handle but decode steps run on the cpu");
    expect_error(
        [&] {
            s.module.decode({s.token.data(), {1, 1, 12}}, s.cache, {s.out.data(), {1, 1, 12}},
                            mha::Mask{{nullptr, {1, 4}, 0x1234}, MaskConvention::keep});
        },
        "key_padding has a device_handle but decode steps run on the cpu");
    EXPECT_EQ(s.cache.lengths(), std::vector<int64_t>{0});
}

// Enumerations cast from integers the API does not define (tests/fuzz found them accepted).
TEST_F(ModuleErrors, EnumerationsOutOfRange) {
    expect_error(
        [&] {
            mha::MultiHeadAttention(12, 3, linear(0), linear(1), linear(2), linear(3),
                                    static_cast<mha::Device>(7));
        },
        "device 7 is none of cpu, cuda and opencl");
    std::vector<uint8_t> m(2 * 7, 1);
    expect_error(
        [&] {
            forward(q(), k(), v(),
                    mha::Mask{{m.data(), {2, 1, 1, 7}}, static_cast<MaskConvention>(2)});
        },
        "mask has convention 2, neither keep (0) nor block (1)");
    mha::ForwardOptions options;
    options.causal = static_cast<mha::Causal>(3);
    expect_error(
        [&] { mha::problems::make_module(p).forward(q(), k(), v(), output_view(), options); },
        "causal 3 is none of none, top_left and bottom_right");
    OneTokenStep s;
    expect_error(
        [&] {
            s.module.decode({s.token.data(), {1, 1, 12}}, s.cache, {s.out.data(), {1, 1, 12}},
                            mha::Mask{{s.keep.data(), {1, 4}}, static_cast<MaskConvention>(9)});
        },
        "key_padding has convention 9, neither keep (0) nor block (1)");
}

// kernel_name() checks the arguments as forward() does, the weights included.
TEST_F(ModuleErrors, KernelNameChecksTheWeights) {
    mha::ForwardOptions options;
    options.weights = mha::MutableTensor{weights.data(), {2, 3, 5, 7, 1}};
    expect_error([&] { mha::problems::make_module(p).kernel_name(q(), k(), v(), options); },
                 "weights has shape [2, 3, 5, 7, 1] but must have 4 dimensions");
}

TEST_F(ModuleErrors, ModuleStillWorksAfterErrors) {
    const auto module = mha::problems::make_module(p);
    const mha::Tensor short_value{p.value.data(), {2, 6, 12}};
    EXPECT_THROW(module.forward(q(), k(), short_value, output_view()), mha::Error);
    module.forward(q(), k(), v(), output_view(), std::nullopt, weights_view());
    const auto want = mha::reference::forward(p);
    EXPECT_LT(mha::reference::relative_l2(output, want.output), 1e-5);
    EXPECT_LT(mha::reference::relative_l2(weights, want.weights), 1e-5);
}

// An allocation that fails inside a kernel (the scratch pool refusing, as when memory runs out)
// raises mha::Error from that call; the module and a KV cache then work on the next call.
TEST(FaultInjection, FailedAllocationInsideAKernel) {
    const Problem p = mha::problems::random_problem({2, 67, 67, 48, 4}, 5);
    const auto module = mha::problems::make_module(p);
    std::vector<float> output(2 * 67 * 48);
    const mha::MutableTensor out{output.data(), {2, 67, 48}};
    const auto want = mha::reference::forward(p);
    for (int successes : {0, 1, 2}) {
        mha::detail::scratch_fail_allocation_after(successes);
        expect_error(
            [&] {
                module.forward(mha::problems::query_view(p), mha::problems::key_view(p),
                               mha::problems::value_view(p), out);
            },
            "Out of memory");
        module.forward(mha::problems::query_view(p), mha::problems::key_view(p),
                       mha::problems::value_view(p), out);
        EXPECT_LT(mha::reference::relative_l2(output, want.output), 1e-5) << successes;
    }
}

TEST(FaultInjection, FailedAllocationInADecodeStepLeavesTheCache) {
    const Problem p = mha::problems::random_problem({1, 1, 70, 32, 4}, 9);
    const auto module = mha::problems::make_module(p);
    mha::KvCache cache = module.make_cache(1, 80);
    std::vector<float> output(70 * 32);
    const mha::Tensor prompt{p.key.data(), {1, 70, 32}};
    // The projection's first allocations and some of the attention kernel's, which allocates
    // per task.
    for (int successes : {0, 1, 2, 10, 100}) {
        mha::detail::scratch_fail_allocation_after(successes);
        expect_error(
            [&] {
                module.decode(prompt, cache, {output.data(), {1, 70, 32}});
            },
            "Out of memory");
        EXPECT_EQ(cache.lengths(), std::vector<int64_t>{0}) << "after " << successes;
    }
    mha::detail::scratch_fail_allocation_after(-1);
    module.decode(prompt, cache, {output.data(), {1, 70, 32}});
    EXPECT_EQ(cache.lengths(), std::vector<int64_t>{70});
    // As a cache that never saw a failure.
    mha::KvCache fresh = module.make_cache(1, 80);
    std::vector<float> fresh_output(70 * 32);
    module.decode(prompt, fresh, {fresh_output.data(), {1, 70, 32}});
    EXPECT_EQ(output, fresh_output);
}

// A thread count holds from the next call on, and computes the same result.
TEST_F(ModuleErrors, SetNumThreads) {
    expect_error([] { mha::set_num_threads(-1); }, "set_num_threads: threads -1 is negative");
    const auto module = mha::problems::make_module(p);
    const auto want = mha::reference::forward(p);
    for (int threads : {1, 3, 0}) {
        mha::set_num_threads(threads);
        module.forward(q(), k(), v(), output_view());
        EXPECT_LT(mha::reference::relative_l2(output, want.output), 1e-5) << threads;
    }
}

// A failure inside a kernel (here: a value buffer shorter than the key buffer, which the public
// API would have refused) comes back as mha::Error carrying Halide's own message, and nothing is
// printed or aborted.
TEST_F(ModuleErrors, HalideRuntimeErrorIsRaised) {
    using mha::contract::ArgId;
    mha::detail::install_runtime_hooks();
    const mha::contract::KernelVariant variant{mha::contract::KernelOp::forward,
                                               mha::contract::MaskKind::none, false, false};
    const auto *kernel = mha::detail::find_kernel(mha::detail::cpu_kernels(),
                                                  int(mha::detail::cpu_isa()), 10, variant);
    ASSERT_NE(kernel, nullptr);
    const int padded = mha::contract::padded_features(12, 4);
    const int panel = mha::contract::kWeightPanel;
    std::vector<float> w(12 * padded, 0.0f), b(padded, 0.0f);
    std::vector<float> query = p.query, key = p.key, value = p.value;
    Halide::Runtime::Buffer<float> qb(query.data(), 12, 5, 2), kb(key.data(), 12, 7, 2);
    Halide::Runtime::Buffer<float> vb(value.data(), 12, 6, 2), ob(output.data(), 12, 5, 2);
    Halide::Runtime::Buffer<float> wb(w.data(), panel, 12, padded / panel), bb(b.data(), padded);
    int32_t head_dim = 4;
    mha::detail::ArgValues values{};
    values[size_t(ArgId::query)] = qb.raw_buffer();
    values[size_t(ArgId::key)] = kb.raw_buffer();
    values[size_t(ArgId::value)] = vb.raw_buffer();
    values[size_t(ArgId::output)] = ob.raw_buffer();
    values[size_t(ArgId::head_dim)] = &head_dim;
    int32_t kv_heads = 3;
    values[size_t(ArgId::kv_heads)] = &kv_heads;
    for (ArgId id : {ArgId::q_weight, ArgId::k_weight, ArgId::v_weight, ArgId::out_weight}) {
        values[size_t(id)] = wb.raw_buffer();
    }
    for (ArgId id : {ArgId::q_bias, ArgId::k_bias, ArgId::v_bias, ArgId::out_bias}) {
        values[size_t(id)] = bb.raw_buffer();
    }
    testing::internal::CaptureStderr();
    expect_error(
        [&] {
            mha::detail::CallContext context;
            mha::detail::call_kernel(*kernel, context, values);
        },
        "Input buffer value is accessed at 6, which is beyond the max (5) in dimension 1");
    EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
}

}  // namespace
