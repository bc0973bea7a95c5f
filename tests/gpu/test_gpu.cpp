// The GPU paths, every suite on each GPU device: OpenCL on whatever OpenCL device is present
// (PoCL's CPU device in CI, where it must work), CUDA where a driver is (skipped without one;
// bench/gpu_check.sh runs this program on a GPU machine). Every forward kernel variant, the
// features of the API and device-resident tensors against the double-precision reference;
// device faults; CUDA's error path without a driver.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <optional>
#include <random>
#include <string>

#include "HalideBuffer.h"
#include "HalideRuntimeCuda.h"
#include "HalideRuntimeOpenCL.h"
#include "mask_setups.h"
#include "mha_contract.h"
#include "problems.h"
#include "test_seed.h"

namespace {

using mha::Device;
using mha::MaskConvention;
using mha::reference::Dims;
using mha::reference::Problem;

constexpr double kTolerance = 1e-5;

using Result = mha::problems::Outputs;

void expect_matches_reference(const Problem &p, const Result &got, bool with_weights) {
    const auto want = mha::reference::forward(p);
    EXPECT_LT(mha::reference::relative_l2(got.output, want.output), kTolerance);
    if (with_weights) {
        EXPECT_LT(mha::reference::relative_l2(got.weights, want.weights), kTolerance);
    }
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

// Why a suite cannot run on `device` here, or nothing when it can. CUDA runs where a driver is
// (where one is, a failure is the test's); OpenCL must work where CI runs (PoCL is installed by
// the set-up), and elsewhere a machine without an OpenCL driver skips it.
std::optional<std::string> unavailable(Device device) {
    if (device == Device::cuda) {
        if (cuda_driver_present()) {
            return std::nullopt;
        }
        return "no CUDA driver: the CUDA kernels are compiled and linked, not run";
    }
    if (std::getenv("CI") != nullptr) {
        return std::nullopt;
    }
    try {
        mha::problems::make_module(mha::problems::random_problem({1, 2, 2, 4, 1}, 1), device);
    } catch (const mha::Error &e) {
        return std::string(e.what());
    }
    return std::nullopt;
}

// A suite on one GPU device.
class Gpu : public ::testing::TestWithParam<Device> {
protected:
    Device device() const { return GetParam(); }
    void SetUp() override {
        if (const std::optional<std::string> why = unavailable(device())) {
            GTEST_SKIP() << *why;
        }
    }
};

std::string device_label(const ::testing::TestParamInfo<Device> &info) {
    return std::string(mha::contract::device_name(info.param));
}

// The devices every suite runs on.
const auto kGpuDevices = ::testing::Values(Device::opencl, Device::cuda);

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

class GpuCases : public Gpu {};

TEST_P(GpuCases, MatchReference) {
    for (const GpuCase &c : kGpuCases) {
        SCOPED_TRACE(c.name);
        Problem p =
            mha::problems::random_problem(c.dims, mha::testing::next_seed(), c.self_attention);
        if (c.mask) {
            mha::problems::add_random_mask(p, *c.mask,
                                           {c.dims.batch, 1, c.dims.query_len, c.dims.key_len},
                                           mha::testing::next_seed());
        }
        const auto module = mha::problems::make_module(p, device());
        expect_matches_reference(p, mha::problems::run_module(module, p, c.with_weights),
                                 c.with_weights);
    }
}
INSTANTIATE_TEST_SUITE_P(Devices, GpuCases, kGpuDevices, device_label);

// Every forward kernel variant of the contract (mask kind x weights x fused QKV x causal) and the
// averaging kernel, at sizes that are not multiples of any tile; the kernel that ran is checked
// to be the variant's.
struct DeviceVariant {
    Device device;
    mha::contract::KernelVariant variant;
    bool averaged;
};

std::vector<DeviceVariant> device_variants() {
    std::vector<DeviceVariant> all;
    for (Device device : {Device::opencl, Device::cuda}) {
        for (const mha::contract::KernelVariant &v : mha::contract::kKernelVariants) {
            if (v.op == mha::contract::KernelOp::forward && v.runs_on(device)) {
                all.push_back({device, v, false});
                if (v.returns_weights) {
                    all.push_back({device, v, true});  // with the averaging kernel
                }
            }
        }
    }
    return all;
}

class GpuVariants : public ::testing::TestWithParam<DeviceVariant> {};

TEST_P(GpuVariants, MatchReference) {
    const auto [device, v, averaged] = GetParam();
    if (const std::optional<std::string> why = unavailable(device)) {
        GTEST_SKIP() << *why;
    }
    const Dims d = v.fused_qkv ? Dims{2, 19, 19, 24, 3} : Dims{2, 13, 37, 24, 3};
    Problem p = mha::problems::random_problem(d, mha::testing::next_seed(), v.fused_qkv);
    // 16-bit tensors and weights, which the kernel widens exactly and computes on in f32: the
    // reference, fed the same rounded values, agrees to f32 accuracy.
    p.dtype = v.dtype;
    if (v.mask == mha::contract::MaskKind::bytes) {
        mha::problems::add_random_mask(p, MaskConvention::keep,
                                       {d.batch, 1, d.query_len, d.key_len},
                                       mha::testing::next_seed());
    } else if (v.mask == mha::contract::MaskKind::additive) {
        mha::problems::add_random_additive_mask(p, {d.batch, 1, 1, d.key_len}, false,
                                                mha::testing::next_seed());
    }
    p.causal = !v.causal     ? mha::Causal::none
               : v.fused_qkv ? mha::Causal::top_left
                             : mha::Causal::bottom_right;
    p.average_weights = averaged;
    const auto module = mha::problems::make_module(p, device);
    std::vector<float> weights(v.returns_weights ? d.batch * d.num_heads * d.query_len * d.key_len
                                                 : 0);
    const std::string name = module.kernel_name(
        mha::problems::query_view(p), mha::problems::key_view(p), mha::problems::value_view(p),
        mha::problems::options_view(
            p, v.returns_weights
                   ? std::optional<mha::MutableTensor>(mha::MutableTensor{
                         weights.data(),
                         averaged
                             ? std::vector<int64_t>{d.batch, d.query_len, d.key_len}
                             : std::vector<int64_t>{d.batch, d.num_heads, d.query_len, d.key_len}})
                   : std::nullopt));
    bool found = false;
    for (const mha::KernelInfo &k : mha::linked_kernels()) {
        if (k.name == name) {
            found = true;
            EXPECT_EQ(k.mask, mha::contract::mask_kind_name(v.mask));
            EXPECT_EQ(k.returns_weights, v.returns_weights);
            EXPECT_EQ(k.fused_qkv, v.fused_qkv);
            EXPECT_EQ(k.causal, v.causal);
            EXPECT_EQ(k.device, device);
            EXPECT_EQ(k.dtype, v.dtype);
        }
    }
    EXPECT_TRUE(found) << name;
    expect_matches_reference(p, mha::problems::run_module(module, p, v.returns_weights),
                             v.returns_weights);
}

// "_bf16", "_f16", or nothing for f32: how test names end.
std::string dtype_suffix(mha::DType dtype) {
    return dtype == mha::DType::f32 ? "" : "_" + std::string(mha::contract::dtype_name(dtype));
}

// Names: device, mask kind, causal, QKV, weights, 16-bit dtype (e.g.
// cuda_bytes_causal_fused_weights_bf16).
std::string variant_label(const ::testing::TestParamInfo<DeviceVariant> &info) {
    const DeviceVariant &d = info.param;
    const mha::contract::KernelVariant &v = d.variant;
    return std::string(mha::contract::device_name(d.device)) + "_" +
           std::string(mha::contract::mask_kind_name(v.mask)) + (v.causal ? "_causal" : "") +
           (v.fused_qkv ? "_fused" : "_separate") +
           (d.averaged          ? "_averaged"
            : v.returns_weights ? "_weights"
                                : "") +
           dtype_suffix(v.dtype);
}

INSTANTIATE_TEST_SUITE_P(EveryForwardKernel, GpuVariants, ::testing::ValuesIn(device_variants()),
                         variant_label);

// nn.MultiheadAttention's kdim and vdim, and causal attention in both alignments.
TEST_P(Gpu, KdimVdimAndCausal) {
    for (mha::Causal causal : {mha::Causal::top_left, mha::Causal::bottom_right}) {
        Problem p = mha::problems::random_problem({2, 9, 5, 12, 3}, mha::testing::next_seed(),
                                                  false, 7, 20);
        p.causal = causal;
        const auto module = mha::problems::make_module(p, device());
        expect_matches_reference(p, mha::problems::run_module(module, p, true), true);
    }
}

// Grouped-query heads on the device, self- and cross-attention.
TEST_P(Gpu, GroupedQueryHeads) {
    for (const Dims &d : {Dims{2, 7, 7, 24, 6}, Dims{1, 5, 9, 16, 4}}) {
        Problem p = mha::problems::random_problem(d, mha::testing::next_seed(),
                                                  d.query_len == d.key_len, 0, 0, 2);
        const auto module = mha::problems::make_module(p, device());
        expect_matches_reference(p, mha::problems::run_module(module, p, true), true);
    }
}

// The weights averaged over heads on the device: the mean of the per-head weights.
TEST_P(Gpu, AveragedWeights) {
    Problem p = mha::problems::random_problem({2, 6, 9, 12, 3}, mha::testing::next_seed());
    p.average_weights = true;
    const auto module = mha::problems::make_module(p, device());
    expect_matches_reference(p, mha::problems::run_module(module, p, true), true);
}

// Every mask family and combination (tests/mask_setups.h), cross- and self-attention, in every
// dtype (16-bit tensors and weights: the 16-bit kernels, to f32 accuracy).
class GpuMasks
    : public ::testing::TestWithParam<std::tuple<Device, mha::testing::MaskSetup, mha::DType>> {};

TEST_P(GpuMasks, MatchReference) {
    const auto &[device, setup, dtype] = GetParam();
    if (const std::optional<std::string> why = unavailable(device)) {
        GTEST_SKIP() << *why;
    }
    for (const Dims &d : {Dims{2, 5, 7, 12, 3}, Dims{2, 6, 6, 8, 1}}) {
        const bool self = d.query_len == d.key_len;
        Problem p = mha::problems::random_problem(d, mha::testing::next_seed(), self);
        p.dtype = dtype;
        mha::testing::apply_masks(setup, p, mha::testing::next_seed());
        const auto module = mha::problems::make_module(p, device);
        expect_matches_reference(p, mha::problems::run_module(module, p, self), self);
    }
}

// Names: device, mask setup, 16-bit dtype (e.g. opencl_seed_keep_bf16).
INSTANTIATE_TEST_SUITE_P(
    Devices, GpuMasks,
    ::testing::Combine(kGpuDevices, ::testing::ValuesIn(mha::testing::kMaskSetups),
                       ::testing::ValuesIn(mha::contract::kDTypes)),
    [](const auto &info) {
        return std::string(mha::contract::device_name(std::get<0>(info.param))) + "_" +
               std::get<1>(info.param).name + dtype_suffix(std::get<2>(info.param));
    });

// In every dtype.
TEST_P(Gpu, FullyMaskedRowIsUniformAndFinite) {
    for (mha::DType dtype : mha::contract::kDTypes) {
        SCOPED_TRACE(mha::contract::dtype_name(dtype));
        const Dims d{1, 3, 6, 8, 2};
        Problem p = mha::problems::random_problem(d, mha::testing::next_seed());
        p.dtype = dtype;
        mha::problems::add_random_mask(p, MaskConvention::keep, {1, 1, d.query_len, d.key_len},
                                       mha::testing::next_seed());
        for (int64_t j = 0; j < d.key_len; j++) {
            p.mask[1 * d.key_len + j] = 0;  // query row 1 sees no key
        }
        const Result got =
            mha::problems::run_module(mha::problems::make_module(p, device()), p, true);
        for (int64_t h = 0; h < d.num_heads; h++) {
            for (int64_t j = 0; j < d.key_len; j++) {
                EXPECT_NEAR(got.weights[(h * d.query_len + 1) * d.key_len + j], 1.0 / d.key_len,
                            1e-6);
            }
        }
        expect_matches_reference(p, got, true);
    }
}

// Halide copies a host buffer to the device only when it is marked host-dirty; a runtime that
// forgot would silently compute on stale device memory. New contents at the same addresses
// must give new results.
TEST_P(Gpu, HostInputsRewrittenInPlaceAreCopiedAgain) {
    const Dims d{2, 6, 6, 12, 3};
    Problem p = mha::problems::random_problem(d, mha::testing::next_seed());
    const auto module = mha::problems::make_module(p, device());
    expect_matches_reference(p, mha::problems::run_module(module, p, true), true);
    std::mt19937 rng(mha::testing::next_seed());
    std::uniform_real_distribution<float> u(-1, 1);
    for (auto *tensor : {&p.query, &p.key, &p.value}) {
        for (float &x : *tensor) {
            x = u(rng);  // same vectors, same addresses, new values
        }
    }
    expect_matches_reference(p, mha::problems::run_module(module, p, true), true);
}

// Key counts on both sides of the attention's key-tile edges (tiles of 16 keys; PoCL miscompiles
// a key tile wider than the block's threads, tests/gpu/opencl/idle_work_items.cl), with and without
// the weights.
TEST_P(Gpu, KeyCountsAcrossTileEdges) {
    for (int64_t keys : {1, 15, 16, 17, 31, 32, 33, 48, 49}) {
        SCOPED_TRACE(keys);
        const Problem p =
            mha::problems::random_problem({1, 9, keys, 64, 1}, mha::testing::next_seed());
        const auto module = mha::problems::make_module(p, device());
        expect_matches_reference(p, mha::problems::run_module(module, p, false), false);
        expect_matches_reference(p, mha::problems::run_module(module, p, true), true);
    }
}

// A module of a 16-bit dtype runs that dtype's kernels, on 16-bit tensors as they are and on f32
// ones rounded to it on the host (as the reference rounds them).
TEST_P(Gpu, SixteenBitModules) {
    for (mha::DType dtype : {mha::DType::bf16, mha::DType::f16}) {
        SCOPED_TRACE(mha::contract::dtype_name(dtype));
        Problem p = mha::problems::random_problem({2, 7, 9, 24, 3}, mha::testing::next_seed());
        p.dtype = dtype;
        const auto module = mha::problems::make_module(p, device());
        const mha::Tensor query = mha::problems::query_view(p);
        const mha::Tensor key = mha::problems::key_view(p);
        const mha::Tensor value = mha::problems::value_view(p);
        const std::string kernel = module.kernel_name(query, key, value);
        EXPECT_EQ(kernel.substr(kernel.rfind('_') + 1), mha::contract::dtype_name(dtype)) << kernel;
        expect_matches_reference(p, mha::problems::run_module(module, p, true), true);
        std::vector<float> output(p.query.size());
        module.forward(query, key, value, {output.data(), query.shape});
        EXPECT_LT(mha::reference::relative_l2(output, mha::reference::forward(p).output),
                  kTolerance);
    }
}

// A Halide-managed device buffer: a cl_mem or a CUDA device pointer, as a user would hold one.
// Dimensions innermost first; f32 elements, or the bits of bf16 or f16 (uint16_t).
template <typename Element = float>
struct DeviceTensor {
    Device device;
    Halide::Runtime::Buffer<Element> buffer;
    DeviceTensor(Device device, std::vector<Element> &host, const std::vector<int> &extents)
        : device(device), buffer(host.data(), extents) {
        buffer.set_host_dirty();
        EXPECT_EQ(buffer.copy_to_device(device == Device::cuda ? halide_cuda_device_interface()
                                                               : halide_opencl_device_interface()),
                  0);
    }
    uint64_t handle() {
        return device == Device::cuda ? halide_cuda_get_device_ptr(nullptr, buffer.raw_buffer())
                                      : halide_opencl_get_cl_mem(nullptr, buffer.raw_buffer());
    }
    void read_back() {
        buffer.set_device_dirty();
        EXPECT_EQ(buffer.copy_to_host(), 0);
    }
};

TEST_P(Gpu, DeviceResidentTensorsAreUsedInPlace) {
    const Dims d{2, 5, 9, 16, 4};
    const Problem p = mha::problems::random_problem(d, mha::testing::next_seed());
    const auto module = mha::problems::make_module(p, device());
    std::vector<float> query = p.query, key = p.key, value = p.value;
    std::vector<float> output(d.batch * d.query_len * d.embed_dim, NAN);
    std::vector<float> weights(d.batch * d.num_heads * d.query_len * d.key_len, NAN);
    const int B = d.batch, Sq = d.query_len, Sk = d.key_len, E = d.embed_dim, H = d.num_heads;
    DeviceTensor<> q(device(), query, {E, Sq, B}), k(device(), key, {E, Sk, B});
    DeviceTensor<> v(device(), value, {E, Sk, B}), out(device(), output, {E, Sq, B});
    DeviceTensor<> w(device(), weights, {Sk, Sq, H, B});
    // Only device handles: the library never sees these host arrays.
    module.forward({nullptr, {B, Sq, E}, q.handle()}, {nullptr, {B, Sk, E}, k.handle()},
                   {nullptr, {B, Sk, E}, v.handle()}, {nullptr, {B, Sq, E}, out.handle()},
                   std::nullopt, mha::MutableTensor{nullptr, {B, H, Sq, Sk}, w.handle()});
    out.read_back();
    w.read_back();
    expect_matches_reference(p, {output, weights}, true);
}
// A bf16 module's kernels read device-resident bf16 inputs in place; the output is f32 on the
// device. A bf16 output there cannot be converted (the kernels write f32): a clear error.
TEST_P(Gpu, DeviceResidentSixteenBitInputs) {
    const Dims d{2, 5, 9, 16, 4};
    Problem p = mha::problems::random_problem(d, mha::testing::next_seed());
    p.dtype = mha::DType::bf16;
    const auto module = mha::problems::make_module(p, device());
    using mha::reference::bits_of;
    std::vector<uint16_t> query = bits_of(p.query, p.dtype), key = bits_of(p.key, p.dtype);
    std::vector<uint16_t> value = bits_of(p.value, p.dtype);
    std::vector<float> output(d.batch * d.query_len * d.embed_dim, NAN);
    const int B = d.batch, Sq = d.query_len, Sk = d.key_len, E = d.embed_dim;
    DeviceTensor<uint16_t> q(device(), query, {E, Sq, B}), k(device(), key, {E, Sk, B});
    DeviceTensor<uint16_t> v(device(), value, {E, Sk, B});
    DeviceTensor<> out(device(), output, {E, Sq, B});
    const auto on_device = [](DeviceTensor<uint16_t> &t, std::vector<int64_t> shape) {
        return mha::BF16Tensor{nullptr, std::move(shape), t.handle()};
    };
    module.forward(on_device(q, {B, Sq, E}), on_device(k, {B, Sk, E}), on_device(v, {B, Sk, E}),
                   mha::MutableTensor{nullptr, {B, Sq, E}, out.handle()});
    out.read_back();
    expect_matches_reference(p, {output, {}}, false);
    try {
        module.forward(on_device(q, {B, Sq, E}), on_device(k, {B, Sk, E}), on_device(v, {B, Sk, E}),
                       mha::MutableBF16Tensor{nullptr, {B, Sq, E}, out.handle()});
        FAIL() << "no error for a device-resident bf16 output";
    } catch (const mha::Error &e) {
        EXPECT_STREQ(e.what(),
                     "output has a device_handle but the kernels write f32, which 16-bit outputs "
                     "are converted from on the host");
    }
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
        mha::problems::make_module(mha::problems::random_problem({1, 2, 2, 8, 2}, 1),
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
    const Problem p = mha::problems::random_problem({1, 9, 9, 16, 2}, 1);
    const auto module = mha::problems::make_module(p, Device::opencl);
    try {
        mha::problems::run_module(module, p, false);
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
    const Problem p = mha::problems::random_problem({1, 4, 4, 64, 1}, mha::testing::next_seed());
    const auto module = mha::problems::make_module(p, Device::opencl);
    const int64_t rows = (int64_t(1) << 20) + 64, E = 64;  // 256 MiB + 16 KiB
    std::vector<float> large(rows * E, 0.5f), output(rows * E);
    try {
        module.forward({large.data(), {1, rows, E}}, mha::problems::key_view(p),
                       mha::problems::value_view(p), {output.data(), {1, rows, E}});
        FAIL() << "no error from a query larger than the device's largest allocation";
    } catch (const mha::Error &e) {
        EXPECT_PRED2(contains, e.what(), "copying query to the opencl device failed");
        EXPECT_PRED2(contains, e.what(), "CL_INVALID_BUFFER_SIZE");
    }
    expect_matches_reference(p, mha::problems::run_module(module, p, true), true);
}

TEST(Cuda, WithoutADriverConstructionFailsClearly) {
    if (cuda_driver_present()) {
        GTEST_SKIP() << "a CUDA driver is present on this machine";
    }
    const Problem p = mha::problems::random_problem({1, 2, 2, 8, 2}, 1);
    try {
        mha::problems::make_module(p, Device::cuda);
        FAIL() << "no error without a CUDA driver";
    } catch (const mha::Error &e) {
        EXPECT_STREQ(e.what(), "no cuda driver found: libcuda.so.1 could not be loaded");
    }
}

INSTANTIATE_TEST_SUITE_P(Devices, Gpu, kGpuDevices, device_label);

TEST(CpuModule, RejectsDeviceHandles) {
    const Problem p = mha::problems::random_problem({1, 2, 2, 8, 2}, 1);
    const auto module = mha::problems::make_module(p);
    std::vector<float> out(16);
    try {
        module.forward({nullptr, {1, 2, 8}, 0x1234}, mha::problems::key_view(p),
                       mha::problems::value_view(p), {out.data(), {1, 2, 8}});
        FAIL() << "no error";
    } catch (const mha::Error &e) {
        EXPECT_STREQ(e.what(), "query has a device_handle but the module runs on the cpu");
    }
}

}  // namespace
