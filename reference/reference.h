// A naive double-precision reference of the seed's PyTorch MultiHeadAttention module, written
// plainly for reading: pure functions of row-major vectors in PyTorch's layouts, which know
// nothing of the library they check (tests/support makes the problems and runs the library).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "mha/types.h"
#include "mha_contract.h"

namespace mha::reference {

using Dims = contract::ProblemShape;

// One of PyTorch's mask arguments: boolean (nonzero = True = blocked) or float (added), in
// PyTorch's shape: key_padding_mask [B, Sk], attn_mask [Sq, Sk] or [B·H, Sq, Sk].
struct TorchMask {
    bool is_bool = true;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bools;
    std::vector<float> floats;
};

// A rotary position embedding (mha::RotaryOptions' meaning): the first rotary_dim features of
// each head (0: all) in pairs, i with i + rotary_dim / 2 or, interleaved, 2i with 2i + 1, rotated
// by position · theta^(-2i / rotary_dim), or by the tables' angles.
struct Rotary {
    bool interleaved = false;
    int64_t rotary_dim = 0;
    double theta = 10000;
    std::vector<float> cos, sin;  // [positions, rotary_dim / 2]; empty: from theta
};

// One problem: inputs, the four nn.Linear layers, and optional masks of one family (see
// mha::ForwardOptions).
struct Problem {
    Dims dims;
    bool self_attention = false;           // key and value views show `query` itself
    std::vector<float> query, key, value;  // [B, Sq, E], [B, Sk, E], [B, Sk, E]
    std::array<int64_t, 4> in_features{};  // of q, k, v, out: E, kdim, vdim, E
    int64_t kv_heads = 0;                  // key/value heads (grouped-query attention)
    // q, k, v, out: [out, in_features] ([out, in] layout), out = E, or kv_heads · d for k and v.
    std::vector<float> weight[4];
    std::vector<float> bias[4];  // [E]
    std::optional<MaskConvention> mask_convention;
    std::vector<int64_t> mask_shape;  // broadcasts to [B, H, Sq, Sk]
    std::vector<uint8_t> mask;
    std::vector<int64_t> additive_shape;  // broadcasts to [B, H, Sq, Sk]; empty: none
    std::vector<float> additive;
    std::optional<TorchMask> key_padding_mask, attn_mask;
    Causal causal = Causal::none;
    bool average_weights = false;  // weights averaged over heads, [B, Sq, Sk]
    // The library runs the problem in `dtype`: a module of that dtype, its tensors of that type
    // (the output f32); the reference reads the inputs, weights and biases rounded to it.
    DType dtype = DType::f32;
    // The projected keys and values rounded to it, as a decode step's cache of it holds them
    // (int8: each token's head quantized with its own scale, then scaled back).
    CacheDType kv_dtype = CacheDType::f32;
    // The projected queries and keys rotated, query i at position i and key j at j (before the
    // keys are rounded to kv_dtype), as a decode step with a rotary cache rotates them.
    std::optional<Rotary> rotary;
};

// Output features of projection l (0 = q, 1 = k, 2 = v, 3 = out).
int64_t out_features(const Problem &p, int l);

// The bits of x rounded to a 16-bit dtype (bf16 or f16), as tensors of it hold them; x as such
// a tensor holds it (f32: x itself); the values such bits hold.
std::vector<uint16_t> bits_of(const std::vector<float> &x, DType dtype);
std::vector<float> rounded(const std::vector<float> &x, DType dtype);
std::vector<float> values_of(const std::vector<uint16_t> &bits, DType dtype);

// --- The stages, in double precision. ---
// y[r, o] = b[o] + sum_i x[r, i] * w[o, i]  over rows r of x [rows, in], o < b.size().
std::vector<double> linear(const std::vector<double> &x, int64_t rows, int64_t in,
                           const std::vector<float> &w, const std::vector<float> &b);
// [B, S, H*d] -> [B, H, S, d] and back.
// x [rows, heads · d] rotated by `r`, row t at position t % positions.
std::vector<double> rotated(const std::vector<double> &x, int64_t positions, int64_t heads,
                            int64_t d, const Rotary &r);
std::vector<double> split_heads(const std::vector<double> &x, int64_t B, int64_t S, int64_t H,
                                int64_t d);
std::vector<double> merge_heads(const std::vector<double> &x, int64_t B, int64_t S, int64_t H,
                                int64_t d);
// [B, H, Sq, d] x [B, H, Sk, d] -> [B, H, Sq, Sk], divided by sqrt(d).
std::vector<double> scaled_scores(const std::vector<double> &q, const std::vector<double> &k,
                                  int64_t BH, int64_t Sq, int64_t Sk, int64_t d);
// What a problem's masks do to score (b, h, i, j), by their documented semantics
// (mha::ForwardOptions): a blocked score becomes -1e9; otherwise `added` is added to it.
struct ScoreMask {
    bool blocked = false;
    double added = 0;
};
ScoreMask score_mask(const Problem &p, int64_t b, int64_t h, int64_t i, int64_t j);
// How many keys query i sees in the problem's causal order (all without one).
int64_t visible_keys(const Problem &p, int64_t i);
// Softmax over keys of the scores [B, H, Sq, Sk] masked by `p`'s masks.
std::vector<double> masked_softmax(const std::vector<double> &scores, const Problem &p);
// The same with only a byte mask broadcast to [B, H, Sq, Sk].
std::vector<double> masked_softmax(const std::vector<double> &scores, const Dims &dims,
                                   const std::optional<MaskConvention> &convention,
                                   const std::vector<int64_t> &mask_shape,
                                   const std::vector<uint8_t> &mask);
// [B, H, Sq, Sk] x [B, H, Sk, d] -> [B, H, Sq, d].
std::vector<double> attend_values(const std::vector<double> &weights, const std::vector<double> &v,
                                  int64_t BH, int64_t Sq, int64_t Sk, int64_t d);

// Whether the mask blocks position (b, h, i, j), broadcasting its shape.
bool is_blocked(MaskConvention convention, const std::vector<int64_t> &mask_shape,
                const std::vector<uint8_t> &mask, int64_t b, int64_t h, int64_t i, int64_t j);

struct Result {
    std::vector<double> output;   // [B, Sq, E]
    std::vector<double> weights;  // [B, H, Sq, Sk], or [B, Sq, Sk] averaged over heads
};
Result forward(const Problem &p);

// What a decode step (MultiHeadAttention::decode) gives the last `count` tokens of one row whose
// tokens so far, cached then new, are `sequence` [T, E]: forward() over the whole row with
// `module`'s weights (its dims and masks ignored) in causal order, cache position j hidden where
// `hidden[j]` (empty: none hidden), keys and values rounded to `cache_dtype`. [count, E].
std::vector<double> decode_outputs(const Problem &module, const std::vector<float> &sequence,
                                   int64_t count, const std::vector<bool> &hidden = {},
                                   CacheDType cache_dtype = CacheDType::f32);

std::vector<double> to_double(const std::vector<float> &x);

// ||got - want||_2 / ||want||_2.
double relative_l2(const std::vector<float> &got, const std::vector<double> &want);
// The relative L2 error the library's output meets against forward(p): 1e-5 (f32 arithmetic),
// and 1e-2 in bf16, whose matrix-engine kernels round to bf16 (2^-9 each at most) what their
// tile products read: the projected queries, keys and values, the attention weights and the
// merged heads; outputs which cancel magnify that (4.7e-3 on a fuzzed shape).
double output_tolerance(const Problem &p);
// The same for the attention weights: 1e-5, and 1e-2 in bf16 (scores of bf16 queries and keys).
double weights_tolerance(const Problem &p);
// max |got - want| / max |want|.
double max_relative_error(const std::vector<float> &got, const std::vector<double> &want);

}  // namespace mha::reference
