// An attention call's arguments (mha::attention), checked and reduced to what chooses and feeds
// its kernel: check_attention() reads no tensor and allocates nothing unless it throws
// mha::Error naming the argument.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "masks.h"
#include "mha/mha.h"
#include "rotary.h"

namespace mha::detail {

// A strided view of the library's: extents and strides (in elements) outermost first, always
// as many as the logical shape has (a view's empty strides made row-major).
struct Strided {
    std::array<int64_t, kMaxRank> shape{}, strides{};
    int rank = 0;
    // Whether the innermost dimension is contiguous, as a kernel's buffers must be.
    bool dense_rows() const { return rank == 0 || strides[rank - 1] == 1 || shape[rank - 1] == 1; }
};

struct AttentionParams {
    DType dtype;                                                              // of the tensors
    int64_t batch, heads, kv_heads, query_len, key_len, head_dim, value_dim;  // B, H, Hkv, ...
    Strided query, key, value, output, lse;
    bool has_lse;
    float scale;
    KernelMask mask;  // the one mask the kernel reads (masks.h), [B, H, Sq, Sk] by strides
    // Query i sees keys i + window_start <= j <= i + window_end (clamped to [-Sq, Sk]).
    bool window;
    int32_t window_start, window_end;
    // Soft-capping or ALiBi: the kernels that modify the scores.
    bool modified_scores;
    float softcap;
    Strided alibi_slopes;
    // Q and K rotated first (AttentionOptions::rotary), their positions checked.
    std::optional<RotaryParams> rotary;

    std::array<int64_t, 4> scores_shape() const { return {batch, heads, query_len, key_len}; }
};

// Checks a call of mha::attention on views whose elements are of `dtype` (every view's data read
// as the type the caller gave).
AttentionParams check_attention(const StridedView<const void> &query,
                                const StridedView<const void> &key,
                                const StridedView<const void> &value,
                                const StridedView<void> &output, DType dtype,
                                const AttentionOptions &options);

// A call of mha::varlen_attention: the packed views ([total, heads, features]; lse [H, total_q])
// and each sequence's first query and key row (B + 1 of each, the last the totals). Checks the
// packing alone: each sequence's own call checks the options.
struct VarlenParams {
    int64_t batch, heads, kv_heads, head_dim, value_dim;
    Strided query, key, value, output, lse;
    bool has_lse;
    std::vector<int64_t> query_starts, key_starts;
};
VarlenParams check_varlen_attention(const StridedView<const void> &query,
                                    const StridedView<const void> &key,
                                    const StridedView<const void> &value,
                                    const StridedView<const int32_t> &cu_seqlens_q,
                                    const StridedView<const int32_t> &cu_seqlens_k,
                                    const StridedView<void> &output, DType dtype,
                                    const AttentionOptions &options);

// A call of mha::paged_attention: the query's and output's parameters (Sq 1, key_len what the
// block table reaches, a window always; query and output viewed as [B, H, 1, d]), and the
// cache's views. Reads the sequence lengths and
// the block table entries each sequence reads, which must lie in the pool.
struct PagedParams {
    AttentionParams attention;
    Strided key_cache, value_cache, block_table, sequence_lengths;
    int64_t num_blocks, block_size;
    int64_t longest_blocks;  // the blocks of the longest sequence
};

// A template (f32, bf16, f16) rather than on erased views, whose copies of the shapes would
// allocate: a paged step allocates nothing.
template <typename T>
PagedParams check_paged_attention(const StridedView<const T> &query, const PagedKvCache<T> &cache,
                                  const StridedView<T> &output, const AttentionOptions &options);

// mha::paged_attention after its check: the module's paged step checks before it writes the
// cache, then runs the step on the parameters it has.
template <typename T>
void run_checked_paged_attention(PagedParams p, const StridedView<const T> &query,
                                 const PagedKvCache<T> &cache, const StridedView<T> &output,
                                 const AttentionOptions &options);

}  // namespace mha::detail
