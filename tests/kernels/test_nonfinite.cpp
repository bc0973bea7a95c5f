// NaN and Inf with PyTorch's meaning: a non-finite value in unmasked data reaches every output
// it touches (a key's scores make their softmax rows NaN), one at a masked score position never
// matters; the double-precision reference, which replaces blocked scores as PyTorch does, says
// where. On the CPU (every instruction set: this file runs under the ISA caps too) and on
// OpenCL in the programs that link its kernels.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <tuple>

#include "problems.h"
#include "test_seed.h"

namespace {

using mha::reference::Dims;
using mha::reference::Problem;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// Where the output and weights are NaN must be where the reference's are; the rest must match.
void expect_like_reference(const mha::MultiHeadAttention &module, const Problem &p,
                           const std::string &what) {
    SCOPED_TRACE(what);
    const auto got = mha::problems::run_module(module, p, true);
    const auto want = mha::reference::forward(p);
    // Per element: ten times the relative L2 bound (outputs: the dtype's), relative to 1 + |want|.
    for (const auto &[values, expected, tolerance] :
         {std::tuple{&got.output, &want.output, 10 * mha::reference::output_tolerance(p)},
          std::tuple{&got.weights, &want.weights, 1e-4}}) {
        ASSERT_EQ(values->size(), expected->size());
        for (size_t n = 0; n < values->size(); n++) {
            const bool want_finite = std::isfinite((*expected)[n]);
            ASSERT_EQ(std::isfinite((*values)[n]), want_finite)
                << "element " << n << ": " << (*values)[n] << ", reference " << (*expected)[n];
            if (want_finite) {
                ASSERT_NEAR((*values)[n], (*expected)[n],
                            tolerance * (1 + std::abs((*expected)[n])))
                    << "element " << n;
            }
        }
    }
}

struct Case {
    const char *name;
    std::function<void(Problem &)> poison;
    bool expect_nan;  // whether the reference's output has NaN at all (a sanity check)
};

class NonFinite : public ::testing::TestWithParam<mha::Device> {};

TEST_P(NonFinite, PropagateAsInPyTorch) {
    const Dims d{2, 5, 7, 12, 3};
    const int64_t E = d.embed_dim, Sk = d.key_len;
    const uint64_t seed = mha::testing::next_seed();
    const auto key_row = [&](Problem &p, int64_t b, int64_t j) {
        return &p.key[(b * Sk + j) * E];
    };
    const std::vector<Case> cases = {
        {"NaN in one query row", [&](Problem &p) { p.query[(1 * d.query_len + 2) * E + 4] = kNaN; },
         true},
        {"NaN in an unmasked key", [&](Problem &p) { key_row(p, 0, 3)[5] = kNaN; }, true},
        {"+Inf in an unmasked key", [&](Problem &p) { key_row(p, 1, 6)[0] = kInf; }, true},
        {"-Inf in an unmasked key", [&](Problem &p) { key_row(p, 1, 6)[0] = -kInf; }, true},
        {"NaN in a value", [&](Problem &p) { p.value[(0 * Sk + 1) * E + 7] = kNaN; }, true},
        {"NaN in a key the key padding mask hides",
         [&](Problem &p) {
             key_row(p, 0, 4)[2] = kNaN;
             key_row(p, 1, 4)[9] = kInf;
             p.key_padding_mask = mha::reference::TorchMask{true, {d.batch, Sk}, {}, {}};
             p.key_padding_mask->bools.assign(d.batch * Sk, 0);
             p.key_padding_mask->bools[0 * Sk + 4] = p.key_padding_mask->bools[1 * Sk + 4] = 1;
         },
         false},
        {"NaN in a key the causal order hides from early queries",
         [&](Problem &p) {
             key_row(p, 0, 6)[1] = kNaN;  // query i sees keys j <= i: rows 0..5 never see key 6
             p.causal = mha::Causal::top_left;
         },
         false},
        {"NaN in the query projection's weights", [&](Problem &p) { p.weight[0][3] = kNaN; }, true},
        {"Inf in the output projection's bias", [&](Problem &p) { p.bias[3][5] = kInf; }, true},
    };
    for (const Case &c : cases) {
        Problem p = mha::problems::random_problem(d, seed);
        c.poison(p);
        const auto want = mha::reference::forward(p);
        bool any_nan = false;
        for (double o : want.output) {
            any_nan = any_nan || !std::isfinite(o);
        }
        ASSERT_EQ(any_nan, c.expect_nan) << c.name;
        try {
            expect_like_reference(mha::problems::make_module(p, GetParam()), p, c.name);
        } catch (const mha::Error &e) {
            GTEST_SKIP() << e.what();  // no OpenCL device on this machine
        }
    }
}

// The CPU, and OpenCL when this program links its kernels.
std::vector<mha::Device> linked_devices() {
    std::vector<mha::Device> devices{mha::Device::cpu};
    for (const mha::KernelInfo &kernel : mha::linked_kernels()) {
        if (kernel.device == mha::Device::opencl) {
            devices.push_back(mha::Device::opencl);
            break;
        }
    }
    return devices;
}

INSTANTIATE_TEST_SUITE_P(Devices, NonFinite, ::testing::ValuesIn(linked_devices()),
                         [](const auto &info) {
                             return std::string(mha::contract::device_name(info.param));
                         });

}  // namespace
