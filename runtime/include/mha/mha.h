// mha: multi-head attention with ahead-of-time compiled Halide kernels.
//
// Semantics are those of torch.nn.MultiheadAttention without dropout (the seed's PyTorch module):
//   Q = query·Wqᵀ + bq, K = key·Wkᵀ + bk, V = value·Wvᵀ + bv          [B, S, E]
//   split into H heads of d = E / H                                     [B, H, S, d]
//   scores = Q·Kᵀ / sqrt(d), plus any float mask; blocked positions     [B, H, Sq, Sk]
//            set to exactly -1e9 (see ForwardOptions for the masks)
//   weights = softmax over keys (row max subtracted; a row whose every key a byte or boolean
//             mask blocks is uniform, never NaN)
//   context = weights·V, heads merged back                               [B, Sq, E]
//   output = context·Woᵀ + bo                                            [B, Sq, E]
//
// Tensors are row-major, contiguous views laid out as PyTorch lays them; the library never owns
// or frees them. Every argument is checked before a kernel runs: a bad one raises mha::Error
// whose message names it and its value. forward() may be called from several threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "mha/types.h"

namespace mha {

// Raised for bad arguments and for failures reported by a kernel.
class Error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

// The kernels address each buffer with 32-bit offsets: every tensor a call passes, every
// broadcast view of a mask (counted at its full [B, H, Sq, Sk] extent) and every buffer a kernel
// makes from them (the padded projections, the heads, the per-head weights an average is taken
// over, the KV cache) holds at most this many bytes. Calls past it raise mha::Error before
// anything is allocated or read.
inline constexpr int64_t kMaxBufferBytes = 2147483647;

// A 16-bit element of a tensor (mha::DType, types.h) held as its bits. The attention weights a
// call returns are f32 in every dtype.
struct bfloat16 {
    uint16_t bits = 0;
};
struct float16 {
    uint16_t bits = 0;
};
// Exact widening, and rounding to the nearest even (NaN stays NaN; f16 overflows to Inf).
float to_float(bfloat16 x);
float to_float(float16 x);
bfloat16 to_bfloat16(float x);
float16 to_float16(float x);

// A row-major, contiguous view: `shape` lists dimensions outermost first, as PyTorch does.
// On a GPU module a tensor may live in device memory instead: `device_handle` is then a CUDA
// device pointer (CUdeviceptr) or an OpenCL buffer (cl_mem, of the context Halide's runtime
// uses), `data` is ignored, and the kernels read and write it in place.
template <typename T>
struct TensorView {
    T *data = nullptr;
    std::vector<int64_t> shape;
    uint64_t device_handle = 0;
};
using Tensor = TensorView<const float>;
using MutableTensor = TensorView<float>;
using BF16Tensor = TensorView<const bfloat16>;
using MutableBF16Tensor = TensorView<bfloat16>;
using F16Tensor = TensorView<const float16>;
using MutableF16Tensor = TensorView<float16>;

// A view with strides: `shape` and `strides` outermost first, strides in elements (zero for a
// broadcast dimension); empty strides: row-major and contiguous. The library never owns it.
template <typename T>
struct StridedView {
    T *data = nullptr;
    std::vector<int64_t> shape;
    std::vector<int64_t> strides;
};

// A byte mask of the seeds, in either convention. In a forward call it broadcasts against
// [B, H, Sq, Sk] as the seed's masked_fill broadcasts it: any rank up to 4, right-aligned, each
// dimension 1 or the full extent ([B, 1, 1, Sk] is a key padding, [Sq, Sk] or [H, Sq, Sk] a mask
// of positions, [1] one for all). A decode step's key padding is [B, capacity].
struct Mask {
    TensorView<const uint8_t> values;
    MaskConvention convention = MaskConvention::keep;
};

// One of PyTorch's mask arguments (torch.nn.MultiheadAttention.forward): boolean, one byte per
// element, nonzero = True = the position is blocked; or float, added to the scores.
using BoolTensor = TensorView<const uint8_t>;
using MaskTensor = std::variant<BoolTensor, Tensor>;

// What a forward call may take besides its inputs and output. Masks come in two families that a
// call does not mix: the seeds' (`mask` or `additive_mask`) and PyTorch's (`key_padding_mask`,
// `attn_mask`, or both, which combine as in PyTorch: blocked where either blocks, floats added).
//
// | argument | shape | element | a position is |
// |---|---|---|---|
// | mask | rank <= 4, broadcast | byte, keep or block convention | blocked: score = -1e9 |
// | additive_mask | rank <= 4, broadcast | float | score + value |
// | key_padding_mask | [B, Sk] | bool (True = padding) or float | blocked, or score + value |
// | attn_mask | [Sq, Sk] or [B·H, Sq, Sk] | bool (True = blocked) or float | same |
//
// A blocked score is exactly -1e9, as in the seed, so a row that every key blocks gets uniform
// weights; PyTorch blocks with -inf and gives NaN there. Float masks are added as given: -inf
// weighs a key exactly 0, and a row that is -inf everywhere gives NaN, as in PyTorch. When a
// boolean and a float PyTorch mask combine, True becomes -inf, as PyTorch converts it.
// Seed masks broadcast right-aligned, so PyTorch's [B, Sk] key padding goes in key_padding_mask
// (as a seed mask it would be read as [Sq, Sk]).
struct ForwardOptions {
    std::optional<Mask> mask;
    std::optional<Tensor> additive_mask;  // e.g. the TF article's mask·(-1e9), BERT's extended mask
    std::optional<MaskTensor> key_padding_mask;
    std::optional<MaskTensor> attn_mask;
    // Keys a query does not see in this order weigh exactly 0 and are never computed (whole key
    // tiles skipped); masks apply among the keys it sees. A query that sees no key (bottom_right
    // with Sq > Sk) gets weights 0 and a zero context, so its output is the output bias, as
    // FlashAttention and PyTorch's scaled_dot_product_attention with causal_lower_right give.
    Causal causal = Causal::none;
    // When given, the attention weights: [B, H, Sq, Sk], each head's, or with average_weights
    // (PyTorch's average_attn_weights=True, its default) [B, Sq, Sk], their mean over heads.
    std::optional<MutableTensor> weights;
    bool average_weights = false;
};

// One nn.Linear(in, E): weight [E, in] in [out, in] layout, bias [E] or none (zero); in f32
// (Linear), or as a model ships them, bf16 or f16.
template <typename T>
struct LinearOf {
    TensorView<const T> weight;
    std::optional<TensorView<const T>> bias;
};
using Linear = LinearOf<float>;
using BF16Linear = LinearOf<bfloat16>;
using F16Linear = LinearOf<float16>;

// A rotary position embedding (RoPE) of a token's query and key heads at its position p: the
// first rotary_dim features of each head (even; 0: all d) rotate in pairs, rotate_half (Llama,
// NeoX: feature i with i + rotary_dim / 2) or interleaved (GPT-J: 2i with 2i + 1), by the angle
// p · theta^(-2i / rotary_dim), computed in f32 as transformers computes it; or by caller-given
// tables cos and sin [max_position, rotary_dim / 2] (f32; scaled variants such as YaRN's give
// them). rotary_embedding() applies it to tensors, a decode step to its new tokens.
enum class RotaryStyle { rotate_half, interleaved };
struct RotaryOptions {
    RotaryStyle style = RotaryStyle::rotate_half;
    int64_t rotary_dim = 0;
    float theta = 10000;
    std::optional<StridedView<const float>> cos, sin;
};

namespace detail {
struct PackedWeights;
struct KvCacheStorage;
struct WidenedLinears;
}  // namespace detail
template <typename T>
struct PagedDecodeCache;

// The keys and values of the tokens a decoder has seen, already projected and split into heads,
// so that a decode step projects only its new tokens (MultiHeadAttention::decode). Made by a
// module (make_cache) for `batch` rows of up to `capacity` tokens each, all allocated at once,
// in f32, bf16, f16 or int8, its keys rotated or not (RotaryOptions); owned by the caller; used
// with that module only.
class KvCache {
public:
    ~KvCache();
    KvCache(KvCache &&) noexcept;
    KvCache &operator=(KvCache &&) noexcept;

