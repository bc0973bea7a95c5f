// Conversions between the element types of the public API (mha::DType) and the f32 the kernels
// read and write, for tensors of a call and a module's weights.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include <optional>
#include <type_traits>

#include "checks.h"
#include "halide_types.h"
#include "mha/mha.h"
#include "mha_contract.h"

namespace mha::detail {

// The bytes of one element of `dtype` in a kernel's buffer (contract::element_type).
inline int64_t element_bytes(DType dtype) {
    return contract::halide_type(contract::element_type(dtype)).bytes();
}
inline int64_t element_bytes(CacheDType dtype) {
    return contract::halide_type(contract::element_type(dtype)).bytes();
}

template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
    return DType::f32;
}
template <>
constexpr DType dtype_of<bfloat16>() {
    return DType::bf16;
}
template <>
constexpr DType dtype_of<float16>() {
    return DType::f16;
}

// out[i] = in[i] widened (exact) or rounded to the nearest even, for n elements.
void convert(const bfloat16 *in, float *out, int64_t n);
void convert(const float16 *in, float *out, int64_t n);
void convert(const float *in, bfloat16 *out, int64_t n);
void convert(const float *in, float16 *out, int64_t n);
// The same type: a copy.
template <typename T>
void convert(const T *in, T *out, int64_t n) {
    std::copy(in, in + n, out);
}

// x[i] rounded to `dtype` and widened back: the value a tensor of that type holds.
void round_to(DType dtype, float *x, int64_t n);

// A module's four projections in f32, widened from another element type or rounded to its
// dtype, and Linear views of them: what it packs its weights from.
struct WidenedLinears {
    std::array<Linear, 4> linears{};
    std::array<std::vector<float>, 4> weights, biases;

    // `from` holds q, k, v and out, whose views the caller has checked.
    template <typename T>
    WidenedLinears(const std::array<const LinearOf<T> *, 4> &from, DType dtype) {
        const auto widen = [dtype](const TensorView<const T> &t, std::vector<float> &to) {
            int64_t n = 1;
            for (int64_t extent : t.shape) {
                n *= extent;
            }
            to.resize(size_t(n));
            convert(t.data, to.data(), n);
            round_to(dtype, to.data(), n);
            return Tensor{to.data(), t.shape};
        };
        for (size_t p = 0; p < from.size(); p++) {
            linears[p].weight = widen(from[p]->weight, weights[p]);
            if (from[p]->bias) {
                linears[p].bias = widen(*from[p]->bias, biases[p]);
            }
        }
    }
};

// Memory for one call's converted tensor of `count` elements of T, from the scratch pool;
// mha::Error when it is out.
void *scratch_or_throw(size_t bytes);
void scratch_free(void *block);
template <typename T>
class Scratch {
public:
    explicit Scratch(int64_t count)
        : data_(static_cast<T *>(scratch_or_throw(size_t(count) * sizeof(T)))) {}
    ~Scratch() { scratch_free(data_); }
    Scratch(const Scratch &) = delete;
    Scratch &operator=(const Scratch &) = delete;
    T *data() const { return data_; }

private:
    T *data_;
};
using ScratchFloats = Scratch<float>;

inline constexpr const char *kConvertedOnHost =
    "the kernels read it in another element type, to which it is converted on the host";
inline constexpr const char *kOutputConvertedOnHost =
    "the kernels write f32, which 16-bit outputs are converted from on the host";

// Whether two views are the same tensor: the same memory (host or device) and shape.
template <typename T>
bool same_view(const TensorView<T> &a, const TensorView<T> &b) {
    return a.data == b.data && a.device_handle == b.device_handle && a.shape == b.shape;
}

// A call's tensor of type In as the kernels read it, of type K (f32, or the module's 16-bit
// type for the matrix engine and GPUs), rounded to the module's `dtype`: a view of the
// caller's memory (on the host or a device) when that changes nothing, else a copy in scratch
// memory held for the call. `shares` converts nothing when another tensor of the call is the
// same view (self-attention keeps its fused QKV projection).
template <typename In, typename K = float>
class ConvertedInput {
public:
    ConvertedInput(const char *name, const TensorView<const In> &t, DType dtype,
                   const ConvertedInput *shares = nullptr)
        : source_(t) {
        check_view(name, t, 3, "[batch, sequence, features]");
        if (shares != nullptr && same_view(shares->source_, t)) {
            view_ = shares->view_;
            return;
        }
        if constexpr (std::is_same_v<In, K>) {
            if (dtype_of<In>() == dtype || !std::is_same_v<K, float>) {
                view_ = t;  // already what the kernels read
                return;
            }
        }
        check_on_host(name, t, kConvertedOnHost);
        const int64_t n = t.shape[0] * t.shape[1] * t.shape[2];  // fits: check_view
        memory_.emplace(n);
        convert(t.data, memory_->data(), n);
        if constexpr (std::is_same_v<K, float>) {
            if (dtype_of<In>() != dtype) {
                round_to(dtype, memory_->data(), n);
            }
        }
        view_ = TensorView<const K>{memory_->data(), t.shape};
    }
    const TensorView<const K> &view() const { return view_; }

private:
    TensorView<const In> source_;
    std::optional<Scratch<K>> memory_;
    TensorView<const K> view_;
};

// A call's output of another element type: the kernels write f32 here, then finish() converts.
template <typename Out>
class ConvertedOutput {
public:
    ConvertedOutput(const char *name, const TensorView<Out> &t) : target_(t) {
        check_view(name, t, 3, "[batch, sequence, embed_dim]");
        if constexpr (std::is_same_v<Out, float>) {
            view_ = t;
        } else {
            check_on_host(name, t, kOutputConvertedOnHost);
            memory_.emplace(count());
            view_ = MutableTensor{memory_->data(), t.shape};
        }
    }
    const MutableTensor &view() const { return view_; }
    void finish() const {
        if constexpr (!std::is_same_v<Out, float>) {
            convert(memory_->data(), target_.data, count());
        }
    }

private:
    int64_t count() const { return target_.shape[0] * target_.shape[1] * target_.shape[2]; }
    TensorView<Out> target_;
    std::optional<ScratchFloats> memory_;
    MutableTensor view_;
};

// Activations of type In for a module of `dtype`: f32 ones or its own type.
template <typename In>
void check_activations(DType dtype) {
    constexpr DType given = dtype_of<In>();
    if (given != DType::f32 && dtype != DType::f32 && given != dtype) {
        throw Error(fmt::format("a {} module takes {} or f32 tensors, not {}",
                                contract::dtype_name(dtype), contract::dtype_name(dtype),
                                contract::dtype_name(given)));
    }
}

}  // namespace mha::detail
