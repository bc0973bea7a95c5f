#include "stream_read.h"

#include <array>
#include <thread>
#include <vector>

namespace mha::bench {
namespace {

// Several independent sums, so that the loop is bound by loads, not by one addition chain.
float sum(const float *data, size_t count) {
    std::array<float, 16> partial{};
    size_t i = 0;
    for (; i + partial.size() <= count; i += partial.size()) {
        for (size_t l = 0; l < partial.size(); l++) {
            partial[l] += data[i + l];
        }
    }
    float total = 0;
    for (; i < count; i++) {
        total += data[i];
    }
    for (float p : partial) {
        total += p;
    }
    return total;
}

}  // namespace

float stream_read(const float *data, size_t bytes, int threads) {
    const size_t count = bytes / sizeof(float), share = count / threads;
    std::vector<float> totals(threads);
    std::vector<std::thread> workers;
    for (int t = 1; t < threads; t++) {
        workers.emplace_back([&, t] { totals[t] = sum(data + t * share, share); });
    }
    totals[0] = sum(data, share);
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
