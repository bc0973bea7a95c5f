#include "packed_weights.h"

#include "device.h"

namespace mha::detail {
namespace {

using contract::ArgId;
using contract::kWeightPanel;

// Writes Wᵀ of one nn.Linear [out_features, in_features] into `block`, panel-major [panels]
// [in_features][kWeightPanel], and its bias into `bias`.
void pack_linear(const Linear &lin, int64_t in_features, float *block, float *bias) {
    for (int64_t out = 0; out < lin.weight.shape[0]; out++) {
        float *panel = block + (out / kWeightPanel) * in_features * kWeightPanel;
        for (int64_t in = 0; in < in_features; in++) {
            panel[in * kWeightPanel + out % kWeightPanel] = lin.weight.data[out * in_features + in];
        }
        bias[out] = lin.bias ? lin.bias->data[out] : 0.0f;
    }
}

// Writes the nn.Linear layers of `blocks`, one after the other along the output features, each
// padded to its width, as bf16 tiles over `in_features` (contract::kBf16TileDepth): (pair, lane,
// panel x pairs + p) = W[panel x 16 + lane][2 p + pair].
std::vector<uint16_t> bf16_tiles(const std::vector<std::pair<const Linear *, int64_t>> &blocks,
                                 int64_t in_features) {
    const int64_t width = contract::kBf16TileWidth, pairs = contract::bf16_tile_pairs(in_features);
    int64_t rows = 0;
    for (const auto &[lin, padded_width] : blocks) {
        rows += padded_width;
    }
    std::vector<uint16_t> tiles(size_t(2 * width * (rows / width) * pairs), 0);
    int64_t first = 0;
    for (const auto &[lin, padded_width] : blocks) {
        for (int64_t out = 0; out < lin->weight.shape[0]; out++) {
            const int64_t row = first + out, panel = row / width, lane = row % width;
            for (int64_t in = 0; in < in_features; in++) {
                tiles[size_t(((panel * pairs + in / 2) * width + lane) * 2 + in % 2)] =
                    to_bfloat16(lin->weight.data[out * in_features + in]).bits;
            }
        }
        first += padded_width;
    }
    return tiles;
}

}  // namespace

PackedWeights::PackedWeights(int64_t E, int64_t num_heads, const Linear *linears[4],
                             const KernelComponent *gpu, bool with_bf16_tiles)
    : embed_dim(E) {
    const int64_t d = E / num_heads;
    for (int p = 0; p < 4; p++) {
        in_features[p] = linears[p]->weight.shape[1];
        out_features[p] = linears[p]->weight.shape[0];
    }
    padded = contract::padded_features(E, d);
    padded_kv = contract::padded_features(out_features[1], d);
    const int64_t P = padded, Pkv = padded_kv;
    const int projections = contract::kQkvProjections;
    const std::array<int64_t, 3> widths = {P, Pkv, Pkv};
    // Projection p's panels start after those of the projections before it; with equal input
    // features that is qkv_block_offset(p, P, Pkv) · E, the fused kernels' stacking.
    std::array<int64_t, 3> first_panel{};
    for (int p = 1; p < projections; p++) {
        first_panel[p] = first_panel[p - 1] + widths[p - 1] * in_features[p - 1];
    }
    qkv_panels.assign(first_panel[2] + Pkv * in_features[2], 0.0f);
    qkv_bias.assign(P + 2 * Pkv, 0.0f);
    for (int p = 0; p < projections; p++) {
        pack_linear(*linears[p], in_features[p], qkv_panels.data() + first_panel[p],
                    qkv_bias.data() + contract::qkv_block_offset(p, P, Pkv));
    }
    out_panels.assign(P * E, 0.0f);
    out_bias.assign(P, 0.0f);
    pack_linear(*linears[3], E, out_panels.data(), out_bias.data());

    const auto f32 = halide_type_of<float>();
    const auto panels = [&](ArgId id, const float *first, int64_t features, int64_t in) {
        buffers[size_t(id)] = view_buffer(first, f32, {features / kWeightPanel, in, kWeightPanel},
                                          {in * kWeightPanel, kWeightPanel, 1});
    };
    const auto row = [&](ArgId id, const float *first, int64_t features) {
        buffers[size_t(id)] = view_buffer(first, f32, {features}, {1});
    };
    if (stacked()) {
        panels(ArgId::qkv_weight, qkv_panels.data(), P + 2 * Pkv, E);
        row(ArgId::qkv_bias, qkv_bias.data(), P + 2 * Pkv);
    }
    const ArgId weight_ids[] = {ArgId::q_weight, ArgId::k_weight, ArgId::v_weight};
    const ArgId bias_ids[] = {ArgId::q_bias, ArgId::k_bias, ArgId::v_bias};
    for (int p = 0; p < projections; p++) {
        panels(weight_ids[p], qkv_panels.data() + first_panel[p], widths[p], in_features[p]);
        row(bias_ids[p], qkv_bias.data() + contract::qkv_block_offset(p, P, Pkv), widths[p]);
    }
    panels(ArgId::out_weight, out_panels.data(), P, E);
    row(ArgId::out_bias, out_bias.data(), P);

    if (with_bf16_tiles) {
        const auto tile_buffer = [&](ArgId id, const std::vector<uint16_t> &t) {
            const int64_t width = contract::kBf16TileWidth;
            tile_buffers[size_t(id)] =
                view_buffer(t.data(), halide_type_of<bfloat16>(),
                            {int64_t(t.size()) / (2 * width), width, 2}, {2 * width, 2, 1});
        };
        if (stacked()) {
            qkv_tiles = bf16_tiles({{linears[0], P}, {linears[1], Pkv}, {linears[2], Pkv}}, E);
            tile_buffer(ArgId::qkv_weight, qkv_tiles);
        }
        for (int p = 0; p < projections; p++) {
            projection_tiles[p] = bf16_tiles({{linears[p], widths[p]}}, in_features[p]);
            tile_buffer(weight_ids[p], projection_tiles[p]);
        }
        projection_tiles[3] = bf16_tiles({{linears[3], P}}, E);
        tile_buffer(ArgId::out_weight, projection_tiles[3]);
    }

    if (gpu != nullptr) {
        for (std::optional<HostBuffer> &b : buffers) {
            if (b) {
                CallContext context;
                place_on_device(*b, 0, /*is_input=*/true, *gpu, context, "the module's weights");
            }
        }
    }
}

}  // namespace mha::detail
