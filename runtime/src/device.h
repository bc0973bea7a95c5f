// GPU devices through Halide's runtime: the linked component and its driver, uploads, wrapping
// caller device memory, copies back. Every Halide call passes a CallContext, so its errors reach
// the caller.
#pragma once

#include <cstdint>

#include "buffers.h"
#include "halide_calls.h"
#include "kernel_table.h"

namespace mha::detail {

// The linked component of a GPU `device`, its driver loadable; throws mha::Error saying what is
// missing (the component library, or the driver).
const KernelComponent &gpu_component(Device device);

// Makes `buffer` usable by a kernel on the component's device for one call: wraps
// `device_handle` when it is set, else copies the host data in (`is_input`) or allocates device
// memory for the kernel to write. The buffer releases what it received when destroyed. A failure
// (no device, device memory exhausted) raises mha::Error naming the buffer by `what`.
void place_on_device(HostBuffer &buffer, uint64_t device_handle, bool is_input,
                     const KernelComponent &component, CallContext &context, const char *what);

// After the kernel: copies an output the kernel wrote on the device back to host memory, unless
// the caller passed device memory.
void copy_output_to_host(HostBuffer &buffer, uint64_t device_handle, CallContext &context,
                         const char *what);

}  // namespace mha::detail
