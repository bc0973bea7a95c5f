// Which kernels the program links, and which one serves a call.

#include "cpu_isa.h"
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
    const int slot = component.device == Device::cpu ? schedule_choice(isa).slot : 0;
    const contract::ScheduleCells cell =
        contract::schedule_cell(slot, contract::shape_bucket(token_rows));
    for (size_t k = 0; k < component.count; k++) {
        const CompiledKernel &kernel = component.kernels[k];
        if (kernel.variant == variant && (kernel.cells & cell) &&
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
                            {},
                            std::string(contract::mask_kind_name(kernel.variant.mask)),
                            kernel.variant.returns_weights,
                            kernel.variant.fused_qkv,
                            kernel.variant.causal,
                            kernel.variant.modified_scores,
                            kernel.variant.single_query,
                            kernel.variant.paged,
                            kernel.variant.dtype,
                            {}};
            const contract::BucketSet buckets = contract::cell_buckets(kernel.cells);
            if (buckets == contract::kAllBuckets) {
                info.buckets.emplace_back(contract::kAnyBucket);
            }
            for (const contract::BucketSpec &b : contract::kShapeBuckets) {
                if (buckets != contract::kAllBuckets &&
                    (buckets & contract::bucket_bit(b.bucket))) {
                    info.buckets.emplace_back(b.name);
                }
            }
            if (kernel.device == Device::cpu && kernel.cells != contract::kAllCells) {
                if (contract::serves_slot(kernel.cells, 0)) {
                    info.tunings.emplace_back("defaults");
                }
                for (const detail::TunedCpu *t = component->tuned_cpus; t->isa >= 0; t++) {
                    if (t->isa == kernel.isa && contract::serves_slot(kernel.cells, t->slot)) {
                        info.tunings.push_back(contract::cpu_key(t->cpu));
                    }
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

std::vector<TunedSchedule> tuned_schedules() {
    std::vector<TunedSchedule> all;
    for (size_t isa = 0; isa < contract::kCpuIsaCount; isa++) {
        if (detail::linked(isa)) {
            const detail::ScheduleChoice &choice = detail::schedule_choice(int(isa));
            all.push_back({std::string(contract::kCpuIsas[isa].name),
                           choice.tuned ? contract::cpu_key(choice.tuned->cpu) : "defaults",
                           choice.tuned ? contract::describe(choice.tuned->cpu) : "", choice.why});
        }
    }
    return all;
}

std::string this_cpu() { return contract::describe(detail::this_cpu()); }

}  // namespace mha
