#include "dispatch.h"

#include <fmt/format.h>

#include <vector>

#include "buffers.h"
#include "cpu_isa.h"
#include "device.h"
#include "halide_calls.h"

namespace mha::detail {

using contract::ArgId;

const KernelComponent &component_for(Device device) {
    if (device == Device::cpu) {
        // An unusable MHA_CPU_ISA or MHA_TUNED_CPU is an error before any kernel is chosen.
        schedule_choice(int(cpu_isa()));
        return cpu_kernels();
    }
    return gpu_component(device);
}

ForwardKernels select_kernel(const ForwardParams &p) {
    contract::KernelVariant v;
    v.op = contract::KernelOp::forward;
    v.mask = p.mask.kind;                   // none, bytes (either convention) or additive
    v.causal = p.causal != Causal::none;    // either alignment: the kernel takes causal_offset
    v.returns_weights = p.returns_weights;  // per head (the averaging kernel reads them)
    v.fused_qkv = p.self_attention;         // one QKV projection
    v.dtype = p.kernel_dtype;               // f32, or 16 bits for the matrix engine or a GPU
    // On the CPU: the instruction set of the dtype, then the shape bucket of the token rows.
    const int isa = p.device != Device::cpu        ? -1
                    : p.kernel_dtype == DType::f32 ? int(cpu_isa())
                                                   : int(bf16_isa(p.kernel_dtype).value());
    const KernelComponent &component = component_for(p.device);
    ForwardKernels kernels{find_kernel(component, isa, p.token_rows(), v), nullptr};
    if (p.average_weights) {  // in f32, on the f32 instruction set
        const int f32_isa = p.device == Device::cpu ? int(cpu_isa()) : -1;
        kernels.average_heads =
            find_kernel(component, f32_isa, p.token_rows(), {contract::KernelOp::average_heads});
    }
    if (kernels.forward == nullptr || (p.average_weights && kernels.average_heads == nullptr)) {
        throw Error(fmt::format("internal error: the {} kernels have no variant for this call",
                                contract::device_name(p.device)));
    }
    return kernels;
}

const CompiledKernel &select_kernel(const AttentionParams &p) {
    contract::KernelVariant v;
    v.op = contract::KernelOp::attention;
    v.mask = p.mask.kind;                   // none, bytes (either convention) or additive
    v.causal = p.window;                    // a causal order or a sliding window, or both
    v.modified_scores = p.modified_scores;  // soft-capping or ALiBi
    v.single_query = p.query_len == 1;      // a decode step: K and V read where they lie
    const KernelComponent &component = component_for(Device::cpu);
    const int64_t rows = p.batch * p.query_len;
    // bf16 tensors read as they are by the bf16 instruction set that bf16_isa gives for this use
    // (one query row: wherever the CPU has AVX512_BF16; more: AMX's tile products, or dot
    // products where they outrun the f32 FMAs); every other call on the f32 instruction set,
    // 16-bit tensors widened.
    const CompiledKernel *kernel = nullptr;
    if (p.dtype == DType::bf16) {
        const Bf16Use use = v.single_query ? Bf16Use::reads : Bf16Use::products;
        if (const std::optional<size_t> bf16 = bf16_isa(p.dtype, use)) {
            v.dtype = DType::bf16;
            kernel = find_kernel(component, int(*bf16), rows, v);
        }
    }
    if (kernel == nullptr) {
        v.dtype = DType::f32;
        kernel = find_kernel(component, int(cpu_isa()), rows, v);
    }
    if (kernel == nullptr) {
        throw Error("internal error: the cpu kernels have no attention variant for this call");
    }
    return *kernel;
}

const CompiledKernel &select_kernel(const PagedParams &p) {
    contract::KernelVariant v;
    v.op = contract::KernelOp::attention;
    v.paged = true;               // one query row per head at the end of each sequence
    v.single_query = true;        // ... which one kernel of every f32 instruction set takes,
    v.causal = true;              // in a window, with modified scores, whatever the options
    v.modified_scores = true;     // (off at run time: the whole sequence, softcap and slopes 0)
    v.dtype = p.attention.dtype;  // of Q, K and V, widened as they are read
    const CompiledKernel *kernel =
        find_kernel(component_for(Device::cpu), int(cpu_isa()), p.attention.batch, v);
    if (kernel == nullptr) {
        throw Error("internal error: the cpu kernels have no paged attention variant");
    }
    return *kernel;
}

void run_forward(const ForwardParams &p, const ForwardKernels &kernels, const PackedWeights &packed,
                 const Tensor &query, const Tensor &key, const Tensor &value,
                 const MutableTensor &output, const std::optional<MutableTensor> &weights) {
    const CompiledKernel &kernel = *kernels.forward;
    const bool averaged = kernels.average_heads != nullptr;
    const std::array<int64_t, 4> full = p.weights_shape();
    // Buffers for every argument the variant takes; the kernel reads them in contract order.
    const auto typed = [&](ArgId id, const Tensor &t) {
        return dense_buffer(t, argument_type(kernel, id));
    };
    HostBuffer q = typed(ArgId::query, query), k = typed(ArgId::key, key);
    HostBuffer v = typed(ArgId::value, value), out = dense_buffer(output);
    HostBuffer mask_buffer, weights_buffer, averaged_buffer;
    std::vector<uint8_t> combined_bytes;
    std::vector<float> combined_floats;
    ArgValues values{};
    values[size_t(ArgId::query)] = q.raw_buffer();
    values[size_t(ArgId::key)] = k.raw_buffer();
    values[size_t(ArgId::value)] = v.raw_buffer();
    values[size_t(ArgId::output)] = out.raw_buffer();
    int32_t mask_blocks_nonzero = p.mask.blocks_nonzero;
    if (p.mask.kind != contract::MaskKind::none) {
        mask_buffer = kernel_mask_buffer(p.mask, full, combined_bytes, combined_floats);
        const bool bytes = p.mask.kind == contract::MaskKind::bytes;
        values[size_t(bytes ? ArgId::mask : ArgId::additive_mask)] = mask_buffer.raw_buffer();
        values[size_t(ArgId::mask_blocks_nonzero)] = &mask_blocks_nonzero;
    }
    // With averages asked for, the forward kernel writes each head's weights into the library's
    // own buffer, which the averaging kernel then reads.
    std::vector<float> head_weights;
    if (averaged) {
        head_weights.resize(size_t(full[0] * full[1] * full[2] * full[3]));
        weights_buffer =
            dense_buffer(MutableTensor{head_weights.data(), {full.begin(), full.end()}});
        averaged_buffer = dense_buffer(*weights);
        values[size_t(ArgId::head_weights)] = weights_buffer.raw_buffer();
        values[size_t(ArgId::averaged_weights)] = averaged_buffer.raw_buffer();
    } else if (weights) {
        weights_buffer = dense_buffer(*weights);
    }
    if (weights) {
        values[size_t(ArgId::weights)] = weights_buffer.raw_buffer();
    }
    int32_t head_dim = int32_t(p.head_dim), kv_heads = int32_t(p.kv_heads);
    int32_t causal_offset = p.causal_offset;
    values[size_t(ArgId::causal_offset)] = &causal_offset;
    values[size_t(ArgId::head_dim)] = &head_dim;
    values[size_t(ArgId::kv_heads)] = &kv_heads;
    for (size_t id = 0; id < contract::kArgCount; id++) {
        // Kernels only read the weights: one prepacked copy serves concurrent calls.
        const std::optional<HostBuffer> &w = packed.kernel_buffer(ArgId(id), p.kernel_dtype);
        if (w) {
            values[id] = const_cast<halide_buffer_t *>(w->raw_buffer());
        }
    }

    CallContext context;
    if (p.device != Device::cpu) {
        const KernelComponent &component = component_for(p.device);
        place_on_device(q, query.device_handle, true, component, context, "query");
        if (!kernel.variant.fused_qkv) {
            place_on_device(k, key.device_handle, true, component, context, "key");
            place_on_device(v, value.device_handle, true, component, context, "value");
        }
        if (p.mask.kind != contract::MaskKind::none) {
            place_on_device(mask_buffer, p.mask.device_handle, true, component, context,
                            "the mask");
        }
        place_on_device(out, output.device_handle, false, component, context, "output");
        if (averaged) {
            place_on_device(weights_buffer, 0, false, component, context, "the per-head weights");
        }
        if (weights) {
            place_on_device(averaged ? averaged_buffer : weights_buffer, weights->device_handle,
                            false, component, context, "weights");
        }
    }
    call_kernel(kernel, context, values);
    if (averaged) {
        call_kernel(*kernels.average_heads, context, values);
    }
    if (p.device != Device::cpu) {
        copy_output_to_host(out, output.device_handle, context, "output");
        if (weights) {
            copy_output_to_host(averaged ? averaged_buffer : weights_buffer, weights->device_handle,
                                context, "weights");
        }
    }
}

}  // namespace mha::detail
