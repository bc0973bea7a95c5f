// The GPU paths: OpenCL kernels on whatever OpenCL device is present (PoCL's CPU device in CI)
// against the reference; host and device-resident tensors; CUDA's error and skip paths.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <optional>
#include <random>
#include <string>

#include "HalideBuffer.h"
#include "HalideRuntimeOpenCL.h"
#include "mask_setups.h"
#include "reference.h"
#include "test_seed.h"

namespace {

using mha::Device;
using mha::MaskConvention;
using mha::reference::Dims;
using mha::reference::Problem;

constexpr double kTolerance = 1e-5;

using Result = mha::reference::Outputs;

void expect_matches_reference(const Problem &p, const Result &got, bool with_weights) {
    const auto want = mha::reference::forward(p);
    EXPECT_LT(mha::reference::relative_l2(got.output, want.output), kTolerance);
    if (with_weights) {
        EXPECT_LT(mha::reference::relative_l2(got.weights, want.weights), kTolerance);
    }
}

// OpenCL must work where CI runs (PoCL is installed by the set-up); elsewhere a machine without
// an OpenCL driver skips these tests.
class OpenCl : public ::testing::Test {
protected:
    void SetUp() override {
        try {
            mha::reference::make_module(mha::reference::random_problem({1, 2, 2, 4, 1}, 1),
                                        Device::opencl);
        } catch (const mha::Error &e) {
            if (std::getenv("CI") != nullptr) {
                FAIL() << "OpenCL is required in CI: " << e.what();
            }
            GTEST_SKIP() << e.what();
        }
    }
};

struct GpuCase {
    const char *name;
    Dims dims;
    bool self_attention, with_weights;
    std::optional<MaskConvention> mask;
};
const GpuCase kGpuCases[] = {
    {"cross_e12_h3_keep_mask_weights", {2, 5, 7, 12, 3}, false, true, MaskConvention::keep},
    {"self_fused_no_mask", {1, 9, 9, 16, 2}, true, false, std::nullopt},
    {"self_fused_block_mask_weights", {3, 4, 4, 8, 1}, true, true, MaskConvention::block},
    {"one_query_long_keys", {1, 1, 70, 24, 4}, false, false, MaskConvention::keep},
    {"head_dim_96_weights", {1, 33, 20, 96, 1}, false, true, std::nullopt},
    {"many_query_and_key_tiles", {2, 40, 100, 24, 2}, false, false, std::nullopt},
    {"self_fused_several_tiles", {1, 64, 64, 32, 2}, true, false, MaskConvention::block},
    {"head_dim_64_partial_key_tile", {1, 20, 23, 64, 1}, false, false, std::nullopt},
};

class OpenClCases : public OpenCl, public ::testing::WithParamInterface<GpuCase> {};

TEST_P(OpenClCases, MatchesReference) {
    const GpuCase &c = GetParam();
    Problem p = mha::reference::random_problem(c.dims, mha::testing::next_seed(), c.self_attention);
    if (c.mask) {
        mha::reference::add_random_mask(p, *c.mask,
                                        {c.dims.batch, 1, c.dims.query_len, c.dims.key_len},
                                        mha::testing::next_seed());
    }
    const auto module = mha::reference::make_module(p, Device::opencl);
    expect_matches_reference(p, mha::reference::run_module(module, p, c.with_weights),
                             c.with_weights);
}

INSTANTIATE_TEST_SUITE_P(PoCL, OpenClCases, ::testing::ValuesIn(kGpuCases),
                         [](const auto &info) { return std::string(info.param.name); });

// nn.MultiheadAttention's kdim and vdim, and causal attention in both alignments.
TEST_F(OpenCl, KdimVdimAndCausal) {
    for (mha::Causal causal : {mha::Causal::top_left, mha::Causal::bottom_right}) {
        Problem p = mha::reference::random_problem({2, 9, 5, 12, 3}, mha::testing::next_seed(),
                                                   false, 7, 20);
        p.causal = causal;
        const auto module = mha::reference::make_module(p, Device::opencl);
        expect_matches_reference(p, mha::reference::run_module(module, p, true), true);
    }
}

// Grouped-query heads on the device, self- and cross-attention.
TEST_F(OpenCl, GroupedQueryHeads) {
    for (const Dims &d : {Dims{2, 7, 7, 24, 6}, Dims{1, 5, 9, 16, 4}}) {
        Problem p = mha::reference::random_problem(d, mha::testing::next_seed(),
                                                   d.query_len == d.key_len, 0, 0, 2);
        const auto module = mha::reference::make_module(p, Device::opencl);
        expect_matches_reference(p, mha::reference::run_module(module, p, true), true);
    }
}

// The weights averaged over heads on the device: the mean of the per-head weights.
TEST_F(OpenCl, AveragedWeights) {
    Problem p = mha::reference::random_problem({2, 6, 9, 12, 3}, mha::testing::next_seed());
    p.average_weights = true;
    const auto module = mha::reference::make_module(p, Device::opencl);
    expect_matches_reference(p, mha::reference::run_module(module, p, true), true);
}

// Every mask family and combination (tests/mask_setups.h), cross- and self-attention.
class OpenClMasks : public OpenCl, public ::testing::WithParamInterface<mha::testing::MaskSetup> {};

TEST_P(OpenClMasks, MatchReference) {
    for (const Dims &d : {Dims{2, 5, 7, 12, 3}, Dims{2, 6, 6, 8, 1}}) {
        const bool self = d.query_len == d.key_len;
        Problem p = mha::reference::random_problem(d, mha::testing::next_seed(), self);
        mha::testing::apply_masks(GetParam(), p, mha::testing::next_seed());
        const auto module = mha::reference::make_module(p, Device::opencl);
        expect_matches_reference(p, mha::reference::run_module(module, p, self), self);
    }
}

INSTANTIATE_TEST_SUITE_P(PoCL, OpenClMasks, ::testing::ValuesIn(mha::testing::kMaskSetups),
                         [](const auto &info) { return std::string(info.param.name); });

TEST_F(OpenCl, FullyMaskedRowIsUniformAndFinite) {
    const Dims d{1, 3, 6, 8, 2};
    Problem p = mha::reference::random_problem(d, mha::testing::next_seed());
    mha::reference::add_random_mask(p, MaskConvention::keep, {1, 1, d.query_len, d.key_len},
                                    mha::testing::next_seed());
    for (int64_t j = 0; j < d.key_len; j++) {
        p.mask[1 * d.key_len + j] = 0;  // query row 1 sees no key
    }
    const Result got =
        mha::reference::run_module(mha::reference::make_module(p, Device::opencl), p, true);
    for (int64_t h = 0; h < d.num_heads; h++) {
        for (int64_t j = 0; j < d.key_len; j++) {
            EXPECT_NEAR(got.weights[(h * d.query_len + 1) * d.key_len + j], 1.0 / d.key_len, 1e-6);
        }
    }
    expect_matches_reference(p, got, true);
}

// Halide copies a host buffer to the device only when it is marked host-dirty; a runtime that
// forgot would silently compute on stale device memory. New contents at the same addresses
// must give new results.
TEST_F(OpenCl, HostInputsRewrittenInPlaceAreCopiedAgain) {
    const Dims d{2, 6, 6, 12, 3};
    Problem p = mha::reference::random_problem(d, mha::testing::next_seed());
    const auto module = mha::reference::make_module(p, Device::opencl);
    expect_matches_reference(p, mha::reference::run_module(module, p, true), true);
    std::mt19937 rng(mha::testing::next_seed());
    std::uniform_real_distribution<float> u(-1, 1);
    for (auto *tensor : {&p.query, &p.key, &p.value}) {
        for (float &x : *tensor) {
            x = u(rng);  // same vectors, same addresses, new values
        }
    }
    expect_matches_reference(p, mha::reference::run_module(module, p, true), true);
}

// A Halide-managed OpenCL buffer: a cl_mem as a user would hold one. Dimensions innermost first.
struct DeviceTensor {
    Halide::Runtime::Buffer<float> buffer;
    DeviceTensor(std::vector<float> &host, const std::vector<int> &extents)
        : buffer(host.data(), extents) {
        buffer.set_host_dirty();
        EXPECT_EQ(buffer.copy_to_device(halide_opencl_device_interface()), 0);
    }
    uint64_t cl_mem() { return halide_opencl_get_cl_mem(nullptr, buffer.raw_buffer()); }
    void read_back() {
        buffer.set_device_dirty();
        EXPECT_EQ(buffer.copy_to_host(), 0);
    }
};

TEST_F(OpenCl, DeviceResidentTensorsAreUsedInPlace) {
    const Dims d{2, 5, 9, 16, 4};
    const Problem p = mha::reference::random_problem(d, mha::testing::next_seed());
    const auto module = mha::reference::make_module(p, Device::opencl);
    std::vector<float> query = p.query, key = p.key, value = p.value;
    std::vector<float> output(d.batch * d.query_len * d.embed_dim, NAN);
    std::vector<float> weights(d.batch * d.num_heads * d.query_len * d.key_len, NAN);
    const int B = d.batch, Sq = d.query_len, Sk = d.key_len, E = d.embed_dim, H = d.num_heads;
    DeviceTensor q(query, {E, Sq, B}), k(key, {E, Sk, B}), v(value, {E, Sk, B});
    DeviceTensor out(output, {E, Sq, B}), w(weights, {Sk, Sq, H, B});
    // Only device handles: the library never sees these host arrays.
    module.forward({nullptr, {B, Sq, E}, q.cl_mem()}, {nullptr, {B, Sk, E}, k.cl_mem()},
                   {nullptr, {B, Sk, E}, v.cl_mem()}, {nullptr, {B, Sq, E}, out.cl_mem()},
                   std::nullopt, mha::MutableTensor{nullptr, {B, H, Sq, Sk}, w.cl_mem()});
    out.read_back();
    w.read_back();
    expect_matches_reference(p, {output, weights}, true);
}

bool cuda_driver_present() {
    for (const char *name : {"libcuda.so.1", "libcuda.so"}) {
        if (void *h = dlopen(name, RTLD_LAZY | RTLD_LOCAL)) {
            dlclose(h);
            return true;
        }
    }
    return false;
}

// Device faults, each provoked through one of PoCL's settings in a process of its own
// (tests/CMakeLists.txt runs each test with its variable): they raise mha::Error from the call
// that met them, as the CPU's do, naming what failed and with the driver's words.
bool contains(const std::string &text, const std::string &part) {
    return text.find(part) != std::string::npos;
}

std::optional<std::string> fault_setting(const char *variable) {
    const char *value = std::getenv(variable);
    if (value == nullptr) {
        return std::nullopt;
    }
    return std::string(value);
}

// HL_OCL_DEVICE_TYPE=gpu: Halide's runtime asks for a GPU, and PoCL has only a CPU device.
TEST(OpenClFaults, NoDevice) {
    if (!fault_setting("HL_OCL_DEVICE_TYPE")) {
        GTEST_SKIP() << "run with HL_OCL_DEVICE_TYPE=gpu";
    }
    try {
        mha::reference::make_module(mha::reference::random_problem({1, 2, 2, 8, 2}, 1),
                                    Device::opencl);
        FAIL() << "no error without a device";
    } catch (const mha::Error &e) {
        EXPECT_PRED2(contains, e.what(),
                     "copying the module's weights to the opencl "
                     "device failed");
        EXPECT_PRED2(contains, e.what(), "CL_DEVICE_NOT_FOUND");
    }
}

// POCL_MAX_WORK_GROUP_SIZE=4: smaller than the kernels' thread blocks, so the launch fails.
TEST(OpenClFaults, FailedKernelLaunch) {
    if (!fault_setting("POCL_MAX_WORK_GROUP_SIZE")) {
        GTEST_SKIP() << "run with POCL_MAX_WORK_GROUP_SIZE=4";
    }
    const Problem p = mha::reference::random_problem({1, 9, 9, 16, 2}, 1);
    const auto module = mha::reference::make_module(p, Device::opencl);
    try {
        mha::reference::run_module(module, p, false);
        FAIL() << "no error from a launch that cannot run";
    } catch (const mha::Error &e) {
        EXPECT_PRED2(contains, e.what(), "kernel mha_forward_opencl_any_none_mask_");
        EXPECT_PRED2(contains, e.what(), "CL_INVALID_WORK_GROUP_SIZE");
    }
}

// POCL_MEMORY_LIMIT=1: 1 GiB of device memory, 256 MiB the largest allocation. A query over that
// cannot be copied in; the module then works as before.
TEST(OpenClFaults, OutOfDeviceMemory) {
    if (!fault_setting("POCL_MEMORY_LIMIT")) {
        GTEST_SKIP() << "run with POCL_MEMORY_LIMIT=1";
    }
    const Problem p = mha::reference::random_problem({1, 4, 4, 64, 1}, mha::testing::next_seed());
    const auto module = mha::reference::make_module(p, Device::opencl);
    const int64_t rows = (int64_t(1) << 20) + 64, E = 64;  // 256 MiB + 16 KiB
    std::vector<float> large(rows * E, 0.5f), output(rows * E);
    try {
        module.forward({large.data(), {1, rows, E}}, mha::reference::key_view(p),
                       mha::reference::value_view(p), {output.data(), {1, rows, E}});
        FAIL() << "no error from a query larger than the device's largest allocation";
    } catch (const mha::Error &e) {
        EXPECT_PRED2(contains, e.what(), "copying query to the opencl device failed");
        EXPECT_PRED2(contains, e.what(), "CL_INVALID_BUFFER_SIZE");
    }
    expect_matches_reference(p, mha::reference::run_module(module, p, true), true);
}

TEST(Cuda, WithoutADriverConstructionFailsClearly) {
    if (cuda_driver_present()) {
        GTEST_SKIP() << "a CUDA driver is present on this machine";
    }
    const Problem p = mha::reference::random_problem({1, 2, 2, 8, 2}, 1);
    try {
        mha::reference::make_module(p, Device::cuda);
        FAIL() << "no error without a CUDA driver";
    } catch (const mha::Error &e) {
        EXPECT_STREQ(e.what(), "no cuda driver found: libcuda.so.1 could not be loaded");
    }
}

TEST(Cuda, MatchesReference) {
    if (!cuda_driver_present()) {
        GTEST_SKIP() << "no CUDA driver: the CUDA kernels are compiled and linked, not run";
    }
    for (const GpuCase &c : kGpuCases) {
        Problem p =
            mha::reference::random_problem(c.dims, mha::testing::next_seed(), c.self_attention);
        const auto module = mha::reference::make_module(p, Device::cuda);
        expect_matches_reference(p, mha::reference::run_module(module, p, c.with_weights),
                                 c.with_weights);
    }
}

TEST(CpuModule, RejectsDeviceHandles) {
    const Problem p = mha::reference::random_problem({1, 2, 2, 8, 2}, 1);
    const auto module = mha::reference::make_module(p);
    std::vector<float> out(16);
    try {
        module.forward({nullptr, {1, 2, 8}, 0x1234}, mha::reference::key_view(p),
                       mha::reference::value_view(p), {out.data(), {1, 2, 8}});
        FAIL() << "no error";
    } catch (const mha::Error &e) {
        EXPECT_STREQ(e.what(), "query has a device_handle but the module runs on the cpu");
    }
}

}  // namespace
