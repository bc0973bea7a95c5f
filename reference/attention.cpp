#include "attention.h"

#include <cmath>
#include <limits>

namespace mha::reference {
namespace {

// Element (b, h, i, j) of a tensor whose shape broadcasts, right-aligned, to [B, H, Sq, Sk]: a
// size-1 dimension reads index 0.
int64_t broadcast_index(const std::vector<int64_t> &shape, const int64_t (&index)[4]) {
    const size_t offset = 4 - shape.size();
    int64_t flat = 0;
    for (size_t d = 0; d < shape.size(); d++) {
        flat = flat * shape[d] + (shape[d] == 1 ? 0 : index[offset + d]);
    }
    return flat;
}

}  // namespace

bool sees(const AttentionProblem &p, int64_t i, int64_t j) {
    const int64_t diagonal = i + (p.causal == Causal::top_left ? 0 : p.key_len - p.query_len);
    if (p.causal != Causal::none && j > diagonal) {
        return false;
    }
    if (p.window_left >= 0 && j < diagonal - p.window_left) {
        return false;
    }
    return p.window_right < 0 || j <= diagonal + p.window_right;
}

AttentionResult attention(const AttentionProblem &p) {
    const int64_t B = p.batch, H = p.heads, Sq = p.query_len, Sk = p.key_len;
    const int64_t d = p.head_dim, dv = p.value_dim, group = p.heads / p.kv_heads;
    const double scale = p.scale ? *p.scale : 1.0 / std::sqrt(double(d));
    const double infinity = std::numeric_limits<double>::infinity();
    AttentionResult r;
    r.output.assign(B * H * Sq * dv, 0.0);
    r.lse.assign(B * H * Sq, -infinity);
    std::vector<double> score(Sk);
    std::vector<bool> counts(Sk);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < Sq; i++) {
                const int64_t kv = b * p.kv_heads + h / group;
                double max = -infinity;
                bool nan = false;
                for (int64_t j = 0; j < Sk; j++) {
                    counts[j] = sees(p, i, j);
                    double s = 0;
                    for (int64_t c = 0; c < d; c++) {
                        s += double(p.query[((b * H + h) * Sq + i) * d + c]) *
                             double(p.key[(kv * Sk + j) * d + c]);
                    }
                    s *= scale;
                    if (p.softcap > 0) {
                        s = p.softcap * std::tanh(s / p.softcap);
                    }
                    if (!p.alibi_slopes.empty()) {
                        s -= p.alibi_slopes[h] * std::abs(double(i + Sk - Sq - j));
                    }
                    if (!p.mask_shape.empty()) {
                        const int64_t at = broadcast_index(p.mask_shape, {b, h, i, j});
                        if (!p.mask_is_bool) {
                            s += p.floats[at];
                        } else if ((p.bools[at] != 0) != (p.convention == MaskConvention::keep)) {
                            counts[j] = false;
                        }
                    }
                    score[j] = s;
                    if (counts[j]) {
                        nan = nan || std::isnan(s);
                        max = std::isnan(s) ? max : std::max(max, s);
                    }
                }
                double *out = &r.output[((b * H + h) * Sq + i) * dv];
                if (nan) {
                    std::fill(out, out + dv, std::nan(""));
                    r.lse[(b * H + h) * Sq + i] = std::nan("");
                    continue;
                }
                if (max == -infinity) {  // no key weighs: zeros, as SDPA gives
                    continue;
                }
                double sum = 0;
                for (int64_t j = 0; j < Sk; j++) {
                    score[j] = counts[j] ? std::exp(score[j] - max) : 0.0;
                    sum += score[j];
                }
                for (int64_t j = 0; j < Sk; j++)
                    for (int64_t c = 0; c < dv; c++) {
                        out[c] += score[j] / sum * double(p.value[(kv * Sk + j) * dv + c]);
                    }
                r.lse[(b * H + h) * Sq + i] = max + std::log(sum);
            }
    return r;
}

}  // namespace mha::reference
