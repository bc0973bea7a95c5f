// Replayable random tests. Every random input of a test comes from next_seed(), derived from the
// run's base seed and the test's full name: a failing test prints the base seed, and running
// it again with MHA_TEST_SEED set to that value (or --gtest_random_seed) replays it exactly,
// alone or among others.
#pragma once

#include <cstdint>

namespace mha::testing {

// The next seed of the running test.
uint64_t next_seed();

}  // namespace mha::testing
