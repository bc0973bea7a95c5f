// Which kernels the program links, and which one serves a call.

#include "kernel_table.h"

// Defined by the GPU libraries (kernels/<device>_kernels.cpp); weak, so that a program linked
// without one sees null. Linking mha_<device> forces the definition in (--undefined).
extern "C" {
__attribute__((weak)) const mha::detail::KernelComponent *mha_detail_cuda_kernels();
__attribute__((weak)) const mha::detail::KernelComponent *mha_detail_opencl_kernels();
}

namespace mha {
namespace detail {

const KernelComponent *linked_component(Device device) {
    switch (device) {
    case Device::cpu:
        return &cpu_kernels();
    case Device::cuda:
        return mha_detail_cuda_kernels != nullptr ? mha_detail_cuda_kernels() : nullptr;
    case Device::opencl:
        return mha_detail_opencl_kernels != nullptr ? mha_detail_opencl_kernels() : nullptr;
    }
    return nullptr;
}

const CompiledKernel *find_kernel(const KernelComponent &component, int isa, int64_t token_rows,
                                  const contract::KernelVariant &variant) {
    const contract::BucketSet bucket = contract::bucket_bit(contract::shape_bucket(token_rows));
    for (size_t k = 0; k < component.count; k++) {
        const CompiledKernel &kernel = component.kernels[k];
        if (kernel.variant == variant && (kernel.buckets & bucket) &&
            (kernel.device != Device::cpu || kernel.isa == isa)) {
            return &kernel;
        }
    }
    return nullptr;
}

bool has_forward_kernels(const KernelComponent &component, DType dtype) {
    for (size_t k = 0; k < component.count; k++) {
        const contract::KernelVariant &v = component.kernels[k].variant;
        if (v.op == contract::KernelOp::forward && v.dtype == dtype) {
            return true;
        }
    }
    return false;
}

}  // namespace detail

std::vector<KernelInfo> linked_kernels() {
    std::vector<KernelInfo> all;
    for (Device device : contract::kDevices) {
        const detail::KernelComponent *component = detail::linked_component(device);
        for (size_t k = 0; component != nullptr && k < component->count; k++) {
            const detail::CompiledKernel &kernel = component->kernels[k];
            KernelInfo info{std::string(kernel.name),
                            std::string(contract::op_name(kernel.variant.op)),
                            kernel.device,
                            kernel.isa >= 0 ? std::string(contract::kCpuIsas[kernel.isa].name) : "",
                            {},
                            std::string(contract::mask_kind_name(kernel.variant.mask)),
                            kernel.variant.returns_weights,
                            kernel.variant.fused_qkv,
                            kernel.variant.causal,
                            kernel.variant.modified_scores,
                            kernel.variant.single_query,
                            kernel.variant.dtype,
                            {}};
            if (kernel.buckets == contract::kAllBuckets) {
                info.buckets.emplace_back(contract::kAnyBucket);
            }
            for (const contract::BucketSpec &b : contract::kShapeBuckets) {
                if (kernel.buckets != contract::kAllBuckets &&
                    (kernel.buckets & contract::bucket_bit(b.bucket))) {
                    info.buckets.emplace_back(b.name);
                }
            }
            for (contract::ArgId id : contract::kernel_arguments(kernel.variant)) {
                info.arguments.emplace_back(contract::arg(id).name);
            }
            all.push_back(std::move(info));
        }
    }
    return all;
}

}  // namespace mha
