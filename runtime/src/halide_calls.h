// Calls into Halide on behalf of the library. Each call passes a CallContext as Halide's
// user_context; the library's hooks (installed once, chained to whatever was installed before)
// take the errors, scratch allocations and parallel loops (thread_pool.h) that carry the
// CallContext of the call their thread works for, and hand everything else, another Halide
// pipeline's in the same process, to the previous handlers.
#pragma once

#include <array>
#include <mutex>
#include <string>

#include "kernel_table.h"

namespace mha::detail {

// The user_context of one library call, made on the thread that calls the kernels, which it
// marks as working for the call while it lives (contexts nest).
class CallContext {
public:
    CallContext();
    ~CallContext();
    CallContext(const CallContext &) = delete;
    CallContext &operator=(const CallContext &) = delete;

    std::string error;  // Halide's messages for this call
    std::mutex error_mutex;

private:
    const CallContext *caller_;
};

// Once per process, before the first kernel runs.
void install_runtime_hooks();

// Throws mha::Error("<what> failed (Halide error N): <messages>") when `result` is non-zero.
void check_halide(int result, const CallContext &context, const std::string &what);

// A kernel's argument values by contract argument (halide_buffer_t* for buffers, a pointer to
// the value for scalars); the kernel's variant decides which it reads, in contract order.
using ArgValues = std::array<void *, contract::kArgCount>;

// Runs `kernel`; a failure inside it raises mha::Error with Halide's message.
void call_kernel(const CompiledKernel &kernel, CallContext &context, const ArgValues &values);

// The name of the kernel the last call_kernel on this thread ran.
std::string_view last_kernel_name();

}  // namespace mha::detail
