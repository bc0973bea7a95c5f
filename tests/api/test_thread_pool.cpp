// The kernels' thread pool (runtime/src/thread_pool.h) on its own: nested loops as the kernels
// nest them, failures, several calling threads at once, sizes. Also run under TSan
// (tests/sanitizers).
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <thread>
#include <vector>

#include "thread_pool.h"

namespace {

using mha::detail::pool_par_for;

// An outer loop whose iterations each run an inner loop on the pool, counting every (outer,
// inner) iteration that runs.
struct Nested {
    static constexpr int kOuter = 7, kInner = 13;
    std::array<std::atomic<int>, kOuter * kInner> runs{};
    struct Inner {
        Nested *nested;
        int outer;
    };

    static int inner(void *, int i, uint8_t *closure) {
        const auto *c = reinterpret_cast<const Inner *>(closure);
        c->nested->runs[size_t(c->outer * kInner + i)]++;
        return 0;
    }
    static int outer(void *, int o, uint8_t *closure) {
        Inner c{reinterpret_cast<Nested *>(closure), o};
        return pool_par_for(nullptr, &Nested::inner, 0, kInner, reinterpret_cast<uint8_t *>(&c));
    }
    int run() { return pool_par_for(nullptr, &Nested::outer, 0, kOuter, as_closure()); }
    uint8_t *as_closure() { return reinterpret_cast<uint8_t *>(this); }
};

class ThreadPool : public ::testing::Test {
protected:
    void TearDown() override { mha::detail::set_pool_threads(0); }
};

TEST_F(ThreadPool, NestedLoopsRunEachIterationOnce) {
    for (int threads : {1, 2, 3, 5}) {
        mha::detail::set_pool_threads(threads);
        for (int round = 0; round < 20; round++) {
            Nested nested;
            ASSERT_EQ(nested.run(), 0);
            for (const auto &runs : nested.runs) {
                ASSERT_EQ(runs.load(), 1) << threads << " threads, round " << round;
            }
        }
    }
}

TEST_F(ThreadPool, LoopsStartAnywhere) {
    mha::detail::set_pool_threads(3);
    std::array<std::atomic<int>, 40> runs{};
    const auto task = [](void *, int i, uint8_t *closure) {
        (*reinterpret_cast<std::array<std::atomic<int>, 40> *>(closure))[size_t(i)]++;
        return 0;
    };
    ASSERT_EQ(pool_par_for(nullptr, task, 11, 29, reinterpret_cast<uint8_t *>(&runs)), 0);
    for (size_t i = 0; i < runs.size(); i++) {
        EXPECT_EQ(runs[i].load(), i >= 11 ? 1 : 0) << i;
    }
    EXPECT_EQ(pool_par_for(nullptr, task, 3, 0, reinterpret_cast<uint8_t *>(&runs)), 0);
}

TEST_F(ThreadPool, AFailureIsReturnedAndStopsTheLoop) {
    for (int threads : {1, 2, 4}) {
        mha::detail::set_pool_threads(threads);
        std::atomic<int> ran{0};
        const auto task = [](void *, int i, uint8_t *closure) {
            (*reinterpret_cast<std::atomic<int> *>(closure))++;
            return i == 5 ? -7 : 0;
        };
        EXPECT_EQ(pool_par_for(nullptr, task, 0, 100000, reinterpret_cast<uint8_t *>(&ran)), -7);
        EXPECT_LT(ran.load(), 100000) << threads << " threads";
    }
}

TEST_F(ThreadPool, CallersOnSeveralThreadsEachComplete) {
    mha::detail::set_pool_threads(3);
    std::vector<std::thread> callers;
    std::atomic<int> failures{0};
    for (int t = 0; t < 4; t++) {
        callers.emplace_back([&] {
            for (int round = 0; round < 50; round++) {
                Nested nested;
                bool complete = nested.run() == 0;
                for (const auto &runs : nested.runs) {
                    complete = complete && runs.load() == 1;
                }
                failures += complete ? 0 : 1;
            }
        });
    }
    for (std::thread &caller : callers) {
        caller.join();
    }
    EXPECT_EQ(failures.load(), 0);
}

TEST_F(ThreadPool, SizeIsTheCallersOrTheDefault) {
    mha::detail::set_pool_threads(3);
    EXPECT_EQ(mha::detail::pool_threads(), 3);
    mha::detail::set_pool_threads(0);
    const int hardware = int(std::thread::hardware_concurrency());
    EXPECT_EQ(mha::detail::pool_threads(),
              std::getenv("HL_NUM_THREADS") ? std::atoi(std::getenv("HL_NUM_THREADS")) : hardware);
}

}  // namespace
