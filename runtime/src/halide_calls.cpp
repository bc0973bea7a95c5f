#include "halide_calls.h"

#include <fmt/format.h>

#include <mutex>
#include <utility>

#include "scratch_pool.h"
#include "thread_pool.h"

namespace mha::detail {
namespace {

// The library call each thread works for: set while a CallContext lives on the calling thread,
// and in the pool's workers while they run that call's parallel loops. A user_context is the
// library's exactly when it is this thread's: a foreign one is never dereferenced, and the
// hooks, called several times per task, take no lock.
thread_local const CallContext *current_call = nullptr;

bool is_library_context(void *user_context) {
    return user_context != nullptr && user_context == current_call;
}

// The handlers installed before the library's, to which everything else goes.
halide_error_handler_t previous_error = &halide_default_error;
halide_malloc_t previous_malloc = &halide_default_malloc;
halide_free_t previous_free = &halide_default_free;
halide_do_par_for_t previous_par_for = &halide_default_do_par_for;

void on_error(void *user_context, const char *message) {
    if (is_library_context(user_context)) {
        // One call may report several errors (a failed driver call, then its consequence), from
        // several of its tasks at once.
        auto *context = static_cast<CallContext *>(user_context);
        std::lock_guard<std::mutex> lock(context->error_mutex);
        context->error += context->error.empty() ? "" : "; ";
        context->error += message;
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

// A library loop's task, run on whichever thread of the pool takes it for the call.
struct LibraryLoop {
    halide_task_t task;
    uint8_t *closure;
};

int run_library_task(void *user_context, int index, uint8_t *loop_closure) {
    const auto *loop = reinterpret_cast<const LibraryLoop *>(loop_closure);
    const CallContext *caller =
        std::exchange(current_call, static_cast<CallContext *>(user_context));
    const int result = loop->task(user_context, index, loop->closure);
    current_call = caller;
    return result;
}

int on_par_for(void *user_context, halide_task_t task, int min, int extent, uint8_t *closure) {
    if (!is_library_context(user_context)) {
        return previous_par_for(user_context, task, min, extent, closure);
    }
    LibraryLoop loop{task, closure};
    return pool_par_for(user_context, &run_library_task, min, extent,
                        reinterpret_cast<uint8_t *>(&loop));
}

thread_local std::string_view last_kernel;

}  // namespace

CallContext::CallContext() : caller_(std::exchange(current_call, this)) {}

CallContext::~CallContext() { current_call = caller_; }

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
