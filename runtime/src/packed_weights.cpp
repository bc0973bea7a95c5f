#include "packed_weights.h"

#include "device.h"

namespace mha::detail {
namespace {

using contract::ArgId;
using contract::kWeightPanel;

// Writes Wᵀ of one nn.Linear as output features [column, column + E) of a panel-major block of
// `panels` x [E, kWeightPanel], and its bias at the same offset.
void pack_linear(const Linear &lin, int64_t E, int64_t column, std::vector<float> &panels,
                 std::vector<float> &bias) {
    for (int64_t out = 0; out < E; out++) {
        const int64_t feature = column + out;
        float *panel = panels.data() + (feature / kWeightPanel) * E * kWeightPanel;
        for (int64_t in = 0; in < E; in++) {
            panel[in * kWeightPanel + feature % kWeightPanel] = lin.weight.data[out * E + in];
        }
        bias[feature] = lin.bias ? lin.bias->data[out] : 0.0f;
    }
}

}  // namespace

PackedWeights::PackedWeights(int64_t E, int64_t num_heads, const Linear *linears[4],
                             const KernelComponent *gpu)
    : embed_dim(E), padded(contract::padded_features(E, E / num_heads)) {
    const int64_t P = padded;
    const int projections = contract::kQkvProjections;
    qkv_panels.assign(projections * P * E, 0.0f);
    qkv_bias.assign(projections * P, 0.0f);
    for (int p = 0; p < projections; p++) {
        pack_linear(*linears[p], E, contract::qkv_block_offset(p, P), qkv_panels, qkv_bias);
    }
    out_panels.assign(P * E, 0.0f);
    out_bias.assign(P, 0.0f);
    pack_linear(*linears[3], E, 0, out_panels, out_bias);

    const auto f32 = halide_type_of<float>();
    const auto panels = [&](ArgId id, const float *first, int64_t features) {
        buffers[size_t(id)] = view_buffer(first, f32, {features / kWeightPanel, E, kWeightPanel},
                                          {E * kWeightPanel, kWeightPanel, 1});
    };
    const auto row = [&](ArgId id, const float *first, int64_t features) {
        buffers[size_t(id)] = view_buffer(first, f32, {features}, {1});
    };
    panels(ArgId::qkv_weight, qkv_panels.data(), projections * P);
    row(ArgId::qkv_bias, qkv_bias.data(), projections * P);
    const ArgId weight_ids[] = {ArgId::q_weight, ArgId::k_weight, ArgId::v_weight};
    const ArgId bias_ids[] = {ArgId::q_bias, ArgId::k_bias, ArgId::v_bias};
    for (int p = 0; p < projections; p++) {
        const int64_t offset = contract::qkv_block_offset(p, P);
        panels(weight_ids[p], qkv_panels.data() + offset * E, P);
        row(bias_ids[p], qkv_bias.data() + offset, P);
    }
    panels(ArgId::out_weight, out_panels.data(), P);
    row(ArgId::out_bias, out_bias.data(), P);

    if (gpu != nullptr) {
        for (std::optional<HostBuffer> &b : buffers) {
            if (b) {
                CallContext context;
                place_on_device(*b, 0, /*is_input=*/true, *gpu, context);
            }
        }
    }
}

}  // namespace mha::detail
