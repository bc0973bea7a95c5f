#include "allocation_counter.h"

#include <atomic>
#include <cstdlib>
#include <new>

namespace {
std::atomic<bool> counting{false};
std::atomic<size_t> allocations{0};
}  // namespace

void *operator new(size_t bytes) {
    if (counting) {
        allocations++;
    }
    if (void *p = std::malloc(bytes == 0 ? 1 : bytes)) {
        return p;
    }
    throw std::bad_alloc();
}
void operator delete(void *p) noexcept { std::free(p); }
void operator delete(void *p, size_t) noexcept { std::free(p); }

namespace mha::testing {

void start_counting_allocations() {
    allocations = 0;
    counting = true;
}

size_t stop_counting_allocations() {
    counting = false;
    return allocations;
}

}  // namespace mha::testing
