// mha: runs the compiled multi-head attention kernels on random inputs, prints the dimension flow
// stage by stage, the error against the double-precision reference and the forward pass's time.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "command_line.h"
#include "mha/mha.h"
#include "mha_contract.h"
#include "problems.h"

namespace {

using mha::reference::Dims;

struct Options {
    Dims dims{2, 5, 5, 512, 8};  // the seed's example
    bool key_len_given = false;
    int64_t kdim = 0, vdim = 0;  // the key's and value's features; 0: E
    int64_t kv_heads = 0;        // key/value heads; 0: H
    std::string mask = "none";   // none, a mask convention, or additive
    std::string key_padding_mask = "none", attn_mask = "none";  // none, bool or float
    mha::Causal causal = mha::Causal::none;
    mha::DType dtype = mha::DType::f32;
    std::optional<mha::CacheDType> cache_dtype;  // --decode's; the module's when not given
    mha::Device device = mha::Device::cpu;
    bool return_weights = true;
    bool average_weights = false;
    bool check = true;
    int repeats = 50;
    uint64_t seed = 2024;
    bool list_kernels = false;
    bool explain = false;
    bool decode = false;
};

std::map<std::string, mha::Causal> causal_by_name() {
    std::map<std::string, mha::Causal> names;
    for (mha::Causal c : mha::contract::kCausalAlignments) {
        names.emplace(mha::contract::causal_name(c), c);
    }
    return names;
}

// The command line; nullopt when the program should exit with `exit_code`.
std::optional<Options> parse(int argc, char **argv, int &exit_code) {
    Options o;
    CLI::App app(
        "Runs the compiled multi-head attention kernels on random inputs: prints the "
        "dimension flow, the error against a double-precision reference and the "
        "forward pass's time.",
        "mha");
    const auto size = [&](const char *flag, int64_t &value, const char *what) {
        return app.add_option(flag, value, what)
            ->check(mha::tools::positive_integer())
            ->type_name("N")
            ->capture_default_str();
    };
    size("--batch", o.dims.batch, "batch size B");
    size("--query-len", o.dims.query_len, "query length Sq");
    CLI::Option *key_len = app.add_option("--key-len", o.dims.key_len,
                                          "key/value length Sk (default: Sq, "
                                          "self-attention)")
                               ->check(mha::tools::positive_integer())
                               ->type_name("N");
    size("--embed-dim", o.dims.embed_dim, "embedding dimension E");
    size("--heads", o.dims.num_heads, "number of heads H, dividing E");
    for (auto [flag, value, what] : {std::tuple{"--kdim", &o.kdim, "key features (default: E)"},
                                     {"--vdim", &o.vdim, "value features (default: E)"},
                                     {"--kv-heads", &o.kv_heads,
                                      "key/value heads, dividing H (grouped-query attention; "
                                      "default: H)"}}) {
        app.add_option(flag, *value, what)->check(mha::tools::positive_integer())->type_name("N");
    }
    std::vector<std::string> masks = {"none"};
    for (mha::MaskConvention c : mha::contract::kMaskConventions) {
        masks.emplace_back(mha::contract::mask_convention_name(c));
    }
    masks.emplace_back("additive");
    app.add_option("--mask", o.mask,
                   "the seeds' mask, [B, 1, Sq, Sk]: none | keep (0 = blocked) | block (nonzero = "
                   "blocked) | additive (0 or -1e9, added to the scores)")
        ->check(CLI::IsMember(masks))
        ->type_name("KIND")
        ->capture_default_str();
    for (auto [flag, value, shape] :
         {std::tuple{"--key-padding-mask", &o.key_padding_mask, "[B, Sk]"},
          {"--attn-mask", &o.attn_mask, "[Sq, Sk]"}}) {
        app.add_option(flag, *value,
                       fmt::format("PyTorch's {}, {}: none | bool (True = blocked) | float "
                                   "(added to the scores)",
                                   flag + 2, shape))
            ->check(CLI::IsMember({"none", "bool", "float"}))
            ->type_name("KIND")
            ->capture_default_str()
            ->excludes(app.get_option("--mask"));
    }
    app.add_option(
           "--causal", o.causal,
           "none | top_left (j <= i, PyTorch's is_causal) | bottom_right (j <= i + Sk - Sq, "
           "FlashAttention's)")
        ->transform(CLI::CheckedTransformer(causal_by_name()))
        ->type_name("ALIGNMENT")
        ->default_str("none");
    std::vector<std::string> devices;
    for (mha::Device d : mha::contract::kDevices) {
        devices.emplace_back(mha::contract::device_name(d));
    }
    std::map<std::string, mha::DType> dtypes;
    for (mha::DType t : mha::contract::kDTypes) {
        dtypes.emplace(mha::contract::dtype_name(t), t);
    }
    app.add_option("--dtype", o.dtype,
                   "f32 | bf16 | f16: the module's and the inputs' element type (the reference "
                   "reads the inputs and weights rounded to it)")
        ->transform(CLI::CheckedTransformer(dtypes))
        ->type_name("DTYPE")
        ->default_str("f32");
    std::string device = "cpu";
    app.add_option("--device", device, "cpu | cuda | opencl")
        ->check(CLI::IsMember(devices))
        ->type_name("DEVICE")
        ->capture_default_str();
    app.add_flag(
        "--no-weights", [&](int64_t) { o.return_weights = false; },
        "do not return the attention weights");
    app.add_flag("--average-weights", o.average_weights,
                 "return the weights averaged over heads, [B, Sq, Sk] (PyTorch's default)");
    app.add_flag(
        "--no-check", [&](int64_t) { o.check = false; },
        "skip the double-precision reference (for large shapes)");
    app.add_option("--repeats", o.repeats, "timed forward passes")
        ->check(CLI::Range(1, 1 << 20))
        ->type_name("N")
        ->capture_default_str();
    app.add_option("--seed", o.seed, "random seed of inputs and weights")
        ->type_name("N")
        ->capture_default_str();
    app.add_flag("--list-kernels", o.list_kernels,
                 "list the kernels this program links and what each takes, then exit");
    app.add_flag("--explain", o.explain,
                 "say which kernel this call runs and why: instruction set, shape bucket and "
                 "whose tuned parameters; then exit");
    app.add_flag("--decode", o.decode,
                 "time a decode step instead: one new token per batch row against a KV cache "
                 "already holding --key-len tokens");
    std::map<std::string, mha::CacheDType> cache_dtypes;
    for (mha::CacheDType t : mha::contract::kCacheDTypes) {
        cache_dtypes.emplace(mha::contract::cache_dtype_name(t), t);
    }
    app.add_option("--cache-dtype", o.cache_dtype,
                   "f32 | bf16 | f16 | int8: what --decode's KV cache stores (default: --dtype)")
        ->transform(CLI::CheckedTransformer(cache_dtypes))
        ->type_name("DTYPE");
    if (const auto code = mha::tools::parse_command_line(app, argc, argv)) {
        exit_code = *code;
        return std::nullopt;
    }
    o.device = mha::contract::kDevices[std::find(devices.begin(), devices.end(), device) -
                                       devices.begin()];
    o.key_len_given = key_len->count() > 0;
    if (!o.key_len_given) {
        o.dims.key_len = o.dims.query_len;
    }
    return o;
}

// Which tuning of each instruction set's kernels (or of `only_isa`'s) runs on this CPU, and why.
void print_tuned_schedules(const std::string &only_isa = "") {
    fmt::print("{}this CPU: {}\n", only_isa.empty() ? "" : "  ", mha::this_cpu());
    for (const mha::TunedSchedule &s : mha::tuned_schedules()) {
        if (!only_isa.empty() && s.isa != only_isa) {
            continue;
        }
        fmt::print("  {:<10} runs the parameters {}: {}\n", s.isa,
                   s.tuned_on.empty() ? "of its defaults"
                                      : fmt::format("tuned on {} ({})", s.tuned_cpu, s.tuned_on),
                   s.why);
    }
}

int list_kernels() {
    const std::vector<mha::KernelInfo> kernels = mha::linked_kernels();
    fmt::print("{} kernels; the f32 CPU kernels of {} run here, the bf16 ones of {}\n",
               kernels.size(), mha::dispatched_isa(), mha::dispatched_isa(mha::DType::bf16));
    print_tuned_schedules();
    // causal: an attention kernel's keys bounded by a window; scores: soft-capped and ALiBi;
    // rows: the query rows per head an attention kernel is for (page: one, over a paged cache).
    fmt::print(
        "{:<76} {:<7} {:<10} {:<5} {:<20} {:<26} {:<8} {:<6} {:<8} {:<5} {:<7} {:<4} arguments\n",
        "name", "device", "isa", "dtype", "buckets", "tunings", "mask", "causal", "qkv", "wts",
        "scores", "rows");
    for (const mha::KernelInfo &k : kernels) {
        const bool forward = k.op == "forward";
        fmt::print(
            "{:<76} {:<7} {:<10} {:<5} {:<20} {:<26} {:<8} {:<6} {:<8} {:<5} {:<7} {:<4} {}\n",
            k.name, mha::contract::device_name(k.device), k.isa.empty() ? "-" : k.isa,
            mha::contract::dtype_name(k.dtype), fmt::join(k.buckets, ","),
            k.tunings.empty() ? "all" : fmt::format("{}", fmt::join(k.tunings, ",")), k.mask,
            k.causal ? "yes" : "no",
            !forward      ? "-"
            : k.fused_qkv ? "fused"
                          : "separate",
            k.returns_weights ? "yes" : "no", k.modified_scores ? "capped" : "-",
            k.op != "attention" ? "-"
            : k.paged           ? "page"
            : k.single_query    ? "1"
                                : "any",
            fmt::join(k.arguments, ", "));
    }
    return 0;
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
               self ? shape({B, Sq, E})
                    : shape({B, Sq, E}) + " query, " + shape({B, Sk, E}) + " key/value");
    line("projected Q/K/V",
         self ? shape({B, Sq, E}) : shape({B, Sq, E}) + " Q, " + shape({B, Sk, E}) + " K/V");
    line("heads", self ? shape({B, H, Sq, hd})
                       : shape({B, H, Sq, hd}) + " Q, " + shape({B, H, Sk, hd}) + " K/V");
    line("scores", shape({B, H, Sq, Sk}));
    line("softmax weights", shape({B, H, Sq, Sk}));
    line("per-head context", shape({B, H, Sq, hd}));
    line("merged", shape({B, Sq, E}));
    line("output", shape({B, Sq, E}));
}