    int64_t batch() const;
    int64_t capacity() const;
    // What the keys and values are stored in.
    CacheDType dtype() const;
    // Tokens cached in each batch row.
    const std::vector<int64_t> &lengths() const;
    // Whether a step rotates its new tokens' queries and keys (make_cache's `rotary`).
    bool rotary() const;
    // Forgets every row's tokens; or all but the first `length` of each row.
    void reset();
    void truncate(int64_t length);

private:
    friend class MultiHeadAttention;
    explicit KvCache(std::unique_ptr<detail::KvCacheStorage> storage);
    std::unique_ptr<detail::KvCacheStorage> storage_;
};

class MultiHeadAttention {
public:
    // Checks and copies the weights, prepacked for the kernels (and uploaded once to a GPU
    // `device`); the views may be freed after. A missing GPU or driver raises mha::Error.
    // q_proj and out_proj are [E, E]; k_proj is [kv_heads·d, kdim] and v_proj [kv_heads·d,
    // vdim]: kdim and vdim are the key's and value's features (nn.MultiheadAttention's; E when
    // they are the query's), kv_heads the key/value heads, dividing num_heads (grouped-query
    // attention, as Llama-family models and SDPA's enable_gqa; 1 is multi-query attention;
    // num_heads, the default, is the seed's multi-head attention). Query head h attends with
    // key/value head h / (num_heads / kv_heads).
    //
    // `dtype` is the element type the module computes in: its weights are rounded to it here,
    // once, and the activations of a call to it on entry (f32 ones rounded, 16-bit ones of its
    // own type as they are; a 16-bit tensor of the other type raises mha::Error). The kernels
    // accumulate in f32: on GPUs (kernels that read the 16-bit values) and on CPUs without bf16
    // products the result is f32 arithmetic on inputs and weights rounded to `dtype`; with
    // them (bf16 on AMX or AVX512-BF16) the products' operands are rounded to bf16 too
    // (docs/semantics.md).
    // Weights may arrive in bf16 or f16 (widened exactly).
    MultiHeadAttention(int64_t embed_dim, int64_t num_heads, const Linear &q_proj,
                       const Linear &k_proj, const Linear &v_proj, const Linear &out_proj,
                       Device device = Device::cpu, DType dtype = DType::f32);
    MultiHeadAttention(int64_t embed_dim, int64_t num_heads, const BF16Linear &q_proj,
                       const BF16Linear &k_proj, const BF16Linear &v_proj,
                       const BF16Linear &out_proj, Device device = Device::cpu,
                       DType dtype = DType::bf16);
    MultiHeadAttention(int64_t embed_dim, int64_t num_heads, const F16Linear &q_proj,
                       const F16Linear &k_proj, const F16Linear &v_proj, const F16Linear &out_proj,
                       Device device = Device::cpu, DType dtype = DType::f16);

