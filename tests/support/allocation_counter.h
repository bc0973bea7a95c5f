// Counts the program's heap allocations (operator new) between start() and stop(): this test
// program replaces the global operator new to do so.
#pragma once

#include <cstddef>

namespace mha::testing {

void start_counting_allocations();
size_t stop_counting_allocations();  // how many happened since start

}  // namespace mha::testing
