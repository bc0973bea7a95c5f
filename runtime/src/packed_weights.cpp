#include "packed_weights.h"

#include <fmt/format.h>

#include "device.h"
#include "kernel_abi.h"

namespace mha::detail {
namespace {

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

PackedWeights::PackedWeights(int64_t E, int64_t num_heads, const Linear *linears[4], Device dev)
    : embed_dim(E), padded(padded_features(E, num_heads)), device(dev) {
    const int64_t P = padded;
    qkv_panels.assign(3 * P * E, 0.0f);
    qkv_bias.assign(3 * P, 0.0f);
    for (int p = 0; p < 3; p++) {
        pack_linear(*linears[p], E, p * P, qkv_panels, qkv_bias);
    }
    out_panels.assign(P * E, 0.0f);
    out_bias.assign(P, 0.0f);
    pack_linear(*linears[3], E, 0, out_panels, out_bias);

    const auto f32 = halide_type_of<float>();
    const auto panels = [&](const char *name, const float *first, int64_t features) {
        views.push_back({name, std::make_unique<BufferView>(
                                   first, f32, std::vector<int64_t>{features / kWeightPanel, E, kWeightPanel},
                                   std::vector<int64_t>{E * kWeightPanel, kWeightPanel, 1})});
    };
    const auto row = [&](const char *name, const float *first, int64_t features) {
        views.push_back({name, std::make_unique<BufferView>(first, f32, std::vector<int64_t>{features},
                                                            std::vector<int64_t>{1})});
    };
    panels("qkv_weight", qkv_panels.data(), 3 * P);
    row("qkv_bias", qkv_bias.data(), 3 * P);
    const char *const weight_names[3] = {"q_weight", "k_weight", "v_weight"};
    const char *const bias_names[3] = {"q_bias", "k_bias", "v_bias"};
    for (int p = 0; p < 3; p++) {
        panels(weight_names[p], qkv_panels.data() + p * P * E, P);
        row(bias_names[p], qkv_bias.data() + p * P, P);
    }
    panels("out_weight", out_panels.data(), P);
    row("out_bias", out_bias.data(), P);

    if (device != Device::cpu) {
        const halide_device_interface_t *interface = device_interface(device);
        CallContext context;
        for (Named &n : views) {
            halide_buffer_t *b = n.view->raw();
            b->flags |= halide_buffer_flag_host_dirty;
            check_halide(halide_copy_to_device(&context, b, interface), context,
                         fmt::format("uploading {} to the {} device", n.name, device_name(device)));
        }
    }
}

PackedWeights::~PackedWeights() {
    CallContext context;
    for (Named &n : views) {
        halide_device_free(&context, n.view->raw());
    }
}

}  // namespace mha::detail
