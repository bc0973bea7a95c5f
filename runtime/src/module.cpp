// The module: construction (checks, weights widened or rounded to its dtype, prepacked), and its
// forward entry points, which check a call (forward_params.h), choose its kernels and run them
// (dispatch.h).
#include <fmt/format.h>

#include <algorithm>

#include "checks.h"
#include "cpu_isa.h"
#include "dispatch.h"
#include "dtype.h"
#include "forward_params.h"
#include "halide_calls.h"
#include "mha/mha.h"
#include "packed_weights.h"
#include "thread_pool.h"

namespace mha {
namespace {

using detail::check_on_host;
using detail::check_tensor;
using detail::check_view;

const char *const kProjectionNames[4] = {"q_proj", "k_proj", "v_proj", "out_proj"};
// The module copies and prepacks its weights from host memory, on every device.
const char *const kWeightsOnHost = "weights are read from host memory";
const char *const kOnTheCpu = "the module runs on the cpu";

// A view of a tensor's memory as the f32 view the checks and buffers take: what it points to is
// read as the kernel's element type.
template <typename T>
Tensor unread(const TensorView<const T> &t) {
    return Tensor{reinterpret_cast<const float *>(t.data), t.shape, t.device_handle};
}

}  // namespace

MultiHeadAttention::MultiHeadAttention(int64_t embed_dim, int64_t num_heads, const Linear &q_proj,
                                       const Linear &k_proj, const Linear &v_proj,
                                       const Linear &out_proj, Device device, DType dtype)
    : embed_dim_(embed_dim), num_heads_(num_heads), device_(device), dtype_(dtype) {
    detail::install_runtime_hooks();
    if (std::find(contract::kDevices.begin(), contract::kDevices.end(), device) ==
        contract::kDevices.end()) {
        throw Error(fmt::format("device {} is none of cpu, cuda and opencl", int(device)));
    }
    detail::check_dtype("dtype", dtype);
    if (embed_dim < 1) {
        throw Error(fmt::format("embed_dim {} must be >= 1", embed_dim));
    }
    if (num_heads < 1) {
        throw Error(fmt::format("num_heads {} must be >= 1", num_heads));
    }
    if (embed_dim % num_heads != 0) {
        throw Error(
            fmt::format("embed_dim {} is not divisible by num_heads {}", embed_dim, num_heads));
    }
    const int64_t E = embed_dim, d = E / num_heads;
    const Linear *linears[4] = {&q_proj, &k_proj, &v_proj, &out_proj};
    // k_proj and v_proj: kv_heads · d output features (grouped-query heads; E without them),
    // kdim and vdim input features.
    check_view("k_proj.weight", k_proj.weight, 2, "[kv_heads x head_dim, kdim]");
    const int64_t kv_features = k_proj.weight.shape[0];
    if (kv_features % d != 0 || num_heads % (kv_features / d) != 0) {
        throw Error(fmt::format(
            "k_proj.weight has {} output features: must be kv_heads x head_dim ({}) with "
            "kv_heads dividing num_heads {}",
            kv_features, d, num_heads));
    }
    int64_t packed_elements = 0;  // of the four prepacked projections
    for (int p = 0; p < 4; p++) {
        const std::string name = fmt::format("{}.weight", kProjectionNames[p]);
        const Tensor &weight = linears[p]->weight;
        const bool key_or_value = p == 1 || p == 2;
        const int64_t out = key_or_value ? kv_features : E;
        check_view(name.c_str(), weight, 2,
                   key_or_value ? "[kv_heads x head_dim, in features]" : "[embed_dim, embed_dim]");
        check_tensor(name.c_str(), weight, std::array{out, key_or_value ? weight.shape[1] : E});
        check_on_host(name.c_str(), weight, kWeightsOnHost);
        if (linears[p]->bias) {
            const std::string bias = fmt::format("{}.bias", kProjectionNames[p]);
            check_tensor(bias.c_str(), *linears[p]->bias, std::array{out});
            check_on_host(bias.c_str(), *linears[p]->bias, kWeightsOnHost);
        }
        // Sizes are in elements of at most 2^31 bytes (check_view), so these products fit.
        packed_elements += contract::padded_features(out, d) * weight.shape[1];
    }
    if (packed_elements > kMaxBufferBytes / static_cast<int64_t>(sizeof(float))) {
        throw Error(
            fmt::format("embed_dim {} is too large: the packed weights exceed the {} "
                        "bytes a kernel addresses",
                        embed_dim, kMaxBufferBytes));
    }
    // A module of a 16-bit dtype packs its weights rounded to it.
    std::optional<detail::WidenedLinears> rounded;
    if (dtype != DType::f32) {
        rounded.emplace(std::array{linears[0], linears[1], linears[2], linears[3]}, dtype);
        for (int p = 0; p < 4; p++) {
            linears[p] = &rounded->linears[size_t(p)];
        }
    }
    const detail::KernelComponent *component = &detail::component_for(device);
    // The dtype the forward kernels read: the module's on a GPU whose library has its kernels
    // (MHA_GPU_DTYPES). On the CPU, bf16 where the matrix engine runs it: modules narrower than
    // one tile slice of features gain nothing from it, and their outputs, sums of a few terms,
    // would carry the bf16 rounding of the merged heads almost undiluted (relative L2 2e-2 seen
    // at E = 1). Elsewhere f32, on the rounded values.
    const bool own_kernels =
        device == Device::cpu ? E >= contract::kBf16TileDepth && detail::bf16_isa(dtype).has_value()
                              : detail::has_forward_kernels(*component, dtype);
    const DType kernel_dtype = own_kernels ? dtype : DType::f32;
    packed_ = std::make_shared<const detail::PackedWeights>(
        E, num_heads, linears, device == Device::cpu ? nullptr : component, kernel_dtype, dtype);
}

namespace {

// The views of 16-bit projections, checked before they are widened (the f32 constructor then
// checks their shapes against each other).
template <typename T>
std::array<const LinearOf<T> *, 4> checked_views(const LinearOf<T> &q_proj,
                                                 const LinearOf<T> &k_proj,
                                                 const LinearOf<T> &v_proj,
                                                 const LinearOf<T> &out_proj) {
    const std::array<const LinearOf<T> *, 4> linears{&q_proj, &k_proj, &v_proj, &out_proj};
    for (size_t p = 0; p < linears.size(); p++) {
        const std::string weight = fmt::format("{}.weight", kProjectionNames[p]);
        check_view(weight.c_str(), linears[p]->weight, 2, "[out features, in features]");
        check_on_host(weight.c_str(), linears[p]->weight, kWeightsOnHost);
        if (linears[p]->bias) {
            const std::string bias = fmt::format("{}.bias", kProjectionNames[p]);
            check_view(bias.c_str(), *linears[p]->bias, 1, "[out features]");
            check_on_host(bias.c_str(), *linears[p]->bias, kWeightsOnHost);
        }
    }
    return linears;
}

}  // namespace

MultiHeadAttention::MultiHeadAttention(int64_t embed_dim, int64_t num_heads,
                                       const detail::WidenedLinears &w, Device device, DType dtype)
    : MultiHeadAttention(embed_dim, num_heads, w.linears[0], w.linears[1], w.linears[2],
                         w.linears[3], device, dtype) {}

MultiHeadAttention::MultiHeadAttention(int64_t embed_dim, int64_t num_heads,
                                       const BF16Linear &q_proj, const BF16Linear &k_proj,
                                       const BF16Linear &v_proj, const BF16Linear &out_proj,
                                       Device device, DType dtype)
    : MultiHeadAttention(
          embed_dim, num_heads,
          detail::WidenedLinears(checked_views(q_proj, k_proj, v_proj, out_proj), DType::f32),
          device, dtype) {}

MultiHeadAttention::MultiHeadAttention(int64_t embed_dim, int64_t num_heads,
                                       const F16Linear &q_proj, const F16Linear &k_proj,
                                       const F16Linear &v_proj, const F16Linear &out_proj,
                                       Device device, DType dtype)
    : MultiHeadAttention(
          embed_dim, num_heads,
          detail::WidenedLinears(checked_views(q_proj, k_proj, v_proj, out_proj), DType::f32),
          device, dtype) {}

MultiHeadAttention MultiHeadAttention::from_in_proj(int64_t embed_dim, int64_t num_heads,
                                                    const Tensor &in_proj_weight,
                                                    const std::optional<Tensor> &in_proj_bias,
                                                    const Linear &out_proj, Device device,
                                                    DType dtype) {
    const int64_t E = embed_dim;
    if (E < 1 || E > kMaxBufferBytes) {
        throw Error(fmt::format("embed_dim {} must be in [1, {}]", E, kMaxBufferBytes));
    }
    check_view("in_proj_weight", in_proj_weight, 2, "[3 x embed_dim, embed_dim]");
    check_tensor("in_proj_weight", in_proj_weight, std::array{3 * E, E});
    check_on_host("in_proj_weight", in_proj_weight, kWeightsOnHost);
    if (in_proj_bias) {
        check_tensor("in_proj_bias", *in_proj_bias, std::array{3 * E});
        check_on_host("in_proj_bias", *in_proj_bias, kWeightsOnHost);
    }
    // Rows [p·E, (p + 1)·E) of the packed tensors are projection p's.
    std::array<Linear, 3> qkv;
    for (int p = 0; p < 3; p++) {
        qkv[p].weight = Tensor{in_proj_weight.data + p * E * E, {E, E}};
        if (in_proj_bias) {
            qkv[p].bias = Tensor{in_proj_bias->data + p * E, {E}};
        }
    }
    return MultiHeadAttention(embed_dim, num_heads, qkv[0], qkv[1], qkv[2], out_proj, device,
                              dtype);
}

int64_t MultiHeadAttention::kdim() const { return packed_->in_features[1]; }
int64_t MultiHeadAttention::num_kv_heads() const { return packed_->out_features[1] / head_dim(); }
int64_t MultiHeadAttention::vdim() const { return packed_->in_features[2]; }

std::string MultiHeadAttention::kernel_name(const Tensor &query, const Tensor &key,
                                            const Tensor &value,
                                            const ForwardOptions &options) const {
    const detail::ForwardParams p = detail::check_forward(*packed_, num_heads_, device_, query, key,
                                                          value, options, packed_->kernel_dtype);
    return std::string(detail::select_kernel(p).forward->name);
}

void MultiHeadAttention::forward(const Tensor &query, const Tensor &key, const Tensor &value,
                                 const MutableTensor &output, const std::optional<Mask> &mask,
                                 const std::optional<MutableTensor> &weights) const {
    ForwardOptions options;
    options.mask = mask;
    options.weights = weights;
    forward(query, key, value, output, options);
}

void MultiHeadAttention::forward(const Tensor &query, const Tensor &key, const Tensor &value,
                                 const MutableTensor &output, const ForwardOptions &options) const {
    if (dtype_ == DType::f32) {
        forward_kernels(query, key, value, output, options);
    } else {
        forward_converted(query, key, value, output, options);
    }
}

template <typename In, typename Out>
void MultiHeadAttention::forward_converted(const TensorView<const In> &query,
                                           const TensorView<const In> &key,
                                           const TensorView<const In> &value,
                                           const TensorView<Out> &output,
                                           const ForwardOptions &options) const {
    detail::check_activations<In>(dtype_);
    // Every argument is checked before a tensor is read or converted memory is taken:
    // check_forward() reads no tensor (and its limits are the converted f32 tensors' ones).
    detail::check_forward(*packed_, num_heads_, device_, unread(query), unread(key), unread(value),
                          options, DType::f32);
    check_tensor("output", output, std::array{query.shape[0], query.shape[1], embed_dim_});
    const detail::ConvertedOutput<Out> out("output", output);
    // 16-bit kernels (the matrix engine's, a GPU's) read the module's dtype: f32 inputs rounded,
    // 16-bit ones as they are; f32 kernels read f32, 16-bit inputs widened. Inputs are of the
    // module's dtype or f32 (check_activations).
    const auto run = [&](auto kernel_element) {
        using K = decltype(kernel_element);
        const detail::ConvertedInput<In, K> q("query", query, dtype_);
        const detail::ConvertedInput<In, K> k("key", key, dtype_, &q);
        const detail::ConvertedInput<In, K> v("value", value, dtype_,
                                              detail::same_view(value, query) ? &q : &k);
        forward_kernels(q.view(), k.view(), v.view(), out.view(), options);
    };
    switch (packed_->kernel_dtype) {
    case DType::f32:
        run(float{});
        break;
    case DType::bf16:
        if constexpr (!std::is_same_v<In, float16>) {
            run(bfloat16{});
        }
        break;
    case DType::f16:
        if constexpr (!std::is_same_v<In, bfloat16>) {
            run(float16{});
        }
        break;
    }
    out.finish();
}

void MultiHeadAttention::forward(const BF16Tensor &query, const BF16Tensor &key,
                                 const BF16Tensor &value, const MutableBF16Tensor &output,
                                 const ForwardOptions &options) const {
    forward_converted(query, key, value, output, options);
}
void MultiHeadAttention::forward(const BF16Tensor &query, const BF16Tensor &key,
                                 const BF16Tensor &value, const MutableTensor &output,
                                 const ForwardOptions &options) const {
    forward_converted(query, key, value, output, options);
}
void MultiHeadAttention::forward(const F16Tensor &query, const F16Tensor &key,
                                 const F16Tensor &value, const MutableF16Tensor &output,
                                 const ForwardOptions &options) const {
    forward_converted(query, key, value, output, options);
}
void MultiHeadAttention::forward(const F16Tensor &query, const F16Tensor &key,
                                 const F16Tensor &value, const MutableTensor &output,
                                 const ForwardOptions &options) const {
    forward_converted(query, key, value, output, options);
}

template <typename T>
void MultiHeadAttention::forward_kernels(const TensorView<const T> &query,
                                         const TensorView<const T> &key,
                                         const TensorView<const T> &value,
                                         const MutableTensor &output,
                                         const ForwardOptions &options) const {
    const detail::ForwardParams p =
        detail::check_forward(*packed_, num_heads_, device_, unread(query), unread(key),
                              unread(value), options, detail::dtype_of<T>());
    check_tensor("output", output, std::array{p.batch, p.query_len, embed_dim_});
    if (device_ == Device::cpu) {
        check_on_host("output", output, kOnTheCpu);
    }
    detail::run_forward(p, detail::select_kernel(p), *packed_, unread(query), unread(key),
                        unread(value), output, options.weights);
}

std::string dispatched_isa() { return std::string(contract::kCpuIsas[detail::cpu_isa()].name); }

std::string dispatched_isa(DType dtype) {
    return std::string(
        contract::kCpuIsas[detail::bf16_isa(dtype).value_or(detail::cpu_isa())].name);
}

void set_num_threads(int threads) {
    if (threads < 0) {
        throw Error(fmt::format("set_num_threads: threads {} is negative", threads));
    }
    detail::set_pool_threads(threads);
}

}  // namespace mha
