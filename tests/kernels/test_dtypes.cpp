// bf16 and f16: conversions, modules of those dtypes against the double-precision reference fed
// the same rounded inputs and weights, 16-bit weights and outputs, and their errors. This binary
// also runs every forward, mask, non-finite and decode suite in one dtype (MHA_TEST_DTYPE=bf16
// or f16, set by tests/CMakeLists.txt), through problems::set_problem_dtype.
#include <gtest/gtest.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <string_view>

#include "dtype.h"
#include "mha_contract.h"
#include "problems.h"
#include "test_seed.h"

namespace {

using mha::DType;
using mha::reference::Dims;
using mha::reference::Problem;

[[maybe_unused]] const bool dtype_chosen = [] {
    if (const char *name = std::getenv("MHA_TEST_DTYPE")) {
        const std::optional<DType> dtype = mha::contract::dtype_named(name);
        if (!dtype) {
            std::fprintf(stderr, "MHA_TEST_DTYPE=%s is none of f32, bf16 and f16\n", name);
            std::exit(2);
        }
        mha::problems::set_problem_dtype(*dtype);
    }
    return true;
}();

float from_bits(uint32_t u) {
    float x;
    std::memcpy(&x, &u, sizeof x);
    return x;
}

TEST(DtypeConversions, RoundToNearestEven) {
    // bf16 keeps 8 bits of mantissa: 1 + 2^-8 is a tie between 1 and 1 + 2^-7.
    EXPECT_EQ(mha::to_bfloat16(1.0f + 0x1p-8f).bits, 0x3f80);
    EXPECT_EQ(mha::to_bfloat16(1.0f + 3 * 0x1p-8f).bits, 0x3f82);
    EXPECT_EQ(mha::to_bfloat16(1.0f + 0x1p-8f + 0x1p-20f).bits, 0x3f81);
    EXPECT_EQ(mha::to_float(mha::bfloat16{0x3f81}), 1.0f + 0x1p-7f);
    // f16: 10 bits of mantissa; 65504 is the largest, 65520 and more overflow to Inf.
    EXPECT_EQ(mha::to_float16(1.0f + 0x1p-11f).bits, 0x3c00);
    EXPECT_EQ(mha::to_float16(1.0f + 3 * 0x1p-11f).bits, 0x3c02);
    EXPECT_EQ(mha::to_float(mha::to_float16(65504.0f)), 65504.0f);
    EXPECT_EQ(mha::to_float(mha::to_float16(65519.0f)), 65504.0f);
    EXPECT_TRUE(std::isinf(mha::to_float(mha::to_float16(65520.0f))));
    // Subnormals: 2^-24 is the smallest f16, half of it a tie that rounds to zero.
    EXPECT_EQ(mha::to_float(mha::to_float16(0x1p-24f)), 0x1p-24f);
    EXPECT_EQ(mha::to_float16(0x1p-25f).bits, 0);
    EXPECT_EQ(mha::to_float16(-0x1p-14f).bits, 0x8400);
}

TEST(DtypeConversions, NonFiniteValuesStay) {
    const float inf = std::numeric_limits<float>::infinity();
    for (const float x : {inf, -inf, std::numeric_limits<float>::quiet_NaN(),
                          from_bits(0x7f800001u) /* a signaling NaN */}) {
        const float b = mha::to_float(mha::to_bfloat16(x)), h = mha::to_float(mha::to_float16(x));
        EXPECT_EQ(std::isnan(b), std::isnan(x)) << x;
        EXPECT_EQ(std::isnan(h), std::isnan(x)) << x;
        if (!std::isnan(x)) {
            EXPECT_EQ(b, x);
            EXPECT_EQ(h, x);
        }
    }
    // A bf16 NaN whose mantissa would round away stays a NaN.
    EXPECT_TRUE(std::isnan(mha::to_float(mha::to_bfloat16(from_bits(0x7f800001u)))));
    EXPECT_TRUE(std::isnan(mha::to_float(mha::to_bfloat16(from_bits(0xff80ffffu)))));
}

// The runtime's array conversions (F16C where the CPU has it) give what the scalar ones give,
// and widening back is exact.
TEST(DtypeConversions, ArraysMatchScalars) {
    std::mt19937 rng(uint32_t(mha::testing::next_seed()));
    std::vector<float> x(1003);  // not a multiple of the vector width
    for (float &v : x) {
        v = from_bits(rng());
        if (std::isnan(v)) {
            v = 1.5f;  // NaN payloads may differ between the two
        }
    }
    x[0] = 65520.0f;
    x[1] = 0x1p-25f;
    std::vector<mha::bfloat16> b(x.size());
    std::vector<mha::float16> h(x.size());
    mha::detail::convert(x.data(), b.data(), int64_t(x.size()));
    mha::detail::convert(x.data(), h.data(), int64_t(x.size()));
    std::vector<float> back(x.size());
    mha::detail::convert(h.data(), back.data(), int64_t(x.size()));
    for (size_t n = 0; n < x.size(); n++) {
        ASSERT_EQ(b[n].bits, mha::to_bfloat16(x[n]).bits) << x[n];
        ASSERT_EQ(h[n].bits, mha::to_float16(x[n]).bits) << x[n];
        const float widened = mha::to_float(h[n]);
        ASSERT_EQ(std::memcmp(&back[n], &widened, sizeof(float)), 0);
    }
}

// Relative L2 of the library in each dtype against the reference on the same rounded inputs and
// weights (the bounds: 1e-2 for bf16, 2e-3 for f16; f16 runs f32 kernels, so its
// errors are f32's, and bf16 products round only the merged heads), and how far
// rounding the inputs to the dtype moves the result.
struct DtypeCase {
    const char *name;
    Dims dims;
    bool self_attention;
};
const DtypeCase kDtypeCases[] = {
    {"all_ones", {1, 1, 1, 1, 1}, false},
    {"primes", {3, 13, 17, 30, 5}, false},
    {"seed_self", {2, 5, 5, 512, 8}, true},
    {"head_dim_96", {1, 19, 23, 192, 2}, false},
};

class Dtypes : public ::testing::TestWithParam<DType> {};

TEST_P(Dtypes, MatchTheReferenceOnRoundedInputs) {
    const double bound = GetParam() == DType::bf16 ? 1e-2 : 2e-3;
    for (const DtypeCase &c : kDtypeCases) {
        Problem p =
            mha::problems::random_problem(c.dims, mha::testing::next_seed(), c.self_attention);
        p.dtype = GetParam();
        const auto got = mha::problems::run_module(mha::problems::make_module(p), p, true);
        const auto want = mha::reference::forward(p);
        const double output_error = mha::reference::relative_l2(got.output, want.output);
        EXPECT_LT(output_error, bound) << c.name;
        EXPECT_LT(mha::reference::relative_l2(got.weights, want.weights), bound) << c.name;
        const int64_t rows = c.dims.batch * c.dims.num_heads * c.dims.query_len;
        for (int64_t r = 0; r < rows; r++) {
            double sum = 0;
            for (int64_t j = 0; j < c.dims.key_len; j++) {
                sum += got.weights[r * c.dims.key_len + j];
            }
            ASSERT_NEAR(sum, 1.0, 1e-3) << c.name << " row " << r;
        }
        Problem unrounded = p;
        unrounded.dtype = DType::f32;
        const double rounding =
            mha::reference::relative_l2(got.output, mha::reference::forward(unrounded).output);
        RecordProperty(std::string(c.name) + "_relative_l2", std::to_string(output_error));
        std::printf(
            "%s %s: relative L2 %.2e against the reference on rounded inputs, %.2e "
            "against f32 inputs\n",
            std::string(mha::contract::dtype_name(GetParam())).c_str(), c.name, output_error,
            rounding);
    }
}

// Weights that arrive in bf16 or f16 give the module that f32 weights rounded to that type
// give; an output in the inputs' type is the f32 output rounded.
template <typename T>
void expect_16_bit_weights_and_output(DType dtype) {
    Problem p = mha::problems::random_problem({2, 6, 6, 24, 3}, mha::testing::next_seed(), true);
    p.dtype = dtype;
    const auto from_f32 = mha::problems::make_module(p);
    std::vector<T> weights[4], biases[4];
    std::array<mha::LinearOf<T>, 4> linears;
    const std::array<mha::Linear, 4> f32 = mha::problems::linears(p);
    for (int l = 0; l < 4; l++) {
        weights[l].resize(p.weight[l].size());
        biases[l].resize(p.bias[l].size());
        mha::detail::convert(p.weight[l].data(), weights[l].data(), int64_t(weights[l].size()));
        mha::detail::convert(p.bias[l].data(), biases[l].data(), int64_t(biases[l].size()));
        linears[l] = {{weights[l].data(), f32[l].weight.shape},
                      mha::TensorView<const T>{biases[l].data(), f32[l].bias->shape}};
    }
    const mha::MultiHeadAttention from_16(p.dims.embed_dim, p.dims.num_heads, linears[0],
                                          linears[1], linears[2], linears[3]);
    EXPECT_EQ(from_16.dtype(), dtype);
    const auto want = mha::problems::run_module(from_f32, p, false).output;
    EXPECT_EQ(mha::problems::run_module(from_16, p, false).output, want);

    std::vector<T> tokens(p.query.size()), output(want.size());
    mha::detail::convert(p.query.data(), tokens.data(), int64_t(tokens.size()));
    const mha::TensorView<const T> x{tokens.data(), mha::problems::query_view(p).shape};
    from_16.forward(x, x, x, mha::TensorView<T>{output.data(), x.shape});
    std::vector<T> rounded(want.size());
    mha::detail::convert(want.data(), rounded.data(), int64_t(want.size()));
    for (size_t n = 0; n < want.size(); n++) {
        ASSERT_EQ(output[n].bits, rounded[n].bits) << n;
    }
}

// What the CPU has for bf16, asked without Halide: AMX-BF16 and its tiles (CPUID leaf 7: EDX bits
// 22 and 24); AVX512_BF16 (leaf 7 subleaf 1: EAX bit 5) with the AVX-512 VBMI that Halide's
// avx512_zen4 also asks for (leaf 7: ECX bit 1); an AMD vendor (leaf 0).
struct CpuBf16 {
    bool amx = false, dot_pairs = false, amd = false;
};
CpuBf16 cpu_bf16() {
    CpuBf16 cpu;
#if defined(__x86_64__)
    unsigned eax, ebx, ecx, edx;
    __get_cpuid(0, &eax, &ebx, &ecx, &edx);
    cpu.amd = std::string_view(reinterpret_cast<const char *>(&ebx), 4) == "Auth" &&
              std::string_view(reinterpret_cast<const char *>(&ecx), 4) == "cAMD";
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) {
        return cpu;
    }
    cpu.amx = (edx >> 22 & 1) && (edx >> 24 & 1);
    const bool vbmi = ecx >> 1 & 1;
    cpu.dot_pairs = vbmi && __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) && (eax >> 5 & 1);
