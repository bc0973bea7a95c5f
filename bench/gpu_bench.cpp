// Times the GPU kernels on device-resident tensors and checks them against the reference.
// Prints one JSON object per line:
// {"dims": [B, Sq, Sk, E, H], "dtype": ..., "weights": ..., "ms": median, "rel_l2": error}.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "HalideBuffer.h"
#include "HalideRuntimeCuda.h"
#include "HalideRuntimeOpenCL.h"
#include "command_line.h"
#include "problems.h"
#include "sweeps.h"

namespace {

using mha::reference::Dims;

// A tensor in device memory, managed through Halide's runtime; extents innermost first. Its
// elements are f32, or the bits of bf16 or f16 (uint16_t).
template <typename Element>
class DeviceTensor {
public:
    DeviceTensor(mha::Device device, std::vector<Element> &host, std::vector<int64_t> shape)
        : device_(device),
          shape_(std::move(shape)),
          buffer_(host.data(), std::vector<int>(shape_.rbegin(), shape_.rend())) {
        buffer_.set_host_dirty();
        const auto *interface = device == mha::Device::cuda ? halide_cuda_device_interface()
                                                            : halide_opencl_device_interface();
        if (buffer_.copy_to_device(interface) != 0) {
            throw mha::Error("could not copy a tensor to the device");
        }
    }

    // The library's view of it, as a tensor of T (of Element's size).
    template <typename T = Element>
    mha::TensorView<T> view() {
        static_assert(sizeof(T) == sizeof(Element));
        const uint64_t handle = device_ == mha::Device::cuda
                                    ? halide_cuda_get_device_ptr(nullptr, buffer_.raw_buffer())
                                    : halide_opencl_get_cl_mem(nullptr, buffer_.raw_buffer());
        return {nullptr, shape_, handle};
    }
    void read_back() {
        buffer_.set_device_dirty();
        buffer_.copy_to_host();
    }
    void sync() { buffer_.device_sync(); }

private:
    mha::Device device_;
    std::vector<int64_t> shape_;
    Halide::Runtime::Buffer<Element> buffer_;
};

// One shape: median milliseconds of forward() on device-resident tensors of `dtype` (a module of
// that dtype; the output f32), with the attention weights [B, H, Sq, Sk] written to the device
// too when `with_weights`.
void run_shape(mha::Device device, const Dims &d, mha::DType dtype, bool with_weights,
               double max_check_gflop) {
    const bool self = d.query_len == d.key_len;
    mha::reference::Problem p = mha::problems::random_problem(d, 7, self);
    p.dtype = dtype;
    const int64_t E = d.embed_dim;
    const mha::MultiHeadAttention module = mha::problems::make_module(p, device);
    std::vector<float> output(d.batch * d.query_len * E);
    DeviceTensor<float> out(device, output, {d.batch, d.query_len, E});
    std::vector<float> weights(with_weights ? d.batch * d.num_heads * d.query_len * d.key_len : 0);
    std::optional<DeviceTensor<float>> w;
    mha::ForwardOptions options;
    if (with_weights) {
        w.emplace(device, weights,
                  std::vector<int64_t>{d.batch, d.num_heads, d.query_len, d.key_len});
        options.weights = w->view();
    }
    // The inputs in the module's dtype; self-attention passes one tensor three times (the fused
    // QKV kernels).
    const auto inputs = [&](auto element, auto &query_host, auto &key_host, auto &value_host) {
        using T = decltype(element);
        using Element = std::remove_reference_t<decltype(query_host[0])>;
        DeviceTensor<Element> q(device, query_host, {d.batch, d.query_len, E});
        DeviceTensor<Element> k(device, key_host, {d.batch, d.key_len, E});
        DeviceTensor<Element> v(device, value_host, {d.batch, d.key_len, E});
        const mha::TensorView<const T> query = q.template view<const T>();
        const mha::TensorView<const T> key = self ? query : k.template view<const T>();
        const mha::TensorView<const T> value = self ? query : v.template view<const T>();
        const auto forward = [&] {
            module.forward(query, key, value, out.view(), options);
        };
        forward();  // first call: module load, kernel compilation
        out.sync();
        std::vector<double> ms;
        const auto budget_start = std::chrono::steady_clock::now();
        while (ms.size() < 5 || (ms.size() < 50 && std::chrono::steady_clock::now() - budget_start <
                                                       std::chrono::seconds(2))) {
            const auto t = std::chrono::steady_clock::now();
            forward();
            out.sync();
            ms.push_back(
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t)
                    .count());
        }
        std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
        return ms[ms.size() / 2];
    };
    double median_ms = 0;
    if (dtype == mha::DType::f32) {
        median_ms = inputs(float{}, p.query, p.key, p.value);
    } else {
        using mha::reference::bits_of;
        std::vector<uint16_t> query = bits_of(p.query, dtype), key = bits_of(p.key, dtype);
        std::vector<uint16_t> value = bits_of(p.value, dtype);
        median_ms = dtype == mha::DType::bf16 ? inputs(mha::bfloat16{}, query, key, value)
                                              : inputs(mha::float16{}, query, key, value);
    }
    double error = -1;  // not checked: the double-precision reference is too slow for it
    if (d.forward_flops() * 1e-9 <= max_check_gflop) {
        out.read_back();
        error = mha::reference::relative_l2(output, mha::reference::forward(p).output);
    }
    fmt::print(
        "{{\"dims\": [{}, {}, {}, {}, {}], \"dtype\": \"{}\", \"weights\": {}, \"ms\": {:.4f}, "
        "\"rel_l2\": {:.3e}}}\n",
        d.batch, d.query_len, d.key_len, d.embed_dim, d.num_heads, mha::contract::dtype_name(dtype),
        with_weights, median_ms, error);
    std::fflush(stdout);
}

}  // namespace

