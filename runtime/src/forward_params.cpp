#include "forward_params.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <string>
#include <tuple>
#include <vector>

#include "checks.h"

namespace mha::detail {
namespace {

const char *const kOnTheCpu = "the module runs on the cpu";

// The buffers a forward kernel makes from its arguments (every schedule rounds rows and
// features up by at most a tile of kMaxTile), and the mask's view at its full extent: Halide
// checks an input's extents as if it were dense, broadcast dimensions included.
void check_kernel_buffers(const ForwardParams &p, const PackedWeights &packed, const Tensor &query,
                          const Tensor &key, const ForwardOptions &options) {
    const int64_t B = p.batch, H = p.heads, Sq = p.query_len, Sk = p.key_len;
    const int64_t d = p.head_dim, tile = contract::kMaxTile;
    const int64_t P = packed.padded, Pkv = packed.padded_kv;
    const int64_t query_rows = contract::round_up(B * Sq, tile);
    const int64_t key_rows = contract::round_up(B * Sk, tile);
    const auto named = [](const char *what, const Tensor &t) {
        return [what, &t] {
            return fmt::format(what, shape_string(t.shape));
        };
    };
    if (packed.stacked()) {
        check_kernel_buffer({query_rows, P + 2 * Pkv}, sizeof(float),
                            named("the Q, K and V projections of query {}, rows x padded "
                                  "features,",
                                  query));
    }
    check_kernel_buffer({query_rows, P}, sizeof(float),
                        named("the projection of query {}, rows x padded features,", query));
    check_kernel_buffer({key_rows, Pkv}, sizeof(float),
                        named("the projection of key {}, rows x padded features,", key));
    check_kernel_buffer({B, p.kv_heads, contract::round_up(d, tile), key_rows + tile},
                        sizeof(float),
                        named("the keys of key {} split into heads, [B, heads, head_dim, Sk] "
                              "(padded),",
                              key));
    check_kernel_buffer({B, contract::round_up(Sq, tile), H, contract::round_up(d, tile)},
                        sizeof(float),
                        named("the attention context of query {}, [B, Sq, H, head_dim] "
                              "(padded),",
                              query));
    if (p.mask.kind == contract::MaskKind::none) {
        return;
    }
    const int64_t element_bytes = p.mask.kind == contract::MaskKind::bytes ? 1 : sizeof(float);
    check_kernel_buffer({B, H, Sq, Sk}, element_bytes, [&] {
        std::vector<std::string> masks;
        for (const auto &[given, name] :
             {std::pair{options.mask.has_value(), "mask"},
              {options.additive_mask.has_value(), "additive_mask"},
              {options.key_padding_mask.has_value(), "key_padding_mask"},
              {options.attn_mask.has_value(), "attn_mask"}}) {
            if (given) {
                masks.push_back(name);
            }
        }
        return fmt::format("{}, which the kernels read at [B, H, Sq, Sk] = [{}, {}, {}, {}],",
                           fmt::join(masks, " and "), B, H, Sq, Sk);
    });
}

// The weights output: per head [B, H, Sq, Sk], or averaged [B, Sq, Sk]; the per-head weights an
// average is taken over are the library's, so they must fit a kernel too.
void check_weights(const ForwardParams &p, const MutableTensor &weights) {
    const int64_t B = p.batch, Sq = p.query_len, Sk = p.key_len;
    if (p.average_weights) {
        check_view("weights", weights, 3, "[batch, query length, key length]");
        check_tensor("weights", weights, std::array{B, Sq, Sk});
        check_kernel_buffer({B, p.heads, Sq, Sk}, sizeof(float), [&] {
            return fmt::format(
                "averaged weights of [B, Sq, Sk] = [{}, {}, {}]: the per-head "
                "weights [B, H, Sq, Sk] they average",
                B, Sq, Sk);
        });
    } else {
        check_view("weights", weights, 4, "[batch, num_heads, query length, key length]");
        check_tensor("weights", weights, p.weights_shape());
    }
    if (p.device == Device::cpu) {
        check_on_host("weights", weights, kOnTheCpu);
    }
}

}  // namespace

ForwardParams check_forward(const PackedWeights &packed, int64_t num_heads, Device device,
                            const Tensor &query, const Tensor &key, const Tensor &value,
                            const ForwardOptions &options, DType kernel_dtype) {
    const char *layout = "[batch, sequence, embed_dim]";
    check_view("query", query, 3, layout);
    check_view("key", key, 3, layout);
    check_view("value", value, 3, layout);
    const int64_t B = query.shape[0];
    for (const auto &[name, t, features, what] :
         {std::tuple{"query", &query, packed.embed_dim, "embed_dim"},
          {"key", &key, packed.in_features[1], "kdim"},
          {"value", &value, packed.in_features[2], "vdim"}}) {
        if (t->shape[2] != features) {
            throw Error(fmt::format("{} has {} features but the module's {} is {}", name,
                                    t->shape[2], what, features));
        }
        if (t->shape[0] != B) {
            throw Error(
                fmt::format("{} has batch {} but query has batch {}", name, t->shape[0], B));
        }
    }
    if (value.shape[1] != key.shape[1]) {
        throw Error(fmt::format("key has {} rows but value has {}", key.shape[1], value.shape[1]));
    }
    if (options.causal != Causal::none && options.causal != Causal::top_left &&
        options.causal != Causal::bottom_right) {
        throw Error(fmt::format("causal {} is none of none, top_left and bottom_right",
                                int(options.causal)));
    }
    ForwardParams p{};
    p.batch = B;
    p.query_len = query.shape[1];
    p.key_len = key.shape[1];
    p.heads = num_heads;
    p.head_dim = packed.embed_dim / num_heads;
    p.kv_heads = packed.out_features[1] / p.head_dim;
    p.device = device;
    p.kernel_dtype = kernel_dtype;
    p.causal = options.causal;
    // Sq and Sk pass the kernels' 32-bit size checks below, so their difference fits.
    p.causal_offset = options.causal == Causal::bottom_right ? int32_t(p.key_len - p.query_len) : 0;
    p.mask = resolve_masks(options, p.weights_shape());
    check_kernel_buffers(p, packed, query, key, options);
    if (device == Device::cpu) {
        check_on_host("query", query, kOnTheCpu);
        check_on_host("key", key, kOnTheCpu);
        check_on_host("value", value, kOnTheCpu);
        if (p.mask.device_handle != 0) {
            throw Error(fmt::format("a mask has a device_handle but {}", kOnTheCpu));
        }
    }
    p.self_attention = packed.stacked() && query.data == key.data && query.data == value.data &&
                       query.device_handle == key.device_handle &&
                       query.device_handle == value.device_handle && query.shape == key.shape &&
                       query.shape == value.shape;
    p.returns_weights = options.weights.has_value();
    p.average_weights = p.returns_weights && options.average_weights;
    if (options.weights) {
        check_weights(p, *options.weights);
    }
    return p;
}

}  // namespace mha::detail
