// Halide's allocator hooks for the kernels' intermediate buffers, which Halide allocates and frees
// on every call. Returned straight to the C library, the larger ones go back to the operating
// system at the end of each call and are faulted in again by the next (with TLB shootdowns
// across the thread pool): on small calls that costs more than the arithmetic. The pool keeps
// freed blocks for later calls, up to kMaxCachedBytes in all, each in a cache of the thread that
// freed it (a global one, under a mutex, had the kernels' tasks waiting on each other).
#pragma once

#include <cstddef>

namespace mha::detail {

inline constexpr size_t kMaxCachedBytes = size_t(256) << 20;

// Halide's allocations for a library call (halide_calls.cpp routes them here).
void *scratch_allocate(size_t bytes);
void scratch_release(void *block);

// Bytes the threads' caches have reserved for reuse (at least what they hold now; it grows only
// when a cache outgrows its reservation), and blocks obtained from the C library so far, for
// tests.
size_t scratch_cached_bytes();
size_t scratch_blocks_allocated();

// Fault injection, for tests: after `successes` more allocations, the next one fails as if
// memory had run out (once); -1 cancels.
void scratch_fail_allocation_after(int successes);

}  // namespace mha::detail
