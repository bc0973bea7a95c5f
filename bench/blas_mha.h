// The multi-head attention a C++ user writes by hand on a BLAS: cblas_sgemm for the projections
// and the per-head products, a vectorized softmax. A peer for the benchmarks, not a reference.
#pragma once

#include <cstdint>
#include <vector>

#include "reference.h"

namespace mha::bench {

class BlasMultiHeadAttention {
public:
    explicit BlasMultiHeadAttention(const reference::Problem &p);
    // weights: [B, H, Sq, Sk] when non-null; else one [Sq, Sk] scratch is reused per head.
    void forward(const float *query, const float *key, const float *value, float *output,
                 float *weights);

private:
    reference::Dims d_;
    const reference::Problem &p_;
    std::vector<float> q_, k_, v_, context_, scores_;
};

}  // namespace mha::bench
