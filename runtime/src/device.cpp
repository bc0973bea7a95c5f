#include "device.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include "HalideRuntimeCuda.h"
#include "HalideRuntimeOpenCL.h"

namespace mha::detail {

const char *device_name(Device device) {
    switch (device) {
    case Device::cpu:
        return "cpu";
    case Device::cuda:
        return "cuda";
    case Device::opencl:
        return "opencl";
    }
    return "unknown";
}

namespace {

// Halide's runtime loads the driver itself, lazily; look first, to say plainly what is missing.
void require_driver(const char *api, const char *library, const char *soname) {
    for (const char *name : {soname, library}) {
        if (void *handle = dlopen(name, RTLD_LAZY | RTLD_LOCAL)) {
            dlclose(handle);
            return;
        }
    }
    throw Error(fmt::format("no {} driver found: {} could not be loaded", api, library));
}

}  // namespace

const halide_device_interface_t *device_interface(Device device) {
    if (device == Device::cpu) {
        return nullptr;
    }
#ifdef MHA_WITH_GPU
    if (device == Device::cuda) {
        require_driver("CUDA", "libcuda.so", "libcuda.so.1");
        return halide_cuda_device_interface();
    }
    require_driver("OpenCL", "libOpenCL.so", "libOpenCL.so.1");
    return halide_opencl_device_interface();
#else
    throw Error(fmt::format("this build has no {} kernels (configured with MHA_GPU_KERNELS=OFF)",
                            device_name(device)));
#endif
}

DeviceCall::DeviceCall(Device device, CallContext &context)
    : device_(device), context_(context), interface_(device_interface(device)) {}

DeviceCall::~DeviceCall() {
#ifdef MHA_WITH_GPU
    for (halide_buffer_t *b : wrapped_) {
        if (device_ == Device::cuda) {
            halide_cuda_detach_device_ptr(&context_, b);
        } else {
            halide_opencl_detach_cl_mem(&context_, b);
        }
    }
#endif
    for (halide_buffer_t *b : allocated_) {
        halide_device_free(&context_, b);
    }
}

void DeviceCall::input(halide_buffer_t *buffer, uint64_t device_handle) {
    if (device_handle != 0) {
        output(buffer, device_handle);  // wrapping is the same either way
        return;
    }
    // Without the host-dirty flag Halide would allocate device memory and never copy into it.
    buffer->flags |= halide_buffer_flag_host_dirty;
    allocated_.push_back(buffer);
    check_halide(halide_copy_to_device(&context_, buffer, interface_), context_,
                 fmt::format("copying an input to the {} device", device_name(device_)));
}

void DeviceCall::output(halide_buffer_t *buffer, uint64_t device_handle) {
    if (device_handle != 0) {
#ifdef MHA_WITH_GPU
        const int result = device_ == Device::cuda
                               ? halide_cuda_wrap_device_ptr(&context_, buffer, device_handle)
                               : halide_opencl_wrap_cl_mem(&context_, buffer, device_handle);
        check_halide(result, context_,
                     fmt::format("wrapping {} device memory", device_name(device_)));
        wrapped_.push_back(buffer);
#endif
        return;
    }
    allocated_.push_back(buffer);
    host_outputs_.push_back(buffer);
    check_halide(halide_device_malloc(&context_, buffer, interface_), context_,
                 fmt::format("allocating an output on the {} device", device_name(device_)));
}

void DeviceCall::finish() {
    for (halide_buffer_t *b : host_outputs_) {
        check_halide(halide_copy_to_host(&context_, b), context_,
                     fmt::format("copying an output back from the {} device", device_name(device_)));
    }
}

}  // namespace mha::detail
