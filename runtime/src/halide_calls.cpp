#include "halide_calls.h"

#include <fmt/format.h>

#include <algorithm>
#include <mutex>
#include <vector>

#include "scratch_pool.h"
#include "thread_pool.h"

namespace mha::detail {
namespace {

// The live call contexts. Looked up only on errors and scratch allocations (a few per call),
// by address: a foreign user_context is never dereferenced.
struct LiveContexts {
    std::mutex mutex;
    std::vector<const void *> live;
};
LiveContexts &live_contexts() {
    static LiveContexts *const contexts = new LiveContexts;  // never destroyed: see scratch_pool
    return *contexts;
}

bool is_library_context(void *user_context) {
    if (user_context == nullptr) {
        return false;
    }
    LiveContexts &c = live_contexts();
    std::lock_guard<std::mutex> lock(c.mutex);
    return std::find(c.live.begin(), c.live.end(), user_context) != c.live.end();
}

// The handlers installed before the library's, to which everything else goes.
halide_error_handler_t previous_error = &halide_default_error;
halide_malloc_t previous_malloc = &halide_default_malloc;
halide_free_t previous_free = &halide_default_free;
halide_do_par_for_t previous_par_for = &halide_default_do_par_for;

void on_error(void *user_context, const char *message) {
    if (is_library_context(user_context)) {
        // One call may report several errors (a failed driver call, then its consequence).
        std::string &error = static_cast<CallContext *>(user_context)->error;
        error += error.empty() ? "" : "; ";
        error += message;
    } else {
        previous_error(user_context, message);
    }
}

void *on_malloc(void *user_context, size_t bytes) {
    return is_library_context(user_context) ? scratch_allocate(bytes)
                                            : previous_malloc(user_context, bytes);
}

void on_free(void *user_context, void *block) {
    if (is_library_context(user_context)) {
        scratch_release(block);
    } else {
        previous_free(user_context, block);
    }
}

int on_par_for(void *user_context, halide_task_t task, int min, int extent, uint8_t *closure) {
    return is_library_context(user_context)
               ? pool_par_for(user_context, task, min, extent, closure)
               : previous_par_for(user_context, task, min, extent, closure);
}

thread_local std::string_view last_kernel;

}  // namespace

CallContext::CallContext() {
    LiveContexts &c = live_contexts();
    std::lock_guard<std::mutex> lock(c.mutex);
    c.live.push_back(this);
}

CallContext::~CallContext() {
    LiveContexts &c = live_contexts();
    std::lock_guard<std::mutex> lock(c.mutex);
    c.live.erase(std::find(c.live.begin(), c.live.end(), this));
}

void install_runtime_hooks() {
    static std::once_flag once;
    std::call_once(once, [] {
        // A null previous handler means Halide's default.
        if (halide_error_handler_t e = halide_set_error_handler(&on_error)) {
            previous_error = e;
        }
        if (halide_malloc_t m = halide_set_custom_malloc(&on_malloc)) {
            previous_malloc = m;
        }
        if (halide_free_t f = halide_set_custom_free(&on_free)) {
            previous_free = f;
        }
        if (halide_do_par_for_t p = halide_set_custom_do_par_for(&on_par_for)) {
            previous_par_for = p;
        }
    });
}

void check_halide(int result, const CallContext &context, const std::string &what) {
    if (result != 0) {
        throw Error(fmt::format("{} failed (Halide error {}): {}", what, result, context.error));
    }
}

void call_kernel(const CompiledKernel &kernel, CallContext &context, const ArgValues &values) {
    void *user_context = &context;
    std::array<void *, contract::kArgCount + 1> argv{};
    size_t n = 0;
    argv[n++] = &user_context;
    for (contract::ArgId id : contract::kernel_arguments(kernel.variant)) {
        argv[n++] = values[size_t(id)];
    }
    last_kernel = kernel.name;
    const int result = kernel.call_argv(argv.data());
    if (result != 0) {  // the message is formatted only then: a call allocates nothing
        check_halide(result, context, fmt::format("kernel {}", kernel.name));
    }
}

std::string_view last_kernel_name() { return last_kernel; }

}  // namespace mha::detail
