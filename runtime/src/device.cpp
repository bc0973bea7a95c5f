#include "device.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <string>

namespace mha::detail {
namespace {

// Halide's runtime loads the driver itself, lazily; look first, to say plainly what is missing.
void require_driver(Device device) {
    for (const contract::GpuTarget &g : contract::kGpuTargets) {
        if (g.device != device) {
            continue;
        }
        const std::string library(g.driver_library);
        if (void *handle = dlopen(library.c_str(), RTLD_LAZY | RTLD_LOCAL)) {
            dlclose(handle);
            return;
        }
        throw Error(fmt::format("no {} driver found: {} could not be loaded",
                                contract::device_name(device), library));
    }
}

}  // namespace

const KernelComponent &gpu_component(Device device) {
    const KernelComponent *component = linked_component(device);
    if (component == nullptr) {
        throw Error(
            fmt::format("this program has no {0} kernels: link the mha_{0} library "
                        "(built when MHA_GPU_KERNELS is ON)",
                        contract::device_name(device)));
    }
    require_driver(device);
    return *component;
}

void place_on_device(HostBuffer &buffer, uint64_t device_handle, bool is_input,
                     const KernelComponent &component, CallContext &context, const char *what) {
    const halide_device_interface_t *interface = component.device_interface();
    const std::string_view device = contract::device_name(component.device);
    if (device_handle != 0) {
        check_halide(buffer.device_wrap_native(interface, device_handle, &context), context,
                     fmt::format("wrapping the {} device memory of {}", device, what));
    } else if (is_input) {
        // Without the host-dirty flag Halide would allocate device memory and never copy into it.
        buffer.set_host_dirty();
        check_halide(buffer.copy_to_device(interface, &context), context,
                     fmt::format("copying {} to the {} device", what, device));
    } else {
        check_halide(buffer.device_malloc(interface, &context), context,
                     fmt::format("allocating {} on the {} device", what, device));
    }
}

void copy_output_to_host(HostBuffer &buffer, uint64_t device_handle, CallContext &context,
                         const char *what) {
    if (device_handle == 0) {
        check_halide(buffer.copy_to_host(&context), context,
                     fmt::format("copying {} back from the device", what));
    }
}

}  // namespace mha::detail
