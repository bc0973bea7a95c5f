// Run with MHA_CPU_ISA set (ctest does): dispatch must stay at or below that instruction set, so
// that the AVX2 kernels built from the committed tuned file are the ones the other tests in this
// binary check against the reference, even on a CPU with AVX-512.
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>

#include "reference.h"

TEST(IsaCap, DispatchRunsTheCappedInstructionSet) {
    const char *cap = std::getenv("MHA_CPU_ISA");
    ASSERT_NE(cap, nullptr) << "this binary is meant to run with MHA_CPU_ISA set";
    for (const mha::reference::Dims d : {mha::reference::Dims{2, 5, 5, 40, 4},      // small
                                         mha::reference::Dims{3, 100, 100, 24, 2},  // medium
                                         mha::reference::Dims{1, 1100, 7, 16, 2}}) {  // large
        const auto p = mha::reference::random_problem(d, std::random_device{}(), true);
        std::vector<float> out(d.batch * d.query_len * d.embed_dim);
        mha::reference::make_module(p).forward(
            mha::reference::query_view(p), mha::reference::key_view(p),
            mha::reference::value_view(p), {out.data(), {d.batch, d.query_len, d.embed_dim}});
        EXPECT_EQ(mha::dispatched_isa(), cap);
        EXPECT_LT(mha::reference::relative_l2(out, mha::reference::forward(p).output), 1e-5);
    }
}
