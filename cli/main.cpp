// mha: runs the compiled multi-head attention kernels on random inputs, prints the dimension flow
// stage by stage, the error against the double-precision reference and the forward pass's time.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <map>
#include <string>
#include <vector>

#include "mha/mha.h"
#include "reference.h"

namespace {

using mha::reference::Dims;

struct Options {
    Dims dims{2, 5, 5, 512, 8};  // the seed's example
    bool key_len_given = false;
    std::string mask = "none";   // none | keep | block
    mha::Device device = mha::Device::cpu;
    bool return_weights = true;
    bool check = true;
    int repeats = 50;
    uint64_t seed = 2024;
};

constexpr const char *kUsage = R"(usage: mha [options]
  --batch N        batch size B (default 2)
  --query-len N    query length Sq (default 5)
  --key-len N      key/value length Sk (default: Sq, self-attention)
  --embed-dim N    embedding dimension E (default 512)
  --heads N        number of heads H, dividing E (default 8)
  --mask KIND      none | keep (0 = blocked) | block (1 = blocked), shape [B, 1, Sq, Sk]
  --device D       cpu | cuda | opencl (default cpu)
  --no-weights     do not return the attention weights
  --no-check       skip the double-precision reference (for large shapes)
  --repeats N      timed forward passes (default 50)
  --seed N         random seed of inputs and weights (default 2024)
  --help           this text)";

class UsageError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

int64_t parse_positive(const std::string &flag, const char *text) {
    char *end = nullptr;
    errno = 0;
    const long long value = std::strtoll(text, &end, 10);
    if (end == text || *end != '\0' || errno != 0 || value < 1) {
        throw UsageError(fmt::format("{} '{}' is not a positive integer", flag, text));
    }
    return value;
}

Options parse(int argc, char **argv) {
    Options o;
    std::map<std::string, int64_t *> sizes = {
        {"--batch", &o.dims.batch},         {"--query-len", &o.dims.query_len},
        {"--key-len", &o.dims.key_len},     {"--embed-dim", &o.dims.embed_dim},
        {"--heads", &o.dims.num_heads}};
    for (int a = 1; a < argc; a++) {
        const std::string flag = argv[a];
        auto takes_value = [&]() -> const char * {
            if (a + 1 >= argc) {
                throw UsageError(fmt::format("{} needs a value", flag));
            }
            return argv[++a];
        };
        if (flag == "--help") {
            fmt::print("{}\n", kUsage);
            std::exit(0);
        } else if (auto it = sizes.find(flag); it != sizes.end()) {
            *it->second = parse_positive(flag, takes_value());
            o.key_len_given |= flag == "--key-len";
        } else if (flag == "--mask") {
            o.mask = takes_value();
            if (o.mask != "none" && o.mask != "keep" && o.mask != "block") {
                throw UsageError(
                    fmt::format("--mask '{}' is not one of none, keep, block", o.mask));
            }
        } else if (flag == "--device") {
            const std::string d = takes_value();
            const std::map<std::string, mha::Device> devices = {
                {"cpu", mha::Device::cpu}, {"cuda", mha::Device::cuda}, {"opencl", mha::Device::opencl}};
            if (devices.count(d) == 0) {
                throw UsageError(fmt::format("--device '{}' is not one of cpu, cuda, opencl", d));
            }
            o.device = devices.at(d);
        } else if (flag == "--no-weights") {
            o.return_weights = false;
        } else if (flag == "--no-check") {
            o.check = false;
        } else if (flag == "--repeats") {
            o.repeats = static_cast<int>(std::min<int64_t>(parse_positive(flag, takes_value()), 1 << 20));
        } else if (flag == "--seed") {
            o.seed = static_cast<uint64_t>(parse_positive(flag, takes_value()));
        } else {
            throw UsageError(fmt::format("unknown option '{}' (see --help)", flag));
        }
    }
    if (!o.key_len_given) {
        o.dims.key_len = o.dims.query_len;
    }
    return o;
}

std::string shape(std::initializer_list<int64_t> dims) {
    return fmt::format("[{}]", fmt::join(dims, ", "));
}

