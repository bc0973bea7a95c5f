// The ahead-of-time compiled forward-pass variants, one per row of the build's variant table.
#pragma once

#include <cstddef>
#include <vector>
#include <string>

#include "HalideRuntime.h"
#include "kernel_abi.h"
#include "mha/mha.h"

namespace mha::detail {

enum class MaskKind { none, keep, block };

struct ForwardKernel {
    Device device;
    ShapeBucket bucket;
    MaskKind mask_kind;
    bool returns_weights;
    bool fused_qkv;  // self-attention: query = key = value, one QKV projection
    int (*call)(void **args);  // Halide's _argv entry point
    const halide_filter_metadata_t *(*metadata)();
};

// The kernel for a call whose largest projection has `token_rows` = B·max(Sq, Sk); null when
// the build has no such variant.
const ForwardKernel *find_forward_kernel(Device device, int64_t token_rows, MaskKind mask_kind,
                                         bool returns_weights, bool fused_qkv);

// Collects the error messages of the Halide calls made with it as their user_context.
struct CallContext {
    std::string error;
};

// Throws mha::Error("<what> failed (Halide error N): <messages>") when `result` is non-zero.
void check_halide(int result, const CallContext &context, const std::string &what);

// Once per process: routes Halide's error messages to the call that raised them (through
// user_context) instead of printing them, and observes which compiled target Halide's run-time
// dispatch picks. Replaces the process-wide halide_error and can_use_target_features hooks.
void install_runtime_hooks();

// The instruction set ("avx512", "avx2", "sse41") of the kernel that Halide's dispatch last
// chose in this process; empty before any.
const char *dispatched_isa();

// The name of the kernel the last call_kernel on this thread ran.
const char *last_kernel_name();

struct NamedArgument {
    const char *name;
    void *value;  // halide_buffer_t* for buffers, a pointer to the value for scalars
};

// Calls a kernel through its argv entry point, binding arguments by their metadata names and
// `context` as its user_context; a failure inside the kernel raises mha::Error with Halide's
// message.
void call_kernel(const ForwardKernel &kernel, CallContext &context,
                 const std::vector<NamedArgument> &named);

}  // namespace mha::detail
