// What the ceilings share: one piece of work per thread, all at once, and a result that depends on
// every one of them.
#pragma once

#include <thread>
#include <vector>

namespace mha::bench {

// The sum of work(t) for t in [0, threads), each on a thread of its own (0 on the caller's).
template <typename Work>
float sum_over_threads(int threads, Work work) {
    std::vector<float> totals(threads);
    std::vector<std::thread> workers;
    for (int t = 1; t < threads; t++) {
        workers.emplace_back([&, t] { totals[t] = work(t); });
    }
    totals[0] = work(0);
    for (std::thread &w : workers) {
        w.join();
    }
    float total = 0;
    for (float t : totals) {
        total += t;
    }
    return total;
}

}  // namespace mha::bench