    // From PyTorch's packed input projection, nn.MultiheadAttention's in_proj_weight [3E, E]
    // (Wq, Wk, Wv stacked) and in_proj_bias [3E] (or none), and out_proj.
    static MultiHeadAttention from_in_proj(int64_t embed_dim, int64_t num_heads,
                                           const Tensor &in_proj_weight,
                                           const std::optional<Tensor> &in_proj_bias,
                                           const Linear &out_proj, Device device = Device::cpu,
                                           DType dtype = DType::f32);

    Device device() const { return device_; }
    DType dtype() const { return dtype_; }
    int64_t embed_dim() const { return embed_dim_; }
    int64_t num_heads() const { return num_heads_; }
    int64_t head_dim() const { return embed_dim_ / num_heads_; }
    int64_t kdim() const;          // the key's features
    int64_t vdim() const;          // the value's features
    int64_t num_kv_heads() const;  // key/value heads

    // query [B, Sq, E], key [B, Sk, kdim], value [B, Sk, vdim] -> output [B, Sq, E] and, when
    // asked, the
    // attention weights (see ForwardOptions). On a GPU, host tensors are copied in and out;
    // device tensors (device_handle) are used in place.
    void forward(const Tensor &query, const Tensor &key, const Tensor &value,
                 const MutableTensor &output, const ForwardOptions &options) const;
    // The seed's call: forward(query, key, value, mask) returning the weights as well.
    void forward(const Tensor &query, const Tensor &key, const Tensor &value,
                 const MutableTensor &output, const std::optional<Mask> &mask = std::nullopt,
                 const std::optional<MutableTensor> &weights = std::nullopt) const;
    // bf16 or f16 activations, the output in f32 or in the inputs' type (rounded to the nearest
    // even); masks and weights as in the f32 call. On a GPU module of the inputs' dtype they may
    // be device-resident (its kernels read them as they are), as may an f32 output; conversions
    // (another dtype, a 16-bit output) run on the host.
    void forward(const BF16Tensor &query, const BF16Tensor &key, const BF16Tensor &value,
                 const MutableBF16Tensor &output, const ForwardOptions &options = {}) const;
    void forward(const BF16Tensor &query, const BF16Tensor &key, const BF16Tensor &value,
                 const MutableTensor &output, const ForwardOptions &options = {}) const;
    void forward(const F16Tensor &query, const F16Tensor &key, const F16Tensor &value,
                 const MutableF16Tensor &output, const ForwardOptions &options = {}) const;
    void forward(const F16Tensor &query, const F16Tensor &key, const F16Tensor &value,
                 const MutableTensor &output, const ForwardOptions &options = {}) const;

