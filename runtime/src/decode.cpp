// Decode steps over a KV cache: the new tokens' QKV projection (one kernel), their keys and
// values appended to the cache, then their attention over the cache and the output projection
// (a second kernel). Nothing is allocated once a step with as many new tokens has run.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <optional>

#include "attention_params.h"
#include "buffers.h"
#include "checks.h"
#include "cpu_isa.h"
#include "dtype.h"
#include "halide_calls.h"
#include "kernel_table.h"
#include "mha/mha.h"
#include "packed_weights.h"
#include "rotary.h"
#include "thread_pool.h"

namespace mha {
namespace detail {

// A cache's memory: keys in tiles of kCacheKeyTile, each tile's features one after another with
// its keys innermost (jj, c, tile, h, b), so that a new token's scores read keys contiguously and
// a tile is one run of memory; values (c, j, h, b); each row's keys padded to a whole number of
// tiles, each key's values to one of kCacheValueFeatures; elements of `dtype` (int8: with a key
// and a value scale per token and head, (j, h, b)); the rotation of its steps, if any.
struct KvCacheStorage {
    KvCacheStorage(std::shared_ptr<const PackedWeights> module, int64_t batch, int64_t capacity,
                   int64_t heads, int64_t head_dim, CacheDType dtype,
                   const std::optional<RotaryOptions> &rotary_options)
        : module(std::move(module)),
          batch(batch),
          capacity(capacity),
          padded_capacity(contract::round_up(capacity, contract::kCacheKeyTile)),
          heads(heads),
          head_dim(head_dim),
          value_features(contract::round_up(head_dim, contract::kCacheValueFeatures)),
          dtype(dtype),
          keys(size_t(batch * heads * head_dim * padded_capacity * element_bytes(dtype))),
          values(size_t(batch * heads * value_features * padded_capacity * element_bytes(dtype))),
          key_scales(dtype == CacheDType::int8 ? size_t(batch * heads * padded_capacity) : 0),
          value_scales(key_scales.size()),
          lengths(batch, 0),
          cached_lengths(batch),
          new_counts(batch) {
        if (rotary_options) {
            rotary.emplace(*rotary_options, head_dim);
        }
    }

    // Where appending writes and the kernels read, in elements: token j of head h in row b has
    // its value at slot · value_features, its scales at slot, and its key's feature f at
    // key_index + f · kCacheKeyTile (key_view's layout).
    int64_t slot(int64_t b, int64_t h, int64_t j) const {
        return (b * heads + h) * padded_capacity + j;
    }
    int64_t key_index(int64_t b, int64_t h, int64_t j) const {
        constexpr int64_t kTile = contract::kCacheKeyTile;
        return (slot(b, h, j) - j % kTile) * head_dim + j % kTile;
    }
    // The kernels' views of every row's first `count` keys (whole tiles): keys (jj, c, tile, h,
    // b), values (c, j, h, b), an int8 cache's scales (j, h, b).
    HostBuffer key_view(int64_t count) {
        constexpr int64_t kTile = contract::kCacheKeyTile;
        const int64_t d = head_dim, cap = padded_capacity;
        return view_buffer(keys.data(), element(), {batch, heads, count / kTile, d, kTile},
                           {heads * d * cap, d * cap, d * kTile, kTile, 1});
    }
    HostBuffer value_view(int64_t count) {
        const int64_t dv = value_features, cap = padded_capacity;
        return view_buffer(values.data(), element(), {batch, heads, count, dv},
                           {heads * cap * dv, cap * dv, dv, 1});
    }
    HostBuffer scales_view(std::vector<float> &scales, int64_t count) const {
        return view_buffer(scales.data(), halide_type_of<float>(), {batch, heads, count},
                           {heads * padded_capacity, padded_capacity, 1});
    }
    halide_type_t element() const { return contract::halide_type(contract::element_type(dtype)); }