// The median time of `repeats` calls of `call`, in milliseconds.
template <typename Call>
double median_ms(int repeats, Call &&call) {
    std::vector<double> ms(repeats);
    for (double &t : ms) {
        const auto start = std::chrono::steady_clock::now();
        call();
        t = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                .count();
    }
    std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
    return ms[ms.size() / 2];
}

// The reference check's report: max |error| / max |reference| and relative L2 of the output,
// and of the weights when they were returned.
void print_errors(const std::vector<float> &output, const std::vector<double> &want_output,
                  const std::vector<float> *weights = nullptr,
                  const std::vector<double> *want_weights = nullptr) {
    fmt::print("error against the double-precision reference (max |error| / max |reference|):\n");
    fmt::print("  output  {:.2e}  (relative L2 {:.2e})\n",
               mha::reference::max_relative_error(output, want_output),
               mha::reference::relative_l2(output, want_output));
    if (weights != nullptr) {
        fmt::print("  weights {:.2e}  (relative L2 {:.2e})\n",
                   mha::reference::max_relative_error(*weights, *want_weights),
                   mha::reference::relative_l2(*weights, *want_weights));
    }
}

// Why a call runs `kernel`: its instruction set, the shape bucket of its `token_rows`, and
// whose tuned parameters it was compiled with.
void explain(const std::string &kernel, int64_t token_rows) {
    const std::vector<mha::KernelInfo> kernels = mha::linked_kernels();
    const auto k = std::find_if(kernels.begin(), kernels.end(),
                                [&](const mha::KernelInfo &info) { return info.name == kernel; });
    if (k == kernels.end() || k->device != mha::Device::cpu) {
        fmt::print("  on {}: its one kernel of this variant serves every shape\n",
                   k == kernels.end() ? "a GPU" : mha::contract::device_name(k->device));
        return;
    }
    const mha::contract::BucketSpec &bucket =
        mha::contract::bucket_spec(mha::contract::shape_bucket(token_rows));
    fmt::print("  instruction set {} (the best of this CPU and the build{})\n", k->isa,
               std::getenv("MHA_CPU_ISA") ? ", capped by MHA_CPU_ISA" : "");
    fmt::print("  shape bucket {}: {} token rows (batch · max(query, key length)), at most {}\n",
               bucket.name, token_rows, bucket.max_token_rows);
    print_tuned_schedules(k->isa);
    const std::vector<mha::TunedSchedule> schedules = mha::tuned_schedules();
    const std::string tuning = std::find_if(schedules.begin(), schedules.end(), [&](const auto &s) {
                                   return s.isa == k->isa;
                               })->tuned_cpu;
    const bool as_defaults = k->tunings.empty() || std::count(k->tunings.begin(), k->tunings.end(),
                                                              std::string("defaults"));
    fmt::print("  its parameters: {}; the kernel serves tunings {} in buckets {}\n",
               tuning == "defaults" ? "the defaults"
               : as_defaults
                   ? fmt::format("the defaults, which {} kept in bucket {}", tuning, bucket.name)
                   : fmt::format("tuned on {} for bucket {}", tuning, bucket.name),
               k->tunings.empty() ? "all" : fmt::format("{}", fmt::join(k->tunings, ", ")),
               fmt::join(k->buckets, ", "));
}

