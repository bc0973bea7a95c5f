// A program that uses the CPU kernels only, as a user's would: it links the mha library alone
// (no GPU library, no fmt, no Halide) and runs the seeds' example. tests/CMakeLists.txt also
// checks that its binary holds no GPU kernel and needs no library beyond the C/C++ runtime.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "mha/mha.h"

int main() {
    const int64_t B = 2, S = 5, E = 512, H = 8;
    // nn.Linear-sized weights from a fixed linear congruential sequence.
    uint32_t state = 12345;
    const auto next = [&] {
        state = state * 1664525u + 1013904223u;
        return (float(state >> 8) / float(1 << 24) - 0.5f) / 16.0f;
    };
    std::vector<float> weights[4], biases[4];
    mha::Linear linears[4];
    for (int l = 0; l < 4; l++) {
        weights[l].resize(E * E);
        biases[l].resize(E);
        for (float &w : weights[l])
            w = next();
        for (float &b : biases[l])
            b = next();
        linears[l].weight = {weights[l].data(), {E, E}};
        linears[l].bias = mha::Tensor{biases[l].data(), {E}};
    }
    std::vector<float> x(B * S * E), out(B * S * E), attention(B * H * S * S);
    for (float &v : x)
        v = next() * 16;
    const mha::MultiHeadAttention module(E, H, linears[0], linears[1], linears[2], linears[3]);
    const mha::Tensor input{x.data(), {B, S, E}};
    module.forward(input, input, input, {out.data(), {B, S, E}}, std::nullopt,
                   mha::MutableTensor{attention.data(), {B, H, S, S}});
    for (int64_t row = 0; row < B * H * S; row++) {
        double sum = 0;
        for (int64_t j = 0; j < S; j++)
            sum += attention[row * S + j];
        if (std::abs(sum - 1) > 1e-5) {
            std::printf("weights row %ld sums to %f\n", long(row), sum);
            return 1;
        }
    }
    for (float v : out) {
        if (!std::isfinite(v)) {
            std::printf("non-finite output\n");
            return 1;
        }
    }
    // Without a GPU library linked, a GPU module says which one to link.
    try {
        mha::MultiHeadAttention(E, H, linears[0], linears[1], linears[2], linears[3],
                                mha::Device::opencl);
        std::printf("an OpenCL module without the OpenCL library\n");
        return 1;
    } catch (const mha::Error &e) {
        if (std::string(e.what()).find("link the mha_opencl library") == std::string::npos) {
            std::printf("unexpected error: %s\n", e.what());
            return 1;
        }
    }
    std::printf("ok: %s on %s\n", module.kernel_name(input, input, input).c_str(),
                mha::dispatched_isa().c_str());
    return 0;
}