    // A cache for decode steps of this (CPU) module, whose kdim and vdim are E: `batch` rows of
    // up to `capacity` tokens, whose keys and values are stored in `dtype`: the module's (when
    // none is given), f32 or int8, or for an f32 module any. Each key and value is stored once,
    // as it is appended (rounded to a 16-bit type; quantized with a scale per token and key/value
    // head in int8, CacheDType::int8), and read widened to f32. A 16-bit cache halves the bytes a
    // step reads, as a 16-bit module's steps read its weights in 16 bits; an int8 one quarters
    // them, its scales adding 8 bytes per token and key/value head. With `rotary`, each step
    // rotates its new tokens' queries and keys at their positions (the row's cached tokens
    // before them count from 0) after their projection, before the keys are stored or any query
    // reads them, as an LLM's attention does (Llama: rotate_half, theta from its config); the
    // cache copies the options' tables. Bad options raise mha::Error here.
    KvCache make_cache(int64_t batch, int64_t capacity,
                       std::optional<CacheDType> dtype = std::nullopt,
                       const std::optional<RotaryOptions> &rotary = std::nullopt) const;
    // The same, its elements those of a DType.
    KvCache make_cache(int64_t batch, int64_t capacity, DType dtype,
                       const std::optional<RotaryOptions> &rotary = std::nullopt) const;

    // One decode step of self-attention (query = key = value). `tokens` [B, n, E] are appended
    // to `cache`: row b appends the first new_tokens[b] of its n (all n when `new_tokens` is
    // empty; the others are padding). Writes the new tokens' outputs [B, n, E]: each attends
    // over its row's cached tokens and the new tokens up to itself, which is what forward()
    // over the whole sequence with Causal::top_left computes for them, however the sequence is
    // split into steps (with the cache's rotation, on queries and keys rotated at their
    // positions; a position past its tables raises mha::Error); padding tokens get 0.
    // `key_padding`, [B, capacity] bytes in its convention, hides cache positions from every new
    // token (among the keys it sees: one whose every key is hidden weighs those keys uniformly). A
    // step that would exceed a row's capacity raises mha::Error and leaves the cache as it was.
    // Allocates nothing once a first step with as many new tokens ran (a module of a 16-bit dtype
    // converts through reused memory too, and copies only the shapes of the converted views).
    void decode(const Tensor &tokens, KvCache &cache, const MutableTensor &output,
                const std::optional<Mask> &key_padding = std::nullopt,
                const std::vector<int64_t> &new_tokens = {}) const;
    // The same for bf16 or f16 tokens, the output in their type.
    void decode(const BF16Tensor &tokens, KvCache &cache, const MutableBF16Tensor &output,
                const std::optional<Mask> &key_padding = std::nullopt,
                const std::vector<int64_t> &new_tokens = {}) const;
    void decode(const F16Tensor &tokens, KvCache &cache, const MutableF16Tensor &output,
                const std::optional<Mask> &key_padding = std::nullopt,
                const std::vector<int64_t> &new_tokens = {}) const;
    // One decode step of B sequences over a paged cache (an engine's, laid out as
    // paged_attention reads it; see PagedDecodeCache), the cache's elements T in f32 or the
    // module's dtype (an f32 module's: any). tokens [B, 1, E] are each sequence's newest token:
    // its key and value are written into slot slot_mapping[b], then its query attends over the
    // sequence's sequence_lengths[b] keys, its own included -> output [B, 1, E]. A row whose slot
    // is negative is padding: nothing is written and its output is 0. With a 16-bit cache the
    // query and the attention's output are rounded to it as well (paged_attention's). Every
    // argument is checked before the cache is written; allocates nothing once a first step of
    // as many rows ran. For a (CPU) module whose kdim and vdim are E.
    template <typename T>
    void decode(const Tensor &tokens, const PagedDecodeCache<T> &cache,
                const MutableTensor &output) const;
    // The same for bf16 or f16 tokens, the output in their type.
    template <typename T>
    void decode(const BF16Tensor &tokens, const PagedDecodeCache<T> &cache,
                const MutableBF16Tensor &output) const;
    template <typename T>
    void decode(const F16Tensor &tokens, const PagedDecodeCache<T> &cache,
                const MutableF16Tensor &output) const;

