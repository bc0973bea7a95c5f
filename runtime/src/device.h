// GPU devices through Halide's runtime: driver checks, uploads, wrapping caller device memory,
// copies back. Every Halide call passes a user_context, so its errors reach the caller.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "HalideRuntime.h"
#include "kernel_table.h"
#include "mha/mha.h"

namespace mha::detail {

const char *device_name(Device device);

// Halide's interface for `device`; throws mha::Error when its driver cannot be loaded.
const halide_device_interface_t *device_interface(Device device);

// The buffers of one forward call on a device: host tensors are copied in and out (marked
// host-dirty, which Halide needs to copy them at all), device tensors are wrapped without
// copies. Releases every device allocation it made when destroyed.
class DeviceCall {
public:
    DeviceCall(Device device, CallContext &context);
    ~DeviceCall();
    DeviceCall(const DeviceCall &) = delete;
    DeviceCall &operator=(const DeviceCall &) = delete;

    // An input: wrapped when `device_handle` is set, else its host memory is copied in.
    void input(halide_buffer_t *buffer, uint64_t device_handle);
    // An output: wrapped when `device_handle` is set, else copied back by finish().
    void output(halide_buffer_t *buffer, uint64_t device_handle);
    // After the kernel: copies host outputs back.
    void finish();

private:
    Device device_;
    CallContext &context_;
    const halide_device_interface_t *interface_;
    std::vector<halide_buffer_t *> wrapped_, allocated_, host_outputs_;
};

}  // namespace mha::detail