int run(const Options &o) {
    const Dims &d = o.dims;
    const bool self = d.query_len == d.key_len && !o.key_len_given && o.kdim == 0 && o.vdim == 0;
    mha::reference::Problem problem =
        mha::problems::random_problem(d, o.seed, self, o.kdim, o.vdim, o.kv_heads);
    if (o.mask == "additive") {
        mha::problems::add_random_additive_mask(problem, {d.batch, 1, d.query_len, d.key_len}, true,
                                                o.seed + 1);
    } else if (o.mask != "none") {
        mha::problems::add_random_mask(
            problem, o.mask == "keep" ? mha::MaskConvention::keep : mha::MaskConvention::block,
            {d.batch, 1, d.query_len, d.key_len}, o.seed + 1);
    }
    if (o.key_padding_mask != "none") {
        problem.key_padding_mask = mha::problems::random_torch_mask(
            o.key_padding_mask == "bool", {d.batch, d.key_len}, o.seed + 2);
    }
    if (o.attn_mask != "none") {
        problem.attn_mask = mha::problems::random_torch_mask(o.attn_mask == "bool",
                                                             {d.query_len, d.key_len}, o.seed + 3);
    }
    problem.causal = o.causal;
    problem.average_weights = o.average_weights;
    problem.dtype = o.dtype;
    const mha::MultiHeadAttention module = mha::problems::make_module(problem, o.device);

    std::vector<float> output(d.batch * d.query_len * d.embed_dim);
    const mha::MutableTensor output_view{output.data(), {d.batch, d.query_len, d.embed_dim}};
    std::vector<int64_t> weights_shape = {d.batch, d.num_heads, d.query_len, d.key_len};
    if (o.average_weights) {
        weights_shape.erase(weights_shape.begin() + 1);
    }
    std::vector<float> weights;
    std::optional<mha::MutableTensor> weights_view;
    if (o.return_weights) {
        weights.resize(std::accumulate(weights_shape.begin(), weights_shape.end(), int64_t(1),
                                       std::multiplies<>()));
        weights_view = mha::MutableTensor{weights.data(), weights_shape};
    }
    const mha::problems::ProblemTensors inputs(problem);  // in --dtype
    const auto forward = [&] {
        inputs.forward(module, output_view, mha::problems::options_view(problem, weights_view));
    };

    fmt::print(
        "mha: {}-attention in {}, batch {}, query length {}, key length {}, embed_dim {}, {} "
        "heads of {}, mask {}, key_padding_mask {}, attn_mask {}, causal {}, weights {}\n",
        self ? "self" : "cross", mha::contract::dtype_name(o.dtype), d.batch, d.query_len,
        d.key_len, d.embed_dim, d.num_heads, d.head_dim(), o.mask, o.key_padding_mask, o.attn_mask,
        mha::contract::causal_name(o.causal),
        !o.return_weights   ? "not returned"
        : o.average_weights ? "averaged"
                            : "per head");
    print_dimension_flow(d);

    const std::string kernel = module.kernel_name(
        mha::problems::query_view(problem), mha::problems::key_view(problem),
        mha::problems::value_view(problem), mha::problems::options_view(problem, weights_view));
    fmt::print("kernel: {}\n", kernel);
    if (o.explain) {
        explain(kernel, d.batch * std::max(d.query_len, d.key_len));
        return 0;
    }
    forward();  // the first call also checks every argument
    if (o.check) {
        const mha::reference::Result want = mha::reference::forward(problem);
        if (o.return_weights) {
            print_errors(output, want.output, &weights, &want.weights);
        } else {
            print_errors(output, want.output);
        }
    }

    const double median = median_ms(o.repeats, forward);
    fmt::print("forward pass: median {:.4f} ms over {} runs, {:.1f} GFLOP/s\n", median, o.repeats,
               d.forward_flops() / (median * 1e6));
    return 0;
}

