// Which code ran: the ISA Halide's dispatch chose, the fused QKV kernels for self-attention, the
// shape bucket, and the fused attention core that never allocates a [B, H, Sq, Sk] tensor.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <random>
#include <utility>

#include "HalideRuntime.h"
#include "halide_calls.h"
#include "problems.h"
#include "scratch_pool.h"
#include "test_seed.h"

namespace {

using mha::reference::Dims;
using mha::reference::Problem;

void run(const Problem &p, bool with_weights, std::vector<float> &output,
         std::vector<float> &weights) {
    auto r = mha::problems::run_module(mha::problems::make_module(p), p, with_weights);
    output = std::move(r.output);
    weights = std::move(r.weights);
}

// The best f32 ISA this CPU offers among those the build has kernels for, found without Halide.
std::string best_isa_of_this_cpu() {
    __builtin_cpu_init();
    const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
                        __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("fma");
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    const std::vector<mha::KernelInfo> kernels = mha::linked_kernels();
    for (const auto &[isa, supported] :
         {std::pair{"avx512", avx512}, std::pair{"avx2", avx2}, std::pair{"sse41", true}}) {
        if (supported && std::any_of(kernels.begin(), kernels.end(),
                                     [&](const mha::KernelInfo &k) { return k.isa == isa; })) {
            return isa;
        }
    }
    return "none";
}

TEST(Dispatch, RunsTheBestCompiledTargetThisCpuSupports) {
    const Problem p = mha::problems::random_problem({1, 7, 7, 24, 3}, mha::testing::next_seed());
    std::vector<float> out, w;
    run(p, false, out, w);
    const std::string after = mha::dispatched_isa();
    std::cout << "[ dispatch ] this CPU ran the " << after << " kernels\n";
    RecordProperty("dispatched_isa", after);
    EXPECT_EQ(after, best_isa_of_this_cpu());
}

TEST(QkvFusion, SelfAttentionOnOneTensorRunsTheFusedKernel) {
    for (const Dims d : {Dims{2, 9, 9, 24, 3}, Dims{1, 1, 1, 12, 3}, Dims{3, 17, 17, 40, 1}}) {
        const Problem p = mha::problems::random_problem(d, mha::testing::next_seed(), true);
        std::vector<float> out, w;
        run(p, true, out, w);
        EXPECT_NE(std::string(mha::detail::last_kernel_name()).find("_fused"), std::string::npos)
            << mha::detail::last_kernel_name();
        const auto want = mha::reference::forward(p);
        EXPECT_LT(mha::reference::relative_l2(out, want.output), 1e-5);
        EXPECT_LT(mha::reference::relative_l2(w, want.weights), 1e-5);
    }
}

TEST(QkvFusion, EqualContentsInDistinctTensorsTakeTheSeparateKernel) {
    Problem fused =
        mha::problems::random_problem({2, 6, 6, 20, 4}, mha::testing::next_seed(), true);
    Problem separate = fused;
    separate.self_attention = false;  // key and value are copies of query, not the same memory
    std::vector<float> out_fused, out_separate, w;
    run(fused, false, out_fused, w);
    ASSERT_NE(std::string(mha::detail::last_kernel_name()).find("_fused"), std::string::npos);
    run(separate, false, out_separate, w);
    EXPECT_NE(std::string(mha::detail::last_kernel_name()).find("_separate"), std::string::npos);
    for (size_t n = 0; n < out_fused.size(); n++) {
        ASSERT_NEAR(out_fused[n], out_separate[n], 1e-5 * (1 + std::abs(out_separate[n])));
    }
}

// The CPU kernels are tuned per bucket of the largest projection's token rows, B·max(Sq, Sk):
// one query against a long context is a large K/V GEMM, not a small one.
TEST(ShapeBuckets, ChosenByTheLargestProjection) {
    using mha::contract::ShapeBucket;
    const auto most = [](ShapeBucket b) {
        return mha::contract::bucket_spec(b).max_token_rows;
    };
    const int64_t token = most(ShapeBucket::token), small = most(ShapeBucket::small);
    const int64_t medium = most(ShapeBucket::medium);
    const std::pair<Dims, const char *> cases[] = {
        {Dims{1, 1, 1, 16, 2}, "token"},          {Dims{token, 1, 1, 16, 2}, "token"},
        {Dims{1, token, token, 16, 2}, "token"},  {Dims{token + 1, 1, 1, 16, 2}, "small"},
        {Dims{2, 5, 5, 16, 2}, "small"},          {Dims{1, 1, small, 16, 2}, "small"},
        {Dims{1, 1, small + 1, 16, 2}, "medium"}, {Dims{3, 300, 7, 16, 2}, "medium"},
        {Dims{1, 1, medium + 1, 16, 2}, "large"}};
    const std::vector<mha::KernelInfo> kernels = mha::linked_kernels();
    for (const auto &[d, bucket] : cases) {
        const Problem p = mha::problems::random_problem(d, mha::testing::next_seed());
        std::vector<float> out, w;
        run(p, false, out, w);
        const std::string ran(mha::detail::last_kernel_name());
        const auto info = std::find_if(kernels.begin(), kernels.end(),
                                       [&](const mha::KernelInfo &k) { return k.name == ran; });
        ASSERT_NE(info, kernels.end()) << ran;
        const std::vector<std::string> &serves = info->buckets;
        EXPECT_TRUE(std::find(serves.begin(), serves.end(), bucket) != serves.end() ||
                    serves == std::vector<std::string>{"any"})
            << ran << " does not serve bucket " << bucket;
        EXPECT_EQ(info->isa, mha::dispatched_isa());
        EXPECT_LT(mha::reference::relative_l2(out, mha::reference::forward(p).output), 1e-5);
    }
}

// Halide's heap allocations during one call, through its custom allocator hooks.
struct AllocationLog {
    static inline std::atomic<size_t> count{0}, largest{0};
    static void *allocate(void *, size_t bytes) {
        count++;
        size_t seen = largest.load();
        while (bytes > seen && !largest.compare_exchange_weak(seen, bytes)) {
        }
        // Halide expects its allocations aligned to at least 32 bytes; 128 covers AVX-512.
        return aligned_alloc(128, (bytes + 127) / 128 * 128);
    }
    static void release(void *, void *ptr) { free(ptr); }
    static void reset() { count = 0, largest = 0; }
};

TEST(FusedAttention, NoScoresTensorAndAllocationsIndependentOfLength) {
    halide_malloc_t old_malloc = halide_set_custom_malloc(&AllocationLog::allocate);
    halide_free_t old_free = halide_set_custom_free(&AllocationLog::release);
    std::vector<size_t> counts;
    // Lengths of one shape bucket (B·max(Sq, Sk) in 65..1024), so that one kernel serves them all.
    for (const int64_t S : {128, 512, 1024}) {
        const Dims d{1, S, S, 64, 2};
        const Problem p = mha::problems::random_problem(d, mha::testing::next_seed());
        std::vector<float> out, w;
        run(p, false, out, w);  // warm-up: Halide's thread pool allocates on first use
        AllocationLog::reset();
        run(p, false, out, w);
        const size_t scores_bytes = sizeof(float) * d.batch * d.num_heads * d.query_len * d.key_len;
        // The largest buffer is a projection's output [S, padded E], never [B, H, Sq, Sk].
        EXPECT_LT(AllocationLog::largest.load(), scores_bytes) << "S = " << S;
        counts.push_back(AllocationLog::count.load());
        const auto want = mha::reference::forward(p);
        EXPECT_LT(mha::reference::relative_l2(out, want.output), 1e-5);
    }
    halide_set_custom_malloc(old_malloc);
    halide_set_custom_free(old_free);
    // Per-task tile buffers, not per-tile: the count does not grow with the sequence length.
    EXPECT_EQ(*std::max_element(counts.begin(), counts.end()) -
                  *std::min_element(counts.begin(), counts.end()),
              0u)
        << "allocations per call: " << counts[0] << ", " << counts[1] << ", " << counts[2];
}

// The kernels' intermediate buffers are reused across calls instead of going back to the system.
TEST(ScratchPool, FreedBlocksAreReusedAligned) {
    using mha::detail::scratch_allocate;
    using mha::detail::scratch_release;
    // A size no kernel of these tests allocates, so that no other free block fits it.
    const size_t bytes = 7777777;
    void *first = scratch_allocate(bytes);
    ASSERT_NE(first, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % 128, 0u);
    scratch_release(first);
    void *again = scratch_allocate(bytes);
    EXPECT_EQ(again, first);
    // A block more than twice the request is not handed out for it.
    void *small = scratch_allocate(bytes / 4);
    EXPECT_NE(small, first);
    scratch_release(again);
    scratch_release(small);
    EXPECT_LE(mha::detail::scratch_cached_bytes(), mha::detail::kMaxCachedBytes);
}

TEST(ScratchPool, RepeatedCallsAllocateNothingNew) {
    const Problem p =
        mha::problems::random_problem({2, 37, 37, 64, 2}, mha::testing::next_seed(), true);
    std::vector<float> out, w;
    // On one thread the tasks ask in one order. On several, which free block a task takes
    // depends on the order they ask in, and an order not seen before can need one more block
    // (a loaded machine showed it). A few calls settle the blocks earlier tests left.
    mha::set_num_threads(1);
    for (int warm_up = 0; warm_up < 3; warm_up++) {
        run(p, false, out, w);
    }
    const size_t after_warm_up = mha::detail::scratch_cached_bytes();
    EXPECT_GT(after_warm_up, 0u);
    const size_t blocks = mha::detail::scratch_blocks_allocated();
    for (int repeat = 0; repeat < 3; repeat++) {
        run(p, false, out, w);
    }
    // Every block the later calls needed came from the pool and went back to it.
    EXPECT_EQ(mha::detail::scratch_blocks_allocated(), blocks);
    EXPECT_EQ(mha::detail::scratch_cached_bytes(), after_warm_up);
    EXPECT_LT(mha::reference::relative_l2(out, mha::reference::forward(p).output), 1e-5);
    mha::set_num_threads(0);
}

}  // namespace