    // The name of the kernel forward() runs for these arguments (see linked_kernels()); the
    // arguments are checked as forward() checks them.
    std::string kernel_name(const Tensor &query, const Tensor &key, const Tensor &value,
                            const ForwardOptions &options = {}) const;

private:
    MultiHeadAttention(int64_t embed_dim, int64_t num_heads, const detail::WidenedLinears &linears,
                       Device device, DType dtype);
    // forward() on tensors the kernels read as they are: f32, or bf16 for the bf16 instruction
    // sets' kernels; decode() on f32 tensors.
    template <typename T>
    void forward_kernels(const TensorView<const T> &query, const TensorView<const T> &key,
                         const TensorView<const T> &value, const MutableTensor &output,
                         const ForwardOptions &options) const;
    void decode_f32(const Tensor &tokens, KvCache &cache, const MutableTensor &output,
                    const std::optional<Mask> &key_padding,
                    const std::vector<int64_t> &new_tokens) const;
    template <typename T>
    void decode_f32(const Tensor &tokens, const PagedDecodeCache<T> &cache,
                    const MutableTensor &output) const;
    // Either of them on tensors of type In, converted to f32 rounded to the module's dtype; the
    // output converted back to Out (`step`: decode_f32's arguments after the cache).
    template <typename In, typename Out>
    void forward_converted(const TensorView<const In> &query, const TensorView<const In> &key,
                           const TensorView<const In> &value, const TensorView<Out> &output,
                           const ForwardOptions &options) const;
    template <typename In, typename Out, typename Cache, typename... Step>
    void decode_converted(const TensorView<const In> &tokens, Cache &cache,
                          const TensorView<Out> &output, const Step &...step) const;
    // That this module has decode steps (a CPU one, kdim = vdim = E) and that their cache may
    // hold `dtype` (f32, int8 or the module's; any for an f32 module).
    void check_decode_cache(CacheDType dtype) const;
    int64_t embed_dim_;
    int64_t num_heads_;
    Device device_;
    DType dtype_;
    // Immutable once built, so copies of a module share it (and its device copy).
    std::shared_ptr<const detail::PackedWeights> packed_;
};

// --- The attention core: F.scaled_dot_product_attention's level -------------------------------

// An attention mask of any rank up to 4, broadcast against [B, H, Sq, Sk] as torch broadcasts
// (right-aligned, each dimension 1 or the full extent, by shape or by zero strides): boolean, one
// byte per element, in `convention` (keep: nonzero = the key takes part, as SDPA's True; block:
// nonzero = left out, as nn.MultiheadAttention's True), or float, added to the scores.
struct AttentionMask {
    std::variant<StridedView<const uint8_t>, StridedView<const float>> values;
    MaskConvention convention = MaskConvention::keep;
};

struct AttentionOptions {
    // Of q·kᵀ; 1 / sqrt(d) unless given.
    std::optional<float> scale;
    std::optional<AttentionMask> mask;
    // top_left: SDPA's is_causal (query i sees keys j <= i); bottom_right: FlashAttention's
    // (j <= i + Sk - Sq). Key tiles no query of a tile sees are never computed.
    Causal causal = Causal::none;
    // A sliding window (FlashAttention's window_size; Mistral, Gemma 2): query i sees keys
    // i + diagonal - window_left <= j <= i + diagonal + window_right, -1 leaving a side
    // unbounded, diagonal = 0 with top_left causality and Sk - Sq otherwise. Causal attention's
    // window_right is 0. Key tiles outside every window of a query tile are never computed.
    int64_t window_left = -1;
    int64_t window_right = -1;
    // Logit soft-capping (Gemma 2): scores become softcap · tanh(score / softcap); 0: none.
    float softcap = 0;
    // ALiBi (FlashAttention's): [H] slopes, score of key j for query i minus
    // slope[h] · |i + Sk - Sq - j|.
    std::optional<StridedView<const float>> alibi_slopes;
    // When given, [B, H, Sq]: each row's log-sum-exp of its final scores (natural log), -inf for
    // a row that no key weighs.
    std::optional<StridedView<float>> lse;
    // paged_attention only (FlashAttention's num_splits): each sequence's keys in this many
    // splits of whole blocks, run as tasks of their own and merged by log-sum-exp; 0 chooses
    // them from the threads, the batch, the key/value heads and the longest sequence. Steps with
    // a window that leaves keys out, or with ALiBi, run one split.
    int num_splits = 0;
    // Rotary embeddings of the query and the key before their scores (FlashAttention's
    // rotary_cos and rotary_sin): query row i at position Sk - Sq + i (the last Sq of the Sk
    // positions, as bottom_right aligns them), key j at j; the caller's tensors are left as they
    // are (the kernel reads rotated copies, rounded to what it reads). varlen_attention: within
    // each sequence. paged_attention: the query at sequence_lengths[b] - 1, the cache's keys as
    // they lie (rotated when written: rotary_embedding, or a module's rotary step).
    std::optional<RotaryOptions> rotary;
};

// query [B, H, Sq, d], key [B, Hkv, Sk, d], value [B, Hkv, Sk, dv] -> output [B, H, Sq, dv]:
// softmax(scale · q·kᵀ, masked) · v per head, H a multiple of Hkv (query head h reads key/value
// head h / (H / Hkv): grouped-query attention). Any layout through strides, [B, H, S, d] and
// [B, S, H, d] alike, read in place when each row's features are contiguous (copied otherwise).
// As F.scaled_dot_product_attention: a key a boolean mask leaves out, or a float mask adds -inf
// to, weighs exactly 0; a query that no key weighs gets a zero output (and -inf in lse); NaN
// reaches what it touches. bf16 tensors are read as they are where the CPU has AVX512_BF16:
// one query row per head widened as it is read; more rows, where dispatched_isa(DType::bf16) is
// "amx" or "avx512bf16", with Q·Kᵀ and weights·V as AMX tile products or products of bf16
// pairs, accumulated in f32 (the weights rounded to bf16 first), the softmax in f32. Other
// 16-bit calls are widened exactly and computed in f32. 16-bit outputs are rounded to the
// nearest even. Runs on the CPU; may be called from several threads at once. Bad shapes,
// strides and options raise mha::Error naming the argument.
void attention(const StridedView<const float> &query, const StridedView<const float> &key,
               const StridedView<const float> &value, const StridedView<float> &output,
               const AttentionOptions &options = {});
void attention(const StridedView<const bfloat16> &query, const StridedView<const bfloat16> &key,
               const StridedView<const bfloat16> &value, const StridedView<bfloat16> &output,
               const AttentionOptions &options = {});
void attention(const StridedView<const float16> &query, const StridedView<const float16> &key,
               const StridedView<const float16> &value, const StridedView<float16> &output,
               const AttentionOptions &options = {});
// Sequences packed without padding, as FlashAttention's flash_attn_varlen_func takes them (a
// prefill of requests of different lengths): query [total_q, H, d], key [total_k, Hkv, d], value
// [total_k, Hkv, dv] -> output [total_q, H, dv]. Sequence b is query rows cu_seqlens_q[b] to
// cu_seqlens_q[b + 1] - 1 over key rows cu_seqlens_k[b] to cu_seqlens_k[b + 1] - 1 (int32
// [B + 1], from 0, nondecreasing, ending at total_q and total_k), computed as attention() computes
// one batch row with these options: causal order, window, softcap, ALiBi and scale within each
// sequence (FlashAttention's causal is bottom_right); lse, when given, [H, total_q]. No mask. A
// sequence of no keys gets zero outputs (and -inf lse). Every sequence is checked before any is
// computed; bad arguments raise mha::Error naming the argument. Its keys and values go into a
// paged cache with write_paged_cache, which takes the same packed rows.
void varlen_attention(const StridedView<const float> &query, const StridedView<const float> &key,
                      const StridedView<const float> &value,
                      const StridedView<const int32_t> &cu_seqlens_q,
                      const StridedView<const int32_t> &cu_seqlens_k,
                      const StridedView<float> &output, const AttentionOptions &options = {});
void varlen_attention(const StridedView<const bfloat16> &query,
                      const StridedView<const bfloat16> &key,
                      const StridedView<const bfloat16> &value,
                      const StridedView<const int32_t> &cu_seqlens_q,
                      const StridedView<const int32_t> &cu_seqlens_k,
                      const StridedView<bfloat16> &output, const AttentionOptions &options = {});
void varlen_attention(const StridedView<const float16> &query,
                      const StridedView<const float16> &key,
                      const StridedView<const float16> &value,
                      const StridedView<const int32_t> &cu_seqlens_q,
                      const StridedView<const int32_t> &cu_seqlens_k,
                      const StridedView<float16> &output, const AttentionOptions &options = {});
// The kernel attention() runs for these arguments (checked as attention() checks them).
std::string attention_kernel_name(const StridedView<const float> &query,
                                  const StridedView<const float> &key,
                                  const StridedView<const float> &value,
                                  const AttentionOptions &options = {});
std::string attention_kernel_name(const StridedView<const bfloat16> &query,
                                  const StridedView<const bfloat16> &key,
                                  const StridedView<const bfloat16> &value,
                                  const AttentionOptions &options = {});
std::string attention_kernel_name(const StridedView<const float16> &query,
                                  const StridedView<const float16> &key,
                                  const StridedView<const float16> &value,
                                  const AttentionOptions &options = {});

// A paged KV cache as FlashAttention's flash_attn_with_kvcache and vLLM's FlashAttention backend
// lay it out, so that an engine hands over its own tensors: key_cache [num_blocks, block_size,
// Hkv, d] and value_cache [num_blocks, block_size, Hkv, dv] (any strides, each row's features
// contiguous; block_size a power of two), block_table [B, max_blocks] (key j of sequence b in
// slot j % block_size of block block_table[b][j / block_size]), sequence_lengths [B] (the keys
// of each sequence, its newest token's included).
template <typename T>
struct PagedKvCache {
    StridedView<const T> key_cache, value_cache;
    StridedView<const int32_t> block_table, sequence_lengths;
};

// The paged cache a module's decode step writes and reads: paged_attention's, with the pools
// writable, and the slot of each row's new token (write_paged_cache's slot_mapping, [B] int64),
// which sequence_lengths count. With `rotary`, the step rotates each new token's query and key
// at its position, sequence_lengths[b] - 1, before the key is written (the tables are read, not
// copied).
template <typename T>
struct PagedDecodeCache {
    StridedView<T> key_cache, value_cache;
    StridedView<const int32_t> block_table, sequence_lengths;
    StridedView<const int64_t> slot_mapping;
    std::optional<RotaryOptions> rotary;
};

// A decode step of B sequences of different lengths over a paged cache: query [B, 1, H, d], each
// sequence's newest token (whose key and value write_paged_cache has written), -> output
// [B, 1, H, dv]; H a multiple of Hkv. The query is its sequence's last position, so the step is
// causal (options.causal none or bottom_right); window_left bounds the keys it sees from below
// (window_right must be -1 or 0), with softcap, alibi_slopes, scale and lse as attention()
// takes them; a sequence of no keys gets a zero output. No mask. The cache, the block table and
// the lengths are read where they lie, each key and value once for the query heads that share
// it, in f32, bf16 or f16 widened to f32 as they are read. Block entries past a sequence's
// length are never read; those it reads must lie in the pool. Bad arguments raise mha::Error.
void paged_attention(const StridedView<const float> &query, const PagedKvCache<float> &cache,
                     const StridedView<float> &output, const AttentionOptions &options = {});
void paged_attention(const StridedView<const bfloat16> &query, const PagedKvCache<bfloat16> &cache,
                     const StridedView<bfloat16> &output, const AttentionOptions &options = {});
void paged_attention(const StridedView<const float16> &query, const PagedKvCache<float16> &cache,
                     const StridedView<float16> &output, const AttentionOptions &options = {});

// Writes T tokens' keys [T, Hkv, d] and values [T, Hkv, dv] into a paged cache (as vLLM's
// reshape_and_cache_flash): token t into slot slot_mapping[t] = block · block_size + offset of
// key_cache and value_cache [num_blocks, block_size, Hkv, d | dv]; a negative slot (a padding
// token) is skipped. Nothing else moves.
template <typename T>
void write_paged_cache(const StridedView<const T> &key, const StridedView<const T> &value,
                       const StridedView<T> &key_cache, const StridedView<T> &value_cache,
                       const StridedView<const int64_t> &slot_mapping);

// Rotary position embeddings (RoPE), as vLLM's rotary_embedding op applies them before the
// attention and the cache write: query [T, H, d] and key [T, Hkv, d] rotated in place, token t at
// position positions[t] (int64 [T]), as RotaryOptions says. 16-bit elements are rounded once. Any
// strides. Bad arguments raise mha::Error naming the argument, before anything is written.
template <typename T>
void rotary_embedding(const StridedView<T> &query, const StridedView<T> &key,
                      const StridedView<const int64_t> &positions,
                      const RotaryOptions &options = {});

// The blocks of one paged cache given to sequences, and the tables paged_attention reads: a
// fixed pool of num_blocks blocks of block_size slots, max_sequences rows of up to
// max_blocks_per_sequence blocks. A sequence (a row) grows and shrinks in whole blocks taken from
// and returned to the pool, so that no key ever moves; nothing is allocated after construction.
class PagedBlockTables {
public:
    PagedBlockTables(int64_t num_blocks, int64_t block_size, int64_t max_sequences,
                     int64_t max_blocks_per_sequence);