#endif
    return cpu;
}

// MHA_CPU_ISA, or "amx" (the top, capping nothing) when unset.
std::string capped_isa() {
    const char *cap = std::getenv("MHA_CPU_ISA");
    return cap ? cap : "amx";
}

// The bf16 instruction set a bf16 module runs: amx where the CPU has it, else avx512bf16 where
// it has its dot products, on an AMD CPU or when MHA_CPU_ISA names it; a cap of MHA_CPU_ISA
// below one leaves the next, or none.
std::string cpu_bf16_isa() {
    const CpuBf16 cpu = cpu_bf16();
    const std::string capped = capped_isa();
    if (cpu.amx && capped == "amx") {
        return "amx";
    }
    if (cpu.dot_pairs && ((capped == "amx" && cpu.amd) || capped == "avx512bf16")) {
        return "avx512bf16";
    }
    return "";
}

// bf16 attention reads its tensors in place where the CPU has AVX512_BF16 (and VBMI) and
// MHA_CPU_ISA leaves it: one query row per head on any such CPU (avx512bf16's kernels), more
// rows where a bf16 module runs AMX's tile products or avx512bf16's dot products (else the f32
// kernels on widened tensors).
TEST(Dtypes16, Bf16AttentionReadsBf16WhereTheCpuCan) {
    const std::string capped = capped_isa();
    const bool reads = cpu_bf16().dot_pairs && (capped == "amx" || capped == "avx512bf16");
    const std::string products = cpu_bf16_isa();
    for (const int64_t queries : {1, 7}) {
        const int64_t heads = 4, kv_heads = 2, keys = 19, d = 16;
        std::vector<mha::bfloat16> q(size_t(heads * queries * d)), kv(size_t(kv_heads * keys * d));
        const mha::StridedView<const mha::bfloat16> query{q.data(), {1, heads, queries, d}, {}},
            key{kv.data(), {1, kv_heads, keys, d}, {}};
        const std::string kernel = mha::attention_kernel_name(query, key, key);
        const bool bf16 = queries == 1 ? reads : !products.empty();
        const std::string isa = queries == 1 ? "avx512bf16" : products;
        if (bf16) {
            EXPECT_NE(kernel.find("_cpu_" + isa + "_"), std::string::npos) << kernel;
        }
        // The bf16 instruction sets hold bf16 kernels only: without the suffix, an f32 set's.
        EXPECT_EQ(kernel.find("_bf16") != std::string::npos, bf16) << kernel;
    }
}

