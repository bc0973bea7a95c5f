// mha::attention: a call checked (attention_params.cpp), its kernel chosen (dispatch.cpp), its
// tensors given to the kernel where they lie when they are of its element type with contiguous
// rows, else converted through scratch memory, and the kernel run.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "attention_params.h"
#include "buffers.h"
#include "dispatch.h"
#include "dtype.h"
#include "halide_calls.h"
#include "mha/mha.h"
#include "rotary.h"
#include "thread_pool.h"

namespace mha {
namespace detail {
namespace {

using contract::ArgId;

float widen(float x) { return x; }
float widen(bfloat16 x) { return to_float(x); }
float widen(float16 x) { return to_float(x); }
template <typename T>
T narrow(float x) {
    if constexpr (std::is_same_v<T, bfloat16>) {
        return to_bfloat16(x);
    } else if constexpr (std::is_same_v<T, float16>) {
        return to_float16(x);
    } else {
        return x;
    }
}

// Calls f(offset in the strided view, offset in the dense row-major one, row length, whether
// the row's elements are contiguous) for every innermost row of `s`.
template <typename F>
void for_each_row(const Strided &s, F f) {
    const int64_t n = s.shape[s.rank - 1];
    int64_t dense = 0;
    for (int64_t b = 0; b < (s.rank > 3 ? s.shape[s.rank - 4] : 1); b++)
        for (int64_t h = 0; h < (s.rank > 2 ? s.shape[s.rank - 3] : 1); h++)
            for (int64_t i = 0; i < (s.rank > 1 ? s.shape[s.rank - 2] : 1); i++, dense += n) {
                const int64_t at = (s.rank > 3 ? b * s.strides[s.rank - 4] : 0) +
                                   (s.rank > 2 ? h * s.strides[s.rank - 3] : 0) +
                                   (s.rank > 1 ? i * s.strides[s.rank - 2] : 0);
                f(at, dense, n, s.strides[s.rank - 1] == 1);
            }
}

int64_t elements(const Strided &s) {
    int64_t n = 1;
    for (int d = 0; d < s.rank; d++) {
        n *= s.shape[d];
    }
    return n;
}

// A view the kernel reads with contiguous rows, in its element type (f32, or bf16 for a bf16
// kernel given bf16): the caller's memory when it is that, else a dense copy held for the call.
// With `rotary`, always the copy, [B, heads, S, d], its row i rotated at first_position + i.
class KernelInput {
public:
    template <typename T>
    KernelInput(const T *data, const Strided &s, DType kernel_dtype,
                const std::optional<RotaryParams> &rotary = std::nullopt,
                int64_t first_position = 0)
        : strided_(s) {
        const RotaryParams *rotation = rotary ? &*rotary : nullptr;
        if (kernel_dtype == DType::f32) {
            store(data, s, f32_memory_, rotation, first_position);
        } else if constexpr (std::is_same_v<T, bfloat16>) {
            store(data, s, bf16_memory_, rotation, first_position);
        } else {
            throw Error("internal error: a bf16 attention kernel was chosen for another dtype");
        }
    }
    HostBuffer buffer() const {
        return view_buffer(data_, type_, strided_.rank, strided_.shape.data(),
                           strided_.strides.data());
    }

private:
    template <typename T, typename K>
    void store(const T *data, const Strided &s, std::optional<Scratch<K>> &memory,
               const RotaryParams *rotary, int64_t first_position) {
        type_ = halide_type_of<K>();
        if constexpr (std::is_same_v<T, K>) {
            if (s.dense_rows() && rotary == nullptr) {
                data_ = data;
                return;
            }
        }
        memory.emplace(elements(s));
        K *dense = memory->data();
        for_each_row(s, [&](int64_t at, int64_t to, int64_t n, bool contiguous) {
            if (contiguous) {
                convert(data + at, dense + to, n);
            } else {
                for (int64_t c = 0; c < n; c++) {
                    dense[to + c] = narrow<K>(widen(data[at + c * s.strides[s.rank - 1]]));
                }
            }
        });
        data_ = dense;
        for (int d = s.rank, stride = 1; d-- > 0; stride *= int(s.shape[d])) {
            strided_.strides[d] = stride;
        }
        if (rotary != nullptr) {
            const int64_t heads = s.shape[1], rows = s.shape[2], d = s.shape[3];
            for (int64_t b = 0; b < s.shape[0]; b++) {
                for (int64_t i = 0; i < rows; i++) {
                    rotate_token(
                        *rotary, first_position + i,
                        {TokenHeads<K>{dense + (b * heads * rows + i) * d, heads, rows * d, 1}});
                }
            }
        }
    }