// A decode step: B rows, each appending one token to a cache that holds N = --key-len tokens.
// The reference is the new token attending over all N + 1 tokens, which is what the causal
// self-attention of the whole sequence gives the last token.
int run_decode(const Options &o) {
    const Dims &d = o.dims;
    const int64_t B = d.batch, N = d.key_len, E = d.embed_dim, H = d.num_heads, hd = d.head_dim();
    mha::reference::Problem problem = mha::problems::random_problem(
        {B, 1, N + 1, E, d.num_heads}, o.seed, false, 0, 0, o.kv_heads);
    problem.dtype = o.dtype;  // the f32 tokens are rounded to it on entry
    const mha::MultiHeadAttention module = mha::problems::make_module(problem, o.device);
    mha::KvCache cache = module.make_cache(B, N + 1, o.cache_dtype);
    problem.kv_dtype = cache.dtype();
    // The sequences are problem.key (= problem.value): the first N tokens of each row fill the
    // cache, the last one is the new token (problem.query is made the same token).
    std::vector<float> prompt(B * N * E), token(B * E), output(B * E);
    for (int64_t b = 0; b < B; b++) {
        const float *row = problem.key.data() + b * (N + 1) * E;
        std::copy(row, row + N * E, prompt.begin() + b * N * E);
        std::copy(row + N * E, row + (N + 1) * E, token.begin() + b * E);
    }
    problem.value = problem.key;
    problem.query = token;
    std::vector<float> prompt_output(B * N * E);
    module.decode({prompt.data(), {B, N, E}}, cache, {prompt_output.data(), {B, N, E}});
    const auto step = [&] {
        cache.truncate(N);
        module.decode({token.data(), {B, 1, E}}, cache, {output.data(), {B, 1, E}});
    };

    fmt::print(
        "mha: decode step, batch {}, 1 new token per row over {} cached, embed_dim {}, "
        "{} heads of {}, {} cache\n",
        B, N, E, H, hd, mha::contract::cache_dtype_name(cache.dtype()));
    fmt::print("dimension flow:\n     {:<22} {}\n", "new tokens", shape({B, 1, E}));
    const auto line = [](const char *stage, const std::string &s) {
        fmt::print("  -> {:<22} {}\n", stage, s);
    };
    line("projected Q/K/V", shape({B, 1, E}));
    line("K/V cache, appended", shape({B, H, N + 1, hd}));
    line("scores", shape({B, H, 1, N + 1}));
    line("per-head context", shape({B, H, 1, hd}));
    line("output", shape({B, 1, E}));
    step();
    if (o.check) {
        print_errors(output, mha::reference::forward(problem).output);
    }
    const double median = median_ms(o.repeats, step);
    fmt::print("forward pass: median {:.4f} ms over {} runs, {:.0f} tokens/s\n", median, o.repeats,
               B / (median * 1e-3));
    return 0;
}