// A bf16 module runs the bf16 instruction set's kernels where the CPU has one and MHA_CPU_ISA
// does not cap it away, unless it is narrower than one tile slice; an f16 module never does (it
// converts to f32).
TEST(Dtypes16, Bf16ModulesRunTheBf16Kernels) {
    const std::string bf16_isa = cpu_bf16_isa();
    EXPECT_EQ(mha::dispatched_isa(DType::bf16),
              bf16_isa.empty() ? mha::dispatched_isa() : bf16_isa);
    EXPECT_EQ(mha::dispatched_isa(DType::f16), mha::dispatched_isa());
    EXPECT_EQ(mha::dispatched_isa(DType::f32), mha::dispatched_isa());
    for (const auto &[dtype, embed_dim] :
         {std::pair{DType::bf16, 48}, {DType::bf16, 24}, {DType::f16, 48}}) {
        const bool wide = embed_dim >= mha::contract::kBf16TileDepth;
        Problem p =
            mha::problems::random_problem({2, 7, 7, embed_dim, 3}, mha::testing::next_seed(), true);
        p.dtype = dtype;
        const auto module = mha::problems::make_module(p);
        const std::string kernel = module.kernel_name(
            mha::problems::query_view(p), mha::problems::key_view(p), mha::problems::value_view(p));
        const bool runs_bf16 = !bf16_isa.empty() && dtype == DType::bf16 && wide;
        EXPECT_EQ(kernel.find("_cpu_" + bf16_isa + "_") != std::string::npos, runs_bf16) << kernel;
        EXPECT_EQ(kernel.find("_bf16") != std::string::npos, runs_bf16) << kernel;
        const auto got = mha::problems::run_module(module, p, true);
        const auto want = mha::reference::forward(p);
        EXPECT_LT(mha::reference::relative_l2(got.output, want.output),
                  mha::reference::output_tolerance(p));
        EXPECT_LT(mha::reference::relative_l2(got.weights, want.weights),
                  mha::reference::weights_tolerance(p));
    }
}

