// Times the GPU kernels on device-resident tensors and checks them against the reference.
// Prints one JSON object per line: {"dims": [B, Sq, Sk, E, H], "ms": median, "rel_l2": error}.
//
// usage: mha_gpu_bench --device cuda|opencl [--max-check-gflop G] [--shapes B,Sq,Sk,E,H ...]
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "HalideRuntime.h"
#include "HalideRuntimeCuda.h"
#include "HalideRuntimeOpenCL.h"
#include "reference.h"

namespace {

using mha::reference::Dims;

// The CPU sweep plus two larger shapes for a big GPU.
const Dims kGpuSweep[] = {
    {2, 5, 5, 512, 8},          {1, 128, 128, 512, 8},     {4, 256, 256, 512, 8},
    {1, 512, 512, 768, 12},     {1, 1024, 1024, 1024, 16}, {1, 2048, 2048, 512, 8},
    {1, 64, 2048, 512, 8},      {1, 1, 4096, 512, 8},      {8, 1024, 1024, 1024, 16},
    {1, 4096, 4096, 1024, 16},
};

// A tensor in device memory, managed through Halide's runtime.
class DeviceTensor {
public:
    DeviceTensor(mha::Device device, std::vector<float> &host, std::vector<int64_t> shape)
        : device_(device), shape_(std::move(shape)) {
        int32_t stride = 1;
        for (size_t d = shape_.size(); d-- > 0;) {
            dims_.push_back({0, static_cast<int32_t>(shape_[d]), stride, 0});
            stride *= static_cast<int32_t>(shape_[d]);
        }
        buffer_.host = reinterpret_cast<uint8_t *>(host.data());
        buffer_.type = halide_type_of<float>();
        buffer_.dimensions = static_cast<int>(dims_.size());
        buffer_.dim = dims_.data();
        buffer_.flags = halide_buffer_flag_host_dirty;
        const auto *interface = device == mha::Device::cuda ? halide_cuda_device_interface()
                                                             : halide_opencl_device_interface();
        if (halide_copy_to_device(nullptr, &buffer_, interface) != 0) {
            throw mha::Error("could not copy a tensor to the device");
        }
    }
    ~DeviceTensor() { halide_device_free(nullptr, &buffer_); }
    DeviceTensor(const DeviceTensor &) = delete;

    mha::MutableTensor view() {
        const uint64_t handle = device_ == mha::Device::cuda
                                    ? halide_cuda_get_device_ptr(nullptr, &buffer_)
                                    : halide_opencl_get_cl_mem(nullptr, &buffer_);
        return {nullptr, shape_, handle};
    }
    void read_back() {
        buffer_.flags = halide_buffer_flag_device_dirty;
        halide_copy_to_host(nullptr, &buffer_);
    }
    void sync() { halide_device_sync(nullptr, &buffer_); }

private:
    mha::Device device_;
    std::vector<int64_t> shape_;
    std::vector<halide_dimension_t> dims_;
    halide_buffer_t buffer_{};
};

void run_shape(mha::Device device, const Dims &d, double max_check_gflop) {
    const bool self = d.query_len == d.key_len;
    mha::reference::Problem p = mha::reference::random_problem(d, 7, self);
    const int64_t E = d.embed_dim;
    const mha::MultiHeadAttention module = mha::reference::make_module(p, device);
    std::vector<float> output(d.batch * d.query_len * E);
    DeviceTensor q(device, p.query, {d.batch, d.query_len, E});
    DeviceTensor k(device, p.key, {d.batch, d.key_len, E});
    DeviceTensor v(device, p.value, {d.batch, d.key_len, E});
    DeviceTensor out(device, output, {d.batch, d.query_len, E});
    // Self-attention passes one tensor three times (the fused QKV kernels).
    const auto as_input = [](const mha::MutableTensor &t) {
        return mha::Tensor{nullptr, t.shape, t.device_handle};
    };
    const mha::Tensor query = as_input(q.view());
    const mha::Tensor key = self ? query : as_input(k.view());
    const mha::Tensor value = self ? query : as_input(v.view());
    const auto forward = [&] { module.forward(query, key, value, out.view()); };
    forward();  // first call: module load, kernel compilation
    out.sync();
    std::vector<double> ms;
    const auto budget_start = std::chrono::steady_clock::now();
    while (ms.size() < 5 || (ms.size() < 50 && std::chrono::steady_clock::now() - budget_start <
                                                   std::chrono::seconds(2))) {
        const auto t = std::chrono::steady_clock::now();
        forward();
        out.sync();
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t)
                         .count());
    }
    std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
    double error = -1;  // not checked: the double-precision reference is too slow for it
    if (d.forward_flops() * 1e-9 <= max_check_gflop) {
        out.read_back();
        error = mha::reference::relative_l2(output, mha::reference::forward(p).output);
    }
    fmt::print("{{\"dims\": [{}, {}, {}, {}, {}], \"ms\": {:.4f}, \"rel_l2\": {:.3e}}}\n", d.batch,
               d.query_len, d.key_len, d.embed_dim, d.num_heads, ms[ms.size() / 2], error);
    std::fflush(stdout);
}

}  // namespace

int main(int argc, char **argv) {
    mha::Device device = mha::Device::cuda;
    double max_check_gflop = 20;
    std::vector<Dims> shapes(std::begin(kGpuSweep), std::end(kGpuSweep));
    for (int a = 1; a < argc; a++) {
        const std::string arg = argv[a];
        if (arg == "--device" && a + 1 < argc) {
            device = std::strcmp(argv[++a], "opencl") == 0 ? mha::Device::opencl : mha::Device::cuda;
        } else if (arg == "--max-check-gflop" && a + 1 < argc) {
            max_check_gflop = std::stod(argv[++a]);
        } else if (arg == "--shapes") {
            shapes.clear();
            while (a + 1 < argc && argv[a + 1][0] != '-') {
                Dims d{};
                if (std::sscanf(argv[++a], "%ld,%ld,%ld,%ld,%ld", &d.batch, &d.query_len,
                                &d.key_len, &d.embed_dim, &d.num_heads) != 5) {
                    fmt::print(stderr, "mha_gpu_bench: bad shape '{}'\n", argv[a]);
                    return 2;
                }
                shapes.push_back(d);
            }
        } else {
            fmt::print(stderr, "usage: mha_gpu_bench --device cuda|opencl [--max-check-gflop G] "
                               "[--shapes B,Sq,Sk,E,H ...]\n");
            return 2;
        }
    }
    try {
        for (const Dims &d : shapes) {
            run_shape(device, d, max_check_gflop);
        }
    } catch (const std::exception &e) {
        fmt::print(stderr, "mha_gpu_bench: {}\n", e.what());
        return 1;
    }
    return 0;
}