int main(int argc, char **argv) {
    CLI::App app(
        "Times the GPU kernels on device-resident tensors and checks them against the "
        "double-precision reference; one JSON line per shape.",
        "mha_gpu_bench");
    std::string device_name = "cuda";
    double max_check_gflop = 20;
    std::vector<std::string> shape_texts;
    bool with_weights = false;
    std::map<std::string, mha::DType> dtypes;
    for (mha::DType t : mha::contract::kDTypes) {
        dtypes.emplace(mha::contract::dtype_name(t), t);
    }
    mha::DType dtype = mha::DType::f32;
    app.add_option("--device", device_name, "cuda | opencl")
        ->check(CLI::IsMember({"cuda", "opencl"}))
        ->type_name("DEVICE")
        ->capture_default_str();
    app.add_option("--max-check-gflop", max_check_gflop,
                   "check against the reference only shapes up to this many GFLOP")
        ->check(CLI::NonNegativeNumber)
        ->type_name("G")
        ->capture_default_str();
    app.add_option("--shapes", shape_texts,
                   "shapes to run (default: the benchmark sweep and the GPU's larger shapes)")
        ->check(mha::tools::problem_shape())
        ->type_name("B,Sq,Sk,E,H...");
    app.add_option("--dtype", dtype,
                   "the module's and the inputs' dtype (the output is f32); default shapes for "
                   "bf16 and f16: the dtype sweep")
        ->transform(CLI::CheckedTransformer(dtypes))
        ->type_name("f32|bf16|f16")
        ->capture_default_str();
    app.add_flag("--weights", with_weights,
                 "also return the attention weights [B, H, Sq, Sk] (device memory)");
    if (const auto code = mha::tools::parse_command_line(app, argc, argv)) {
        return *code;
    }
    const mha::Device device = device_name == "cuda" ? mha::Device::cuda : mha::Device::opencl;
    std::vector<Dims> shapes;
    for (const std::string &text : shape_texts) {
        shapes.push_back(*mha::tools::parse_problem_shape(text));
    }
    if (shapes.empty() && dtype != mha::DType::f32) {
        shapes.assign(mha::bench::kDtypeSweep.begin(), mha::bench::kDtypeSweep.end());
    } else if (shapes.empty()) {
        shapes.assign(mha::bench::kBenchmarkSweep.begin(), mha::bench::kBenchmarkSweep.end());
        shapes.insert(shapes.end(), mha::bench::kGpuExtraShapes.begin(),
                      mha::bench::kGpuExtraShapes.end());
    }
    try {
        for (const Dims &d : shapes) {
            run_shape(device, d, dtype, with_weights, max_check_gflop);
        }
    } catch (const std::exception &e) {
        fmt::print(stderr, "mha_gpu_bench: {}\n", e.what());
        return 1;
    }
    return 0;
}
