// Which kernels a checked forward call runs, and running them: every variant axis of the
// contract is chosen in select_kernel(), on one screen.
#pragma once

#include <optional>

#include "attention_params.h"
#include "forward_params.h"
#include "kernel_table.h"
#include "packed_weights.h"

namespace mha::detail {

// The device component a module runs on: the CPU's (its instruction set settled first), or a
// linked GPU library's; throws mha::Error saying what is missing.
const KernelComponent &component_for(Device device);

struct ForwardKernels {
    const CompiledKernel *forward;
    const CompiledKernel *average_heads;  // when averaged weights are asked; else null
};

ForwardKernels select_kernel(const ForwardParams &p);
// The attention core's kernel (mha::attention): for bf16 tensors those of AVX512_BF16's dot
// products where bf16_isa gives them, else f32 on the CPU's f32 instruction set.
const CompiledKernel &select_kernel(const AttentionParams &p);
// A paged step's (mha::paged_attention): the one kernel of its dtype on the f32 instruction set.
const CompiledKernel &select_kernel(const PagedParams &p);

// Runs `kernels` on the call's tensors (views of their memory, of the element type the kernels
// read: what `query`, `key` and `value` point to is read as such) and the module's `packed`
// weights; `weights` is options.weights. On a GPU, host tensors are copied in and out.
void run_forward(const ForwardParams &p, const ForwardKernels &kernels, const PackedWeights &packed,
                 const Tensor &query, const Tensor &key, const Tensor &value,
                 const MutableTensor &output, const std::optional<MutableTensor> &weights);

}  // namespace mha::detail
