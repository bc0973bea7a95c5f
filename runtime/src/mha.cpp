#include "mha/mha.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <limits>

#include "buffers.h"
#include "checks.h"
#include "cpu_isa.h"
#include "device.h"
#include "dtype.h"
#include "halide_calls.h"
#include "kernel_table.h"
#include "masks.h"
#include "packed_weights.h"

namespace mha {
namespace {

using contract::ArgId;
using detail::check_data;
using detail::check_kernel_buffer;
using detail::check_on_host;
using detail::check_tensor;
using detail::check_view;
using detail::shape_string;

const char *const kProjectionNames[4] = {"q_proj", "k_proj", "v_proj", "out_proj"};
// The module copies and prepacks its weights from host memory, on every device.
const char *const kWeightsOnHost = "weights are read from host memory";
const char *const kOnTheCpu = "the module runs on the cpu";

// The device component a module runs on: the CPU's (after settling its instruction set), or a
// linked GPU library's.
const detail::KernelComponent *component_for(Device device) {
    if (device == Device::cpu) {
        detail::cpu_isa();  // an unusable MHA_CPU_ISA is an error at construction
        return &detail::cpu_kernels();
    }
    return &detail::gpu_component(device);
}

void check_dtype(DType dtype) {
    if (std::find(contract::kDTypes.begin(), contract::kDTypes.end(), dtype) ==
        contract::kDTypes.end()) {
        throw Error(fmt::format("dtype {} is none of f32, bf16 and f16", int(dtype)));
    }
}

}  // namespace

// What one call runs, after its arguments are checked.
struct MultiHeadAttention::Call {
    const detail::CompiledKernel *kernel;
    std::array<int64_t, 4> weights_shape;  // [B, H, Sq, Sk]
    detail::KernelMask mask;
    const detail::CompiledKernel *average_kernel = nullptr;  // when averaged weights are asked
};

MultiHeadAttention::MultiHeadAttention(int64_t embed_dim, int64_t num_heads, const Linear &q_proj,
                                       const Linear &k_proj, const Linear &v_proj,
                                       const Linear &out_proj, Device device, DType dtype)
    : embed_dim_(embed_dim), num_heads_(num_heads), device_(device), dtype_(dtype) {
    detail::install_runtime_hooks();
    if (std::find(contract::kDevices.begin(), contract::kDevices.end(), device) ==
        contract::kDevices.end()) {
        throw Error(fmt::format("device {} is none of cpu, cuda and opencl", int(device)));
    }
    check_dtype(dtype);
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
    const detail::KernelComponent *component = component_for(device);
    // The dtype the forward kernels read: the module's on a GPU whose library has its kernels
    // (MHA_GPU_DTYPES). On the CPU, bf16 where the matrix engine runs it: modules narrower than
    // one tile slice of features gain nothing from it, and their outputs, sums of a few terms,
    // would carry the bf16 rounding of the merged heads almost undiluted (relative L2 2e-2 seen
    // at E = 1). Elsewhere f32, on the rounded values.
    const bool own_kernels = device == Device::cpu ? E >= contract::kBf16TileDepth &&
                                                         detail::matrix_isa(dtype).has_value()
                                                   : detail::has_forward_kernels(*component, dtype);
    const DType kernel_dtype = own_kernels ? dtype : DType::f32;
    packed_ = std::make_shared<const detail::PackedWeights>(
        E, num_heads, linears, device == Device::cpu ? nullptr : component, kernel_dtype);
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

// The buffers a forward kernel makes from its arguments (every schedule rounds rows and
// features up by at most a tile of kMaxTile), and the mask's view at its full extent: Halide
// checks an input's extents as if it were dense, broadcast dimensions included.
void MultiHeadAttention::check_kernel_buffers(const Tensor &query, const Tensor &key,
                                              const ForwardOptions &options,
                                              const Call &call) const {
    // Plain variables, not a structured binding: the messages' lambdas capture them.
    const int64_t B = call.weights_shape[0], H = call.weights_shape[1];
    const int64_t Sq = call.weights_shape[2], Sk = call.weights_shape[3];
    const int64_t d = head_dim(), kv_heads = num_kv_heads(), tile = contract::kMaxTile;
    const int64_t P = packed_->padded, Pkv = packed_->padded_kv;
    const int64_t query_rows = contract::round_up(B * Sq, tile);
    const int64_t key_rows = contract::round_up(B * Sk, tile);
    const auto named = [](const char *what, const Tensor &t) {
        return [what, &t] {
            return fmt::format(what, shape_string(t.shape));
        };
    };
    if (packed_->stacked()) {
        check_kernel_buffer({query_rows, P + 2 * Pkv}, sizeof(float),
                            named("the Q, K and V projections of query {}, rows x padded "
                                  "features,",
                                  query));
    }
    check_kernel_buffer({query_rows, P}, sizeof(float),
                        named("the projection of query {}, rows x padded features,", query));
    check_kernel_buffer({key_rows, Pkv}, sizeof(float),
                        named("the projection of key {}, rows x padded features,", key));
    check_kernel_buffer({B, kv_heads, contract::round_up(d, tile), key_rows + tile}, sizeof(float),
                        named("the keys of key {} split into heads, [B, heads, head_dim, Sk] "
                              "(padded),",
                              key));
    check_kernel_buffer({B, contract::round_up(Sq, tile), H, contract::round_up(d, tile)},
                        sizeof(float),
                        named("the attention context of query {}, [B, Sq, H, head_dim] "
                              "(padded),",
                              query));
    if (call.mask.kind != contract::MaskKind::none) {
        check_kernel_buffer({B, H, Sq, Sk},
                            call.mask.kind == contract::MaskKind::bytes ? 1 : sizeof(float), [&] {
                                std::vector<std::string> masks;
                                for (const auto &[given, name] :
                                     {std::pair{options.mask.has_value(), "mask"},
                                      {options.additive_mask.has_value(), "additive_mask"},
                                      {options.key_padding_mask.has_value(), "key_padding_mask"},
                                      {options.attn_mask.has_value(), "attn_mask"}}) {
                                    if (given) {
                                        masks.push_back(name);
                                    }
                                }
                                return fmt::format(
                                    "{}, which the kernels read at [B, H, Sq, Sk] = [{}, {}, {}, "
                                    "{}],",
                                    fmt::join(masks, " and "), B, H, Sq, Sk);
                            });
    }
}

MultiHeadAttention::Call MultiHeadAttention::prepare(const Tensor &query, const Tensor &key,
                                                     const Tensor &value,
                                                     const ForwardOptions &options,
                                                     DType kernel_dtype) const {
    const char *layout = "[batch, sequence, embed_dim]";
    check_view("query", query, 3, layout);
    check_view("key", key, 3, layout);
    check_view("value", value, 3, layout);
    const int64_t B = query.shape[0], Sq = query.shape[1], E = embed_dim_;
    const int64_t Sk = key.shape[1], H = num_heads_;
    for (const auto &[name, t, features, what] : {std::tuple{"query", &query, E, "embed_dim"},
                                                  {"key", &key, kdim(), "kdim"},
                                                  {"value", &value, vdim(), "vdim"}}) {
        if (t->shape[2] != features) {
            throw Error(fmt::format("{} has {} features but the module's {} is {}", name,
                                    t->shape[2], what, features));
        }
        if (t->shape[0] != B) {
            throw Error(
                fmt::format("{} has batch {} but query has batch {}", name, t->shape[0], B));
        }
    }
    if (value.shape[1] != Sk) {
        throw Error(fmt::format("key has {} rows but value has {}", Sk, value.shape[1]));
    }
    if (options.causal != Causal::none && options.causal != Causal::top_left &&
        options.causal != Causal::bottom_right) {
        throw Error(fmt::format("causal {} is none of none, top_left and bottom_right",
                                int(options.causal)));
    }
    Call call{nullptr, {B, H, Sq, Sk}, {}};
    call.mask = detail::resolve_masks(options, call.weights_shape);
    check_kernel_buffers(query, key, options, call);
    if (device_ == Device::cpu) {
        check_on_host("query", query, kOnTheCpu);
        check_on_host("key", key, kOnTheCpu);
        check_on_host("value", value, kOnTheCpu);
        if (call.mask.device_handle != 0) {
            throw Error(fmt::format("a mask has a device_handle but {}", kOnTheCpu));
        }
    }
    contract::KernelVariant variant;
    variant.mask = call.mask.kind;
    variant.returns_weights = options.weights.has_value();
    variant.causal = options.causal != Causal::none;
    variant.dtype = kernel_dtype;
    // Self-attention on one tensor takes the fused QKV projection.
    variant.fused_qkv = packed_->stacked() && query.data == key.data && query.data == value.data &&
                        query.device_handle == key.device_handle &&
                        query.device_handle == value.device_handle && query.shape == key.shape &&
                        query.shape == value.shape;
    const detail::KernelComponent &component = *component_for(device_);
    const int isa = device_ != Device::cpu       ? -1
                    : kernel_dtype == DType::f32 ? int(detail::cpu_isa())
                                                 : int(detail::matrix_isa(kernel_dtype).value());
    call.kernel = detail::find_kernel(component, isa, B * std::max(Sq, Sk), variant);
    const bool averaged = options.weights && options.average_weights;
    if (averaged) {
        check_view("weights", *options.weights, 3, "[batch, query length, key length]");
        check_tensor("weights", *options.weights, std::array{B, Sq, Sk});
        // The per-head weights the mean is taken over are the library's: they must fit a kernel.
        check_kernel_buffer({B, H, Sq, Sk}, sizeof(float), [&] {
            return fmt::format(
                "averaged weights of [B, Sq, Sk] = [{}, {}, {}]: the per-head "
                "weights [B, H, Sq, Sk] they average",
                B, Sq, Sk);
        });
    } else if (options.weights) {
        check_view("weights", *options.weights, 4, "[batch, num_heads, query length, key length]");
        check_tensor("weights", *options.weights, call.weights_shape);
    }
    if (options.weights && device_ == Device::cpu) {
        check_on_host("weights", *options.weights, kOnTheCpu);
    }
    if (averaged) {
        // The averaging kernel runs in f32, on the f32 instruction set.
        const int f32_isa = device_ == Device::cpu ? int(detail::cpu_isa()) : -1;
        call.average_kernel = detail::find_kernel(component, f32_isa, B * std::max(Sq, Sk),
                                                  {contract::KernelOp::average_heads});
    }
    if (call.kernel == nullptr || (averaged && call.average_kernel == nullptr)) {
        throw Error(fmt::format("internal error: the {} kernels have no variant for this call",
                                contract::device_name(device_)));
    }
    return call;
}

std::string MultiHeadAttention::kernel_name(const Tensor &query, const Tensor &key,
                                            const Tensor &value,
                                            const ForwardOptions &options) const {
    return std::string(prepare(query, key, value, options, packed_->kernel_dtype).kernel->name);
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
    // Every argument is checked before a tensor is read or converted memory is taken: prepare()
    // reads no tensor (and its limits are the converted f32 tensors' ones).
    const auto unread = [](const TensorView<const In> &t) {
        return Tensor{reinterpret_cast<const float *>(t.data), t.shape, t.device_handle};
    };
    prepare(unread(query), unread(key), unread(value), options);
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
    constexpr DType kernel_dtype = detail::dtype_of<T>();
    const std::optional<MutableTensor> &weights = options.weights;
    const auto unread = [](const TensorView<const T> &t) {
        return Tensor{reinterpret_cast<const float *>(t.data), t.shape, t.device_handle};
    };
    const Call call = prepare(unread(query), unread(key), unread(value), options, kernel_dtype);
    const int64_t B = query.shape[0], Sq = query.shape[1], E = embed_dim_;
    check_tensor("output", output, std::array{B, Sq, E});
    const bool averaged = call.average_kernel != nullptr;
    const int64_t H = call.weights_shape[1], Sk = call.weights_shape[3];
    if (device_ == Device::cpu) {
        check_on_host("output", output, kOnTheCpu);
    }

    // Buffers for every argument the variant takes; the kernel reads them in contract order.
    const auto typed = [&](ArgId id, const auto &t) {
        return detail::dense_buffer(t, detail::argument_type(*call.kernel, id));
    };
    detail::HostBuffer q = typed(ArgId::query, query), k = typed(ArgId::key, key);
    detail::HostBuffer v = typed(ArgId::value, value), out = detail::dense_buffer(output);
    detail::HostBuffer mask_buffer, weights_buffer;
    std::vector<uint8_t> combined_bytes;
    std::vector<float> combined_floats;
    detail::ArgValues values{};
    values[size_t(ArgId::query)] = q.raw_buffer();
    values[size_t(ArgId::key)] = k.raw_buffer();
    values[size_t(ArgId::value)] = v.raw_buffer();
    values[size_t(ArgId::output)] = out.raw_buffer();
    int32_t mask_blocks_nonzero = call.mask.blocks_nonzero;
    if (call.mask.kind != contract::MaskKind::none) {
        mask_buffer = detail::kernel_mask_buffer(call.mask, call.weights_shape, combined_bytes,
                                                 combined_floats);
        const bool bytes = call.mask.kind == contract::MaskKind::bytes;
        values[size_t(bytes ? ArgId::mask : ArgId::additive_mask)] = mask_buffer.raw_buffer();
        values[size_t(ArgId::mask_blocks_nonzero)] = &mask_blocks_nonzero;
    }
    // With averages asked for, the forward kernel writes each head's weights into the library's
    // own buffer, which the averaging kernel then reads.
    std::vector<float> head_weights;
    detail::HostBuffer averaged_buffer;
    if (averaged) {
        head_weights.resize(B * H * Sq * Sk);
        weights_buffer = detail::dense_buffer(MutableTensor{head_weights.data(), {B, H, Sq, Sk}});
        averaged_buffer = detail::dense_buffer(*weights);
        values[size_t(ArgId::head_weights)] = weights_buffer.raw_buffer();
        values[size_t(ArgId::averaged_weights)] = averaged_buffer.raw_buffer();
    } else if (weights) {
        weights_buffer = detail::dense_buffer(*weights);
    }
    if (weights) {
        values[size_t(ArgId::weights)] = weights_buffer.raw_buffer();
    }
    int32_t head_dim = static_cast<int32_t>(E / num_heads_);
    // Sq and Sk passed the kernels' 32-bit size checks, so their difference fits too.
    int32_t causal_offset =
        options.causal == Causal::bottom_right ? int32_t(call.weights_shape[3] - Sq) : 0;
    values[size_t(ArgId::causal_offset)] = &causal_offset;
    values[size_t(ArgId::head_dim)] = &head_dim;
    int32_t kv_heads = static_cast<int32_t>(num_kv_heads());
    values[size_t(ArgId::kv_heads)] = &kv_heads;
    for (size_t id = 0; id < contract::kArgCount; id++) {
        // Kernels only read the weights: one prepacked copy serves concurrent calls.
        const std::optional<detail::HostBuffer> &w =
            packed_->kernel_buffer(ArgId(id), kernel_dtype);
        if (w) {
            values[id] = const_cast<halide_buffer_t *>(w->raw_buffer());
        }
    }

    detail::CallContext context;
    if (device_ != Device::cpu) {
        const detail::KernelComponent &component = *component_for(device_);
        detail::place_on_device(q, query.device_handle, true, component, context, "query");
        if (!call.kernel->variant.fused_qkv) {
            detail::place_on_device(k, key.device_handle, true, component, context, "key");
            detail::place_on_device(v, value.device_handle, true, component, context, "value");
        }
        if (call.mask.kind != contract::MaskKind::none) {
            detail::place_on_device(mask_buffer, call.mask.device_handle, true, component, context,
                                    "the mask");
        }
        detail::place_on_device(out, output.device_handle, false, component, context, "output");
        if (averaged) {
            detail::place_on_device(weights_buffer, 0, false, component, context,
                                    "the per-head weights");
            detail::place_on_device(averaged_buffer, weights->device_handle, false, component,
                                    context, "weights");
        } else if (weights) {
            detail::place_on_device(weights_buffer, weights->device_handle, false, component,
                                    context, "weights");
        }
    }
    detail::call_kernel(*call.kernel, context, values);
    if (averaged) {
        detail::call_kernel(*call.average_kernel, context, values);
    }
    if (device_ != Device::cpu) {
        detail::copy_output_to_host(out, output.device_handle, context, "output");
        if (weights) {
            detail::copy_output_to_host(averaged ? averaged_buffer : weights_buffer,
                                        weights->device_handle, context, "weights");
        }
    }
}

std::string dispatched_isa() { return std::string(contract::kCpuIsas[detail::cpu_isa()].name); }

void set_num_threads(int threads) {
    if (threads < 0) {
        throw Error(fmt::format("set_num_threads: threads {} is negative", threads));
    }
    // Halide's pool takes its size when it starts: stop it, so that the next call starts one of
    // the new size.
    halide_shutdown_thread_pool();
    halide_set_num_threads(threads);
}

}  // namespace mha
