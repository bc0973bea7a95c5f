#include "packed_weights.h"

#include "device.h"
#include "dtype.h"

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

// The bf16 or f16 bits of `x`, whose values that type holds (the module rounded its weights).
std::vector<uint16_t> bits_of(const std::vector<float> &x, DType dtype) {
    std::vector<uint16_t> bits(x.size());
    static_assert(sizeof(bfloat16) == sizeof(uint16_t) && sizeof(float16) == sizeof(uint16_t));
    if (dtype == DType::bf16) {
        convert(x.data(), reinterpret_cast<bfloat16 *>(bits.data()), int64_t(x.size()));
    } else {
        convert(x.data(), reinterpret_cast<float16 *>(bits.data()), int64_t(x.size()));
    }
    return bits;
}

}  // namespace

PackedWeights::PackedWeights(int64_t E, int64_t num_heads, const Linear *linears[4],
                             const KernelComponent *gpu, DType kernel_dtype, DType step_dtype)
    : embed_dim(E), kernel_dtype(kernel_dtype), step_dtype(step_dtype) {
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

    // Panels of `features` output features over `in` input features from `first`, of `type`.
    const auto panels = [&](std::array<std::optional<HostBuffer>, contract::kArgCount> &to,
                            ArgId id, const void *first, halide_type_t type, int64_t features,
                            int64_t in) {
        to[size_t(id)] = view_buffer(first, type, {features / kWeightPanel, in, kWeightPanel},
                                     {in * kWeightPanel, kWeightPanel, 1});
    };
    const auto row = [&](ArgId id, const float *first, int64_t features) {
        buffers[size_t(id)] = view_buffer(first, halide_type_of<float>(), {features}, {1});
    };
    // The projections' panels from the stacked q, k, v ones and out's, in f32 or 16-bit bits.
    const ArgId weight_ids[] = {ArgId::q_weight, ArgId::k_weight, ArgId::v_weight};
    const auto all_panels = [&](std::array<std::optional<HostBuffer>, contract::kArgCount> &to,
                                const auto *qkv, const auto *out, halide_type_t type) {
        if (stacked()) {
            panels(to, ArgId::qkv_weight, qkv, type, P + 2 * Pkv, E);
        }
        for (int p = 0; p < projections; p++) {
            panels(to, weight_ids[p], qkv + first_panel[p], type, widths[p], in_features[p]);
        }
        panels(to, ArgId::out_weight, out, type, P, E);
    };
    all_panels(buffers, qkv_panels.data(), out_panels.data(), halide_type_of<float>());
    if (stacked()) {
        row(ArgId::qkv_bias, qkv_bias.data(), P + 2 * Pkv);
    }
    const ArgId bias_ids[] = {ArgId::q_bias, ArgId::k_bias, ArgId::v_bias};
    for (int p = 0; p < projections; p++) {
        row(bias_ids[p], qkv_bias.data() + contract::qkv_block_offset(p, P, Pkv), widths[p]);
    }
    row(ArgId::out_bias, out_bias.data(), P);

    // The f32 panels' values in `dtype`, for `op`'s kernels on `device`.
    const auto narrow_panels = [&](DType dtype, contract::KernelOp op, Device device) {
        const std::vector<uint16_t> &qkv = narrow_weights.emplace_back(bits_of(qkv_panels, dtype));
        const std::vector<uint16_t> &out = narrow_weights.emplace_back(bits_of(out_panels, dtype));
        contract::KernelVariant narrow{op};
        narrow.dtype = dtype;
        const halide_type_t type =
            contract::halide_type(contract::arg_type(ArgId::out_weight, narrow, device));
        return std::tuple{qkv.data(), out.data(), type};
    };
    if (gpu == nullptr && step_dtype == DType::f32) {
        step_qkv_panels = buffers[size_t(ArgId::qkv_weight)];
        step_out_panels = buffers[size_t(ArgId::out_weight)];
    } else if (gpu == nullptr && stacked()) {
        const auto [qkv, out, type] =
            narrow_panels(step_dtype, contract::KernelOp::decode, Device::cpu);
        std::array<std::optional<HostBuffer>, contract::kArgCount> step;
        all_panels(step, qkv, out, type);
        step_qkv_panels = step[size_t(ArgId::qkv_weight)];
        step_out_panels = step[size_t(ArgId::out_weight)];
    }
    if (kernel_dtype != DType::f32 && gpu != nullptr) {
        const auto [qkv, out, type] =
            narrow_panels(kernel_dtype, contract::KernelOp::forward, gpu->device);
        all_panels(narrow_buffers, qkv, out, type);
    } else if (kernel_dtype == DType::bf16) {
        const auto tile_buffer = [&](ArgId id, const std::vector<uint16_t> &t) {
            const int64_t width = contract::kBf16TileWidth;
            narrow_buffers[size_t(id)] =
                view_buffer(t.data(), halide_type_of<bfloat16>(),
                            {int64_t(t.size()) / (2 * width), width, 2}, {2 * width, 2, 1});
        };
        if (stacked()) {
            tile_buffer(ArgId::qkv_weight,
                        narrow_weights.emplace_back(bf16_tiles(
                            {{linears[0], P}, {linears[1], Pkv}, {linears[2], Pkv}}, E)));
        }
        for (int p = 0; p < projections; p++) {
            tile_buffer(weight_ids[p], narrow_weights.emplace_back(
                                           bf16_tiles({{linears[p], widths[p]}}, in_features[p])));
        }
        tile_buffer(ArgId::out_weight,
                    narrow_weights.emplace_back(bf16_tiles({{linears[3], P}}, E)));
    }

    if (gpu != nullptr) {
        for (size_t id = 0; id < contract::kArgCount; id++) {
            std::optional<HostBuffer> &b = narrow_buffers[id] ? narrow_buffers[id] : buffers[id];
            if (b) {
                CallContext context;
                place_on_device(*b, 0, /*is_input=*/true, *gpu, context, "the module's weights");
            }
        }
    }
}

}  // namespace mha::detail
