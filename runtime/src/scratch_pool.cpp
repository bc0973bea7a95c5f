#include "scratch_pool.h"

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

namespace mha::detail {
namespace {

// Halide's vector loads need at least its own malloc's alignment; 128 covers every target.
constexpr size_t kAlignment = 128;

struct Pool {
    std::mutex mutex;
    // (size, block). A vector, scanned, rather than a map: taking and returning blocks then
    // allocates nothing once it has grown to the number of blocks a call uses.
    std::vector<std::pair<size_t, void *>> free_blocks;
    std::unordered_map<void *, size_t> sizes;  // every block the pool allocated
    size_t cached = 0;
    size_t allocated = 0;
    int successes_before_failure = -1;  // fault injection; -1: none
};

// Never destroyed: Halide may free a buffer after static destructors have run.
Pool &pool() {
    static Pool *const p = new Pool;
    return *p;
}

}  // namespace

void *scratch_allocate(size_t bytes) {
    // Whole alignment units, at least one (a zero-byte request still gets a distinct block).
    const size_t size = std::max<size_t>(1, (bytes + kAlignment - 1) / kAlignment) * kAlignment;
    Pool &p = pool();
    std::lock_guard<std::mutex> lock(p.mutex);
    if (p.successes_before_failure >= 0 && p.successes_before_failure-- == 0) {
        return nullptr;
    }
    // The smallest free block that fits, unless it would waste more than the request.
    auto fit = p.free_blocks.end();
    for (auto b = p.free_blocks.begin(); b != p.free_blocks.end(); ++b) {
        if (b->first >= size && b->first <= 2 * size &&
            (fit == p.free_blocks.end() || b->first < fit->first)) {
            fit = b;
        }
    }
    if (fit != p.free_blocks.end()) {
        void *block = fit->second;
        p.cached -= fit->first;
        *fit = p.free_blocks.back();
        p.free_blocks.pop_back();
        return block;
    }
    void *block = std::aligned_alloc(kAlignment, size);
    if (block != nullptr) {
        p.sizes.emplace(block, size);
        p.allocated++;
    }
    return block;
}

void scratch_release(void *block) {
    if (block == nullptr) {
        return;
    }
    Pool &p = pool();
    std::lock_guard<std::mutex> lock(p.mutex);
    const auto known = p.sizes.find(block);
    if (known == p.sizes.end()) {
        std::free(block);
        return;
    }
    const size_t size = known->second;
    if (p.cached + size > kMaxCachedBytes) {
        p.sizes.erase(known);
        std::free(block);
        return;
    }
    p.free_blocks.emplace_back(size, block);
    p.cached += size;
}

size_t scratch_blocks_allocated() {
    Pool &p = pool();
    std::lock_guard<std::mutex> lock(p.mutex);
    return p.allocated;
}

void scratch_fail_allocation_after(int successes) {
    Pool &p = pool();
    std::lock_guard<std::mutex> lock(p.mutex);
    p.successes_before_failure = successes;
}

size_t scratch_cached_bytes() {
    Pool &p = pool();
    std::lock_guard<std::mutex> lock(p.mutex);
    return p.cached;
}

}  // namespace mha::detail
