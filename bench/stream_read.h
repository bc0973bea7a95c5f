// The machine's streaming-read rate, the floor of memory-bound calls: a sum over a buffer too
// large for the caches, split over `threads` threads.
#pragma once

#include <cstddef>

namespace mha::bench {

// Reads `bytes` once, with `threads` threads; returns a value that depends on every element.
float stream_read(const float *data, size_t bytes, int threads);

}  // namespace mha::bench
