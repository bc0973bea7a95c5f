// The test programs' problems (tests, the mha program, mha-tune and the benchmarks): random
// inputs, weights and masks of a reference::Problem, the library's views of them, and a module's
// run on them. Not the reference: this code calls the library it checks.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "mha/mha.h"
#include "reference.h"

namespace mha::problems {

using reference::Dims;
using reference::Problem;
using reference::TorchMask;

// The dtype random_problem() gives its problems: f32 unless set (the tests run every forward
// suite again in bf16 and in f16 this way, MHA_TEST_DTYPE).
void set_problem_dtype(DType dtype);
DType problem_dtype();

// Fresh uniform(-1, 1) inputs and nn.Linear-like weights; self-attention passes one tensor as
// query, key and value (Sq must equal Sk), which selects the fused QKV kernels.
// kdim and vdim (0: E) are the key's and value's features, kv_heads (0: H) the key/value heads.
Problem random_problem(const Dims &dims, uint64_t seed, bool self_attention = false,
                       int64_t kdim = 0, int64_t vdim = 0, int64_t kv_heads = 0);
// Adds a random mask of `shape` (about a third of positions blocked) in `convention`.
void add_random_mask(Problem &p, MaskConvention convention, std::vector<int64_t> shape,
                     uint64_t seed);

// Adds a random additive mask of `shape` (broadcasting to [B, H, Sq, Sk]): 0 or -1e9 as the TF
// article's mask·(-1e9) gives, key 0 never -1e9, or any finite float. A row -1e9 everywhere has
// no answer both precisions share: in f32, -1e9 + score rounds to a multiple of 64, which the
// double-precision reference does not.
void add_random_additive_mask(Problem &p, std::vector<int64_t> shape, bool only_0_or_minus_1e9,
                              uint64_t seed);
// A random PyTorch mask of `shape`: booleans about a third True, or finite floats; key 0 is
// never True, so that a float mask combined with it never makes a row -inf everywhere.
TorchMask random_torch_mask(bool is_bool, std::vector<int64_t> shape, uint64_t seed);

// The library's views of a problem's tensors.
std::array<Linear, 4> linears(const Problem &p);  // q, k, v, out
MultiHeadAttention make_module(const Problem &p, Device device = Device::cpu);
Tensor query_view(const Problem &p);
Tensor key_view(const Problem &p);
Tensor value_view(const Problem &p);
std::optional<Mask> mask_view(const Problem &p);
// Every mask of the problem, and `weights` when given.
ForwardOptions options_view(const Problem &p,
                            const std::optional<MutableTensor> &weights = std::nullopt);

// A problem's query, key and value as tensors of its dtype, converted once, and the call of a
// module on them (the output in f32): what run_module() and timing loops call.
class ProblemTensors {
public:
    explicit ProblemTensors(const Problem &p);  // `p` must outlive this
    void forward(const MultiHeadAttention &module, const MutableTensor &output,
                 const ForwardOptions &options) const;

private:
    const Problem &p_;
    std::vector<uint16_t> query_, key_, value_;  // bf16 or f16 bits; none for f32
};

// What `module` computes for `p`: output [B, Sq, E] and, when requested, weights [B, H, Sq, Sk]
// or, averaged, [B, Sq, Sk] (empty otherwise); buffers start as NaN so that anything left
// unwritten shows.
struct Outputs {
    std::vector<float> output, weights;
};
Outputs run_module(const MultiHeadAttention &module, const Problem &p, bool with_weights);

}  // namespace mha::problems