    // Sets sequence `sequence`'s length (0: removes it), taking or returning blocks. Raises
    // mha::Error, changing nothing, when the pool or the row has too few blocks.
    void resize(int64_t sequence, int64_t length);
    // The slot (block · block_size + offset) of key `position` of a sequence, for
    // write_paged_cache.
    int64_t slot(int64_t sequence, int64_t position) const;
    int64_t length(int64_t sequence) const;
    int64_t free_blocks() const;
    int64_t num_blocks() const { return num_blocks_; }
    int64_t block_size() const { return block_size_; }
    int64_t max_sequences() const { return max_sequences_; }
    int64_t max_blocks_per_sequence() const { return max_blocks_; }
    // [max_sequences, max_blocks_per_sequence], row-major; unused entries 0.
    StridedView<const int32_t> block_table() const;
    // [max_sequences]; removed sequences 0.
    StridedView<const int32_t> sequence_lengths() const;

private:
    int64_t num_blocks_, block_size_, max_sequences_, max_blocks_;
    std::vector<int32_t> table_, lengths_, free_;  // free_: a stack of free blocks
};

// The instruction set whose f32 CPU kernels this process runs: on x86-64 "avx512", "avx2" or
// "sse41" (the library carries all three and runs the best one the CPU supports, as Halide's
// own target check decides it; setting MHA_CPU_ISA=avx2 (or sse41) in the environment caps that
// choice), on arm64 "neon". Decided once per process; an MHA_CPU_ISA that names none of the
// library's raises mha::Error here and in every CPU module's constructor.
std::string dispatched_isa();
// The instruction set whose CPU kernels a module of `dtype` runs: for bf16 "amx" where the CPU
// has it, "avx512bf16" where it has AVX512_BF16 whose dot products outrun its f32 FMAs (AMD's
// CPUs; on others only when MHA_CPU_ISA names it), when MHA_CPU_ISA does not cap them away (for
// embed_dim >= 32, one bf16 tile slice), else the f32 one, on whose kernels a bf16 or f16 module
// runs its rounded values.
std::string dispatched_isa(DType dtype);

// The CPU kernels' threads, the calling thread's included: `threads` from each parallel loop on,
// or with 0 HL_NUM_THREADS, else one per core. The pool's idle threads poll for new work for a
// millisecond (yielding the core each time) before they sleep, as OpenMP's do.
void set_num_threads(int threads);

// One ahead-of-time compiled kernel linked into this program.
struct KernelInfo {
    std::string name;  // e.g. mha_forward_cpu_avx512_token_bytes_mask_fused_weights
    std::string op;    // forward | qkv_projection | decode | average_heads | attention
    Device device;
    std::string isa;                   // CPU instruction set; empty on GPUs
    std::vector<std::string> buckets;  // CPU shape buckets it serves; {"any"} on GPUs
    // The CPU kernels' parameters: those of the tuned CPUs it serves ("intel-f6-m207") and
    // "defaults" (the instruction set's own); empty where it serves every tuning and on GPUs.
    std::vector<std::string> tunings;
    std::string mask;  // the mask it takes: none, bytes (either convention) or additive
    bool returns_weights;
    bool fused_qkv;
    bool causal;           // an attention kernel's: the keys a query sees bounded by a window
    bool modified_scores;  // attention kernels: soft-capping and ALiBi
    bool single_query;     // attention kernels: for one query row per head (Sq = 1) only
    bool paged;            // attention kernels: K and V in a paged cache (paged_attention)
    // Of its activations and projection weights: on the CPU bf16 for the bf16 instruction sets;
    // on GPUs bf16 or f16, read as their bits and widened to f32.
    DType dtype;
    std::vector<std::string> arguments;  // in call order, after the user_context
};

// Every kernel linked into this program: the CPU kernels, and those of each GPU library the
// program links (mha_cuda, mha_opencl).
std::vector<KernelInfo> linked_kernels();

// The CPU kernels are compiled for each instruction set's default schedule parameters and for
// those tuned on each CPU of schedules/tuned (docs/tuning.md). Which ones run here, per
// instruction set the program links: the tuned CPU closest to this one (of its vendor; the same
// family and model first, then family, then the nearest caches), the defaults where none is of
// its vendor, or what the environment's MHA_TUNED_CPU names ("defaults", or a CPU key such as
// "amd-f26-m2"; one that names none of the build's raises mha::Error, here and in every call).
struct TunedSchedule {
    std::string isa;
    std::string tuned_cpu;  // the CPU key, or "defaults"
    std::string
        tuned_on;     // that CPU: model name, vendor, family, model, caches; empty for defaults
    std::string why;  // e.g. "tuned on a CPU of the same vendor, family and model"
};
std::vector<TunedSchedule> tuned_schedules();

// This CPU, as tuned files describe theirs: "Intel(R) Xeon(R) Processor (GenuineIntel family 6
// model 207; L2 2048K, L3 107520K)".
std::string this_cpu();

}  // namespace mha
