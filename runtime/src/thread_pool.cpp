#include "thread_pool.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <thread>

namespace mha::detail {
namespace {

constexpr int kMaxThreads = 256;

int default_threads() {
    if (const char *env = std::getenv("HL_NUM_THREADS")) {
        if (const int threads = std::atoi(env); threads > 0) {
            return std::min(threads, kMaxThreads);
        }
    }
    return std::clamp(int(std::thread::hardware_concurrency()), 1, kMaxThreads);
}

// One parallel loop, on its caller's stack while the call lasts.
struct Loop {
    halide_task_t task;
    void *user_context;
    uint8_t *closure;
    int min, extent;
    Loop *below = nullptr;  // the loop published before it, still open
    // Each on its own cache line: `next` is taken by every thread, `active` polled by the caller.
    alignas(64) std::atomic<int> next{0};
    alignas(64) std::atomic<int> active{0};  // workers inside run()
    std::atomic<int> result{0};

    // Takes iterations until none is left or one has failed.
    void run() {
        for (int i; (i = next.fetch_add(1, std::memory_order_relaxed)) < extent;) {
            if (const int r = task(user_context, min + i, closure)) {
                int none = 0;
                result.compare_exchange_strong(none, r);
                next.store(extent, std::memory_order_relaxed);
            }
        }
    }
};

class Pool {
public:
    int par_for(void *user_context, halide_task_t task, int min, int extent, uint8_t *closure) {
        if (extent <= 1 || threads_.load(std::memory_order_relaxed) <= 1) {
            for (int i = min; i < min + extent; i++) {
                if (const int r = task(user_context, i, closure)) {
                    return r;
                }
            }
            return 0;
        }
        Loop loop{task, user_context, closure, min, extent};
        {
            std::lock_guard<std::mutex> lock(mutex_);
            start_workers();
            loop.below = open_;
            open_ = &loop;
            published_.fetch_add(1, std::memory_order_release);
            if (sleeping_ > 0) {
                wake_.notify_all();
            }
        }
        loop.run();
        {
            // Unpublished, no worker joins it any more; those inside finish their iterations.
            std::lock_guard<std::mutex> lock(mutex_);
            Loop **link = &open_;
            while (*link != &loop) {
                link = &(*link)->below;
            }
            *link = loop.below;
        }
        // Meanwhile take iterations of other open loops, as a worker would: of a loop nested in
        // a sibling's task, say, which otherwise its owner alone would finish (at the end of a
        // kernel's loop over heads, the other head's row tiles: 5-8 % of a prefill call).
        while (loop.active.load(std::memory_order_acquire) != 0) {
            if (!run_an_open_loop()) {
                std::this_thread::yield();
            }
        }
        return loop.result.load(std::memory_order_relaxed);
    }

    void set_threads(int threads) {
        threads_.store(threads > 0 ? std::min(threads, kMaxThreads) : default_threads());
    }
    int threads() const { return threads_.load(); }

private:
    // Under mutex_.
    void start_workers() {
        for (; started_ < threads_.load() - 1; started_++) {
            std::thread([this, index = started_] { work(index); }).detach();
        }
    }

    // Workers past the pool's size (after set_threads made it smaller) stay asleep.
    bool in_use(int index) const { return index < threads_.load(std::memory_order_relaxed) - 1; }

    // Joins the newest open loop with iterations left and takes them; false if none is left.
    bool run_an_open_loop() {
        Loop *joined = nullptr;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            for (Loop *loop = open_; loop != nullptr && joined == nullptr; loop = loop->below) {
                if (loop->next.load(std::memory_order_relaxed) < loop->extent) {
                    joined = loop;
                    joined->active.fetch_add(1, std::memory_order_relaxed);
                }
            }
        }
        if (joined == nullptr) {
            return false;
        }
        joined->run();
        joined->active.fetch_sub(1, std::memory_order_release);
        return true;
    }

    // A loop gains no iterations once published, so a worker that found nothing to join looks
    // again only when another loop is published: its polls read one counter, and leave the
    // callers' cache lines and mutex_ alone.
    [[noreturn]] void work(int index) {
        using Clock = std::chrono::steady_clock;
        Clock::time_point last_work = Clock::now();
        uint64_t looked_at = 0;  // the publications already looked at
        const auto news = [&] {
            return published_.load(std::memory_order_acquire) != looked_at && in_use(index);
        };
        for (;;) {
            if (news()) {
                const uint64_t published = published_.load(std::memory_order_acquire);
                if (run_an_open_loop()) {
                    last_work = Clock::now();
                } else {
                    looked_at = published;
                }
                continue;
            }
            if (Clock::now() - last_work < kPollFor) {
                std::this_thread::yield();
                continue;
            }
            std::unique_lock<std::mutex> lock(mutex_);
            sleeping_++;
            wake_.wait(lock, news);
            sleeping_--;
            last_work = Clock::now();
        }
    }

    std::mutex mutex_;
    std::condition_variable wake_;
    Loop *open_ = nullptr;                // the open loops, newest first (under mutex_)
    std::atomic<uint64_t> published_{0};  // loops published so far (changed under mutex_)
    int sleeping_ = 0;                    // under mutex_
    int started_ = 0;                     // under mutex_
    std::atomic<int> threads_{default_threads()};
};

// Never destroyed: its detached workers may still poll while the process exits.
Pool &pool() {
    static Pool *const instance = new Pool;
    return *instance;
}

}  // namespace

int pool_par_for(void *user_context, halide_task_t task, int min, int extent, uint8_t *closure) {
    return pool().par_for(user_context, task, min, extent, closure);
}

void set_pool_threads(int threads) { pool().set_threads(threads); }

int pool_threads() { return pool().threads(); }

int64_t key_splits(int64_t tasks, int64_t keys, int threads, int64_t min_split_keys) {
    const int64_t most = std::max<int64_t>(1, keys / min_split_keys);
    int64_t splits = 1;
    for (; splits < most; splits++) {
        const int64_t total = tasks * splits;
        if (total >= threads && (total % threads == 0 || total >= 4 * threads)) {
            break;
        }
    }
    return splits;
}

}  // namespace mha::detail
