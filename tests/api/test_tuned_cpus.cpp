// Run with MHA_TUNED_CPU set (ctest does: to "defaults" and to each CPU of schedules/tuned):
// dispatch must run that tuning's kernels, which the other tests in this binary then check
// against the reference. So every tuning's kernels are tested on whatever CPU runs the tests,
// not only the one dispatch would pick here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "mha_contract.h"
#include "problems.h"
#include "test_seed.h"

namespace {

// The kernel a module runs for `p`, as linked_kernels() describes it.
mha::KernelInfo kernel_of(const mha::problems::Problem &p) {
    const auto module = mha::problems::make_module(p);
    const std::string name = module.kernel_name(
        mha::problems::query_view(p), mha::problems::key_view(p), mha::problems::value_view(p));
    for (mha::KernelInfo &k : mha::linked_kernels()) {
        if (k.name == name) {
            return k;
        }
    }
    ADD_FAILURE() << name << " is not in linked_kernels()";
    return {};
}

}  // namespace

TEST(TunedCpu, DispatchRunsTheNamedTuning) {
    const char *named = std::getenv("MHA_TUNED_CPU");
    ASSERT_NE(named, nullptr) << "this binary is meant to run with MHA_TUNED_CPU set";
    bool has_named = std::string(named) == "defaults";
    const std::vector<mha::TunedSchedule> schedules = mha::tuned_schedules();
    for (const mha::TunedSchedule &s : schedules) {
        EXPECT_EQ(s.why, "MHA_TUNED_CPU is " + std::string(named)) << s.isa;
        EXPECT_TRUE(s.tuned_cpu == named || s.tuned_cpu == "defaults") << s.isa;
        EXPECT_EQ(s.tuned_on.empty(), s.tuned_cpu == "defaults") << s.isa;
        has_named = has_named || s.tuned_cpu == named;
    }
    EXPECT_TRUE(has_named) << "no instruction set has a file tuned on " << named;
    const std::string isa = mha::dispatched_isa();
    const auto f32 = std::find_if(schedules.begin(), schedules.end(),
                                  [&](const auto &s) { return s.isa == isa; });
    ASSERT_NE(f32, schedules.end());
    for (const mha::reference::Dims d : {mha::reference::Dims{1, 1, 1, 24, 2},        // token
                                         mha::reference::Dims{2, 5, 5, 40, 4},        // small
                                         mha::reference::Dims{3, 100, 100, 24, 2},    // medium
                                         mha::reference::Dims{1, 1100, 7, 16, 2}}) {  // large
        const auto p =
            mha::problems::random_problem(d, mha::testing::next_seed(), d.query_len == d.key_len);
        const mha::KernelInfo kernel = kernel_of(p);
        // Its kernel serves every tuning, or this one among others.
        EXPECT_TRUE(kernel.tunings.empty() ||
                    std::count(kernel.tunings.begin(), kernel.tunings.end(), f32->tuned_cpu))
            << kernel.name;
        const std::vector<float> out =
            mha::problems::run_module(mha::problems::make_module(p), p, false).output;
        EXPECT_LT(mha::reference::relative_l2(out, mha::reference::forward(p).output), 1e-5);
    }
}

// Run with MHA_TUNED_CPU naming no tuned CPU (ctest does): an error naming the build's.
TEST(TunedCpu, UnknownNameIsAnError) {
    const char *named = std::getenv("MHA_TUNED_CPU");
    if (named == nullptr || std::string(named) != "bogus") {
        GTEST_SKIP() << "this test runs with MHA_TUNED_CPU=bogus";
    }
    const auto p = mha::problems::random_problem({1, 2, 2, 8, 2}, 1);
    try {
        mha::problems::make_module(p);
        ADD_FAILURE() << "no error";
    } catch (const mha::Error &e) {
        EXPECT_EQ(std::string(e.what()).rfind("MHA_TUNED_CPU is 'bogus', which is not one of "
                                              "defaults, ",
                                              0),
                  0u)
            << e.what();
    }
    EXPECT_THROW(mha::tuned_schedules(), mha::Error);
}

// How close a tuned CPU is: never one of another vendor; the same model before the same family
// before the vendor alone; among equals, the nearest caches.
TEST(TunedCpu, ClosestCpuOrder) {
    using mha::contract::cpu_match;
    using mha::contract::CpuIdentity;
    const CpuIdentity running{"GenuineIntel", 6, 207, 2048, 266240, "Xeon"};
    const CpuIdentity same_model{"GenuineIntel", 6, 207, 2048, 107520, "Xeon"};
    const CpuIdentity same_family{"GenuineIntel", 6, 143, 2048, 266240, "Xeon"};
    const CpuIdentity same_vendor{"GenuineIntel", 7, 1, 2048, 266240, "Xeon"};
    const CpuIdentity other_vendor{"AuthenticAMD", 6, 207, 2048, 266240, "EPYC"};
    EXPECT_FALSE(cpu_match(other_vendor, running));
    EXPECT_FALSE(cpu_match(CpuIdentity{}, CpuIdentity{}));
    EXPECT_GT(cpu_match(same_model, running)->score, cpu_match(same_family, running)->score);
    EXPECT_GT(cpu_match(same_family, running)->score, cpu_match(same_vendor, running)->score);
    EXPECT_GT(cpu_match(running, running)->score, cpu_match(same_model, running)->score);
    EXPECT_EQ(cpu_match(same_model, running)->why, "the same vendor, family and model");
    EXPECT_EQ(mha::contract::cpu_key(running), "intel-f6-m207");
    EXPECT_EQ(mha::contract::cpu_key(other_vendor), "amd-f6-m207");
}
