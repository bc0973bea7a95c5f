#include "attention_params.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "checks.h"
#include "dtype.h"

namespace mha::detail {
namespace {

// A view's extents and strides, checked: `rank` dimensions of at least 1, strides of the same
// count (or none: row-major), none negative, a span the kernels address; an output's elements
// each its own (no two indices reach the same element).
Strided checked(const char *name, const void *data, const std::vector<int64_t> &shape,
                const std::vector<int64_t> &strides, int rank, const char *layout,
                int64_t element_bytes, bool written) {
    if (data == nullptr) {
        throw Error(fmt::format("{} has a null data pointer", name));
    }
    if (int(shape.size()) != rank) {
        throw Error(fmt::format("{} has shape {} but must have {} dimensions {}", name,
                                shape_string(shape), rank, layout));
    }
    if (!strides.empty() && strides.size() != shape.size()) {
        throw Error(
            fmt::format("{} has {} strides for its {} dimensions", name, strides.size(), rank));
    }
    Strided s;
    s.rank = rank;
    int64_t row_major = 1, span = 1;  // elements the view reaches, first to last
    for (int d = rank; d-- > 0;) {
        s.shape[d] = shape[d];
        s.strides[d] = strides.empty() ? row_major : strides[d];
        if (shape[d] < 1) {
            throw Error(fmt::format("{} has shape {}: dimension {} is {}, must be >= 1", name,
                                    shape_string(shape), d, shape[d]));
        }
        if (s.strides[d] < 0) {
            throw Error(fmt::format("{} has stride {} in dimension {}: strides must be >= 0", name,
                                    s.strides[d], d));
        }
        // Every product and sum checked: extents and strides come from the caller.
        const std::optional<int64_t> reach =
            contract::checked_product({shape[d] - 1, s.strides[d]});
        int64_t reached = 0;
        const std::optional<int64_t> bytes =
            reach && !__builtin_add_overflow(span, *reach, &reached)
                ? contract::checked_product({reached, element_bytes})
                : std::nullopt;
        if (!bytes || *bytes > kMaxBufferBytes) {
            throw Error(
                fmt::format("{} of shape {} spans more than the {} bytes a kernel addresses", name,
                            shape_string(shape), kMaxBufferBytes));
        }
        span = reached;
        // A row-major stride past the span's limit is never used: the next check throws first.
        row_major = contract::checked_product({row_major, shape[d]}).value_or(kMaxBufferBytes);
    }
    if (written) {
        // No overlap: taken by increasing stride, each dimension steps past all inner ones.
        std::array<int, kMaxRank> order{0, 1, 2, 3};
        for (int n = 1; n < rank; n++) {  // insertion sort of at most four
            for (int m = n; m > 0 && s.strides[order[m]] < s.strides[order[m - 1]]; m--) {
                std::swap(order[m], order[m - 1]);
            }
        }
        int64_t inner = 1;
        for (int n = 0; n < rank; n++) {
            const int d = order[n];
            if (s.shape[d] > 1 && s.strides[d] < inner) {
                throw Error(fmt::format("{} has strides {} over shape {}: its elements overlap",
                                        name, shape_string(strides), shape_string(shape)));
            }
            inner = std::max(inner, s.strides[d] * (s.shape[d] - 1) + 1);
        }
    }
    return s;
}

template <typename T>
Strided checked(const char *name, const StridedView<T> &t, int rank, const char *layout,
                int64_t element_bytes) {
    return checked(name, t.data, t.shape, t.strides, rank, layout, element_bytes,
                   !std::is_const_v<T>);
}

void check_extent(const char *name, int dimension, int64_t got, const char *than, int64_t want) {
    if (got != want) {
        throw Error(fmt::format("{} has {} {} but {} has {}", name, got,
                                dimension == 0   ? "batch rows"
                                : dimension == 1 ? "heads"
                                : dimension == 2 ? "positions"
                                                 : "features",
                                than, want));
    }
}

// The options every attention call takes alike: scale, causal alignment, window sides, softcap,
// ALiBi slopes, lse; the mask and the window's offsets are the caller's.
void check_score_options(AttentionParams &p, const AttentionOptions &options) {
    p.scale = options.scale ? *options.scale : 1.0f / std::sqrt(float(p.head_dim));
    if (!std::isfinite(p.scale)) {
        throw Error(fmt::format("scale {} is not finite", p.scale));
    }
    if (options.causal != Causal::none && options.causal != Causal::top_left &&
        options.causal != Causal::bottom_right) {
        throw Error(fmt::format("causal {} is none of none, top_left and bottom_right",
                                int(options.causal)));
    }
    for (const auto &[name, side] :
         {std::pair{"window_left", options.window_left}, {"window_right", options.window_right}}) {
        if (side < -1) {
            throw Error(fmt::format("{} {} must be -1 (unbounded) or >= 0", name, side));
        }
    }
    if (!(options.softcap >= 0 && std::isfinite(options.softcap))) {
        throw Error(fmt::format("softcap {} must be finite and >= 0 (0: none)", options.softcap));
    }
    p.softcap = options.softcap;
    if (options.num_splits < 0) {
        throw Error(fmt::format("num_splits {} must be >= 0 (0: chosen)", options.num_splits));
    }
    if (options.alibi_slopes) {
        p.alibi_slopes =
            checked("alibi_slopes", *options.alibi_slopes, 1, "[heads]", sizeof(float));
        check_extent("alibi_slopes", 1, p.alibi_slopes.shape[0], "query", p.heads);
    }
    p.modified_scores = p.softcap != 0 || options.alibi_slopes.has_value();
    if (options.rotary) {
        p.rotary = check_rotary(*options.rotary, p.head_dim);
    }
    p.has_lse = options.lse.has_value();
    if (p.has_lse) {
        p.lse = checked("lse", *options.lse, 3, "[batch, heads, query length]", sizeof(float));
        const std::array<int64_t, 3> want{p.batch, p.heads, p.query_len};
        if (!std::equal(want.begin(), want.end(), p.lse.shape.begin())) {
            throw Error(fmt::format("lse has shape {} but must be [B, H, Sq] = {}",
                                    shape_string(options.lse->shape), shape_string(want)));
        }
    }
}

}  // namespace

AttentionParams check_attention(const StridedView<const void> &query,
                                const StridedView<const void> &key,
                                const StridedView<const void> &value,
                                const StridedView<void> &output, DType dtype,
                                const AttentionOptions &options) {
    const char *layout = "[batch, heads, sequence, features]";
    const int64_t bytes = element_bytes(dtype);
    AttentionParams p{};
    p.dtype = dtype;
    p.query = checked("query", query, 4, layout, bytes);
    p.key = checked("key", key, 4, layout, bytes);
    p.value = checked("value", value, 4, layout, bytes);
    p.output = checked("output", output, 4, layout, bytes);
    p.batch = p.query.shape[0];
    p.heads = p.query.shape[1];
    p.query_len = p.query.shape[2];
    p.head_dim = p.query.shape[3];
    p.kv_heads = p.key.shape[1];
    p.key_len = p.key.shape[2];
    p.value_dim = p.value.shape[3];
    check_extent("key", 0, p.key.shape[0], "query", p.batch);
    check_extent("value", 0, p.value.shape[0], "query", p.batch);
    check_extent("value", 1, p.value.shape[1], "key", p.kv_heads);
    check_extent("value", 2, p.value.shape[2], "key", p.key_len);
    check_extent("key", 3, p.key.shape[3], "query", p.head_dim);
    if (p.heads % p.kv_heads != 0) {
        throw Error(
            fmt::format("query has {} heads, not a multiple of key's {} (grouped-query "
                        "heads share a key/value head)",
                        p.heads, p.kv_heads));
    }
    const std::array<int64_t, 4> out{p.batch, p.heads, p.query_len, p.value_dim};
    if (!std::equal(out.begin(), out.end(), p.output.shape.begin())) {
        throw Error(fmt::format("output has shape {} but must be [B, H, Sq, dv] = {}",
                                shape_string(output.shape), shape_string(out)));
    }
    check_score_options(p, options);
    if (options.num_splits != 0) {
        throw Error(fmt::format("num_splits {} is paged_attention's: other calls take 0",
                                options.num_splits));
    }
    if (options.mask) {
        p.mask = attention_mask(*options.mask, p.scores_shape());
    }
    const bool causal = options.causal != Causal::none;
    if (causal && options.window_right > 0) {
        throw Error(
            fmt::format("window_right {} with causal attention: a causal order sees no "
                        "key past the diagonal (window_right -1 or 0)",
                        options.window_right));
    }
    // The diagonal and the window about it, as offsets of the query position, clamped to where
    // they see every key or none.
    const int64_t Sq = p.query_len, Sk = p.key_len;
    const int64_t diagonal = options.causal == Causal::top_left ? 0 : Sk - Sq;
    const int64_t right = causal ? 0 : options.window_right;
    p.window = causal || options.window_left >= 0 || options.window_right >= 0;
    p.window_start =
        int32_t(options.window_left < 0
                    ? -Sq
                    : std::clamp(diagonal - std::min(options.window_left, Sq + Sk), -Sq, Sk));
    p.window_end = int32_t(right < 0 ? Sk : std::clamp(diagonal + right, -Sq - 1, Sk));
    // Rotated queries take positions Sk - Sq to Sk - 1, keys 0 to Sk - 1.
    const int64_t first_position = std::min<int64_t>(Sk - Sq, 0), last_position = Sk - 1;
    if (p.rotary && (!rotary_position_valid(*p.rotary, first_position) ||
                     !rotary_position_valid(*p.rotary, last_position))) {
        throw Error(
            fmt::format("rotary tables of positions 0 to {}: the queries and keys take "
                        "positions {} to {} (query i at Sk - Sq + i, key j at j)",
                        p.rotary->table_rows - 1, first_position, last_position));
    }
    // What the kernels make: keys copied key-major and values head-major (rounded up by a tile),
    // the context with the rows' statistics, and the mask read at its full extent.
    const int64_t tile = contract::kMaxTile;
    check_kernel_buffer({p.batch, p.kv_heads, p.head_dim, 2 * contract::round_up(Sk, tile) + tile},
                        sizeof(float), [] { return std::string("the keys copied key-major"); });
    check_kernel_buffer(
        {p.batch, p.kv_heads, contract::round_up(Sk, tile), contract::round_up(p.value_dim, tile)},
        sizeof(float), [] { return std::string("the values copied"); });
    check_kernel_buffer(
        {p.batch, p.heads, contract::round_up(Sq, tile), contract::round_up(p.value_dim, tile)},
        sizeof(float), [] { return std::string("the context"); });
    if (p.mask.kind != contract::MaskKind::none) {
        check_kernel_buffer({p.batch, p.heads, Sq, Sk},
                            p.mask.kind == contract::MaskKind::bytes ? 1 : sizeof(float), [&] {
                                return fmt::format("mask, read at [B, H, Sq, Sk] = {},",
                                                   shape_string(p.scores_shape()));
                            });
    }
    return p;
}

namespace {

// cu_seqlens_q or cu_seqlens_k: row offsets from 0, nondecreasing, ending at `total`.
std::vector<int64_t> sequence_starts(const char *name, const StridedView<const int32_t> &cu,
                                     const char *rows, int64_t total) {
    const Strided s = checked(name, cu, 1, "[batch + 1]", sizeof(int32_t));
    std::vector<int64_t> starts(size_t(s.shape[0]));
    for (size_t b = 0; b < starts.size(); b++) {
        starts[b] = cu.data[int64_t(b) * s.strides[0]];
        if (b == 0 && starts[0] != 0) {
            throw Error(fmt::format("{}[0] is {}: the offsets start at 0", name, starts[0]));
        }
        if (b > 0 && starts[b] < starts[b - 1]) {
            throw Error(
                fmt::format("{}[{}] is {}, less than the {} before it: offsets never "
                            "decrease",
                            name, b, starts[b], starts[b - 1]));
        }
    }
    if (starts.back() != total) {
        throw Error(fmt::format("{}[{}] is {} but {} has {} rows: the sequences must cover them",
                                name, starts.size() - 1, starts.back(), rows, total));
    }
    return starts;
}

}  // namespace

VarlenParams check_varlen_attention(const StridedView<const void> &query,
                                    const StridedView<const void> &key,
                                    const StridedView<const void> &value,
                                    const StridedView<const int32_t> &cu_seqlens_q,
                                    const StridedView<const int32_t> &cu_seqlens_k,
                                    const StridedView<void> &output, DType dtype,
                                    const AttentionOptions &options) {
    const char *layout = "[total rows, heads, features]";
    const int64_t bytes = element_bytes(dtype);
    VarlenParams p{};
    p.query = checked("query", query, 3, layout, bytes);
    p.key = checked("key", key, 3, layout, bytes);
    p.value = checked("value", value, 3, layout, bytes);
    p.output = checked("output", output, 3, layout, bytes);
    p.heads = p.query.shape[1];
    p.head_dim = p.query.shape[2];
    p.kv_heads = p.key.shape[1];
    p.value_dim = p.value.shape[2];
    check_extent("value", 1, p.value.shape[1], "key", p.kv_heads);
    check_extent("key", 2, p.key.shape[2], "query", p.head_dim);
    if (p.value.shape[0] != p.key.shape[0]) {
        throw Error(fmt::format("value has {} rows but key {}", p.value.shape[0], p.key.shape[0]));
    }
    const std::array<int64_t, 3> out{p.query.shape[0], p.heads, p.value_dim};
    if (!std::equal(out.begin(), out.end(), p.output.shape.begin())) {
        throw Error(fmt::format("output has shape {} but must be [total_q, H, dv] = {}",
                                shape_string(output.shape), shape_string(out)));
    }
    if (options.mask) {
        throw Error("varlen_attention takes no mask: cu_seqlens bound each sequence's keys");
    }
    p.query_starts = sequence_starts("cu_seqlens_q", cu_seqlens_q, "query", p.query.shape[0]);
    p.key_starts = sequence_starts("cu_seqlens_k", cu_seqlens_k, "key", p.key.shape[0]);
    if (p.key_starts.size() != p.query_starts.size()) {
        throw Error(
            fmt::format("cu_seqlens_k has {} offsets but cu_seqlens_q {}: one per "
                        "sequence and one past the last in each",
                        p.key_starts.size(), p.query_starts.size()));
    }
    p.batch = int64_t(p.query_starts.size()) - 1;
    p.has_lse = options.lse.has_value();
    if (p.has_lse) {
        p.lse = checked("lse", *options.lse, 2, "[heads, total_q]", sizeof(float));
        const std::array<int64_t, 2> want{p.heads, p.query.shape[0]};
        if (!std::equal(want.begin(), want.end(), p.lse.shape.begin())) {
            throw Error(fmt::format("lse has shape {} but must be [H, total_q] = {}",
                                    shape_string(options.lse->shape), shape_string(want)));
        }
    }
    return p;
}

template <typename T>
PagedParams check_paged_attention(const StridedView<const T> &query, const PagedKvCache<T> &cache,
                                  const StridedView<T> &output, const AttentionOptions &options) {
    const DType dtype = dtype_of<T>();
    const int64_t bytes = element_bytes(dtype);
    const StridedView<const T> &key_cache = cache.key_cache, &value_cache = cache.value_cache;
    const StridedView<const int32_t> &block_table = cache.block_table;
    const StridedView<const int32_t> &sequence_lengths = cache.sequence_lengths;
    const char *pages = "[num_blocks, block_size, kv_heads, features]";
    PagedParams paged{};
    AttentionParams &p = paged.attention;
    p.dtype = dtype;
    p.query = checked("query", query, 4, "[batch, 1, heads, features]", bytes);
    p.output = checked("output", output, 4, "[batch, 1, heads, features]", bytes);
    paged.key_cache = checked("key_cache", key_cache, 4, pages, bytes);
    paged.value_cache = checked("value_cache", value_cache, 4, pages, bytes);
    paged.block_table = checked("block_table", block_table, 2, "[batch, max_blocks]", 4);
    paged.sequence_lengths = checked("sequence_lengths", sequence_lengths, 1, "[batch]", 4);
    p.batch = p.query.shape[0];
    p.query_len = p.query.shape[1];
    p.heads = p.query.shape[2];
    p.head_dim = p.query.shape[3];
    paged.num_blocks = paged.key_cache.shape[0];
    paged.block_size = paged.key_cache.shape[1];
    p.kv_heads = paged.key_cache.shape[2];
    p.value_dim = paged.value_cache.shape[3];
    if (p.query_len != 1) {
        throw Error(
            fmt::format("query has {} positions per sequence: a paged step takes each "
                        "sequence's newest token only",
                        p.query_len));
    }
    for (int d = 0; d < 3; d++) {
        if (paged.value_cache.shape[d] != paged.key_cache.shape[d]) {
            throw Error(
                fmt::format("value_cache has shape {} but key_cache {}: they must agree "
                            "but for the features",
                            shape_string(value_cache.shape), shape_string(key_cache.shape)));
        }
    }
    check_extent("key_cache", 3, paged.key_cache.shape[3], "query", p.head_dim);
    check_extent("block_table", 0, paged.block_table.shape[0], "query", p.batch);
    check_extent("sequence_lengths", 0, paged.sequence_lengths.shape[0], "query", p.batch);
    const int64_t bs = paged.block_size;
    if ((bs & (bs - 1)) != 0) {
        throw Error(
            fmt::format("key_cache has blocks of {} slots: a power of two (16, 32, 64...) "
                        "is required",
                        bs));
    }
    if (p.heads % p.kv_heads != 0) {
        throw Error(
            fmt::format("query has {} heads, not a multiple of key_cache's {} (grouped-query "
                        "heads share a key/value head)",
                        p.heads, p.kv_heads));
    }
    for (const auto &[name, s] : {std::pair{"query", &p.query},
                                  {"key_cache", &paged.key_cache},
                                  {"value_cache", &paged.value_cache}}) {
        if (!s->dense_rows()) {
            throw Error(
                fmt::format("{} has feature stride {}: a paged step reads features "
                            "contiguous (stride 1) in place",
                            name, s->strides[3]));
        }
    }
    const std::array<int64_t, 4> out{p.batch, 1, p.heads, p.value_dim};
    if (!std::equal(out.begin(), out.end(), p.output.shape.begin())) {
        throw Error(fmt::format("output has shape {} but must be [B, 1, H, dv] = {}",
                                shape_string(output.shape), shape_string(out)));
    }
    const int64_t max_blocks = paged.block_table.shape[1];
    p.key_len = max_blocks * bs;
    check_kernel_buffer({p.batch, p.key_len}, 1, [] {
        return std::string("the keys the block table reaches, [batch, max_blocks · block_size],");
    });
    // Each sequence's length and the blocks it reads: the kernel reads no other entry.
    for (int64_t b = 0; b < p.batch; b++) {
        const int64_t length = sequence_lengths.data[b * paged.sequence_lengths.strides[0]];
        if (length < 0 || length > p.key_len) {
            throw Error(
                fmt::format("sequence_lengths[{}] is {}: must be 0 to max_blocks · "
                            "block_size = {}",
                            b, length, p.key_len));
        }
        const int64_t blocks = (length + bs - 1) / bs;
        paged.longest_blocks = std::max(paged.longest_blocks, blocks);
        for (int64_t n = 0; n < blocks; n++) {
            const int64_t block =
                block_table
                    .data[b * paged.block_table.strides[0] + n * paged.block_table.strides[1]];
            if (block < 0 || block >= paged.num_blocks) {
                throw Error(
                    fmt::format("block_table[{}][{}] is {}: sequence {} reads it, and the "
                                "cache has blocks 0 to {}",
                                b, n, block, b, paged.num_blocks - 1));
            }
        }
    }
    check_score_options(p, options);
    for (int64_t b = 0; b < p.batch && p.rotary; b++) {  // the query at its sequence's last key
        const int64_t length = sequence_lengths.data[b * paged.sequence_lengths.strides[0]];
        if (length > 0 && !rotary_position_valid(*p.rotary, length - 1)) {
            throw Error(
                fmt::format("sequence_lengths[{}] is {}: the query's position {} is not in "
                            "the rotary tables' 0 to {}",
                            b, length, length - 1, p.rotary->table_rows - 1));
        }
    }
    if (options.mask) {
        throw Error("a paged step takes no mask: sequence_lengths bound each sequence's keys");
    }
    if (options.causal == Causal::top_left) {
        throw Error(
            "causal top_left with a paged step: the query is each sequence's last "
            "position (none or bottom_right)");
    }
    if (options.window_right > 0) {
        throw Error(
            fmt::format("window_right {} with a paged step: no key lies past the query "
                        "(window_right -1 or 0)",
                        options.window_right));
    }
    // Offsets from the query, the last key: every key before it unless window_left bounds them.
    p.window = true;
    p.window_start =
        int32_t(options.window_left < 0 ? -p.key_len : -std::min(options.window_left, p.key_len));
    p.window_end = 0;
    // The kernels take the query and output as [B, H, 1, d] views.
    for (Strided *s : {&p.query, &p.output}) {
        std::swap(s->shape[1], s->shape[2]);
        std::swap(s->strides[1], s->strides[2]);
    }
    return paged;
}

template PagedParams check_paged_attention(const StridedView<const float> &,
                                           const PagedKvCache<float> &, const StridedView<float> &,
                                           const AttentionOptions &);
template PagedParams check_paged_attention(const StridedView<const bfloat16> &,
                                           const PagedKvCache<bfloat16> &,
                                           const StridedView<bfloat16> &, const AttentionOptions &);
template PagedParams check_paged_attention(const StridedView<const float16> &,
                                           const PagedKvCache<float16> &,
                                           const StridedView<float16> &, const AttentionOptions &);

}  // namespace mha::detail
