// mha._mha: the C++ library's modules and KV caches over arrays (NumPy, PyTorch or any DLPack
// producer). Contiguous CPU float32 arrays are used in place; the Python package (mha/) checks
// dtypes and devices, makes other arrays contiguous and holds the user-facing semantics.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "mha/mha.h"

namespace nb = nanobind;

namespace {

using FloatArray = nb::ndarray<const float, nb::c_contig, nb::device::cpu>;
using MutableFloatArray = nb::ndarray<float, nb::c_contig, nb::device::cpu>;
// A mask: bool (True = blocked) or float32 (added to the scores).
using MaskArray = nb::ndarray<nb::c_contig, nb::device::cpu>;

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

}  // namespace

NB_MODULE(_mha, m) {
    nb::exception<mha::Error>(m, "Error", PyExc_ValueError);
    m.def("dispatched_isa", &mha::dispatched_isa,
          "The CPU instruction set whose kernels run: avx512, avx2 or sse41 (neon on arm64).");
    m.def("set_num_threads", &mha::set_num_threads, nb::arg("threads"),
          "The CPU kernels' threads (0: HL_NUM_THREADS, else one per core). Call it while no "
          "call runs.");

    nb::class_<mha::KvCache>(m, "KvCache",
                             "Projected keys and values of the tokens a decoder has seen.")
        .def_prop_ro("batch", &mha::KvCache::batch)
        .def_prop_ro("capacity", &mha::KvCache::capacity)
        .def_prop_ro("lengths", &mha::KvCache::lengths, "Tokens cached in each batch row.")
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
               const FloatArray &out_weight, const std::optional<FloatArray> &out_bias) {
                new (self) mha::MultiHeadAttention(
                    embed_dim, num_heads, linear(q_weight, q_bias), linear(k_weight, k_bias),
                    linear(v_weight, v_bias), linear(out_weight, out_bias));
            },
            nb::arg("embed_dim"), nb::arg("num_heads"), nb::arg("q_weight"),
            nb::arg("q_bias").none(), nb::arg("k_weight"), nb::arg("k_bias").none(),
            nb::arg("v_weight"), nb::arg("v_bias").none(), nb::arg("out_weight"),
            nb::arg("out_bias").none())
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
                mha::ForwardOptions options;
                options.key_padding_mask = mask_tensor(key_padding_mask, "key_padding_mask");
                options.attn_mask = mask_tensor(attn_mask, "attn_mask");
                options.causal = is_causal ? mha::Causal::top_left : mha::Causal::none;
                if (weights)
                    options.weights = mutable_tensor(*weights);
                options.average_weights = average_weights;
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
        .def("make_cache", &mha::MultiHeadAttention::make_cache, nb::arg("batch"),
             nb::arg("capacity"))
        .def(
            "decode",
            [](const mha::MultiHeadAttention &self, const FloatArray &tokens, mha::KvCache &cache,
               const MutableFloatArray &output,
               const std::optional<nb::ndarray<const bool, nb::c_contig, nb::device::cpu>>
                   &key_padding_mask,
               const std::vector<int64_t> &new_tokens) {
                std::optional<mha::Mask> padding;
                if (key_padding_mask)
                    padding =
                        mha::Mask{{reinterpret_cast<const uint8_t *>(key_padding_mask->data()),
                                   shape_of(*key_padding_mask)},
                                  mha::MaskConvention::block};
                nb::gil_scoped_release released;
                self.decode(tensor(tokens), cache, mutable_tensor(output), padding, new_tokens);
            },
            nb::arg("tokens"), nb::arg("cache"), nb::arg("output"),
            nb::arg("key_padding_mask").none() = nb::none(),
            nb::arg("new_tokens") = std::vector<int64_t>{},
            "One decode step: tokens [B, n, E] appended to the cache -> output [B, n, E].")
        .def(
            "kernel_name",
            [](const mha::MultiHeadAttention &self, const FloatArray &query, const FloatArray &key,
               const FloatArray &value) {
                return self.kernel_name(tensor(query), tensor(key), tensor(value));
            },
            nb::arg("query"), nb::arg("key"), nb::arg("value"));
}