// Validates the sizes before anything is allocated: every tensor the run makes must fit what a
// kernel addresses (mha::kMaxBufferBytes), which the library checks too, but only once given
// the tensors.
void check_sizes(const Options &o) {
    const Dims &d = o.dims;
    const int64_t E = d.embed_dim, H = d.num_heads;
    const int64_t kdim = o.kdim > 0 ? o.kdim : E, vdim = o.vdim > 0 ? o.vdim : E;
    const int64_t kv_features = o.kv_heads > 0 && E % H == 0 ? o.kv_heads * (E / H) : E;
    const int64_t keys = o.decode ? d.key_len + 1 : d.key_len;
    const std::vector<std::pair<std::string, std::vector<int64_t>>> tensors = {
        {"the weights [embed_dim, embed_dim]", {E, E}},
        {"the key projection's weights [kv features, kdim]", {kv_features, kdim}},
        {"the value projection's weights [kv features, vdim]", {kv_features, vdim}},
        {"the query [batch, query length, embed_dim]", {d.batch, d.query_len, E}},
        {"the key [batch, key length, kdim]", {d.batch, keys, kdim}},
        {"the value [batch, key length, vdim]", {d.batch, keys, vdim}},
        {"the attention weights [batch, heads, query length, key length]",
         {d.batch, o.return_weights ? H : 1, d.query_len, keys}},
    };
    for (const auto &[name, extents] : tensors) {
        const std::optional<int64_t> bytes = mha::contract::checked_bytes(extents, sizeof(float));
        if (!bytes || *bytes > mha::kMaxBufferBytes) {
            throw mha::Error(fmt::format(
                "{} {} would take {} bytes, more than the {} a kernel addresses", name,
                fmt::format("[{}]", fmt::join(extents, ", ")),
                bytes ? std::to_string(*bytes) : std::string("over 2^63"), mha::kMaxBufferBytes));
        }
    }
}

}  // namespace

int main(int argc, char **argv) {
    int exit_code = 0;
    const std::optional<Options> options = parse(argc, argv, exit_code);
    if (!options) {
        return exit_code;
    }
    try {
        if (options->list_kernels) {
            return list_kernels();
        }
        check_sizes(*options);
        return options->decode ? run_decode(*options) : run(*options);
    } catch (const std::exception &e) {
        fmt::print(stderr, "mha: error: {}\n", e.what());
        return 1;
    }
}
