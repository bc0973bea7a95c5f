#include "stream_read.h"

#include <array>

#include "sum_over_threads.h"

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
    const size_t share = bytes / sizeof(float) / threads;
    return sum_over_threads(threads, [&](int t) { return sum(data + t * share, share); });
}

}  // namespace mha::bench
