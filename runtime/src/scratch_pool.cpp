#include "scratch_pool.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <utility>
#include <vector>

namespace mha::detail {
namespace {

// Halide's vector loads need at least its own malloc's alignment; 128 covers every target. Each
// block carries its size in a header of that many bytes before it.
constexpr size_t kAlignment = 128;

std::atomic<size_t> reserved_bytes{0};    // the caches' reservations, together
std::atomic<size_t> blocks_allocated{0};  // obtained from the C library
std::atomic<int> successes_before_failure{-1};

size_t &size_of(void *block) {
    return *reinterpret_cast<size_t *>(static_cast<char *>(block) - kAlignment);
}
void free_block(void *block) { std::free(static_cast<char *>(block) - kAlignment); }

// The blocks a thread freed, for its next allocations: a kernel's tasks allocate and free their
// buffers on the thread that runs them, so threads never wait on each other here. (size, block),
// a vector, scanned: taking and returning blocks then allocates nothing once it has grown.
// The cap on all caches together is met by reservations: a cache takes from the global budget
// only when it grows past what it already reserved, so that the calls after the first touch no
// shared counter (an atomic add per release, both threads releasing at once, took 2.4 % of
// a call at 8 x 32 tokens).
struct ThreadCache {
    std::vector<std::pair<size_t, void *>> free_blocks;
    size_t held = 0;      // bytes in free_blocks
    size_t reserved = 0;  // of the global budget, at least `held`
    ~ThreadCache();
};
thread_local bool cache_gone = false;  // trivially destructible: readable after ~ThreadCache
thread_local ThreadCache cache;

ThreadCache::~ThreadCache() {
    for (const auto &[size, block] : free_blocks) {
        free_block(block);
    }
    reserved_bytes -= reserved;
    cache_gone = true;
}

bool injected_failure() {
    int left = successes_before_failure.load(std::memory_order_relaxed);
    while (left >= 0 && !successes_before_failure.compare_exchange_weak(left, left - 1)) {
    }
    return left == 0;
}

}  // namespace

void *scratch_allocate(size_t bytes) {
    if (injected_failure()) {
        return nullptr;
    }
    // Whole alignment units, at least one (a zero-byte request still gets a distinct block).
    const size_t size = std::max<size_t>(1, (bytes + kAlignment - 1) / kAlignment) * kAlignment;
    if (!cache_gone) {
        // The smallest free block that fits, unless it would waste more than the request.
        auto &blocks = cache.free_blocks;
        auto fit = blocks.end();
        for (auto b = blocks.begin(); b != blocks.end(); ++b) {
            if (b->first >= size && b->first <= 2 * size &&
                (fit == blocks.end() || b->first < fit->first)) {
                fit = b;
            }
        }
        if (fit != blocks.end()) {
            void *block = fit->second;
            cache.held -= fit->first;
            *fit = blocks.back();
            blocks.pop_back();
            return block;
        }
    }
    char *base = static_cast<char *>(std::aligned_alloc(kAlignment, kAlignment + size));
    if (base == nullptr) {
        return nullptr;
    }
    blocks_allocated++;
    void *block = base + kAlignment;
    size_of(block) = size;
    return block;
}

void scratch_release(void *block) {
    if (block == nullptr) {
        return;
    }
    const size_t size = size_of(block);
    if (cache_gone) {
        free_block(block);
        return;
    }
    if (cache.held + size > cache.reserved) {
        const size_t more = cache.held + size - cache.reserved;
        if (reserved_bytes.fetch_add(more) + more > kMaxCachedBytes) {
            reserved_bytes -= more;
            free_block(block);
            return;
        }
        cache.reserved += more;
    }
    cache.held += size;
    cache.free_blocks.emplace_back(size, block);
}

size_t scratch_blocks_allocated() { return blocks_allocated.load(); }

void scratch_fail_allocation_after(int successes) { successes_before_failure.store(successes); }

size_t scratch_cached_bytes() { return reserved_bytes.load(); }

}  // namespace mha::detail
