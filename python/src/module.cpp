// mha._mha: the C++ library's modules and KV caches over arrays (NumPy, PyTorch or any DLPack
// producer). Contiguous CPU float32 arrays are used in place; the Python package (mha/) checks
// dtypes and devices, makes other arrays contiguous and holds the user-facing semantics.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>
#include <tuple>

#include "mha/mha.h"
#include "mha_contract.h"

namespace nb = nanobind;

namespace {

using FloatArray = nb::ndarray<const float, nb::c_contig, nb::device::cpu>;
using MutableFloatArray = nb::ndarray<float, nb::c_contig, nb::device::cpu>;
// A contiguous array of any element type; a mask: bool (True = blocked) or float32 (added to
// the scores).
using ContiguousArray = nb::ndarray<nb::c_contig, nb::device::cpu>;
using MaskArray = ContiguousArray;

template <typename Array>
std::vector<int64_t> shape_of(const Array &array) {
    std::vector<int64_t> shape(array.ndim());
    for (size_t i = 0; i < array.ndim(); i++)
        shape[i] = int64_t(array.shape(i));
    return shape;
}

mha::Tensor tensor(const FloatArray &array) { return {array.data(), shape_of(array)}; }
mha::MutableTensor mutable_tensor(const MutableFloatArray &array) {
    return {array.data(), shape_of(array)};
}

std::optional<mha::Tensor> optional_tensor(const std::optional<FloatArray> &array) {
    if (!array)
        return std::nullopt;
    return tensor(*array);
}

std::optional<mha::MaskTensor> mask_tensor(const std::optional<MaskArray> &array,
                                           const char *name) {
    if (!array)
        return std::nullopt;
    if (array->dtype() == nb::dtype<bool>())
        return mha::BoolTensor{static_cast<const uint8_t *>(array->data()), shape_of(*array)};
    if (array->dtype() == nb::dtype<float>())
        return mha::Tensor{static_cast<const float *>(array->data()), shape_of(*array)};
    throw nb::type_error((std::string(name) + " must be bool or float32").c_str());
}

mha::Linear linear(const FloatArray &weight, const std::optional<FloatArray> &bias) {
    return {tensor(weight), optional_tensor(bias)};
}

// A 16-bit array's bits (bfloat16 or float16, as `dtype` says), contiguous.
using BitsArray = nb::ndarray<const int16_t, nb::c_contig, nb::device::cpu>;
using MutableBitsArray = nb::ndarray<int16_t, nb::c_contig, nb::device::cpu>;

mha::DType dtype_named(const std::string &name) {
    if (const std::optional<mha::DType> dtype = mha::contract::dtype_named(name)) {
        return *dtype;
    }
    throw nb::type_error(("dtype " + name + " is none of f32, bf16, f16").c_str());
}

mha::CacheDType cache_dtype_named(const std::string &name) {
    if (const std::optional<mha::CacheDType> dtype = mha::contract::cache_dtype_named(name)) {
        return *dtype;
    }
    throw nb::type_error(("cache dtype " + name + " is none of f32, bf16, f16, int8").c_str());
}

// Calls f(element) with the 16-bit element type `dtype` names.
template <typename F>
void with_16_bits(const std::string &dtype, F f) {
    if (dtype_named(dtype) == mha::DType::bf16)
        f(mha::bfloat16{});
    else if (dtype_named(dtype) == mha::DType::f16)
        f(mha::float16{});
    else
        throw nb::type_error("16-bit arrays take dtype bf16 or f16");
}

template <typename T, typename Array>
mha::TensorView<T> bits_view(const Array &array) {
    return {reinterpret_cast<T *>(array.data()), shape_of(array)};
}

mha::ForwardOptions forward_options(const std::optional<MaskArray> &key_padding_mask,
                                    const std::optional<MaskArray> &attn_mask, bool is_causal,
                                    const std::optional<MutableFloatArray> &weights,
                                    bool average_weights) {
    mha::ForwardOptions options;
    options.key_padding_mask = mask_tensor(key_padding_mask, "key_padding_mask");
    options.attn_mask = mask_tensor(attn_mask, "attn_mask");
    options.causal = is_causal ? mha::Causal::top_left : mha::Causal::none;
    if (weights)
        options.weights = mutable_tensor(*weights);
    options.average_weights = average_weights;
    return options;
}

std::optional<mha::Mask> decode_padding(
    const std::optional<nb::ndarray<const bool, nb::c_contig, nb::device::cpu>> &mask) {
    if (!mask)
        return std::nullopt;
    return mha::Mask{{reinterpret_cast<const uint8_t *>(mask->data()), shape_of(*mask)},
                     mha::MaskConvention::block};
}

// An array of any strides (NumPy gives them in bytes, nanobind in elements).
using StridedArray = nb::ndarray<nb::device::cpu>;

template <typename T, typename Array>
mha::StridedView<T> strided(const Array &array) {
    std::vector<int64_t> strides(array.ndim());
    for (size_t i = 0; i < array.ndim(); i++)
        strides[i] = int64_t(array.stride(i));
    return {static_cast<T *>(array.data()), shape_of(array), strides};
}

// A rotation as mha.Rotary gives it: (interleaved, rotary_dim, theta, cos, sin), tables float32.
using RotaryTuple =
    std::tuple<bool, int64_t, float, std::optional<StridedArray>, std::optional<StridedArray>>;
mha::RotaryOptions rotary_options(const RotaryTuple &rotary) {
    const auto &[interleaved, rotary_dim, theta, cos, sin] = rotary;
    mha::RotaryOptions options;
    options.style = interleaved ? mha::RotaryStyle::interleaved : mha::RotaryStyle::rotate_half;
    options.rotary_dim = rotary_dim;
    options.theta = theta;
    for (const auto &[name, table, view] :
         {std::tuple{"cos", &cos, &options.cos}, {"sin", &sin, &options.sin}}) {
        if (*table) {
            if ((*table)->dtype() != nb::dtype<float>())
                throw nb::type_error((std::string(name) + " must be float32").c_str());
            *view = strided<const float>(**table);
        }
    }
    return options;
}

std::optional<mha::RotaryOptions> optional_rotary(const std::optional<RotaryTuple> &rotary) {
    return rotary ? std::optional(rotary_options(*rotary)) : std::nullopt;
}

// What attention(), varlen_attention() and paged_attention() take alike (mask: bool or float32;
// lse: float32; rotary: a RotaryTuple).
mha::AttentionOptions attention_options(const std::optional<StridedArray> &mask,
                                        std::optional<float> scale, int causal, int64_t window_left,
                                        int64_t window_right, float softcap,
                                        const std::optional<StridedArray> &alibi_slopes,
                                        const std::optional<StridedArray> &lse,
                                        const std::optional<RotaryTuple> &rotary) {
    mha::AttentionOptions options;
    options.scale = scale;
    options.rotary = optional_rotary(rotary);
    if (mask) {
        if (mask->dtype() == nb::dtype<bool>())
            options.mask = mha::AttentionMask{strided<const uint8_t>(*mask)};
        else if (mask->dtype() == nb::dtype<float>())
            options.mask = mha::AttentionMask{strided<const float>(*mask)};
        else
            throw nb::type_error("mask must be bool or float32");
    }
    options.causal = static_cast<mha::Causal>(causal);
    options.window_left = window_left;
    options.window_right = window_right;
    options.softcap = softcap;
    if (alibi_slopes) {
        if (alibi_slopes->dtype() != nb::dtype<float>())
            throw nb::type_error("alibi_slopes must be float32");
        options.alibi_slopes = strided<const float>(*alibi_slopes);
    }
    if (lse) {
        if (lse->dtype() != nb::dtype<float>())
            throw nb::type_error("lse must be float32");
        options.lse = strided<float>(*lse);
    }
    return options;
}

// Arrays of `dtype` ("f32", or "bf16"/"f16" given as their 16-bit bits): f(element) when every
// one's elements have its size.
template <typename F>
void with_elements(const std::string &dtype, std::initializer_list<const StridedArray *> arrays,
                   F f) {
    const auto run = [&](auto element) {
        using T = decltype(element);
        for (const StridedArray *a : arrays) {
            if (a->itemsize() != sizeof(T))
                throw nb::type_error(("arrays of " + dtype + " must have elements of " +
                                      std::to_string(sizeof(T)) + " bytes")
                                         .c_str());
        }
        f(element);
    };
    if (dtype_named(dtype) == mha::DType::f32)
        run(float{});
    else
        with_16_bits(dtype, run);
}

template <typename T>
void check_int_array(const char *name, const StridedArray &a) {
    if (a.dtype() != nb::dtype<T>())
        throw nb::type_error(
            (std::string(name) + " must be int" + std::to_string(8 * sizeof(T))).c_str());
}

}  // namespace