TEST(Dtypes16, WeightsAndOutputInBf16) {
    expect_16_bit_weights_and_output<mha::bfloat16>(DType::bf16);
}
TEST(Dtypes16, WeightsAndOutputInF16) {
    expect_16_bit_weights_and_output<mha::float16>(DType::f16);
}

// A decode step of bf16 tokens with a bf16 output: the f32 step's output, rounded.
TEST(Dtypes16, DecodeStepInBf16) {
    Problem p = mha::problems::random_problem({1, 1, 1, 16, 2}, mha::testing::next_seed());
    p.dtype = DType::bf16;
    const auto module = mha::problems::make_module(p);
    mha::KvCache cache16 = module.make_cache(2, 8), cache32 = module.make_cache(2, 8);
    const Problem tokens =
        mha::problems::random_problem({2, 3, 3, 16, 2}, mha::testing::next_seed());
    std::vector<mha::bfloat16> x(tokens.query.size()), out16(x.size());
    std::vector<float> out32(x.size());
    mha::detail::convert(tokens.query.data(), x.data(), int64_t(x.size()));
    std::vector<float> widened(x.size());
    mha::detail::convert(x.data(), widened.data(), int64_t(x.size()));
    module.decode(mha::BF16Tensor{x.data(), {2, 3, 16}}, cache16,
                  mha::MutableBF16Tensor{out16.data(), {2, 3, 16}});
    module.decode(mha::Tensor{widened.data(), {2, 3, 16}}, cache32, {out32.data(), {2, 3, 16}});
    for (size_t n = 0; n < x.size(); n++) {
        ASSERT_EQ(out16[n].bits, mha::to_bfloat16(out32[n]).bits) << n;
    }
    EXPECT_EQ(cache16.lengths(), (std::vector<int64_t>{3, 3}));
}

