#include "attention_params.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "checks.h"

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

}  // namespace

AttentionParams check_attention(const StridedView<const void> &query,
                                const StridedView<const void> &key,
                                const StridedView<const void> &value,
                                const StridedView<void> &output, DType dtype,
                                const AttentionOptions &options) {
    const char *layout = "[batch, heads, sequence, features]";
    const int64_t element_bytes = dtype == DType::f32 ? 4 : 2;
    AttentionParams p{};
    p.dtype = dtype;
    p.query = checked("query", query, 4, layout, element_bytes);
    p.key = checked("key", key, 4, layout, element_bytes);
    p.value = checked("value", value, 4, layout, element_bytes);
    p.output = checked("output", output, 4, layout, element_bytes);
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
    p.scale = options.scale ? *options.scale : 1.0f / std::sqrt(float(p.head_dim));
    if (!std::isfinite(p.scale)) {
        throw Error(fmt::format("scale {} is not finite", p.scale));
    }
    if (options.mask) {
        p.mask = attention_mask(*options.mask, p.scores_shape());
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
    if (!(options.softcap >= 0 && std::isfinite(options.softcap))) {
        throw Error(fmt::format("softcap {} must be finite and >= 0 (0: none)", options.softcap));
    }
    p.softcap = options.softcap;
    if (options.alibi_slopes) {
        p.alibi_slopes =
            checked("alibi_slopes", *options.alibi_slopes, 1, "[heads]", sizeof(float));
        check_extent("alibi_slopes", 1, p.alibi_slopes.shape[0], "query", p.heads);
    }
    p.modified_scores = p.softcap != 0 || options.alibi_slopes.has_value();
    p.has_lse = options.lse.has_value();
    if (p.has_lse) {
        p.lse = checked("lse", *options.lse, 3, "[batch, heads, query length]", sizeof(float));
        const std::array<int64_t, 3> want{p.batch, p.heads, Sq};
        if (!std::equal(want.begin(), want.end(), p.lse.shape.begin())) {
            throw Error(fmt::format("lse has shape {} but must be [B, H, Sq] = {}",
                                    shape_string(options.lse->shape), shape_string(want)));
        }
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

}  // namespace mha::detail
