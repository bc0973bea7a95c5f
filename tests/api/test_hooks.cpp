// Halide's hooks (error handler, allocator, parallel loops) are process-wide and shared with any
// other Halide pipeline in the program. The library must handle only its own calls and pass
// everything else to the handlers installed before it. Its own binary: the application's handlers
// go in before the library is first used, as in a program with pipelines of its own.
#include <gtest/gtest.h>

#include <atomic>
#include <string>

#include "HalideBuffer.h"
#include "HalideRuntime.h"
#include "mha_masked_softmax_none.h"
#include "mha_split_heads.h"
#include "problems.h"
#include "test_seed.h"

namespace {

std::atomic<int> application_errors{0}, application_mallocs{0}, application_frees{0},
    application_loops{0};

void application_error(void *, const char *) { application_errors++; }
void *application_malloc(void *user_context, size_t bytes) {
    application_mallocs++;
    return halide_default_malloc(user_context, bytes);
}
void application_free(void *user_context, void *block) {
    application_frees++;
    halide_default_free(user_context, block);
}

int application_par_for(void *user_context, halide_task_t task, int min, int extent,
                        uint8_t *closure) {
    application_loops++;
    return halide_default_do_par_for(user_context, task, min, extent, closure);
}

[[maybe_unused]] const bool installed = [] {
    halide_set_error_handler(&application_error);
    halide_set_custom_malloc(&application_malloc);
    halide_set_custom_free(&application_free);
    halide_set_custom_do_par_for(&application_par_for);
    return true;
}();

using Halide::Runtime::Buffer;

// Runs the library's forward pass (which installs its hooks on first use).
void run_library(uint64_t seed) {
    const auto p = mha::problems::random_problem({2, 37, 37, 64, 2}, seed, true);
    const auto got = mha::problems::run_module(mha::problems::make_module(p), p, false);
    EXPECT_LT(mha::reference::relative_l2(got.output, mha::reference::forward(p).output), 1e-5);
}

TEST(HalideHooks, ForeignErrorsReachTheHandlerInstalledBefore) {
    run_library(mha::testing::next_seed());
    const int before = application_errors;
    // A foreign pipeline (a stage library, no user_context) with a head count that does not
    // divide the features: Halide reports a bounds error to whoever handles errors.
    Buffer<float> x(12, 5, 2), heads(4, 5, 3, 2);
    x.fill(1.0f);
    EXPECT_NE(mha_split_heads(x, 2, heads), 0);
    EXPECT_GT(application_errors.load(), before);
}

TEST(HalideHooks, ForeignAllocationsReachTheAllocatorInstalledBefore) {
    run_library(mha::testing::next_seed());
    const int mallocs = application_mallocs, frees = application_frees;
    // The softmax stage allocates its row statistics on the heap.
    Buffer<float> scores(300, 40, 2, 2), weights(300, 40, 2, 2);
    scores.fill(0.5f);
    ASSERT_EQ(mha_masked_softmax_none(scores, weights), 0);
    EXPECT_GT(application_mallocs.load(), mallocs);
    EXPECT_EQ(application_mallocs - mallocs, application_frees - frees);
}

TEST(HalideHooks, ForeignParallelLoopsReachTheHandlerInstalledBefore) {
    run_library(mha::testing::next_seed());
    const int loops = application_loops;
    Buffer<float> scores(300, 40, 2, 2), weights(300, 40, 2, 2);
    scores.fill(0.5f);
    ASSERT_EQ(mha_masked_softmax_none(scores, weights), 0);
    EXPECT_GT(application_loops.load(), loops);
}

TEST(HalideHooks, LibraryCallsStayWithTheLibrary) {
    run_library(mha::testing::next_seed());  // warm: the library's scratch blocks exist
    const int errors = application_errors, mallocs = application_mallocs;
    const int loops = application_loops;
    run_library(mha::testing::next_seed());
    EXPECT_EQ(application_mallocs.load(), mallocs);
    EXPECT_EQ(application_loops.load(), loops);  // the library's loops run on its own pool
    // A library error comes back as mha::Error, not through the application's handler.
    const auto p = mha::problems::random_problem({1, 3, 3, 8, 2}, mha::testing::next_seed());
    const auto module = mha::problems::make_module(p);
    std::vector<float> out(24);
    EXPECT_THROW(module.forward(mha::problems::query_view(p), mha::problems::key_view(p),
                                {p.value.data(), {1, 2, 8}}, {out.data(), {1, 3, 8}}),
                 mha::Error);
    EXPECT_EQ(application_errors.load(), errors);
}

}  // namespace