TEST(Dtypes16, Errors) {
    const Problem p = mha::problems::random_problem({1, 2, 2, 8, 2}, 1);
    const std::array<mha::Linear, 4> l = mha::problems::linears(p);
    const auto expect_error = [](auto &&call, const std::string &message) {
        try {
            call();
            ADD_FAILURE() << "no error; expected " << message;
        } catch (const mha::Error &e) {
            EXPECT_EQ(std::string(e.what()), message);
        }
    };
    expect_error(
        [&] {
            mha::MultiHeadAttention(8, 2, l[0], l[1], l[2], l[3], mha::Device::cpu,
                                    static_cast<DType>(5));
        },
        "dtype 5 is none of f32, bf16 and f16");
    const mha::MultiHeadAttention bf16_module(8, 2, l[0], l[1], l[2], l[3], mha::Device::cpu,
                                              DType::bf16);
    std::vector<mha::float16> h(16);
    std::vector<float> out(16);
    const mha::F16Tensor x{h.data(), {1, 2, 8}};
    expect_error(
        [&] {
            bf16_module.forward(x, x, x, mha::MutableTensor{out.data(), {1, 2, 8}});
        },
        "a bf16 module takes bf16 or f32 tensors, not f16");
    std::vector<mha::bfloat16> b(16);
    const mha::BF16Tensor on_device{nullptr, {1, 2, 8}, 0x1234};
    const mha::BF16Tensor y{b.data(), {1, 2, 8}};
    expect_error(
        [&] {
            bf16_module.forward(on_device, y, y, mha::MutableTensor{out.data(), {1, 2, 8}});
        },
        "query has a device_handle but the module runs on the cpu");
    expect_error(
        [&] {
            bf16_module.forward(y, y, mha::BF16Tensor{b.data(), {1, 2}},
                                mha::MutableTensor{out.data(), {1, 2, 8}});
        },
        "value has shape [1, 2] but must have 3 dimensions [batch, sequence, embed_dim]");
    // Mismatched shapes are found before a tensor is read (found by tests/fuzz): this query
    // points at memory that faults.
    const auto *unreadable = reinterpret_cast<const mha::bfloat16 *>(uintptr_t(64));
    expect_error(
        [&] {
            bf16_module.forward(mha::BF16Tensor{unreadable, {3, 2, 8}}, y, y,
                                mha::MutableTensor{out.data(), {1, 2, 8}});
        },
        "key has batch 1 but query has batch 3");
    std::vector<mha::bfloat16> w(64);
    const mha::BF16Linear bad{{w.data(), {8}}, std::nullopt};
    const mha::BF16Linear good{{w.data(), {8, 8}}, std::nullopt};
    expect_error([&] { mha::MultiHeadAttention(8, 2, good, bad, good, good); },
                 "k_proj.weight has shape [8] but must have 2 dimensions [out features, in "
                 "features]");
}

INSTANTIATE_TEST_SUITE_P(Both, Dtypes, ::testing::Values(DType::bf16, DType::f16),
                         [](const auto &info) {
                             return std::string(mha::contract::dtype_name(info.param));
                         });

}  // namespace