    const void *data_ = nullptr;
    halide_type_t type_;
    Strided strided_;
    std::optional<ScratchFloats> f32_memory_;
    std::optional<Scratch<bfloat16>> bf16_memory_;
};

// The output the kernel writes, f32 with contiguous rows: the caller's memory when it is that,
// else scratch memory that finish() converts into the caller's (none: an output the caller does
// not take).
template <typename T>
class KernelOutput {
public:
    KernelOutput(T *data, const Strided &s) : target_(data), strided_(s), dense_(s) {
        if constexpr (std::is_same_v<T, float>) {
            if (data != nullptr && s.dense_rows()) {
                data_ = data;
                return;
            }
        }
        memory_.emplace(elements(s));
        data_ = memory_->data();
        for (int d = s.rank, stride = 1; d-- > 0; stride *= int(s.shape[d])) {
            dense_.strides[d] = stride;
        }
    }
    HostBuffer buffer() const {
        return view_buffer(data_, halide_type_of<float>(), dense_.rank, dense_.shape.data(),
                           dense_.strides.data());
    }
    void finish() const {
        if (!memory_ || target_ == nullptr) {
            return;
        }
        const float *dense = memory_->data();
        for_each_row(strided_, [&](int64_t at, int64_t from, int64_t n, bool contiguous) {
            if (contiguous) {
                convert(dense + from, target_ + at, n);
            } else {
                for (int64_t c = 0; c < n; c++) {
                    target_[at + c * strided_.strides[strided_.rank - 1]] =
                        narrow<T>(dense[from + c]);
                }
            }
        });
    }

private:
    T *target_;
    Strided strided_, dense_;
    float *data_ = nullptr;
    std::optional<ScratchFloats> memory_;
};

template <typename T>
StridedView<const void> erased(const StridedView<const T> &t) {
    return {t.data, t.shape, t.strides};
}
template <typename T>
StridedView<void> erased(const StridedView<T> &t) {
    return {t.data, t.shape, t.strides};
}

// What every attention kernel takes alike: the context (the caller's output, or scratch that
// finish() converts into it), the lse (`lse` where p has one), the scale, the window, the softcap
// and ALiBi slopes (zeros when the call has none), each read by the kernels whose variant takes it.
template <typename T>
class CoreArguments {
public:
    CoreArguments(const AttentionParams &p, const AttentionOptions &options, T *output, float *lse)
        : out_(output, p.output),
          lse_(p.has_lse ? lse : nullptr,
               p.has_lse ? p.lse : Strided{{p.batch, p.heads, p.query_len}, {}, 3}),
          out_buffer_(out_.buffer()),
          lse_buffer_(lse_.buffer()),
          scale_(p.scale),
          softcap_(p.softcap),
          window_start_(p.window_start),
          window_end_(p.window_end) {
        const float *slopes = options.alibi_slopes ? options.alibi_slopes->data : nullptr;
        Strided slopes_shape = p.alibi_slopes;
        if (slopes == nullptr) {
            zero_slopes_.emplace(p.heads);
            std::fill_n(zero_slopes_->data(), p.heads, 0.0f);
            slopes = zero_slopes_->data();
            slopes_shape = {{p.heads}, {1}, 1};
        }
        slopes_buffer_ = view_buffer(slopes, halide_type_of<float>(), 1, slopes_shape.shape.data(),
                                     slopes_shape.strides.data());
    }
    void set(ArgValues &values) {
        values[size_t(ArgId::context)] = out_buffer_.raw_buffer();
        values[size_t(ArgId::lse)] = lse_buffer_.raw_buffer();
        values[size_t(ArgId::scale)] = &scale_;
        values[size_t(ArgId::softcap)] = &softcap_;
        values[size_t(ArgId::window_start)] = &window_start_;
        values[size_t(ArgId::window_end)] = &window_end_;
        values[size_t(ArgId::alibi_slopes)] = slopes_buffer_.raw_buffer();
    }
    void finish() const {
        out_.finish();
        lse_.finish();
    }

private:
    const KernelOutput<T> out_;
    const KernelOutput<float> lse_;
    HostBuffer out_buffer_, lse_buffer_, slopes_buffer_;
    std::optional<ScratchFloats> zero_slopes_;
    float scale_, softcap_;  // the kernels take scalars by address
    int32_t window_start_, window_end_;
};

template <typename T>
void run_attention(const StridedView<const T> &query, const StridedView<const T> &key,
                   const StridedView<const T> &value, const StridedView<T> &output,
                   const AttentionOptions &options) {
    install_runtime_hooks();
    const AttentionParams p = check_attention(erased(query), erased(key), erased(value),
                                              erased(output), dtype_of<T>(), options);
    const CompiledKernel &kernel = select_kernel(p);
    const DType reads = kernel.variant.dtype;
    const KernelInput q(query.data, p.query, reads, p.rotary, p.key_len - p.query_len),
        k(key.data, p.key, reads, p.rotary), v(value.data, p.value, reads);
    CoreArguments<T> core(p, options, output.data, options.lse ? options.lse->data : nullptr);
    HostBuffer q_buffer = q.buffer(), k_buffer = k.buffer(), v_buffer = v.buffer();
    ArgValues values{};
    values[size_t(ArgId::q)] = q_buffer.raw_buffer();
    values[size_t(ArgId::k)] = k_buffer.raw_buffer();
    values[size_t(ArgId::v)] = v_buffer.raw_buffer();
    core.set(values);
    int32_t mask_blocks_nonzero = p.mask.blocks_nonzero;
    values[size_t(ArgId::mask_blocks_nonzero)] = &mask_blocks_nonzero;
    HostBuffer mask_buffer;
    std::vector<uint8_t> unused_bytes;
    std::vector<float> unused_floats;
    if (p.mask.kind != contract::MaskKind::none) {
        mask_buffer = kernel_mask_buffer(p.mask, p.scores_shape(), unused_bytes, unused_floats);
        const bool bytes = p.mask.kind == contract::MaskKind::bytes;
        values[size_t(bytes ? ArgId::mask : ArgId::additive_mask)] = mask_buffer.raw_buffer();
    }
    CallContext context;
    call_kernel(kernel, context, values);
    core.finish();
}

// A view of the caller's memory as a kernel buffer, strides and all.
template <typename T>
HostBuffer in_place(const T *data, const Strided &s) {
    return view_buffer(data, halide_type_of<std::remove_const_t<T>>(), s.rank, s.shape.data(),
                       s.strides.data());
}

// One call of the paged kernel: p's query and cache (block table and lengths given apart, so
// that a split step passes its own), the context into `output` (of T, or f32 scratch) and the
// lse into `lse` where p has one.
template <typename T, typename Out>
void call_paged_kernel(const PagedParams &p, const T *query, const PagedKvCache<T> &cache,
                       const int32_t *block_table, const int32_t *lengths, Out *output, float *lse,
                       const AttentionOptions &options) {
    const CompiledKernel &kernel = select_kernel(p);
    CoreArguments<Out> core(p.attention, options, output, lse);
    HostBuffer q = in_place(query, p.attention.query);
    HostBuffer keys = in_place(cache.key_cache.data, p.key_cache);
    HostBuffer values_buffer = in_place(cache.value_cache.data, p.value_cache);
    HostBuffer table = in_place(block_table, p.block_table);
    HostBuffer sequence_lengths = in_place(lengths, p.sequence_lengths);
    ArgValues values{};
    values[size_t(ArgId::q)] = q.raw_buffer();
    values[size_t(ArgId::key_pages)] = keys.raw_buffer();
    values[size_t(ArgId::value_pages)] = values_buffer.raw_buffer();
    values[size_t(ArgId::block_table)] = table.raw_buffer();
    values[size_t(ArgId::sequence_lengths)] = sequence_lengths.raw_buffer();
    core.set(values);
    CallContext context;
    call_kernel(kernel, context, values);
    core.finish();
}

// The paged kernels' tasks: grouped query heads (H > Hkv) over all of their keys run one task
// per sequence, every key/value head inside each tile of keys, where window_start <= -key_len;
// else a task per (sequence, key/value head). Per sequence is the faster from about 2,048 keys
// (bench/paged_compare.py), and needs splits to fill the threads (none with ALiBi). Otherwise
// the step passes window_start = 1 - key_len, which leaves every key visible (the query is at
// most the last key) and selects per-head tasks.
bool per_sequence_tasks(const PagedParams &p, const AttentionOptions &options) {
    constexpr int64_t kPerSequenceKeys = 2048;
    const AttentionParams &a = p.attention;
    return a.heads > a.kv_heads && a.window_start <= -a.key_len && !options.alibi_slopes &&
           p.longest_blocks * p.block_size >= kPerSequenceKeys;
}

// The splits of a paged step's keys: the caller's, or where its tasks are too few for the
// threads, key_splits' of the longest sequence, of at least 256 keys each; at most one per block.
// A window that leaves keys out, or ALiBi (whose offsets count from each split's own last key),
// runs one.
int64_t paged_splits(const PagedParams &p, const AttentionOptions &options, bool per_sequence) {
    if (p.attention.window_start > -p.attention.key_len || options.alibi_slopes) {
        return 1;
    }
    const int64_t blocks = std::max<int64_t>(1, p.longest_blocks);
    if (options.num_splits > 0) {
        return std::min<int64_t>(options.num_splits, blocks);
    }
    constexpr int64_t kMinSplitKeys = 256;
    const AttentionParams &a = p.attention;
    const int64_t tasks = per_sequence ? a.batch : a.batch * a.kv_heads;
    const int64_t splits = key_splits(tasks, blocks * p.block_size, pool_threads(),
                                      std::max<int64_t>(kMinSplitKeys, p.block_size));
    return std::min(splits, blocks);
}

// A step in `splits` splits per sequence: split s of sequence b is row b·splits + s of a batch
// of its own, whose block table row is the sequence's blocks [s·n, (s + 1)·n) (n: the longest
// sequence's blocks over the splits) and whose query is b's. Each row's context (f32) and
// log-sum-exp come back, merged per sequence and head weighed by exp(lse - the largest lse),
// exact with one split; a split of no keys weighs 0.
template <typename T>
void run_split_paged_attention(const PagedParams &p, const StridedView<const T> &query,
                               const PagedKvCache<T> &cache, const StridedView<T> &output,
                               const AttentionOptions &options, int64_t splits) {
    const AttentionParams &a = p.attention;
    const int64_t B = a.batch, H = a.heads, d = a.head_dim, dv = a.value_dim;
    const int64_t bs = p.block_size, rows = B * splits;
    const int64_t split_blocks = (p.longest_blocks + splits - 1) / splits;
    Scratch<T> queries(rows * H * d);
    Scratch<int32_t> tables(rows * split_blocks), lengths(rows);
    ScratchFloats contexts(rows * H * dv), lses(rows * H);
    const Strided &q = a.query, &table = p.block_table;  // q viewed as [B, H, 1, d]
    for (int64_t b = 0; b < B; b++) {
        const int64_t length = cache.sequence_lengths.data[b * p.sequence_lengths.strides[0]];
        for (int64_t s = 0; s < splits; s++) {
            const int64_t r = b * splits + s, first = s * split_blocks * bs;
            lengths.data()[r] = int32_t(std::clamp<int64_t>(length - first, 0, split_blocks * bs));
            for (int64_t n = 0; n < split_blocks; n++) {
                const int64_t entry = s * split_blocks + n;
                tables.data()[r * split_blocks + n] =
                    first + n * bs < length
                        ? cache.block_table.data[b * table.strides[0] + entry * table.strides[1]]
                        : 0;
            }
            for (int64_t h = 0; h < H; h++) {
                std::copy_n(query.data + b * q.strides[0] + h * q.strides[1], d,
                            queries.data() + (r * H + h) * d);
            }
        }
    }
    PagedParams split = p;
    AttentionParams &sa = split.attention;
    sa.batch = rows;
    sa.key_len = split_blocks * bs;
    // Every key of the split, with the step's choice of tasks (per_sequence_tasks).
    sa.window_start = int32_t((p.attention.window_start <= -a.key_len ? 0 : 1) - sa.key_len);
    sa.query = {{rows, H, 1, d}, {H * d, d, d, 1}, 4};
    sa.output = {{rows, H, 1, dv}, {H * dv, dv, dv, 1}, 4};
    sa.has_lse = true;
    sa.lse = {{rows, H, 1}, {H, 1, 1}, 3};
    split.block_table = {{rows, split_blocks}, {split_blocks, 1}, 2};
    split.sequence_lengths = {{rows}, {1}, 1};
    call_paged_kernel(split, queries.data(), cache, tables.data(), lengths.data(), contexts.data(),
                      lses.data(), options);
    const Strided &out = a.output;  // [B, H, 1, dv]
    for (int64_t b = 0; b < B; b++) {
        for (int64_t h = 0; h < H; h++) {
            const auto split_lse = [&](int64_t s) {
                return lses.data()[(b * splits + s) * H + h];
            };
            float largest = -std::numeric_limits<float>::infinity();
            for (int64_t s = 0; s < splits; s++) {
                largest = std::max(largest, split_lse(s));
            }
            // Split 0's row accumulates the others' (a split of no keys has a zero context).
            float *merged = contexts.data() + (b * splits * H + h) * dv;
            float total = 0;
            for (int64_t s = 0; s < splits; s++) {
                const float weight = largest == -std::numeric_limits<float>::infinity()
                                         ? 0.0f
                                         : std::exp(split_lse(s) - largest);
                const float *context = contexts.data() + ((b * splits + s) * H + h) * dv;
                for (int64_t c = 0; c < dv; c++) {
                    merged[c] = s == 0 ? weight * context[c] : merged[c] + weight * context[c];
                }
                total += weight;
            }
            T *target = output.data + b * out.strides[0] + h * out.strides[1];
            for (int64_t c = 0; c < dv; c++) {
                target[c * out.strides[3]] = narrow<T>(total > 0 ? merged[c] / total : 0.0f);
            }
            if (a.has_lse) {
                options.lse->data[b * a.lse.strides[0] + h * a.lse.strides[1]] =
                    largest + std::log(total);
            }
        }
    }
}

}  // namespace

template <typename T>
void run_checked_paged_attention(PagedParams p, const StridedView<const T> &query,
                                 const PagedKvCache<T> &cache, const StridedView<T> &output,
                                 const AttentionOptions &options) {
    install_runtime_hooks();
    const bool per_sequence = per_sequence_tasks(p, options);
    const int64_t splits = paged_splits(p, options, per_sequence);
    if (!per_sequence && p.attention.window_start <= -p.attention.key_len) {
        p.attention.window_start = int32_t(1 - p.attention.key_len);
    }
    if (splits > 1) {
        run_split_paged_attention(p, query, cache, output, options, splits);
        return;
    }
    call_paged_kernel(p, query.data, cache, cache.block_table.data, cache.sequence_lengths.data,
                      output.data, options.lse ? options.lse->data : nullptr, options);
}

#define MHA_CHECKED_PAGED_ATTENTION(T)                                                         \
    template void run_checked_paged_attention(PagedParams, const StridedView<const T> &,       \
                                              const PagedKvCache<T> &, const StridedView<T> &, \
                                              const AttentionOptions &);
MHA_CHECKED_PAGED_ATTENTION(float)
MHA_CHECKED_PAGED_ATTENTION(bfloat16)
MHA_CHECKED_PAGED_ATTENTION(float16)
#undef MHA_CHECKED_PAGED_ATTENTION

namespace {

// With a rotation, the kernels read a rotated copy of the query.
template <typename T>
void run_paged_attention(const StridedView<const T> &query, const PagedKvCache<T> &cache,
                         const StridedView<T> &output, const AttentionOptions &options) {
    PagedParams p = check_paged_attention(query, cache, output, options);
    if (!p.attention.rotary) {
        run_checked_paged_attention(p, query, cache, output, options);
        return;
    }
    const int64_t B = p.attention.batch, H = p.attention.heads, d = p.attention.head_dim;
    const Strided &q = p.attention.query;  // [B, H, 1, d]
    Scratch<T> rotated(B * H * d);
    for (int64_t b = 0; b < B; b++) {
        T *row = rotated.data() + b * H * d;
        for (int64_t h = 0; h < H; h++) {
            std::copy_n(query.data + b * q.strides[0] + h * q.strides[1], d, row + h * d);
        }
        const int64_t length = cache.sequence_lengths.data[b * p.sequence_lengths.strides[0]];
        if (length > 0) {
            rotate_token(*p.attention.rotary, length - 1, {TokenHeads<T>{row, H, d, 1}});
        }
    }
    p.attention.query = {{B, H, 1, d}, {H * d, d, d, 1}, 4};
    StridedView<const T> rotated_query;  // its data: p.attention.query describes it
    rotated_query.data = rotated.data();
    run_checked_paged_attention(p, rotated_query, cache, output, options);
}

// Rows [first, first + count) of a packed [total, heads, features] view, as the [1, heads,
// count, features] view attention() takes.
template <typename T>
StridedView<T> sequence_rows(const StridedView<T> &packed, const Strided &s, int64_t first,
                             int64_t count) {
    return {packed.data + first * s.strides[0],
            {1, s.shape[1], count, s.shape[2]},
            {0, s.strides[1], s.strides[0], s.strides[2]}};
}

template <typename T>
void run_varlen_attention(const StridedView<const T> &query, const StridedView<const T> &key,
                          const StridedView<const T> &value,
                          const StridedView<const int32_t> &cu_seqlens_q,
                          const StridedView<const int32_t> &cu_seqlens_k,
                          const StridedView<T> &output, const AttentionOptions &options) {
    const VarlenParams p =
        check_varlen_attention(erased(query), erased(key), erased(value), cu_seqlens_q,
                               cu_seqlens_k, erased(output), dtype_of<T>(), options);
    struct Sequence {
        StridedView<const T> query, key, value;
        StridedView<T> output;
        AttentionOptions options;
    };
    std::vector<Sequence> sequences;
    for (int64_t b = 0; b < p.batch; b++) {
        const int64_t q0 = p.query_starts[size_t(b)], k0 = p.key_starts[size_t(b)];
        const int64_t rows = p.query_starts[size_t(b + 1)] - q0;
        const int64_t keys = p.key_starts[size_t(b + 1)] - k0;
        if (rows == 0) {
            continue;
        }
        Sequence s{sequence_rows(query, p.query, q0, rows),
                   {},
                   {},
                   sequence_rows(output, p.output, q0, rows),
                   options};
        if (p.has_lse) {  // [H, total_q] -> [1, H, rows]
            s.options.lse = StridedView<float>{options.lse->data + q0 * p.lse.strides[1],
                                               {1, p.heads, rows},
                                               {0, p.lse.strides[0], p.lse.strides[1]}};
        }
        if (keys > 0) {  // checked, as every sequence is, before any output is written
            s.key = sequence_rows(key, p.key, k0, keys);
            s.value = sequence_rows(value, p.value, k0, keys);
            check_attention(erased(s.query), erased(s.key), erased(s.value), erased(s.output),
                            dtype_of<T>(), s.options);
        }
        sequences.push_back(std::move(s));
    }
    for (const Sequence &s : sequences) {
        if (s.key.data != nullptr) {
            run_attention(s.query, s.key, s.value, s.output, s.options);
            continue;
        }
        // No key weighs its queries: zero outputs, -inf lse.
        for (int64_t i = 0; i < s.output.shape[2]; i++) {
            for (int64_t h = 0; h < p.heads; h++) {
                for (int64_t c = 0; c < p.value_dim; c++) {
                    s.output.data[i * p.output.strides[0] + h * p.output.strides[1] +
                                  c * p.output.strides[2]] = narrow<T>(0.0f);
                }
                if (p.has_lse) {
                    s.options.lse->data[h * p.lse.strides[0] + i * p.lse.strides[1]] = -INFINITY;
                }
            }
        }
    }
}

template <typename T>
std::string kernel_name_for(const StridedView<const T> &query, const StridedView<const T> &key,
                            const StridedView<const T> &value, const AttentionOptions &options) {
    // The output is only checked: a view of the query's shape with dv features, never written.
    std::vector<int64_t> shape = query.shape;
    if (shape.size() == 4 && value.shape.size() == 4) {
        shape[3] = value.shape[3];
    }
    static T unwritten;
    const AttentionParams p = check_attention(erased(query), erased(key), erased(value),
                                              {&unwritten, shape, {}}, dtype_of<T>(), options);
    return std::string(select_kernel(p).name);
}

}  // namespace
}  // namespace detail

void attention(const StridedView<const float> &query, const StridedView<const float> &key,
               const StridedView<const float> &value, const StridedView<float> &output,
               const AttentionOptions &options) {
    detail::run_attention(query, key, value, output, options);
}
void attention(const StridedView<const bfloat16> &query, const StridedView<const bfloat16> &key,
               const StridedView<const bfloat16> &value, const StridedView<bfloat16> &output,
               const AttentionOptions &options) {
    detail::run_attention(query, key, value, output, options);
}
void attention(const StridedView<const float16> &query, const StridedView<const float16> &key,
               const StridedView<const float16> &value, const StridedView<float16> &output,
               const AttentionOptions &options) {
    detail::run_attention(query, key, value, output, options);
}

void paged_attention(const StridedView<const float> &query, const PagedKvCache<float> &cache,
                     const StridedView<float> &output, const AttentionOptions &options) {
    detail::run_paged_attention(query, cache, output, options);
}
void paged_attention(const StridedView<const bfloat16> &query, const PagedKvCache<bfloat16> &cache,
                     const StridedView<bfloat16> &output, const AttentionOptions &options) {
    detail::run_paged_attention(query, cache, output, options);
}
void paged_attention(const StridedView<const float16> &query, const PagedKvCache<float16> &cache,
                     const StridedView<float16> &output, const AttentionOptions &options) {
    detail::run_paged_attention(query, cache, output, options);
}

void varlen_attention(const StridedView<const float> &query, const StridedView<const float> &key,
                      const StridedView<const float> &value,
                      const StridedView<const int32_t> &cu_seqlens_q,
                      const StridedView<const int32_t> &cu_seqlens_k,
                      const StridedView<float> &output, const AttentionOptions &options) {
    detail::run_varlen_attention(query, key, value, cu_seqlens_q, cu_seqlens_k, output, options);
}
void varlen_attention(const StridedView<const bfloat16> &query,
                      const StridedView<const bfloat16> &key,
                      const StridedView<const bfloat16> &value,
                      const StridedView<const int32_t> &cu_seqlens_q,
                      const StridedView<const int32_t> &cu_seqlens_k,
                      const StridedView<bfloat16> &output, const AttentionOptions &options) {
    detail::run_varlen_attention(query, key, value, cu_seqlens_q, cu_seqlens_k, output, options);
}
void varlen_attention(const StridedView<const float16> &query,
                      const StridedView<const float16> &key,
                      const StridedView<const float16> &value,
                      const StridedView<const int32_t> &cu_seqlens_q,
                      const StridedView<const int32_t> &cu_seqlens_k,
                      const StridedView<float16> &output, const AttentionOptions &options) {
    detail::run_varlen_attention(query, key, value, cu_seqlens_q, cu_seqlens_k, output, options);
}

std::string attention_kernel_name(const StridedView<const float> &query,
                                  const StridedView<const float> &key,
                                  const StridedView<const float> &value,
                                  const AttentionOptions &options) {
    return detail::kernel_name_for(query, key, value, options);
}
std::string attention_kernel_name(const StridedView<const bfloat16> &query,
                                  const StridedView<const bfloat16> &key,
                                  const StridedView<const bfloat16> &value,
                                  const AttentionOptions &options) {
    return detail::kernel_name_for(query, key, value, options);
}
std::string attention_kernel_name(const StridedView<const float16> &query,
                                  const StridedView<const float16> &key,
                                  const StridedView<const float16> &value,
                                  const AttentionOptions &options) {
    return detail::kernel_name_for(query, key, value, options);
}

}  // namespace mha
