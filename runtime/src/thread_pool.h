// The kernels' parallel loops (Halide's halide_do_par_for, halide_calls.cpp routes the library's
// calls here): a fork-join pool whose idle workers keep polling for kPollFor before they sleep.
// Halide's own pool polls for about 40 yields (tens of microseconds) and then sleeps, so a call
// that comes a little later, as decode steps and small forward calls from Python or a model's
// layers do, first waits for a sleeping worker to wake: measured on a 2-vCPU VM, a one-query
// attention call over 512 keys took 1.5x as long. OpenMP (PyTorch's) and ONNX Runtime's pools
// poll too. A poll yields the core each time, so that other runnable threads go first.
//
// Nested loops (a kernel's parallel loops over batch rows, heads and row tiles) run on the same
// pool: each call publishes its iterations, works on them itself and waits for the workers that
// took some (taking iterations of other open loops meanwhile), so that a call completes even
// when no worker comes.
#pragma once

#include <HalideRuntime.h>

#include <chrono>
#include <cstdint>

namespace mha::detail {

inline constexpr std::chrono::microseconds kPollFor{1000};

// Runs task(user_context, i, closure) for i in [min, min + extent) on the pool; the first
// nonzero result, if any (later iterations are then skipped).
int pool_par_for(void *user_context, halide_task_t task, int min, int extent, uint8_t *closure);

// The threads the pool uses, the caller's included: `threads`, or with 0 HL_NUM_THREADS, else
// one per core. Takes effect from the next parallel loop.
void set_pool_threads(int threads);
int pool_threads();

// How many splits of its `keys` keys a step over a cache runs as tasks of their own, when its
// batch rows and key/value heads make `tasks`: one where those keep `threads` busy, else the
// fewest that give every thread work and as many tasks each (or at least 4 each), each split
// of at least `min_split_keys` keys. A split costs a pass over its rows' contexts to merge.
int64_t key_splits(int64_t tasks, int64_t keys, int threads, int64_t min_split_keys);

}  // namespace mha::detail
