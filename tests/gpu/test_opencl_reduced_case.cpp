// The reduced case of the PoCL miscompile that keeps the GPU schedule's key tiles as wide as its
// threads (opencl/idle_work_items.cl; docs/gpu-check.md), run on the first
// OpenCL device through the OpenCL API, so that the explanation stays checked: the kernel is
// right unoptimized and in a work-group without idle work-items, and PoCL 3.1 still gets it
// wrong with them. Any other OpenCL implementation must get it right. Each launch stages a value
// of its own: PoCL's lost stores leave the sums of whatever the local memory held, which after
// an earlier launch on the same worker thread may be that launch's right answer.
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace {

template <typename Handle, cl_int (*release)(Handle)>
struct Release {
    void operator()(Handle handle) const { release(handle); }
};
template <typename Handle, cl_int (*release)(Handle)>
using Owned = std::unique_ptr<std::remove_pointer_t<Handle>, Release<Handle, release>>;

void check(cl_int status, const char *call) {
    if (status != CL_SUCCESS) {
        throw std::runtime_error(fmt::format("{} failed with OpenCL error {}", call, status));
    }
}

std::string kernel_source() {
    std::ifstream file(MHA_IDLE_WORK_ITEMS_KERNEL);
    std::stringstream text;
    text << file.rdbuf();
    if (!file || text.str().empty()) {
        throw std::runtime_error(fmt::format("cannot read {}", MHA_IDLE_WORK_ITEMS_KERNEL));
    }
    return text.str();
}

class OpenClReducedCase : public ::testing::Test {
protected:
    void SetUp() override {
        cl_platform_id platform = nullptr;
        cl_uint platforms = 0;
        if (clGetPlatformIDs(1, &platform, &platforms) != CL_SUCCESS || platforms == 0 ||
            clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 1, &device_, nullptr) != CL_SUCCESS) {
            GTEST_SKIP() << "no OpenCL device";
        }
        size_t size = 0;
        check(clGetPlatformInfo(platform, CL_PLATFORM_VERSION, 0, nullptr, &size),
              "clGetPlatformInfo");
        platform_version_.resize(size);
        check(clGetPlatformInfo(platform, CL_PLATFORM_VERSION, size, platform_version_.data(),
                                nullptr),
              "clGetPlatformInfo");
        platform_version_.pop_back();  // the terminating NUL
        cl_int status = CL_SUCCESS;
        context_.reset(clCreateContext(nullptr, 1, &device_, nullptr, nullptr, &status));
        check(status, "clCreateContext");
        queue_.reset(clCreateCommandQueue(context_.get(), device_, 0, &status));
        check(status, "clCreateCommandQueue");
    }

    // The kernel built with `options` (it keeps its program alive).
    Owned<cl_kernel, clReleaseKernel> build(const std::string &options) {
        const std::string source = kernel_source();
        const char *text = source.c_str();
        cl_int status = CL_SUCCESS;
        Owned<cl_program, clReleaseProgram> program(
            clCreateProgramWithSource(context_.get(), 1, &text, nullptr, &status));
        check(status, "clCreateProgramWithSource");
        check(clBuildProgram(program.get(), 1, &device_, options.c_str(), nullptr, nullptr),
              "clBuildProgram");
        Owned<cl_kernel, clReleaseKernel> kernel(
            clCreateKernel(program.get(), "staged_row_sums", &status));
        check(status, "clCreateKernel");
        return kernel;
    }

    // The sums of one width x height work-group of `kernel` staging `value`.
    std::vector<int> staged_row_sums(cl_kernel kernel, size_t width, size_t height, int keys,
                                     int value) {
        cl_int status = CL_SUCCESS;
        std::vector<int> sums(width * height, -1);
        Owned<cl_mem, clReleaseMemObject> buffer(
            clCreateBuffer(context_.get(), CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                           sums.size() * sizeof(int), sums.data(), &status));
        check(status, "clCreateBuffer");
        cl_mem sums_arg = buffer.get();
        check(clSetKernelArg(kernel, 0, sizeof sums_arg, &sums_arg), "clSetKernelArg");
        check(clSetKernelArg(kernel, 1, sizeof keys, &keys), "clSetKernelArg");
        check(clSetKernelArg(kernel, 2, sizeof value, &value), "clSetKernelArg");
        const size_t size[2] = {width, height};
        check(clEnqueueNDRangeKernel(queue_.get(), kernel, 2, nullptr, size, size, 0, nullptr,
                                     nullptr),
              "clEnqueueNDRangeKernel");
        check(clEnqueueReadBuffer(queue_.get(), buffer.get(), CL_TRUE, 0, sums.size() * sizeof(int),
                                  sums.data(), 0, nullptr, nullptr),
              "clEnqueueReadBuffer");
        return sums;
    }

    // Whether every work-item of the kernel's 16 active columns returned keys * value, for each
    // key count, in a width x height group built with `options`; each launch a value of its own.
    void expect_sums(const std::string &options, size_t width, size_t height, bool right) {
        const Owned<cl_kernel, clReleaseKernel> kernel = build(options);
        for (int keys : {1, 2, 15, 16, 17, 31, 32, 33, 64}) {
            SCOPED_TRACE(fmt::format("{} keys, a {} x {} group, options '{}'", keys, width, height,
                                     options));
            const int value = ++launches_;
            const std::vector<int> sums = staged_row_sums(kernel.get(), width, height, keys, value);
            for (size_t i = 0; i < sums.size(); ++i) {
                if (i % width < 16) {
                    ASSERT_EQ(sums[i] == keys * value, right)
                        << "work-item (" << i % width << ", " << i / width << ") returned "
                        << sums[i] << " for " << keys * value;
                }
            }
        }
    }

    // "OpenCL 3.0 PoCL 3.1+debian  Linux, ..." for Debian 12's PoCL.
    bool is_pocl_3_1() const { return platform_version_.find("PoCL 3.1") != std::string::npos; }

    static inline int launches_ = 0;
    cl_device_id device_ = nullptr;
    std::string platform_version_;
    Owned<cl_context, clReleaseContext> context_;
    Owned<cl_command_queue, clReleaseCommandQueue> queue_;
};

TEST_F(OpenClReducedCase, RightWithoutIdleWorkItems) { expect_sums("", 16, 16, true); }

TEST_F(OpenClReducedCase, RightUnoptimized) { expect_sums("-cl-opt-disable", 32, 16, true); }

// The miscompile itself. Should this fail on PoCL 3.1, PoCL compiles the case right now, and the
// GPU schedule's key tiles may be measured wider (schedules/gpu_schedule.h).
TEST_F(OpenClReducedCase, IdleWorkItems) {
    SCOPED_TRACE(platform_version_);
    expect_sums("", 32, 16, !is_pocl_3_1());
}

}  // namespace
