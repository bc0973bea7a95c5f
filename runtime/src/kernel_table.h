// The ahead-of-time compiled forward-pass variants, one per row of the build's variant table.
#pragma once

#include <cstddef>
#include <initializer_list>

#include "HalideRuntime.h"

namespace mha::detail {

enum class MaskKind { none, keep, block };

struct ForwardKernel {
    MaskKind mask_kind;
    bool returns_weights;
    bool fused_qkv;  // self-attention: query = key = value, one QKV projection
    int (*call)(void **args);  // Halide's _argv entry point
    const halide_filter_metadata_t *(*metadata)();
};

// Null when the build has no such variant.
const ForwardKernel *find_forward_kernel(MaskKind mask_kind, bool returns_weights,
                                         bool fused_qkv);

// Once per process: routes Halide's error messages to the call that raised them (through
// user_context) instead of printing them, and observes which compiled target Halide's run-time
// dispatch picks. Replaces the process-wide halide_error and can_use_target_features hooks.
void install_runtime_hooks();

// The instruction set ("avx512", "avx2", "sse41") of the kernel that the last dispatch on this
// thread chose; empty before any.
const char *dispatched_isa();

// The name of the kernel the last call_kernel on this thread ran.
const char *last_kernel_name();

struct NamedArgument {
    const char *name;
    void *value;  // halide_buffer_t* for buffers, a pointer to the value for scalars
};

// Calls a kernel through its argv entry point, binding arguments by their metadata names; a
// failure inside the kernel raises mha::Error with Halide's message.
void call_kernel(const ForwardKernel &kernel, std::initializer_list<NamedArgument> named);

}  // namespace mha::detail