NB_MODULE(_mha, m) {
    nb::exception<mha::Error>(m, "Error", PyExc_ValueError);
    m.def(
        "dispatched_isa",
        [](const std::string &dtype) { return mha::dispatched_isa(dtype_named(dtype)); },
        nb::arg("dtype") = "f32",
        "The CPU instruction set whose kernels a module of dtype ('f32', 'bf16', 'f16') runs: "
        "avx512, avx2 or sse41 (neon on arm64); for bf16 amx or avx512bf16 where the CPU has "
        "them.");
    m.def(
        "tuned_schedules",
        [] {
            std::vector<std::map<std::string, std::string>> out;
            for (const mha::TunedSchedule &s : mha::tuned_schedules()) {
                out.push_back({{"isa", s.isa},
                               {"tuned_cpu", s.tuned_cpu},
                               {"tuned_on", s.tuned_on},
                               {"why", s.why}});
            }
            return out;
        },
        "Per CPU instruction set the library links, whose tuned schedule parameters its kernels "
        "run on this CPU: a list of dicts with 'isa', 'tuned_cpu' (a CPU key such as "
        "'intel-f6-m207', or 'defaults'), 'tuned_on' (that CPU) and 'why'.");
    m.def("set_num_threads", &mha::set_num_threads, nb::arg("threads"),
          "The CPU kernels' threads, the caller's included (0: HL_NUM_THREADS, else one per "
          "core); idle ones poll for work for a millisecond before they sleep.");

    m.def(
        "attention",
        [](const StridedArray &query, const StridedArray &key, const StridedArray &value,
           const StridedArray &output, const std::string &dtype,
           const std::optional<StridedArray> &mask, std::optional<float> scale, int causal,
           int64_t window_left, int64_t window_right, float softcap,
           const std::optional<StridedArray> &alibi_slopes, const std::optional<StridedArray> &lse,
           const std::optional<RotaryTuple> &rotary) {
            const mha::AttentionOptions options = attention_options(
                mask, scale, causal, window_left, window_right, softcap, alibi_slopes, lse, rotary);
            with_elements(dtype, {&query, &key, &value, &output}, [&](auto element) {
                using T = decltype(element);
                nb::gil_scoped_release released;
                mha::attention(strided<const T>(query), strided<const T>(key),
                               strided<const T>(value), strided<T>(output), options);
            });
        },
        nb::arg("query"), nb::arg("key"), nb::arg("value"), nb::arg("output"), nb::arg("dtype"),
        nb::arg("mask").none() = nb::none(), nb::arg("scale").none() = nb::none(),
        nb::arg("causal") = 0, nb::arg("window_left") = -1, nb::arg("window_right") = -1,
        nb::arg("softcap") = 0.0f, nb::arg("alibi_slopes").none() = nb::none(),
        nb::arg("lse").none() = nb::none(), nb::arg("rotary").none() = nb::none(),
        "mha::attention: query [B, H, Sq, d], key [B, Hkv, Sk, d], value [B, Hkv, Sk, dv] -> "
        "output [B, H, Sq, dv], any strides; causal 0 none, 1 top-left, 2 bottom-right; "
        "`rotary` (interleaved, rotary_dim, theta, cos, sin) rotates query row i at Sk - Sq + i "
        "and key j at j.");
    m.def(
        "varlen_attention",
        [](const StridedArray &query, const StridedArray &key, const StridedArray &value,
           const StridedArray &cu_seqlens_q, const StridedArray &cu_seqlens_k,
           const StridedArray &output, const std::string &dtype, std::optional<float> scale,
           int causal, int64_t window_left, int64_t window_right, float softcap,
           const std::optional<StridedArray> &alibi_slopes, const std::optional<StridedArray> &lse,
           const std::optional<RotaryTuple> &rotary) {
            check_int_array<int32_t>("cu_seqlens_q", cu_seqlens_q);
            check_int_array<int32_t>("cu_seqlens_k", cu_seqlens_k);
            const mha::AttentionOptions options =
                attention_options(std::nullopt, scale, causal, window_left, window_right, softcap,
                                  alibi_slopes, lse, rotary);
            with_elements(dtype, {&query, &key, &value, &output}, [&](auto element) {
                using T = decltype(element);
                nb::gil_scoped_release released;
                mha::varlen_attention(strided<const T>(query), strided<const T>(key),
                                      strided<const T>(value), strided<const int32_t>(cu_seqlens_q),
                                      strided<const int32_t>(cu_seqlens_k), strided<T>(output),
                                      options);
            });
        },
        nb::arg("query"), nb::arg("key"), nb::arg("value"), nb::arg("cu_seqlens_q"),
        nb::arg("cu_seqlens_k"), nb::arg("output"), nb::arg("dtype"),
        nb::arg("scale").none() = nb::none(), nb::arg("causal") = 0, nb::arg("window_left") = -1,
        nb::arg("window_right") = -1, nb::arg("softcap") = 0.0f,
        nb::arg("alibi_slopes").none() = nb::none(), nb::arg("lse").none() = nb::none(),
        nb::arg("rotary").none() = nb::none(),
        "mha::varlen_attention: query [total_q, H, d], key [total_k, Hkv, d], value [total_k, "
        "Hkv, dv], cu_seqlens_q and cu_seqlens_k [B + 1] int32 -> output [total_q, H, dv]; "
        "`rotary` rotates each sequence's rows as attention() does.");
    m.def(
        "paged_attention",
        [](const StridedArray &query, const StridedArray &key_cache,
           const StridedArray &value_cache, const StridedArray &block_table,
           const StridedArray &sequence_lengths, const StridedArray &output,
           const std::string &dtype, std::optional<float> scale, int64_t window_left, float softcap,
           const std::optional<StridedArray> &alibi_slopes, const std::optional<StridedArray> &lse,
           int num_splits, const std::optional<RotaryTuple> &rotary) {
            check_int_array<int32_t>("block_table", block_table);
            check_int_array<int32_t>("sequence_lengths", sequence_lengths);
            mha::AttentionOptions options = attention_options(
                std::nullopt, scale, 0, window_left, -1, softcap, alibi_slopes, lse, rotary);
            options.num_splits = num_splits;
            with_elements(dtype, {&query, &key_cache, &value_cache, &output}, [&](auto element) {
                using T = decltype(element);
                const mha::PagedKvCache<T> cache{
                    strided<const T>(key_cache), strided<const T>(value_cache),
                    strided<const int32_t>(block_table), strided<const int32_t>(sequence_lengths)};
                nb::gil_scoped_release released;
                mha::paged_attention(strided<const T>(query), cache, strided<T>(output), options);
            });
        },
        nb::arg("query"), nb::arg("key_cache"), nb::arg("value_cache"), nb::arg("block_table"),
        nb::arg("sequence_lengths"), nb::arg("output"), nb::arg("dtype"),
        nb::arg("scale").none() = nb::none(), nb::arg("window_left") = -1,
        nb::arg("softcap") = 0.0f, nb::arg("alibi_slopes").none() = nb::none(),
        nb::arg("lse").none() = nb::none(), nb::arg("num_splits") = 0,
        nb::arg("rotary").none() = nb::none(),
        "mha::paged_attention: query [B, 1, H, d], key_cache [blocks, block_size, Hkv, d], "
        "value_cache [blocks, block_size, Hkv, dv], block_table [B, max_blocks] int32, "
        "sequence_lengths [B] int32 -> output [B, 1, H, dv]; `rotary` rotates the query at "
        "sequence_lengths[b] - 1.");
    m.def(
        "rotary_embedding",
        [](const StridedArray &query, const StridedArray &key, const StridedArray &positions,
           const std::string &dtype, bool interleaved, int64_t rotary_dim, float theta,
           const std::optional<StridedArray> &cos, const std::optional<StridedArray> &sin) {
            check_int_array<int64_t>("positions", positions);
            const mha::RotaryOptions options =
                rotary_options({interleaved, rotary_dim, theta, cos, sin});
            with_elements(dtype, {&query, &key}, [&](auto element) {
                using T = decltype(element);
                nb::gil_scoped_release released;
                mha::rotary_embedding(strided<T>(query), strided<T>(key),
                                      strided<const int64_t>(positions), options);
            });
        },
        nb::arg("query"), nb::arg("key"), nb::arg("positions"), nb::arg("dtype"),
        nb::arg("interleaved") = false, nb::arg("rotary_dim") = 0, nb::arg("theta") = 10000.0f,
        nb::arg("cos").none() = nb::none(), nb::arg("sin").none() = nb::none(),
        "mha::rotary_embedding: query [T, H, d] and key [T, Hkv, d] rotated in place at "
        "positions [T] int64.");
    m.def(
        "write_paged_cache",
        [](const StridedArray &key, const StridedArray &value, const StridedArray &key_cache,
           const StridedArray &value_cache, const StridedArray &slot_mapping,
           const std::string &dtype) {
            check_int_array<int64_t>("slot_mapping", slot_mapping);
            with_elements(dtype, {&key, &value, &key_cache, &value_cache}, [&](auto element) {
                using T = decltype(element);
                nb::gil_scoped_release released;
                mha::write_paged_cache(strided<const T>(key), strided<const T>(value),
                                       strided<T>(key_cache), strided<T>(value_cache),
                                       strided<const int64_t>(slot_mapping));
            });
        },
        nb::arg("key"), nb::arg("value"), nb::arg("key_cache"), nb::arg("value_cache"),
        nb::arg("slot_mapping"), nb::arg("dtype"),
        "mha::write_paged_cache: key [T, Hkv, d] and value [T, Hkv, dv] into slots "
        "slot_mapping [T] int64 (negative: skipped) of the paged caches.");

    using Int32Array = nb::ndarray<nb::numpy, const int32_t, nb::c_contig>;
    const auto int32_view = [](const mha::StridedView<const int32_t> &view, nb::handle owner) {
        return Int32Array(view.data, view.shape.size(),
                          reinterpret_cast<const size_t *>(view.shape.data()), owner);
    };
    nb::class_<mha::PagedBlockTables>(
        m, "PagedBlockTables",
        "The blocks of a paged KV cache given to sequences, and the tables paged_attention "
        "reads: sequences grow and shrink in whole blocks from a fixed pool, no key moves.")
        .def(nb::init<int64_t, int64_t, int64_t, int64_t>(), nb::arg("num_blocks"),
             nb::arg("block_size"), nb::arg("max_sequences"), nb::arg("max_blocks_per_sequence"))
        .def("resize", &mha::PagedBlockTables::resize, nb::arg("sequence"), nb::arg("length"),
             "Sets a sequence's length in keys (0: removes it), taking or returning blocks.")
        .def("slot", &mha::PagedBlockTables::slot, nb::arg("sequence"), nb::arg("position"),
             "The slot (block * block_size + offset) of a sequence's key, for "
             "write_paged_cache's slot_mapping.")
        .def("length", &mha::PagedBlockTables::length, nb::arg("sequence"))
        .def_prop_ro("free_blocks", &mha::PagedBlockTables::free_blocks)
        .def_prop_ro("num_blocks", &mha::PagedBlockTables::num_blocks)
        .def_prop_ro("block_size", &mha::PagedBlockTables::block_size)
        .def_prop_ro(
            "block_table",
            [int32_view](nb::handle self) {
                return int32_view(nb::cast<const mha::PagedBlockTables &>(self).block_table(),
                                  self);
            },
            "[max_sequences, max_blocks_per_sequence] int32, a view that follows resize().")
        .def_prop_ro(
            "sequence_lengths",
            [int32_view](nb::handle self) {
                return int32_view(nb::cast<const mha::PagedBlockTables &>(self).sequence_lengths(),
                                  self);
            },
            "[max_sequences] int32, a view that follows resize().");

    nb::class_<mha::KvCache>(m, "KvCache",
                             "Projected keys and values of the tokens a decoder has seen.")
        .def_prop_ro("batch", &mha::KvCache::batch)
        .def_prop_ro("capacity", &mha::KvCache::capacity)
        .def_prop_ro(
            "dtype",
            [](const mha::KvCache &self) {
                return std::string(mha::contract::cache_dtype_name(self.dtype()));
            },
            "What the keys and values are stored in: f32, bf16, f16 or int8.")
        .def_prop_ro("lengths", &mha::KvCache::lengths, "Tokens cached in each batch row.")
        .def_prop_ro("rotary", &mha::KvCache::rotary,
                     "Whether its steps rotate their new queries and keys (make_cache's rotary).")
        .def("reset", &mha::KvCache::reset, "Forget every row's tokens.")
        .def("truncate", &mha::KvCache::truncate, nb::arg("length"),
             "Keep the first `length` tokens of each row.");

    nb::class_<mha::MultiHeadAttention>(m, "Module",
                                        "Prepacked weights and the kernels that use them.")
        .def(
            "__init__",
            [](mha::MultiHeadAttention *self, int64_t embed_dim, int64_t num_heads,
               const FloatArray &q_weight, const std::optional<FloatArray> &q_bias,
               const FloatArray &k_weight, const std::optional<FloatArray> &k_bias,
               const FloatArray &v_weight, const std::optional<FloatArray> &v_bias,
               const FloatArray &out_weight, const std::optional<FloatArray> &out_bias,
               const std::string &dtype) {
                new (self) mha::MultiHeadAttention(
                    embed_dim, num_heads, linear(q_weight, q_bias), linear(k_weight, k_bias),
                    linear(v_weight, v_bias), linear(out_weight, out_bias), mha::Device::cpu,
                    dtype_named(dtype));
            },
            nb::arg("embed_dim"), nb::arg("num_heads"), nb::arg("q_weight"),
            nb::arg("q_bias").none(), nb::arg("k_weight"), nb::arg("k_bias").none(),
            nb::arg("v_weight"), nb::arg("v_bias").none(), nb::arg("out_weight"),
            nb::arg("out_bias").none(), nb::arg("dtype") = "f32",
            "A module of `dtype` (f32, bf16, f16), its weights given in f32 (rounded to it).")
        .def_prop_ro("embed_dim", &mha::MultiHeadAttention::embed_dim)
        .def_prop_ro("num_heads", &mha::MultiHeadAttention::num_heads)
        .def_prop_ro("kdim", &mha::MultiHeadAttention::kdim)
        .def_prop_ro("vdim", &mha::MultiHeadAttention::vdim)
        .def(
            "forward",
            [](const mha::MultiHeadAttention &self, const FloatArray &query, const FloatArray &key,
               const FloatArray &value, const MutableFloatArray &output,
               const std::optional<MaskArray> &key_padding_mask,
               const std::optional<MaskArray> &attn_mask, bool is_causal,
               const std::optional<MutableFloatArray> &weights, bool average_weights) {
                const mha::ForwardOptions options = forward_options(
                    key_padding_mask, attn_mask, is_causal, weights, average_weights);
                nb::gil_scoped_release released;
                self.forward(tensor(query), tensor(key), tensor(value), mutable_tensor(output),
                             options);
            },
            nb::arg("query"), nb::arg("key"), nb::arg("value"), nb::arg("output"),
            nb::arg("key_padding_mask").none() = nb::none(),
            nb::arg("attn_mask").none() = nb::none(), nb::arg("is_causal") = false,
            nb::arg("weights").none() = nb::none(), nb::arg("average_weights") = true,
            "query [B, Sq, E], key [B, Sk, kdim], value [B, Sk, vdim] -> output [B, Sq, E] "
            "and, when given, weights [B, Sq, Sk] (averaged) or [B, H, Sq, Sk].")
        .def(
            "forward_bits",
            [](const mha::MultiHeadAttention &self, const BitsArray &query, const BitsArray &key,
               const BitsArray &value, const MutableBitsArray &output, const std::string &dtype,
               const std::optional<MaskArray> &key_padding_mask,
               const std::optional<MaskArray> &attn_mask, bool is_causal,
               const std::optional<MutableFloatArray> &weights, bool average_weights) {
                const mha::ForwardOptions options = forward_options(
                    key_padding_mask, attn_mask, is_causal, weights, average_weights);
                with_16_bits(dtype, [&](auto element) {
                    using T = decltype(element);
                    nb::gil_scoped_release released;
                    self.forward(bits_view<const T>(query), bits_view<const T>(key),
                                 bits_view<const T>(value), bits_view<T>(output), options);
                });
            },
            nb::arg("query"), nb::arg("key"), nb::arg("value"), nb::arg("output"), nb::arg("dtype"),
            nb::arg("key_padding_mask").none() = nb::none(),
            nb::arg("attn_mask").none() = nb::none(), nb::arg("is_causal") = false,
            nb::arg("weights").none() = nb::none(), nb::arg("average_weights") = true,
            "forward() on bf16 or f16 arrays given as their bits; the weights in f32.")
        .def(
            "make_cache",
            [](const mha::MultiHeadAttention &self, int64_t batch, int64_t capacity,
               const std::optional<std::string> &dtype, const std::optional<RotaryTuple> &rotary) {
                return self.make_cache(
                    batch, capacity,
                    dtype ? std::optional(cache_dtype_named(*dtype)) : std::nullopt,
                    optional_rotary(rotary));
            },
            nb::arg("batch"), nb::arg("capacity"), nb::arg("dtype").none() = nb::none(),
            nb::arg("rotary").none() = nb::none(),
            "A cache of `batch` rows of up to `capacity` tokens, its keys and values in `dtype` "
            "(f32, bf16, f16, int8; the module's by default); with `rotary` (interleaved, "
            "rotary_dim, theta, cos, sin), its steps rotate their new queries and keys.")
        .def(
            "decode",
            [](const mha::MultiHeadAttention &self, const FloatArray &tokens, mha::KvCache &cache,
               const MutableFloatArray &output,
               const std::optional<nb::ndarray<const bool, nb::c_contig, nb::device::cpu>>
                   &key_padding_mask,
               const std::vector<int64_t> &new_tokens) {
                const std::optional<mha::Mask> padding = decode_padding(key_padding_mask);
                nb::gil_scoped_release released;
                self.decode(tensor(tokens), cache, mutable_tensor(output), padding, new_tokens);
            },
            nb::arg("tokens"), nb::arg("cache"), nb::arg("output"),
            nb::arg("key_padding_mask").none() = nb::none(),
            nb::arg("new_tokens") = std::vector<int64_t>{},
            "One decode step: tokens [B, n, E] appended to the cache -> output [B, n, E].")
        .def(
            "decode_bits",
            [](const mha::MultiHeadAttention &self, const BitsArray &tokens, mha::KvCache &cache,
               const MutableBitsArray &output, const std::string &dtype,
               const std::optional<nb::ndarray<const bool, nb::c_contig, nb::device::cpu>>
                   &key_padding_mask,
               const std::vector<int64_t> &new_tokens) {
                const std::optional<mha::Mask> padding = decode_padding(key_padding_mask);
                with_16_bits(dtype, [&](auto element) {
                    using T = decltype(element);
                    nb::gil_scoped_release released;
                    self.decode(bits_view<const T>(tokens), cache, bits_view<T>(output), padding,
                                new_tokens);
                });
            },
            nb::arg("tokens"), nb::arg("cache"), nb::arg("output"), nb::arg("dtype"),
            nb::arg("key_padding_mask").none() = nb::none(),
            nb::arg("new_tokens") = std::vector<int64_t>{},
            "decode() on bf16 or f16 arrays given as their bits.")
        .def(
            "decode_paged",
            [](const mha::MultiHeadAttention &self, const ContiguousArray &tokens,
               const StridedArray &key_cache, const StridedArray &value_cache,
               const StridedArray &block_table, const StridedArray &sequence_lengths,
               const StridedArray &slot_mapping, const ContiguousArray &output,
               const std::string &tokens_dtype, const std::string &cache_dtype,
               const std::optional<RotaryTuple> &rotary) {
                check_int_array<int32_t>("block_table", block_table);
                check_int_array<int32_t>("sequence_lengths", sequence_lengths);
                check_int_array<int64_t>("slot_mapping", slot_mapping);
                const size_t token_bytes = dtype_named(tokens_dtype) == mha::DType::f32 ? 4 : 2;
                if (tokens.itemsize() != token_bytes || output.itemsize() != token_bytes)
                    throw nb::type_error(("tokens and output of " + tokens_dtype +
                                          " must have elements of " + std::to_string(token_bytes) +
                                          " bytes")
                                             .c_str());
                with_elements(cache_dtype, {&key_cache, &value_cache}, [&](auto element) {
                    using T = decltype(element);
                    const mha::PagedDecodeCache<T> cache{strided<T>(key_cache),
                                                         strided<T>(value_cache),
                                                         strided<const int32_t>(block_table),
                                                         strided<const int32_t>(sequence_lengths),
                                                         strided<const int64_t>(slot_mapping),
                                                         optional_rotary(rotary)};
                    const auto step = [&](auto token) {
                        using In = decltype(token);
                        nb::gil_scoped_release released;
                        self.decode(bits_view<const In>(tokens), cache, bits_view<In>(output));
                    };
                    if (token_bytes == 4)
                        step(float{});
                    else
                        with_16_bits(tokens_dtype, step);
                });
            },
            nb::arg("tokens"), nb::arg("key_cache"), nb::arg("value_cache"), nb::arg("block_table"),
            nb::arg("sequence_lengths"), nb::arg("slot_mapping"), nb::arg("output"),
            nb::arg("tokens_dtype"), nb::arg("cache_dtype"), nb::arg("rotary").none() = nb::none(),
            "One decode step over a paged cache: tokens [B, 1, E] (f32, or bf16/f16 bits), each "
            "sequence's newest, written into slots slot_mapping [B] int64 of key_cache and "
            "value_cache [blocks, block_size, Hkv, d] (of cache_dtype), block_table [B, "
            "max_blocks] and sequence_lengths [B] int32 -> output [B, 1, E].")
        .def(
            "kernel_name",
            [](const mha::MultiHeadAttention &self, const FloatArray &query, const FloatArray &key,
               const FloatArray &value) {
                return self.kernel_name(tensor(query), tensor(key), tensor(value));
            },
            nb::arg("query"), nb::arg("key"), nb::arg("value"));
}
