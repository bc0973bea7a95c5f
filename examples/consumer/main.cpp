// Self-attention over 2 rows of 5 tokens, E = 64, 4 heads, on the CPU and, where an OpenCL
// device is found, on it too.
#include <cmath>
#include <cstdio>
#include <vector>

#include "mha/mha.h"

int main() {
    const int64_t B = 2, S = 5, E = 64, H = 4;
    std::vector<float> weights[4], biases[4];
    mha::Linear linears[4];
    for (int l = 0; l < 4; l++) {
        for (int64_t i = 0; i < E * E; i++)
            weights[l].push_back(std::sin(0.37f * float(i + 1000 * l)) / 8);
        biases[l].assign(E, 0.01f * float(l));
        linears[l] = {{weights[l].data(), {E, E}}, mha::Tensor{biases[l].data(), {E}}};
    }
    std::vector<float> x(B * S * E), out(B * S * E);
    for (size_t i = 0; i < x.size(); i++)
        x[i] = std::cos(0.11f * float(i));
    const mha::Tensor tokens{x.data(), {B, S, E}};

    mha::ForwardOptions options;
    options.causal = mha::Causal::top_left;
    try {
        mha::MultiHeadAttention attn(E, H, linears[0], linears[1], linears[2], linears[3]);
        attn.forward(tokens, tokens, tokens, {out.data(), {B, S, E}}, options);
        std::printf("cpu (%s): out[0] = %.6f\n", mha::dispatched_isa().c_str(), out[0]);
    } catch (const mha::Error &e) {  // e.g. a CPU that runs none of the library's kernels
        std::fprintf(stderr, "cpu: %s\n", e.what());
        return 1;
    }
    try {
        std::vector<float> gpu_out(out.size());
        mha::MultiHeadAttention gpu(E, H, linears[0], linears[1], linears[2], linears[3],
                                    mha::Device::opencl);
        gpu.forward(tokens, tokens, tokens, {gpu_out.data(), {B, S, E}}, options);
        std::printf("opencl: out[0] = %.6f, |difference| = %.2g\n", gpu_out[0],
                    std::abs(gpu_out[0] - out[0]));
    } catch (const mha::Error &e) {  // no OpenCL library linked, or no device
        std::printf("opencl: %s\n", e.what());
    }
    return 0;
}