    std::shared_ptr<const PackedWeights> module;  // the weights it was made for
    int64_t batch, capacity, padded_capacity, heads, head_dim, value_features;
    CacheDType dtype;
    std::vector<std::byte> keys, values;  // zeroed: whole key tiles read no garbage
    std::vector<float> key_scales, value_scales;
    std::vector<int64_t> lengths;
    // A step's scratch: the new tokens' projections [B, n, P + 2 Pkv], grown to the largest n;
    // each row's cached and new token counts; the key-padding mask over the padded capacity.
    std::vector<float> qkv_rows;
    std::vector<int32_t> cached_lengths, new_counts;
    std::vector<uint8_t> cache_mask;
    std::optional<OwnedRotary> rotary;
};

namespace {

const char *const kDecodeOnTheCpu = "decode steps run on the cpu";

// The kernel of a decode step's op on this process's CPU instruction set.
const CompiledKernel &decode_kernel(const contract::KernelVariant &variant, int64_t token_rows) {
    const CompiledKernel *kernel = find_kernel(cpu_kernels(), int(cpu_isa()), token_rows, variant);
    if (kernel == nullptr) {
        throw Error(fmt::format("internal error: the build has no {} kernel",
                                contract::op_name(variant.op)));
    }
    return *kernel;
}

// One head's n features `x`, stored at out[i · stride] as a cache of T holds them: rounded to T,
// at scale 1.
template <typename T>
float store_head(const float *x, int64_t n, T *out, int64_t stride) {
    if (stride == 1) {
        convert(x, out, n);
        return 1;
    }
    for (int64_t i = 0; i < n; i++) {
        convert(x + i, out + i * stride, 1);
    }
    return 1;
}

// ... or quantized to int8, symmetrically: the largest |x| maps to 127 (all zeros to 0), and the
// scale that maps them back returned. A NaN or an infinity among them gives a NaN scale, which the
// step's outputs then show, as a cache of floats would.
template <>
float store_head(const float *x, int64_t n, int8_t *out, int64_t stride) {
    float largest = 0;
    bool finite = true;
    for (int64_t i = 0; i < n; i++) {
        finite = finite && std::isfinite(x[i]);
        largest = std::max(largest, std::abs(x[i]));
    }
    // In double, as the reference quantizes: 127 / largest overflows f32 for the tiniest heads.
    for (int64_t i = 0; i < n; i++) {
        out[i * stride] =
            finite && largest > 0 ? int8_t(std::nearbyint(double(x[i]) * 127 / largest)) : 0;
    }
    return finite ? largest / 127 : std::numeric_limits<float>::quiet_NaN();
}

// The new tokens' keys and values, from their projections `qkv_rows` [B, n, width], written into
// the cache rows after each row's cached tokens, as the cache's T holds them.
template <typename T>
void append_keys_and_values(KvCacheStorage &c, const float *qkv_rows, int64_t n, int64_t width,
                            int64_t key_offset, int64_t value_offset) {
    T *keys = reinterpret_cast<T *>(c.keys.data());
    T *values = reinterpret_cast<T *>(c.values.data());
    const int64_t d = c.head_dim;
    for (int64_t b = 0; b < c.batch; b++) {
        for (int64_t t = 0; t < c.new_counts[b]; t++) {
            const float *row = qkv_rows + (b * n + t) * width;
            const int64_t j = c.lengths[b] + t;
            for (int64_t h = 0; h < c.heads; h++) {
                const int64_t slot = c.slot(b, h, j);
                const float key_scale =
                    store_head(row + key_offset + h * d, d, keys + c.key_index(b, h, j),
                               contract::kCacheKeyTile);
                const float value_scale =
                    store_head(row + value_offset + h * d, d, values + slot * c.value_features, 1);
                if (!c.key_scales.empty()) {
                    c.key_scales[slot] = key_scale;
                    c.value_scales[slot] = value_scale;
                }
            }
        }
    }
}

// Rotates the queries (H heads from offset 0) and keys (Hkv heads from key_offset) of the new
// tokens in `qkv_rows` [B, n, width], token t of row b at position first_position(b) + t, for the
// first count(b) tokens of each row. The positions were checked.
template <typename FirstPosition, typename Count>
void rotate_new_tokens(const RotaryParams &r, float *qkv_rows, int64_t B, int64_t n, int64_t width,
                       int64_t H, int64_t Hkv, int64_t d, int64_t key_offset,
                       FirstPosition first_position, Count count) {
    for (int64_t b = 0; b < B; b++) {
        for (int64_t t = 0; t < count(b); t++) {
            float *row = qkv_rows + (b * n + t) * width;
            rotate_token(
                r, first_position(b) + t,
                {TokenHeads<float>{row, H, d, 1}, TokenHeads<float>{row + key_offset, Hkv, d, 1}});
        }
    }
}

// `rows` rows of `in` features through one of a module's step projections, the fused QKV one
// (weight qkv_weight) or the output one (out_weight), into `result` [rows, width], width the
// panels' padded output features: the qkv_projection kernel, a linear layer over weight panels.
void project_step_rows(const PackedWeights &packed, contract::ArgId weight, const float *input,
                       int64_t rows, int64_t in, float *result, int64_t width) {
    using contract::ArgId;
    const bool qkv = weight == ArgId::qkv_weight;
    HostBuffer input_rows = view_buffer(input, halide_type_of<float>(), {rows, 1, in}, {in, in, 1});
    HostBuffer result_rows =
        view_buffer(result, halide_type_of<float>(), {rows, 1, width}, {width, width, 1});
    ArgValues values{};
    values[size_t(ArgId::query)] = input_rows.raw_buffer();
    values[size_t(ArgId::qkv_rows)] = result_rows.raw_buffer();
    values[size_t(ArgId::qkv_weight)] = const_cast<halide_buffer_t *>(
        (qkv ? packed.step_qkv_panels : packed.step_out_panels)->raw_buffer());
    values[size_t(ArgId::qkv_bias)] = const_cast<halide_buffer_t *>(
        packed.buffers[size_t(qkv ? ArgId::qkv_bias : ArgId::out_bias)]->raw_buffer());
    const contract::KernelVariant projection{contract::KernelOp::qkv_projection,
                                             contract::MaskKind::none,
                                             false,
                                             true,
                                             false,
                                             packed.step_dtype};
    CallContext context;
    call_kernel(decode_kernel(projection, rows), context, values);
}

// Keys per task of a step over `keys` cached keys (a multiple of kCacheKeyTile) whose batch rows
// and key/value heads make `tasks` (key_splits), whole key tiles of at least two each.
int64_t split_keys(int64_t tasks, int64_t keys, int threads) {
    const int64_t splits = key_splits(tasks, keys, threads, 2 * contract::kCacheKeyTile);
    return contract::round_up((keys + splits - 1) / splits, contract::kCacheKeyTile);
}

// The views a paged step passes to write_paged_cache and paged_attention, kept per thread so
// that their shapes are assigned in place: a step allocates nothing once one of as many rows ran.
template <typename T>
struct PagedStepViews {
    StridedView<const T> query, new_keys, new_values;
    StridedView<T> context;
    PagedKvCache<T> cache;
};

template <typename T>
PagedStepViews<T> &paged_step_views() {
    thread_local PagedStepViews<T> views;
    return views;
}

template <typename T, typename U>
void set_view(StridedView<T> &view, U *data, std::initializer_list<int64_t> shape,
              std::initializer_list<int64_t> strides = {}) {
    view.data = data;
    view.shape.assign(shape);
    view.strides.assign(strides);
}

template <typename T, typename U>
void set_view(StridedView<T> &view, const StridedView<U> &from) {
    view.data = from.data;
    view.shape.assign(from.shape.begin(), from.shape.end());
    view.strides.assign(from.strides.begin(), from.strides.end());
}

}  // namespace
}  // namespace detail

KvCache::KvCache(std::unique_ptr<detail::KvCacheStorage> storage) : storage_(std::move(storage)) {}
KvCache::~KvCache() = default;
KvCache::KvCache(KvCache &&) noexcept = default;
KvCache &KvCache::operator=(KvCache &&) noexcept = default;

int64_t KvCache::batch() const { return storage_->batch; }
int64_t KvCache::capacity() const { return storage_->capacity; }
CacheDType KvCache::dtype() const { return storage_->dtype; }
const std::vector<int64_t> &KvCache::lengths() const { return storage_->lengths; }
bool KvCache::rotary() const { return storage_->rotary.has_value(); }
void KvCache::reset() { truncate(0); }

void KvCache::truncate(int64_t length) {
    if (length < 0) {
        throw Error(fmt::format("truncate to {} tokens: must be >= 0", length));
    }
    for (int64_t &l : storage_->lengths) {
        l = std::min(l, length);
    }
}

void MultiHeadAttention::check_decode_cache(CacheDType dtype) const {
    detail::check_dtype("dtype", dtype);
    if (dtype_ != DType::f32 && dtype != contract::cache_dtype(dtype_) &&
        dtype != CacheDType::f32 && dtype != CacheDType::int8) {
        throw Error(fmt::format("a {} cache for a {} module: it holds {}, f32 or int8",
                                contract::cache_dtype_name(dtype), contract::dtype_name(dtype_),
                                contract::dtype_name(dtype_)));
    }
    if (device_ != Device::cpu) {
        throw Error(fmt::format("decode steps run on the cpu; this module runs on the {}",
                                contract::device_name(device_)));
    }
    if (!packed_->stacked()) {
        throw Error(
            fmt::format("decode steps are self-attention: kdim {} and vdim {} must be the "
                        "embed_dim {}",
                        kdim(), vdim(), embed_dim_));
    }
}

KvCache MultiHeadAttention::make_cache(int64_t batch, int64_t capacity, DType dtype,
                                       const std::optional<RotaryOptions> &rotary) const {
    detail::check_dtype("dtype", dtype);
    return make_cache(batch, capacity, contract::cache_dtype(dtype), rotary);
}

KvCache MultiHeadAttention::make_cache(int64_t batch, int64_t capacity,
                                       std::optional<CacheDType> dtype,
                                       const std::optional<RotaryOptions> &rotary) const {
    const CacheDType cache_dtype = dtype.value_or(contract::cache_dtype(dtype_));
    check_decode_cache(cache_dtype);
    if (rotary) {  // before the cache's memory is taken
        detail::check_rotary(*rotary, head_dim());
    }
    if (batch < 1 || capacity < 1) {
        throw Error(
            fmt::format("a cache of batch {} and capacity {}: both must be >= 1", batch, capacity));
    }
    const int64_t padded_capacity = capacity > kMaxBufferBytes
                                        ? capacity
                                        : contract::round_up(capacity, contract::kCacheKeyTile);
    // Its values, the larger buffer (keys [batch, kv_heads, padded capacity / kCacheKeyTile,
    // head_dim, kCacheKeyTile]).
    detail::check_kernel_buffer(
        {batch, num_kv_heads(), padded_capacity,
         contract::round_up(head_dim(), contract::kCacheValueFeatures)},
        detail::element_bytes(cache_dtype), [&] {
            return fmt::format(
                "a cache of batch {} and capacity {} (its values, [batch, kv_heads, capacity "
                "rounded up to {}, head_dim rounded up to {}])",
                batch, capacity, contract::kCacheKeyTile, contract::kCacheValueFeatures);
        });
    return KvCache(std::make_unique<detail::KvCacheStorage>(
        packed_, batch, capacity, num_kv_heads(), head_dim(), cache_dtype, rotary));
}

void MultiHeadAttention::decode(const Tensor &tokens, KvCache &cache, const MutableTensor &output,
                                const std::optional<Mask> &key_padding,
                                const std::vector<int64_t> &new_tokens) const {
    if (dtype_ == DType::f32) {
        decode_f32(tokens, cache, output, key_padding, new_tokens);
    } else {
        decode_converted(tokens, cache, output, key_padding, new_tokens);
    }
}

template <typename In, typename Out, typename Cache, typename... Step>
void MultiHeadAttention::decode_converted(const TensorView<const In> &tokens, Cache &cache,
                                          const TensorView<Out> &output,
                                          const Step &...step) const {
    detail::check_activations<In>(dtype_);
    // The shapes are checked before the tokens are read or converted memory is taken.
    detail::check_view("tokens", tokens, 3, "[batch, new tokens, embed_dim]");
    detail::check_tensor("tokens", tokens,
                         std::array{tokens.shape[0], tokens.shape[1], embed_dim_});
    detail::check_tensor("output", output,
                         std::array{tokens.shape[0], tokens.shape[1], embed_dim_});
    const detail::ConvertedInput<In> in("tokens", tokens, dtype_);
    const detail::ConvertedOutput<Out> out("output", output);
    decode_f32(in.view(), cache, out.view(), step...);
    out.finish();
}

void MultiHeadAttention::decode(const BF16Tensor &tokens, KvCache &cache,
                                const MutableBF16Tensor &output,
                                const std::optional<Mask> &key_padding,
                                const std::vector<int64_t> &new_tokens) const {
    decode_converted(tokens, cache, output, key_padding, new_tokens);
}

void MultiHeadAttention::decode(const F16Tensor &tokens, KvCache &cache,
                                const MutableF16Tensor &output,
                                const std::optional<Mask> &key_padding,
                                const std::vector<int64_t> &new_tokens) const {
    decode_converted(tokens, cache, output, key_padding, new_tokens);
}

void MultiHeadAttention::decode_f32(const Tensor &tokens, KvCache &cache,
                                    const MutableTensor &output,
                                    const std::optional<Mask> &key_padding,
                                    const std::vector<int64_t> &new_tokens) const {
    using contract::ArgId;
    detail::KvCacheStorage &c = *cache.storage_;
    if (c.module != packed_) {
        throw Error("the cache was made by another module");
    }
    detail::check_view("tokens", tokens, 3, "[batch, new tokens, embed_dim]");
    const int64_t B = tokens.shape[0], n = tokens.shape[1], E = embed_dim_;
    // The cache holds the key/value heads (fewer than the query heads with grouped queries).
    const int64_t H = num_kv_heads(), d = head_dim(), P = packed_->padded;
    const int64_t Pkv = packed_->padded_kv;
    detail::check_tensor("tokens", tokens, std::array{c.batch, n, E});
    detail::check_tensor("output", output, std::array{B, n, E});
    detail::check_on_host("tokens", tokens, detail::kDecodeOnTheCpu);
    detail::check_on_host("output", output, detail::kDecodeOnTheCpu);
    if (!new_tokens.empty() && int64_t(new_tokens.size()) != B) {
        throw Error(
            fmt::format("new_tokens has {} counts for a batch of {}", new_tokens.size(), B));
    }
    for (int64_t b = 0; b < B; b++) {
        const int64_t count = new_tokens.empty() ? n : new_tokens[b];
        if (count < 0 || count > n) {
            throw Error(fmt::format("new_tokens[{}] is {}: must be 0 to {}", b, count, n));
        }
        if (c.lengths[b] + count > c.capacity) {
            throw Error(
                fmt::format("batch row {} holds {} tokens of its capacity {}: {} more do "
                            "not fit",
                            b, c.lengths[b], c.capacity, count));
        }
        // The last new position bounds the others.
        if (c.rotary && count > 0 &&
            !detail::rotary_position_valid(c.rotary->params, c.lengths[b] + count - 1)) {
            throw Error(
                fmt::format("batch row {} would reach position {}: the cache's rotary "
                            "tables have positions 0 to {}",
                            b, c.lengths[b] + count - 1, c.rotary->params.table_rows - 1));
        }
        c.cached_lengths[b] = int32_t(c.lengths[b]);
        c.new_counts[b] = int32_t(count);
    }
    if (key_padding) {
        detail::check_tensor("key_padding", key_padding->values, std::array{B, c.capacity});
        detail::check_on_host("key_padding", key_padding->values, detail::kDecodeOnTheCpu);
        detail::check_convention("key_padding", key_padding->convention);
        c.cache_mask.resize(B * c.padded_capacity);
        for (int64_t b = 0; b < B; b++) {
            std::copy_n(key_padding->values.data + b * c.capacity, c.capacity,
                        c.cache_mask.begin() + b * c.padded_capacity);
        }
    }
    const int64_t width = P + 2 * Pkv;  // q, k and v of one token
    detail::check_kernel_buffer({B, n, width}, sizeof(float), [&] {
        return fmt::format("the projection of tokens {}, [B, n, padded q, k and v features],",
                           detail::shape_string(tokens.shape));
    });
    if (int64_t(c.qkv_rows.size()) < B * n * width) {
        c.qkv_rows.resize(B * n * width);
    }

    // The new tokens' projections, q, k and v of each token side by side.
    detail::project_step_rows(*packed_, ArgId::qkv_weight, tokens.data, B * n, E, c.qkv_rows.data(),
                              width);

    // Their queries and keys rotated at their positions; their keys and values appended to each
    // row.
    const int64_t key_offset = contract::qkv_block_offset(1, P, Pkv);
    const int64_t value_offset = contract::qkv_block_offset(2, P, Pkv);
    if (c.rotary) {
        detail::rotate_new_tokens(
            c.rotary->params, c.qkv_rows.data(), B, n, width, num_heads_, H, d, key_offset,
            [&](int64_t b) { return c.lengths[b]; }, [&](int64_t b) { return c.new_counts[b]; });
    }
    switch (c.dtype) {
    case CacheDType::f32:
        detail::append_keys_and_values<float>(c, c.qkv_rows.data(), n, width, key_offset,
                                              value_offset);
        break;
    case CacheDType::bf16:
        detail::append_keys_and_values<bfloat16>(c, c.qkv_rows.data(), n, width, key_offset,
                                                 value_offset);
        break;
    case CacheDType::f16:
        detail::append_keys_and_values<float16>(c, c.qkv_rows.data(), n, width, key_offset,
                                                value_offset);
        break;
    case CacheDType::int8:
        detail::append_keys_and_values<int8_t>(c, c.qkv_rows.data(), n, width, key_offset,
                                               value_offset);
        break;
    }
    int64_t longest = 0;
    for (int64_t b = 0; b < B; b++) {
        longest = std::max(longest, c.lengths[b] + c.new_counts[b]);
    }

    // Attention over the cache, read up to the longest row in whole key tiles.
    const int64_t keys = std::max<int64_t>(contract::kCacheKeyTile,
                                           contract::round_up(longest, contract::kCacheKeyTile));
    detail::HostBuffer key_cache = c.key_view(keys), value_cache = c.value_view(keys);
    detail::HostBuffer cached =
        detail::view_buffer(c.cached_lengths.data(), halide_type_of<int32_t>(), {B}, {1});
    detail::HostBuffer counts =
        detail::view_buffer(c.new_counts.data(), halide_type_of<int32_t>(), {B}, {1});
    detail::HostBuffer out = detail::dense_buffer(output);
    detail::HostBuffer qkv = detail::view_buffer(c.qkv_rows.data(), halide_type_of<float>(),
                                                 {B, n, width}, {n * width, width, 1});
    detail::ArgValues values{};
    values[size_t(ArgId::new_qkv)] = qkv.raw_buffer();
    // The output projection's weights in the module's dtype (packed_->step_dtype).
    values[size_t(ArgId::out_weight)] =
        const_cast<halide_buffer_t *>(packed_->step_out_panels->raw_buffer());
    values[size_t(ArgId::out_bias)] =
        const_cast<halide_buffer_t *>(packed_->buffers[size_t(ArgId::out_bias)]->raw_buffer());
    detail::HostBuffer mask;
    int32_t head_dim32 = int32_t(d);
    int32_t blocks_nonzero = key_padding && key_padding->convention == MaskConvention::block;
    values[size_t(ArgId::head_dim)] = &head_dim32;
    int32_t kv_heads = int32_t(H);
    values[size_t(ArgId::kv_heads)] = &kv_heads;
    values[size_t(ArgId::key_cache)] = key_cache.raw_buffer();
    values[size_t(ArgId::value_cache)] = value_cache.raw_buffer();
    detail::HostBuffer key_scales, value_scales;
    if (c.dtype == CacheDType::int8) {
        key_scales = c.scales_view(c.key_scales, keys);
        value_scales = c.scales_view(c.value_scales, keys);
        values[size_t(ArgId::key_scales)] = key_scales.raw_buffer();
        values[size_t(ArgId::value_scales)] = value_scales.raw_buffer();
    }
    values[size_t(ArgId::cached_lengths)] = cached.raw_buffer();
    values[size_t(ArgId::new_counts)] = counts.raw_buffer();
    int32_t split_keys = int32_t(detail::split_keys(B * H, keys, detail::pool_threads()));
    values[size_t(ArgId::split_keys)] = &split_keys;
    values[size_t(ArgId::output)] = out.raw_buffer();
    if (key_padding) {
        mask = detail::view_buffer(c.cache_mask.data(), halide_type_of<uint8_t>(), {B, keys},
                                   {c.padded_capacity, 1});
        values[size_t(ArgId::cache_mask)] = mask.raw_buffer();
        values[size_t(ArgId::mask_blocks_nonzero)] = &blocks_nonzero;
    }
    const contract::KernelVariant attention{
        contract::KernelOp::decode,
        key_padding ? contract::MaskKind::bytes : contract::MaskKind::none,
        false,
        true,
        false,
        packed_->step_dtype,
        false,
        false,
        c.dtype};
    detail::CallContext context;
    detail::call_kernel(detail::decode_kernel(attention, B * n), context, values);
    for (int64_t b = 0; b < B; b++) {
        c.lengths[b] += c.new_counts[b];
    }
}

template <typename T>
void MultiHeadAttention::decode(const Tensor &tokens, const PagedDecodeCache<T> &cache,
                                const MutableTensor &output) const {
    if (dtype_ == DType::f32) {
        decode_f32(tokens, cache, output);
    } else {
        decode_converted(tokens, cache, output);
    }
}

template <typename T>
void MultiHeadAttention::decode(const BF16Tensor &tokens, const PagedDecodeCache<T> &cache,
                                const MutableBF16Tensor &output) const {
    decode_converted(tokens, cache, output);
}

template <typename T>
void MultiHeadAttention::decode(const F16Tensor &tokens, const PagedDecodeCache<T> &cache,
                                const MutableF16Tensor &output) const {
    decode_converted(tokens, cache, output);
}

// The QKV projection of the new tokens; their keys and values rounded to T and written into
// their slots; paged_attention of their queries (rounded to T); the output projection of its
// context. Scratch memory comes from the pool.
template <typename T>
void MultiHeadAttention::decode_f32(const Tensor &tokens, const PagedDecodeCache<T> &cache,
                                    const MutableTensor &output) const {
    using contract::ArgId;
    check_decode_cache(contract::cache_dtype(detail::dtype_of<T>()));
    detail::check_view("tokens", tokens, 3, "[batch, 1, embed_dim]");
    const int64_t B = tokens.shape[0], E = embed_dim_, H = num_heads_, d = head_dim();
    const int64_t Hkv = num_kv_heads(), P = packed_->padded, Pkv = packed_->padded_kv;
    detail::check_tensor("tokens", tokens, std::array<int64_t, 3>{B, 1, E});
    detail::check_tensor("output", output, std::array<int64_t, 3>{B, 1, E});
    detail::check_on_host("tokens", tokens, detail::kDecodeOnTheCpu);
    detail::check_on_host("output", output, detail::kDecodeOnTheCpu);
    detail::check_rank("slot_mapping", cache.slot_mapping, 1, "[batch]");
    if (cache.slot_mapping.shape[0] != B) {
        throw Error(fmt::format("slot_mapping has {} slots for a batch of {}",
                                cache.slot_mapping.shape[0], B));
    }
    const int64_t width = P + 2 * Pkv;  // q, k and v of one token
    detail::ScratchFloats rows(B * width), context_rows(B * E), projected(B * P);
    detail::Scratch<T> queries(B * H * d), keys(B * Hkv * d), values(B * Hkv * d),
        contexts(B * H * d);
    detail::PagedStepViews<T> &views = detail::paged_step_views<T>();
    detail::set_view(views.query, queries.data(), {B, 1, H, d});
    detail::set_view(views.context, contexts.data(), {B, 1, H, d});
    detail::set_view(views.new_keys, keys.data(), {B, Hkv, d});
    detail::set_view(views.new_values, values.data(), {B, Hkv, d});
    detail::set_view(views.cache.key_cache, cache.key_cache);
    detail::set_view(views.cache.value_cache, cache.value_cache);
    detail::set_view(views.cache.block_table, cache.block_table);
    detail::set_view(views.cache.sequence_lengths, cache.sequence_lengths);
    // Everything paged_attention checks, and the module's heads, before the cache is written.
    const detail::PagedParams p =
        detail::check_paged_attention(views.query, views.cache, views.context, {});
    if (p.attention.kv_heads != Hkv || p.attention.value_dim != d) {
        throw Error(fmt::format(
            "key_cache {} and value_cache {}: this module's caches hold {} key/value heads of "
            "{} features",
            detail::shape_string(cache.key_cache.shape),
            detail::shape_string(cache.value_cache.shape), Hkv, d));
    }

    const int64_t slot_stride = detail::strides_of(cache.slot_mapping)[0];
    const int64_t length_stride = detail::strides_of(cache.sequence_lengths)[0];
    const auto padding_row = [&](int64_t b) {
        return cache.slot_mapping.data[b * slot_stride] < 0;
    };
    const auto new_position = [&](int64_t b) {
        return int64_t(cache.sequence_lengths.data[b * length_stride]) - 1;
    };
    std::optional<detail::RotaryParams> rotary;
    if (cache.rotary) {
        rotary = detail::check_rotary(*cache.rotary, d);
        for (int64_t b = 0; b < B; b++) {
            if (!padding_row(b) && !detail::rotary_position_valid(*rotary, new_position(b))) {
                throw Error(
                    fmt::format("sequence_lengths[{}] is {}: the new token's position {} "
                                "is not in the rotary tables' 0 to {}",
                                b, new_position(b) + 1, new_position(b), rotary->table_rows - 1));
            }
        }
    }

    detail::project_step_rows(*packed_, ArgId::qkv_weight, tokens.data, B, E, rows.data(), width);
    const int64_t key_offset = contract::qkv_block_offset(1, P, Pkv);
    const int64_t value_offset = contract::qkv_block_offset(2, P, Pkv);
    if (rotary) {
        detail::rotate_new_tokens(*rotary, rows.data(), B, 1, width, H, Hkv, d, key_offset,
                                  new_position, [&](int64_t b) { return padding_row(b) ? 0 : 1; });
    }
    for (int64_t b = 0; b < B; b++) {
        const float *row = rows.data() + b * width;
        detail::convert(row, queries.data() + b * H * d, H * d);
        detail::convert(row + key_offset, keys.data() + b * Hkv * d, Hkv * d);
        detail::convert(row + value_offset, values.data() + b * Hkv * d, Hkv * d);
    }
    write_paged_cache(views.new_keys, views.new_values, cache.key_cache, cache.value_cache,
                      cache.slot_mapping);
    detail::run_checked_paged_attention(p, views.query, views.cache, views.context, {});
    detail::convert(contexts.data(), context_rows.data(), B * E);
    detail::project_step_rows(*packed_, ArgId::out_weight, context_rows.data(), B, E,
                              projected.data(), P);
    for (int64_t b = 0; b < B; b++) {
        float *target = output.data + b * E;
        if (padding_row(b)) {
            std::fill_n(target, E, 0.0f);  // a padding row
        } else {
            std::copy_n(projected.data() + b * P, E, target);
        }
    }
}

#define MHA_PAGED_DECODE(T)                                                                   \
    template void MultiHeadAttention::decode(const Tensor &, const PagedDecodeCache<T> &,     \
                                             const MutableTensor &) const;                    \
    template void MultiHeadAttention::decode(const BF16Tensor &, const PagedDecodeCache<T> &, \
                                             const MutableBF16Tensor &) const;                \
    template void MultiHeadAttention::decode(const F16Tensor &, const PagedDecodeCache<T> &,  \
                                             const MutableF16Tensor &) const;
MHA_PAGED_DECODE(float)
MHA_PAGED_DECODE(bfloat16)
MHA_PAGED_DECODE(float16)
#undef MHA_PAGED_DECODE

}  // namespace mha
