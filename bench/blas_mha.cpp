#include "blas_mha.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>

namespace mha::bench {
namespace {

// y[rows, E] = x[rows, E]·Wᵀ + b, W in nn.Linear [out, in] layout.
void linear(const float *x, int64_t rows, int64_t E, const float *w, const float *b, float *y) {
    for (int64_t r = 0; r < rows; r++) {
        std::copy(b, b + E, y + r * E);
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, E, E, 1.0f, x, E, w, E, 1.0f, y, E);
}

// Row-wise softmax, written so that the compiler vectorizes each loop (-O3 -ffast-math).
void softmax_rows(float *s, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        float *row = s + r * cols;
        float max = row[0];
        for (int64_t j = 1; j < cols; j++) {
            max = std::max(max, row[j]);
        }
        float sum = 0;
        for (int64_t j = 0; j < cols; j++) {
            row[j] = std::exp(row[j] - max);
            sum += row[j];
        }
        const float inv = 1.0f / sum;
        for (int64_t j = 0; j < cols; j++) {
            row[j] *= inv;
        }
    }
}

}  // namespace

BlasMultiHeadAttention::BlasMultiHeadAttention(const reference::Problem &p) : d_(p.dims), p_(p) {
    const int64_t E = d_.embed_dim;
    q_.resize(d_.batch * d_.query_len * E);
    k_.resize(d_.batch * d_.key_len * E);
    v_.resize(d_.batch * d_.key_len * E);
    context_.resize(d_.batch * d_.query_len * E);
    scores_.resize(d_.query_len * d_.key_len);
}

void BlasMultiHeadAttention::forward(const float *query, const float *key, const float *value,
                                     float *output, float *weights) {
    const int64_t B = d_.batch, Sq = d_.query_len, Sk = d_.key_len, E = d_.embed_dim;
    const int64_t H = d_.num_heads, hd = d_.head_dim();
    linear(query, B * Sq, E, p_.weight[0].data(), p_.bias[0].data(), q_.data());
    linear(key, B * Sk, E, p_.weight[1].data(), p_.bias[1].data(), k_.data());
    linear(value, B * Sk, E, p_.weight[2].data(), p_.bias[2].data(), v_.data());
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    for (int64_t b = 0; b < B; b++) {
        for (int64_t h = 0; h < H; h++) {
            // Heads are column slices of the projections: no split copy, leading dimension E.
            float *s = weights ? weights + ((b * H + h) * Sq) * Sk : scores_.data();
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, Sq, Sk, hd, scale,
                        q_.data() + b * Sq * E + h * hd, E, k_.data() + b * Sk * E + h * hd, E,
                        0.0f, s, Sk);
            softmax_rows(s, Sq, Sk);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, Sq, hd, Sk, 1.0f, s, Sk,
                        v_.data() + b * Sk * E + h * hd, E, 0.0f,
                        context_.data() + b * Sq * E + h * hd, E);
        }
    }
    linear(context_.data(), B * Sq, E, p_.weight[3].data(), p_.bias[3].data(), output);
}

}  // namespace mha::bench