void print_dimension_flow(const Dims &d) {
    const int64_t B = d.batch, Sq = d.query_len, Sk = d.key_len, E = d.embed_dim;
    const int64_t H = d.num_heads, hd = d.head_dim();
    const bool self = Sq == Sk;
    fmt::print("dimension flow:\n");
    const auto line = [](const char *stage, const std::string &s) {
        fmt::print("  -> {:<22} {}\n", stage, s);
    };
    fmt::print("     {:<22} {}\n", "input",
               self ? shape({B, Sq, E}) : shape({B, Sq, E}) + " query, " + shape({B, Sk, E}) + " key/value");
    line("projected Q/K/V", self ? shape({B, Sq, E})
                                 : shape({B, Sq, E}) + " Q, " + shape({B, Sk, E}) + " K/V");
    line("heads", self ? shape({B, H, Sq, hd})
                       : shape({B, H, Sq, hd}) + " Q, " + shape({B, H, Sk, hd}) + " K/V");
    line("scores", shape({B, H, Sq, Sk}));
    line("softmax weights", shape({B, H, Sq, Sk}));
    line("per-head context", shape({B, H, Sq, hd}));
    line("merged", shape({B, Sq, E}));
    line("output", shape({B, Sq, E}));
}

int run(const Options &o) {
    const Dims &d = o.dims;
    const bool self = d.query_len == d.key_len && !o.key_len_given;
    mha::reference::Problem problem = mha::reference::random_problem(d, o.seed, self);
    if (o.mask != "none") {
        mha::reference::add_random_mask(
            problem, o.mask == "keep" ? mha::MaskConvention::keep : mha::MaskConvention::block,
            {d.batch, 1, d.query_len, d.key_len}, o.seed + 1);
    }
    const mha::MultiHeadAttention module = mha::reference::make_module(problem, o.device);

    std::vector<float> output(d.batch * d.query_len * d.embed_dim);
    std::vector<float> weights(o.return_weights ? d.batch * d.num_heads * d.query_len * d.key_len
                                                : 0);
    const mha::MutableTensor output_view{output.data(), {d.batch, d.query_len, d.embed_dim}};
    std::optional<mha::MutableTensor> weights_view;
    if (o.return_weights) {
        weights_view = mha::MutableTensor{weights.data(),
                                          {d.batch, d.num_heads, d.query_len, d.key_len}};
    }
    const auto forward = [&] {
        module.forward(mha::reference::query_view(problem), mha::reference::key_view(problem),
                       mha::reference::value_view(problem), output_view,
                       mha::reference::mask_view(problem), weights_view);
    };

    fmt::print("mha: {}-attention, batch {}, query length {}, key length {}, embed_dim {}, {} "
               "heads of {}, mask {}, weights {}\n",
               self ? "self" : "cross", d.batch, d.query_len, d.key_len, d.embed_dim,
               d.num_heads, d.head_dim(), o.mask, o.return_weights ? "returned" : "not returned");
    print_dimension_flow(d);

    forward();  // the first call also checks every argument
    if (o.check) {
        const mha::reference::Result want = mha::reference::forward(problem);
        fmt::print("error against the double-precision reference (max |error| / max |reference|):\n");
        fmt::print("  output  {:.2e}  (relative L2 {:.2e})\n",
                   mha::reference::max_relative_error(output, want.output),
                   mha::reference::relative_l2(output, want.output));
        if (o.return_weights) {
            fmt::print("  weights {:.2e}  (relative L2 {:.2e})\n",
                       mha::reference::max_relative_error(weights, want.weights),
                       mha::reference::relative_l2(weights, want.weights));
        }
    }

    std::vector<double> ms(o.repeats);
    for (double &t : ms) {
        const auto start = std::chrono::steady_clock::now();
        forward();
        t = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                .count();
    }
    std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
    const double median = ms[ms.size() / 2];
    fmt::print("forward pass: median {:.4f} ms over {} runs, {:.1f} GFLOP/s\n", median, o.repeats,
               d.forward_flops() / (median * 1e6));
    return 0;
}

}  // namespace

int main(int argc, char **argv) {
    try {
        return run(parse(argc, argv));
    } catch (const UsageError &e) {
        fmt::print(stderr, "mha: error: {}\n", e.what());
        return 2;
    } catch (const std::exception &e) {
        fmt::print(stderr, "mha: error: {}\n", e.what());
        return 1;
    }
}
