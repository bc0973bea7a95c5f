// Run with MHA_CPU_ISA set (ctest does, to avx2 and to sse41): dispatch must stay at that
// instruction set, so that its kernels (the AVX2 ones built from their tuned file, the SSE4.1
// fallback) are the ones the other tests in this binary check against the reference, even on a
// CPU with AVX-512.
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "mha_contract.h"
#include "problems.h"
#include "test_seed.h"

// Whether this CPU runs `isa`, asked without Halide.
bool cpu_runs(const std::string &isa) {
    __builtin_cpu_init();
    if (isa == "avx2") {
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }
    return isa == "sse41" && __builtin_cpu_supports("sse4.1");
}

TEST(IsaCap, DispatchRunsTheCappedInstructionSet) {
    const char *cap = std::getenv("MHA_CPU_ISA");
    ASSERT_NE(cap, nullptr) << "this binary is meant to run with MHA_CPU_ISA set";
    if (!cpu_runs(cap)) {
        GTEST_SKIP() << "this CPU does not run " << cap;
    }
    for (const mha::reference::Dims d : {mha::reference::Dims{2, 5, 5, 40, 4},        // small
                                         mha::reference::Dims{3, 100, 100, 24, 2},    // medium
                                         mha::reference::Dims{1, 1100, 7, 16, 2}}) {  // large
        const auto p =
            mha::problems::random_problem(d, mha::testing::next_seed(), d.query_len == d.key_len);
        const auto module = mha::problems::make_module(p);
        const std::vector<float> out = mha::problems::run_module(module, p, false).output;
        EXPECT_EQ(mha::dispatched_isa(), cap);
        const std::string kernel = module.kernel_name(
            mha::problems::query_view(p), mha::problems::key_view(p), mha::problems::value_view(p));
        EXPECT_NE(kernel.find("_cpu_" + std::string(cap) + "_"), std::string::npos) << kernel;
        EXPECT_LT(mha::reference::relative_l2(out, mha::reference::forward(p).output), 1e-5);
    }
}

// Run with MHA_CPU_ISA naming no instruction set (ctest does): an error naming the allowed ones.
TEST(IsaCap, UnknownNameIsAnError) {
    const char *cap = std::getenv("MHA_CPU_ISA");
    const std::optional<size_t> isa = cap ? mha::contract::cpu_isa_index(cap) : std::nullopt;
    if (cap == nullptr ||
        (isa && mha::contract::kCpuIsas[*isa].arch == mha::contract::compiled_cpu_arch())) {
        GTEST_SKIP() << "this test runs with MHA_CPU_ISA naming no instruction set of this "
                        "architecture";
    }
    const std::string expected = "MHA_CPU_ISA is '" + std::string(cap) +
                                 "', which is not one of amx, avx512bf16, avx512, avx2, sse41";
    const auto p = mha::problems::random_problem({1, 2, 2, 8, 2}, 1);
    try {
        mha::problems::make_module(p);
        ADD_FAILURE() << "no error";
    } catch (const mha::Error &e) {
        EXPECT_EQ(e.what(), expected);
    }
    EXPECT_THROW(mha::dispatched_isa(), mha::Error);
}
