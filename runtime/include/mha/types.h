// The enumerations of the public API that the kernel contract names too (contract/, generators/,
// the reference): nothing else, so that editing mha.h or its comments rebuilds no kernel.
#pragma once

namespace mha {

// Where a module runs its kernels. The CPU kernels are in the mha library itself; a program
// that uses a GPU links that device's library too (CMake targets mha_cuda, mha_opencl).
enum class Device {
    cpu,     // the best CPU instruction set of the build this CPU runs (mha::dispatched_isa())
    cuda,    // NVIDIA GPUs of compute capability 8.0 or newer (A100, H100, H200, ...)
    opencl,  // any OpenCL 1.2 device (also CPUs, through PoCL)
};

// The element type of activations and weights. Whatever it is, the kernels accumulate, and take
// the softmax and its statistics, in f32. bf16 is bfloat16 (f32's exponent, 8 bits of mantissa),
// f16 IEEE binary16.
enum class DType { f32, bf16, f16 };

// What a decode step's KV cache stores its keys and values in: a DType's elements, or int8 with
// one f32 scale per token and key/value head (symmetric: the head's largest |x| maps to 127),
// which the kernels fold into each score and each softmax weight.
enum class CacheDType { f32, bf16, f16, int8 };

// The two byte-mask conventions of the seeds.
enum class MaskConvention {
    keep,   // 0 = blocked, nonzero = attend (PyTorch article: masked_fill(mask == 0, -1e9))
    block,  // nonzero = blocked, 0 = attend (TF article: logits += mask * -1e9)
};

// Causal attention without a mask tensor: which keys query i sees when Sq != Sk.
enum class Causal {
    none,
    // j <= i: PyTorch's is_causal=True (and F.scaled_dot_product_attention's), aligned top-left.
    top_left,
    // j <= i + Sk - Sq: FlashAttention's and PyTorch's causal_lower_right, what a decode step of
    // Sq new tokens after Sk - Sq cached ones computes. The same as top_left when Sq == Sk.
    bottom_right,
};

}  // namespace mha
