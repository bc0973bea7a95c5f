// libFuzzer harness over the public API (tests/fuzz/README.md). Each input describes a module
// and what is done with it: forward() in every variant (masks of each family, shape, element
// type and convention; causal orders; weights per head or averaged; fused or separate QKV;
// grouped-query heads; kdim and vdim; modules and tensors in f32, bf16 or f16), the seed's call,
// kernel_name(), from_in_proj(), decode steps over a KV cache with truncation and reset, and
// mha::attention (strides, masks of every rank, windows, soft-capping, ALiBi, lse). Most
// inputs also corrupt one thing: an extent, a rank, a data pointer, a device handle, an enum, a
// size or a decode count.
//
// The oracle: a corrupted call raises mha::Error; a clean call returns finite outputs equal to
// the double-precision reference (reference/), and a decode step that does not fit raises
// mha::Error and leaves the cache as it was. Anything else (a crash, an abort, another
// exception, a wrong or non-finite answer, a read past a buffer) is a finding. The kernels are
// compiled with Halide's asan feature, so AddressSanitizer checks their accesses too; and every
// caller buffer lies against an inaccessible page (after its end, or before its start), so that
// a read past it faults even where ASan's redzones would not catch it.
#include <fuzzer/FuzzedDataProvider.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "attention_problems.h"
#include "mha/mha.h"
#include "problems.h"

namespace {

using mha::reference::Dims;
using mha::reference::Problem;

constexpr double kTolerance = 1e-5;  // relative L2, as the unit tests
// A corrupted tensor whose declared size is above this gets no memory: any read of it faults.
constexpr int64_t kMaxAllocatedBytes = int64_t(1) << 20;

// What the current input corrupted, for the report of a finding.
std::string corruption_applied;

[[noreturn]] void finding(const std::string &what) {
    std::fprintf(stderr, "\nFINDING: %s\n(corruption: %s)\n", what.c_str(),
                 corruption_applied.empty() ? "none" : corruption_applied.c_str());
    std::abort();
}

// --- Caller memory against inaccessible pages. ---

class GuardedMemory {
public:
    GuardedMemory() = default;
    GuardedMemory(const GuardedMemory &) = delete;
    GuardedMemory &operator=(const GuardedMemory &) = delete;
    ~GuardedMemory() {
        for (const auto &[base, bytes] : mappings_) {
            munmap(base, bytes);
        }
    }

    // `bytes` of memory (a copy of `init`, the rest zero) that ends at an inaccessible page, or
    // starts right after one.
    void *allocate(size_t bytes, const void *init, size_t init_bytes, bool guard_before) {
        const size_t page = size_t(sysconf(_SC_PAGESIZE));
        const size_t data_pages = (bytes + page - 1) / page;
        const size_t total = (data_pages + 1) * page;
        void *base =
            mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (base == MAP_FAILED) {
            finding("mmap failed");
        }
        mappings_.emplace_back(base, total);
        char *bytes_at = static_cast<char *>(base);
        char *data;
        if (guard_before) {
            mprotect(bytes_at, page, PROT_NONE);
            data = bytes_at + page;
        } else {
            mprotect(bytes_at + data_pages * page, page, PROT_NONE);
            data = bytes_at + data_pages * page - bytes;
        }
        if (init_bytes > 0) {
            std::memcpy(data, init, std::min(bytes, init_bytes));
        }
        return data;
    }

    // Memory that faults on any access.
    void *inaccessible() {
        const size_t page = size_t(sysconf(_SC_PAGESIZE));
        void *base = mmap(nullptr, page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (base == MAP_FAILED) {
            finding("mmap failed");
        }
        mappings_.emplace_back(base, page);
        return base;
    }

private:
    std::vector<std::pair<void *, size_t>> mappings_;
};

// --- The arguments of one call, each of which a corruption may change. ---

// A module weight's in-features may legitimately change (kdim, vdim), and the constructor reads
// a weight as soon as its shape passes: such an argument gets no extent it could take but that
// is too large to allocate here.
enum class Role { input, weight, output, broadcast_mask };

// One tensor argument: its declared view and the data behind it (element_bytes each).
struct Arg {
    std::string name;
    Role role;
    size_t element_bytes;
    std::vector<int64_t> shape;
    const void *init = nullptr;     // what a clean call's buffer holds
    std::array<int64_t, 4> full{};  // a broadcast mask's [B, H, Sq, Sk]
    int free_dim = -1;  // a dimension that takes any extent >= 1 (no other argument has it)
    std::vector<int64_t> clean_shape;  // what `init` holds, once corrupted
    // Set by materialize():
    void *data = nullptr;
    uint64_t device_handle = 0;
    bool corrupted = false;

    template <typename T>
    mha::TensorView<T> view() const {
        return {static_cast<T *>(data), shape, device_handle};
    }
};

std::optional<int64_t> element_count(const std::vector<int64_t> &shape) {
    int64_t n = 1;
    for (int64_t s : shape) {
        if (s < 0 || __builtin_mul_overflow(n, s, &n)) {
            return std::nullopt;
        }
    }
    return n;
}

// Extents that sit at or past a limit, or break an invariant.
int64_t unusual_extent(FuzzedDataProvider &in, int64_t original) {
    static constexpr int64_t kUnusual[] = {0,
                                           -1,
                                           std::numeric_limits<int64_t>::min(),
                                           -(int64_t(1) << 31),
                                           (int64_t(1) << 31) - 1,
                                           int64_t(1) << 31,
                                           int64_t(1) << 32,
                                           (int64_t(1) << 32) + 1,
                                           (int64_t(1) << 16) + 1,
                                           int64_t(1) << 62,
                                           std::numeric_limits<int64_t>::max()};
    const size_t pick = in.ConsumeIntegralInRange<size_t>(0, std::size(kUnusual) + 1);
    if (pick == std::size(kUnusual)) {
        return original + 1;
    }
    if (pick == std::size(kUnusual) + 1) {
        return original + (int64_t(1) << 31);
    }
    return kUnusual[pick];
}

enum class Corruption {
    none,
    extent,      // one extent changed to one the call cannot take
    extra_rank,  // a dimension appended
    no_rank,     // shape {}
    null_data,
    device_handle,  // a device handle on a CPU module
    count
};

// Changes one argument so that the call is invalid; returns false when the pick cannot make it
// invalid (the call then runs clean).
bool corrupt(FuzzedDataProvider &in, std::vector<Arg *> &args, Corruption kind) {
    if (args.empty()) {
        return false;
    }
    Arg &a = *args[in.ConsumeIntegralInRange<size_t>(0, args.size() - 1)];
    a.clean_shape = a.shape;
    switch (kind) {
    case Corruption::extent: {
        if (a.shape.empty()) {
            return false;
        }
        const size_t d = in.ConsumeIntegralInRange<size_t>(0, a.shape.size() - 1);
        const int64_t value = unusual_extent(in, a.shape[d]);
        // A broadcast mask takes 1 or the full extent in each dimension.
        std::vector<int64_t> changed = a.shape;
        changed[d] = value;
        const std::optional<int64_t> n = element_count(changed);
        const bool takeable_but_large = n && *n > kMaxAllocatedBytes / int64_t(a.element_bytes) &&
                                        *n <= mha::kMaxBufferBytes / int64_t(a.element_bytes);
        if (value == a.shape[d] || (int(d) == a.free_dim && value >= 1) ||
            (a.role == Role::broadcast_mask && (value == 1 || value == a.full[d])) ||
            (a.role == Role::weight && takeable_but_large)) {
            return false;
        }
        a.shape[d] = value;
        break;
    }
    case Corruption::extra_rank: {
        const int64_t extent = unusual_extent(in, 0);
        if (extent == 1) {
            return false;
        }
        a.shape.push_back(extent);
        break;
    }
    case Corruption::no_rank:
        a.shape.clear();
        break;
    case Corruption::null_data:
    case Corruption::device_handle:
        break;
    default:
        return false;
    }
    a.corrupted = true;
    corruption_applied = a.name + " " + std::to_string(int(kind)) + " shape [";
    for (int64_t s : a.shape) {
        corruption_applied += std::to_string(s) + " ";
    }
    corruption_applied += "]";
    a.device_handle =
        kind == Corruption::device_handle ? in.ConsumeIntegralInRange<uint64_t>(1, ~0ull) : 0;
    if (kind == Corruption::device_handle && in.ConsumeBool()) {
        a.init = nullptr;  // and no host data either
        a.data = nullptr;
    }
    if (kind == Corruption::null_data) {
        a.init = nullptr;
    }
    return true;
}

// Gives each argument its memory: clean ones a guarded copy of their data (outputs NaN, so
// anything left unwritten shows), corrupted ones what their declared shape asks for, or memory
// that faults when that is too large (the call must then fail before reading any of it).
void materialize(std::vector<Arg *> &args, GuardedMemory &memory, bool guard_before,
                 Corruption kind) {
    for (Arg *a : args) {
        if (a->corrupted && (kind == Corruption::null_data ||
                             (kind == Corruption::device_handle && a->init == nullptr))) {
            a->data = nullptr;
            continue;
        }
        const std::optional<int64_t> n = element_count(a->shape);
        if (!n || *n > kMaxAllocatedBytes / int64_t(a->element_bytes)) {
            a->data = memory.inaccessible();
            continue;
        }
        const size_t bytes = size_t(std::max<int64_t>(*n, 1)) * a->element_bytes;
        std::vector<float> nans;
        const void *init = a->init;
        if (a->role == Role::output) {
            nans.assign(bytes / sizeof(float) + 1, NAN);
            init = nans.data();
        }
        const size_t init_bytes = a->role == Role::output || !a->corrupted
                                      ? bytes
                                      : size_t(*element_count(a->clean_shape)) * a->element_bytes;
        a->data = memory.allocate(bytes, init, init ? init_bytes : 0, guard_before);
    }
}

// --- Clean calls against the reference. ---

void expect_close(const char *what, const float *got, const std::vector<double> &want,
                  double tolerance = kTolerance) {
    double diff = 0, norm = 0;
    for (size_t i = 0; i < want.size(); i++) {
        if (!std::isfinite(got[i])) {
            finding(std::string(what) + "[" + std::to_string(i) + "] is " + std::to_string(got[i]) +
                    " where the reference has " + std::to_string(want[i]));
        }
        diff += (got[i] - want[i]) * (got[i] - want[i]);
        norm += want[i] * want[i];
    }
    // Relative L2 as the unit tests; or, for outputs small against their O(1) terms (a few
    // elements that cancel, a query that sees no key and no bias), a root-mean-square error of a
    // few ulps of 1 (a tenth of the relative bound: 1e-6 in f32).
    const double relative = std::sqrt(diff / norm), rms = std::sqrt(diff / double(want.size()));
    if (!(relative <= tolerance || rms <= tolerance / 10)) {
        finding(std::string(what) + ": relative L2 error " + std::to_string(relative) +
                ", root-mean-square error " + std::to_string(rms) + " against the reference");
    }
}

// What a call must do: fail with mha::Error when corrupted, else return (outputs checked after).
void expect_outcome(bool corrupted, const char *call, const std::function<void()> &run) {
    try {
        run();
    } catch (const mha::Error &e) {
        if (!corrupted) {
            finding(std::string(call) + " raised mha::Error on a valid call: " + e.what());
        }
        return;
    } catch (const std::exception &e) {
        finding(std::string(call) + " raised something other than mha::Error: " + e.what());
    }
    if (corrupted) {
        finding(std::string(call) + " accepted a corrupted call");
    }
}

// --- The module. ---

struct ModuleArgs {
    Arg weight[4], bias[4];
    std::vector<float> zero_bias[4];  // the reference's bias where none is passed
    bool has_bias[4];
};

ModuleArgs module_args(FuzzedDataProvider &in, Problem &p) {
    ModuleArgs m;
    const char *names[4] = {"q_proj", "k_proj", "v_proj", "out_proj"};
    for (int l = 0; l < 4; l++) {
        const int64_t out = mha::reference::out_features(p, l);
        m.weight[l] = {std::string(names[l]) + ".weight",
                       Role::weight,
                       sizeof(float),
                       {out, p.in_features[l]},
                       p.weight[l].data()};
        m.has_bias[l] = in.ConsumeBool();
        if (!m.has_bias[l]) {
            p.bias[l].assign(out, 0.0f);
        }
        m.bias[l] = {
            std::string(names[l]) + ".bias", Role::input, sizeof(float), {out}, p.bias[l].data()};
    }
    return m;
}

mha::Linear linear_view(const ModuleArgs &m, int l) {
    mha::Linear lin{m.weight[l].view<const float>(), std::nullopt};
    if (m.has_bias[l]) {
        lin.bias = m.bias[l].view<const float>();
    }
    return lin;
}

// --- Forward calls. ---

enum class Entry { forward, seed_forward, kernel_name, from_in_proj, decode, attention, count };
enum class MaskFamily { none, bytes, additive, key_padding, attn, both_torch, count };

template <typename E>
E pick(FuzzedDataProvider &in) {
    return static_cast<E>(in.ConsumeIntegralInRange<int>(0, int(E::count) - 1));
}

// A broadcast shape for [B, H, Sq, Sk]: each dimension 1 or full.
std::vector<int64_t> broadcast_shape(FuzzedDataProvider &in, const std::array<int64_t, 4> &full) {
    const uint8_t pattern = in.ConsumeIntegral<uint8_t>();
    std::vector<int64_t> shape(4);
    for (int d = 0; d < 4; d++) {
        shape[d] = (pattern >> d) & 1 ? full[d] : 1;
    }
    return shape;
}

mha::reference::TorchMask torch_mask(FuzzedDataProvider &in, bool key_padding, const Dims &d,
                                     uint64_t seed) {
    std::vector<int64_t> shape =
        key_padding        ? std::vector<int64_t>{d.batch, d.key_len}
        : in.ConsumeBool() ? std::vector<int64_t>{d.query_len, d.key_len}
                           : std::vector<int64_t>{d.batch * d.num_heads, d.query_len, d.key_len};
    return mha::problems::random_torch_mask(in.ConsumeBool(), std::move(shape), seed);
}

Arg torch_mask_arg(const char *name, const mha::reference::TorchMask &m) {
    return {name, Role::input, m.is_bool ? sizeof(uint8_t) : sizeof(float), m.shape,
            m.is_bool ? static_cast<const void *>(m.bools.data()) : m.floats.data()};
}

mha::MaskTensor torch_mask_view(const Arg &a, const mha::reference::TorchMask &m) {
    if (m.is_bool) {
        return a.view<const uint8_t>();
    }
    return a.view<const float>();
}

void fuzz_forward(FuzzedDataProvider &in, Entry entry, uint64_t seed) {
    Dims d;
    d.num_heads = in.ConsumeIntegralInRange<int64_t>(1, 4);
    d.embed_dim = d.num_heads * in.ConsumeIntegralInRange<int64_t>(1, 6);
    d.batch = in.ConsumeIntegralInRange<int64_t>(1, 3);
    d.query_len = in.ConsumeIntegralInRange<int64_t>(1, 9);
    const bool self_attention = in.ConsumeBool();
    d.key_len = self_attention ? d.query_len : in.ConsumeIntegralInRange<int64_t>(1, 9);
    int64_t kv_heads = d.num_heads;
    while (kv_heads > 1 && in.ConsumeBool()) {  // a divisor of H
        do {
            kv_heads--;
        } while (d.num_heads % kv_heads != 0);
    }
    int64_t kdim = 0, vdim = 0;
    if (!self_attention && in.ConsumeBool()) {
        kdim = in.ConsumeIntegralInRange<int64_t>(1, 9);
        vdim = in.ConsumeIntegralInRange<int64_t>(1, 9);
    }
    if (entry == Entry::from_in_proj) {
        kdim = vdim = 0;
        kv_heads = d.num_heads;
    }
    Problem p = mha::problems::random_problem(d, seed, self_attention, kdim, vdim, kv_heads);
    ModuleArgs m = module_args(in, p);
    const std::array<int64_t, 4> full{d.batch, d.num_heads, d.query_len, d.key_len};

    // Masks, causal order, weights.
    const MaskFamily family = entry == Entry::seed_forward
                                  ? (in.ConsumeBool() ? MaskFamily::bytes : MaskFamily::none)
                                  : pick<MaskFamily>(in);
    if (family == MaskFamily::bytes) {
        mha::problems::add_random_mask(
            p, in.ConsumeBool() ? mha::MaskConvention::keep : mha::MaskConvention::block,
            broadcast_shape(in, full), seed + 1);
    } else if (family == MaskFamily::additive) {
        mha::problems::add_random_additive_mask(p, broadcast_shape(in, full), in.ConsumeBool(),
                                                seed + 1);
    }
    if (family == MaskFamily::key_padding || family == MaskFamily::both_torch) {
        p.key_padding_mask = torch_mask(in, true, d, seed + 2);
    }
    if (family == MaskFamily::attn || family == MaskFamily::both_torch) {
        p.attn_mask = torch_mask(in, false, d, seed + 3);
    }
    if (entry != Entry::seed_forward) {
        p.causal = static_cast<mha::Causal>(in.ConsumeIntegralInRange<int>(0, 2));
    }
    const int weights_kind = in.ConsumeIntegralInRange<int>(0, 2);  // none, per head, averaged
    p.average_weights = weights_kind == 2 && entry != Entry::seed_forward;
    const bool with_weights = weights_kind > 0;

    // The module's dtype, and its inputs in that type (forward() only).
    if (entry == Entry::forward) {
        p.dtype = static_cast<mha::DType>(in.ConsumeIntegralInRange<int>(0, 2));
    }
    const size_t input_bytes = p.dtype == mha::DType::f32 ? sizeof(float) : sizeof(uint16_t);
    const auto as_dtype = [&](const std::vector<float> &x) {
        std::vector<uint16_t> bits(x.size());
        for (size_t n = 0; n < x.size(); n++) {
            bits[n] = p.dtype == mha::DType::bf16 ? mha::to_bfloat16(x[n]).bits
                                                  : mha::to_float16(x[n]).bits;
        }
        return bits;
    };
    const std::vector<uint16_t> query16 = as_dtype(p.query), key16 = as_dtype(p.key);
    const std::vector<uint16_t> value16 = as_dtype(p.value);
    const auto init = [&](const std::vector<float> &x, const std::vector<uint16_t> &x16) {
        return p.dtype == mha::DType::f32 ? static_cast<const void *>(x.data()) : x16.data();
    };

    // The call's arguments.
    Arg query{"query",
              Role::input,
              input_bytes,
              {d.batch, d.query_len, d.embed_dim},
              init(p.query, query16)};
    Arg key{"key",
            Role::input,
            input_bytes,
            {d.batch, d.key_len, p.in_features[1]},
            self_attention ? init(p.query, query16) : init(p.key, key16)};
    Arg value{"value",
              Role::input,
              input_bytes,
              {d.batch, d.key_len, p.in_features[2]},
              self_attention ? init(p.query, query16) : init(p.value, value16)};
    Arg output{"output", Role::output, sizeof(float), {d.batch, d.query_len, d.embed_dim}};
    Arg weights{"weights", Role::output, sizeof(float),
                p.average_weights
                    ? std::vector<int64_t>{d.batch, d.query_len, d.key_len}
                    : std::vector<int64_t>{d.batch, d.num_heads, d.query_len, d.key_len}};
    Arg mask{"mask", Role::broadcast_mask, 1, p.mask_shape, p.mask.data(), full};
    Arg additive{"additive_mask",  Role::broadcast_mask, sizeof(float),
                 p.additive_shape, p.additive.data(),    full};
    Arg key_padding, attn;
    if (p.key_padding_mask) {
        key_padding = torch_mask_arg("key_padding_mask", *p.key_padding_mask);
    }
    if (p.attn_mask) {
        attn = torch_mask_arg("attn_mask", *p.attn_mask);
    }
    // in_proj_weight [3E, E] and in_proj_bias [3E]: q, k and v stacked.
    std::vector<float> in_proj_weight, in_proj_bias;
    for (int l = 0; l < 3; l++) {
        in_proj_weight.insert(in_proj_weight.end(), p.weight[l].begin(), p.weight[l].end());
        in_proj_bias.insert(in_proj_bias.end(), p.bias[l].begin(), p.bias[l].end());
    }
    const bool in_proj_has_bias = m.has_bias[0] && m.has_bias[1] && m.has_bias[2];
    if (entry == Entry::from_in_proj && !in_proj_has_bias) {
        for (int l = 0; l < 3; l++) {
            p.bias[l].assign(d.embed_dim, 0.0f);
        }
    }
    Arg in_weight{"in_proj_weight",
                  Role::weight,
                  sizeof(float),
                  {3 * d.embed_dim, d.embed_dim},
                  in_proj_weight.data()};
    Arg in_bias{"in_proj_bias", Role::input, sizeof(float), {3 * d.embed_dim}, in_proj_bias.data()};

    std::vector<Arg *> args{&query};
    if (entry != Entry::kernel_name) {
        args.push_back(&output);
    } else {
        query.free_dim = 1;  // kernel_name() takes no output: any query length will do
    }
    if (!self_attention) {
        args.insert(args.end(), {&key, &value});
    }
    if (with_weights) {
        args.push_back(&weights);
    }
    for (Arg *a : {&mask, &additive, &key_padding, &attn}) {
        if (!a->shape.empty()) {
            args.push_back(a);
        }
    }
    if (entry == Entry::from_in_proj) {
        args.insert(args.end(), {&in_weight, &m.weight[3]});
        if (in_proj_has_bias) {
            args.push_back(&in_bias);
        }
        if (m.has_bias[3]) {
            args.push_back(&m.bias[3]);
        }
    } else {
        for (int l = 0; l < 4; l++) {
            args.push_back(&m.weight[l]);
            if (m.has_bias[l]) {
                args.push_back(&m.bias[l]);
            }
        }
    }

    // At most one corruption: of a tensor, or of a scalar argument.
    bool corrupted = false;
    int64_t embed_dim = d.embed_dim, num_heads = d.num_heads;
    mha::Device device = mha::Device::cpu;
    std::optional<mha::MaskConvention> convention = p.mask_convention;
    mha::Causal causal = p.causal;
    mha::DType module_dtype = p.dtype;
    const Corruption kind = pick<Corruption>(in);
    const int scalar = in.ConsumeIntegralInRange<int>(0, 6);
    if (kind == Corruption::none && scalar > 0) {
        switch (scalar) {
        case 1:
            embed_dim = unusual_extent(in, embed_dim);
            break;
        case 2:  // not dividing E, or not a multiple of the key/value heads
            num_heads = in.ConsumeBool() ? unusual_extent(in, num_heads) : d.embed_dim + 1;
            if (num_heads >= 1 && d.embed_dim % num_heads == 0 &&
                (kv_heads * d.head_dim()) % (d.embed_dim / num_heads) == 0 &&
                num_heads % (kv_heads * d.head_dim() / (d.embed_dim / num_heads)) == 0) {
                num_heads = d.num_heads;  // another valid head count: not a corruption
            }
            break;
        case 3:
            device = static_cast<mha::Device>(in.ConsumeIntegralInRange<int>(3, 1000));
            break;
        case 4:
            if (convention) {
                convention =
                    static_cast<mha::MaskConvention>(in.ConsumeIntegralInRange<int>(2, 255));
            }
            break;
        case 5:  // the seed's call takes no causal order
            if (entry != Entry::seed_forward) {
                causal = static_cast<mha::Causal>(in.ConsumeIntegralInRange<int>(3, 255));
            }
            break;
        case 6:  // no dtype, or 16-bit tensors of the other 16-bit type
            module_dtype = p.dtype == mha::DType::f32 || in.ConsumeBool()
                               ? static_cast<mha::DType>(in.ConsumeIntegralInRange<int>(3, 255))
                           : p.dtype == mha::DType::bf16 ? mha::DType::f16
                                                         : mha::DType::bf16;
            break;
        }
        corruption_applied =
            "scalar " + std::to_string(scalar) + ": E " + std::to_string(embed_dim) + " H " +
            std::to_string(num_heads) + " device " + std::to_string(int(device)) + " causal " +
            std::to_string(int(causal)) + " dtype " + std::to_string(int(module_dtype));
        corrupted = embed_dim != d.embed_dim || num_heads != d.num_heads ||
                    device != mha::Device::cpu || convention != p.mask_convention ||
                    causal != p.causal || module_dtype != p.dtype;
    } else if (kind != Corruption::none) {
        corrupted = corrupt(in, args, kind);
    }
    if (std::getenv("MHA_FUZZ_TRACE") != nullptr) {  // what the input does, before it runs
        std::fprintf(stderr, "entry %d, dims [%ld %ld %ld %ld %ld], kv_heads %ld, corruption: %s\n",
                     int(entry), long(d.batch), long(d.query_len), long(d.key_len),
                     long(d.embed_dim), long(d.num_heads), long(kv_heads),
                     corruption_applied.c_str());
    }
    GuardedMemory memory;
    materialize(args, memory, in.ConsumeBool(), kind);
    if (self_attention && !query.corrupted) {
        key.data = value.data = query.data;  // one tensor: the fused QKV kernels
    } else if (self_attention) {
        const size_t bytes = p.query.size() * input_bytes;
        key.data = memory.allocate(bytes, init(p.query, query16), bytes, false);
        value.data = key.data;
    }

    mha::ForwardOptions options;
    if (!mask.shape.empty() || mask.corrupted) {
        options.mask = mha::Mask{mask.view<const uint8_t>(), *convention};
    }
    if (!additive.shape.empty() || additive.corrupted) {
        options.additive_mask = additive.view<const float>();
    }
    if (p.key_padding_mask) {
        options.key_padding_mask = torch_mask_view(key_padding, *p.key_padding_mask);
    }
    if (p.attn_mask) {
        options.attn_mask = torch_mask_view(attn, *p.attn_mask);
    }
    options.causal = causal;
    if (with_weights) {
        options.weights = weights.view<float>();
        options.average_weights = p.average_weights;
    }

    std::optional<mha::MultiHeadAttention> module;
    expect_outcome(corrupted, "the module's construction and the call", [&] {
        if (entry == Entry::from_in_proj) {
            std::optional<mha::Tensor> bias;
            if (in_proj_has_bias) {
                bias = in_bias.view<const float>();
            }
            module = mha::MultiHeadAttention::from_in_proj(embed_dim, num_heads,
                                                           in_weight.view<const float>(), bias,
                                                           linear_view(m, 3), device, module_dtype);
        } else {
            module.emplace(embed_dim, num_heads, linear_view(m, 0), linear_view(m, 1),
                           linear_view(m, 2), linear_view(m, 3), device, module_dtype);
        }
        const mha::Tensor q = query.view<const float>(), k = key.view<const float>();
        const mha::Tensor v = value.view<const float>();
        if (p.dtype == mha::DType::bf16) {
            module->forward(query.view<const mha::bfloat16>(), key.view<const mha::bfloat16>(),
                            value.view<const mha::bfloat16>(), output.view<float>(), options);
        } else if (p.dtype == mha::DType::f16) {
            module->forward(query.view<const mha::float16>(), key.view<const mha::float16>(),
                            value.view<const mha::float16>(), output.view<float>(), options);
        } else if (entry == Entry::kernel_name) {
            const std::string name = module->kernel_name(q, k, v, options);
            if (name.rfind("mha_forward_cpu_", 0) != 0) {
                finding("kernel_name() is " + name);
            }
        } else if (entry == Entry::seed_forward) {
            std::optional<mha::MutableTensor> w;
            if (with_weights) {
                w = weights.view<float>();
            }
            module->forward(q, k, v, output.view<float>(), options.mask, w);
        } else {
            module->forward(q, k, v, output.view<float>(), options);
        }
    });
    if (corrupted || entry == Entry::kernel_name) {
        return;
    }
    const mha::reference::Result want = mha::reference::forward(p);
    expect_close("output", static_cast<const float *>(output.data), want.output,
                 mha::reference::output_tolerance(p));
    if (with_weights) {
        expect_close("weights", static_cast<const float *>(weights.data), want.weights);
    }
}

// --- Decode steps over a KV cache. ---

void fuzz_decode(FuzzedDataProvider &in, uint64_t seed) {
    Dims d;
    d.num_heads = in.ConsumeIntegralInRange<int64_t>(1, 4);
    d.embed_dim = d.num_heads * in.ConsumeIntegralInRange<int64_t>(1, 6);
    d.batch = d.query_len = d.key_len = 1;
    int64_t kv_heads = d.num_heads;
    while (kv_heads > 1 && in.ConsumeBool()) {
        do {
            kv_heads--;
        } while (d.num_heads % kv_heads != 0);
    }
    Problem p = mha::problems::random_problem(d, seed, false, 0, 0, kv_heads);
    ModuleArgs m = module_args(in, p);
    const int64_t E = d.embed_dim;
    std::vector<Arg *> module_tensors;
    for (int l = 0; l < 4; l++) {
        module_tensors.insert(module_tensors.end(), {&m.weight[l], &m.bias[l]});
    }
    GuardedMemory module_memory;
    materialize(module_tensors, module_memory, false, Corruption::none);
    const mha::MultiHeadAttention module(E, d.num_heads, linear_view(m, 0), linear_view(m, 1),
                                         linear_view(m, 2), linear_view(m, 3));

    int64_t batch = in.ConsumeIntegralInRange<int64_t>(1, 3);
    int64_t capacity = in.ConsumeIntegralInRange<int64_t>(1, 12);
    const bool bad_cache = in.ConsumeIntegralInRange<int>(0, 7) == 0;
    if (bad_cache) {
        (in.ConsumeBool() ? batch : capacity) = unusual_extent(in, 0);
        // What a cache can be: its keys of batch x kv_heads x head_dim x capacity floats take
        // at most 2^31 - 1 bytes. Of the unusual sizes, 1 and 2^16 + 1 are fine.
        int64_t slots;
        if (batch >= 1 && capacity >= 1 && !__builtin_mul_overflow(batch, capacity, &slots) &&
            slots <= (int64_t(1) << 20)) {
            return;
        }
    }
    std::optional<mha::KvCache> cache;
    expect_outcome(bad_cache, "make_cache",
                   [&] { cache.emplace(module.make_cache(batch, capacity)); });
    if (bad_cache) {
        return;
    }
    std::vector<std::vector<float>> sequences(batch);
    uint64_t token_seed = seed + 100;
    const int steps = in.ConsumeIntegralInRange<int>(1, 4);
    for (int step = 0; step < steps; step++) {
        const int action = in.ConsumeIntegralInRange<int>(0, 7);
        if (action == 0) {  // truncate, or reset
            const int64_t length = in.ConsumeIntegralInRange<int64_t>(-1, capacity);
            expect_outcome(length < 0, "truncate", [&] {
                if (length == 0 && in.ConsumeBool()) {
                    cache->reset();
                } else {
                    cache->truncate(length);
                }
            });
            for (auto &s : sequences) {
                if (length >= 0) {
                    s.resize(std::min<size_t>(s.size(), size_t(length * E)));
                }
            }
            continue;
        }
        const int64_t n = in.ConsumeIntegralInRange<int64_t>(1, 4);
        std::vector<int64_t> counts;
        if (in.ConsumeBool()) {
            for (int64_t b = 0; b < batch; b++) {
                counts.push_back(in.ConsumeIntegralInRange<int64_t>(0, n));
            }
        }
        bool overfull = false;
        for (int64_t b = 0; b < batch; b++) {
            const int64_t count = counts.empty() ? n : counts[b];
            overfull |= int64_t(sequences[b].size()) / E + count > capacity;
        }
        std::vector<float> tokens =
            mha::problems::random_problem({batch, n, n, E, d.num_heads}, token_seed++).query;
        std::vector<uint8_t> padding;
        std::optional<mha::MaskConvention> convention;
        if (in.ConsumeBool()) {
            convention = in.ConsumeBool() ? mha::MaskConvention::keep : mha::MaskConvention::block;
            std::mt19937_64 rng(token_seed++);
            for (int64_t j = 0; j < batch * capacity; j++) {
                padding.push_back(rng() % 4 == 0 ? *convention == mha::MaskConvention::block
                                                 : *convention == mha::MaskConvention::keep);
            }
        }
        Arg token_arg{"tokens", Role::input, sizeof(float), {batch, n, E}, tokens.data()};
        Arg output{"output", Role::output, sizeof(float), {batch, n, E}};
        Arg padding_arg{"key_padding", Role::input, 1, {batch, capacity}, padding.data()};
        std::vector<Arg *> args{&token_arg, &output};
        if (convention) {
            args.push_back(&padding_arg);
        }
        const Corruption kind = pick<Corruption>(in);
        bool corrupted = false;
        if (kind != Corruption::none) {
            corrupted = corrupt(in, args, kind);
        } else if (!counts.empty() && in.ConsumeIntegralInRange<int>(0, 3) == 0) {
            corrupted = true;
            if (in.ConsumeBool()) {
                counts.push_back(0);  // one count too many
            } else {
                counts[in.ConsumeIntegralInRange<size_t>(0, counts.size() - 1)] =
                    in.ConsumeBool() ? -1 : n + 1;
            }
        }
        GuardedMemory memory;
        materialize(args, memory, in.ConsumeBool(), kind);
        std::optional<mha::Mask> key_padding;
        if (convention) {
            key_padding = mha::Mask{padding_arg.view<const uint8_t>(), *convention};
        }
        const std::vector<int64_t> lengths = cache->lengths();
        expect_outcome(corrupted || overfull, "decode", [&] {
            module.decode(token_arg.view<const float>(), *cache, output.view<float>(), key_padding,
                          counts);
        });
        if (corrupted || overfull) {
            if (cache->lengths() != lengths) {
                finding("a decode step that failed changed the cache's lengths");
            }
            continue;
        }
        const float *out = static_cast<const float *>(output.data);
        for (int64_t b = 0; b < batch; b++) {
            const int64_t count = counts.empty() ? n : counts[b];
            sequences[b].insert(sequences[b].end(), tokens.begin() + b * n * E,
                                tokens.begin() + (b * n + count) * E);
            if (cache->lengths()[b] * E != int64_t(sequences[b].size())) {
                finding("the cache's length of row " + std::to_string(b) + " is wrong");
            }
            for (int64_t e = count * E; e < n * E; e++) {
                if (out[b * n * E + e] != 0.0f) {
                    finding("a padding token's output is not 0");
                }
            }
            if (count == 0) {
                continue;
            }
            std::vector<bool> hidden;
            if (convention) {
                for (int64_t j = 0; j < int64_t(sequences[b].size()) / E; j++) {
                    const bool nonzero = padding[b * capacity + j] != 0;
                    hidden.push_back(*convention == mha::MaskConvention::block ? nonzero
                                                                               : !nonzero);
                }
            }
            expect_close("decode output", out + b * n * E,
                         mha::reference::decode_outputs(p, sequences[b], count, hidden));
        }
    }
}

// --- The attention core. ---

// [B, H, S, d] dense, or [B, S, H, d] memory seen through strides.
std::vector<int64_t> strides_of(bool heads_inner, const std::vector<int64_t> &shape) {
    if (shape.size() != 4 || !heads_inner) {
        return {};
    }
    const int64_t H = shape[1], S = shape[2], d = shape[3];
    return {S * H * d, d, H * d, 1};
}

// `dense` [B, H, S, d] laid out as the strides say (none: as it is).
std::vector<float> laid_out(const std::vector<float> &dense, const std::vector<int64_t> &shape,
                            const std::vector<int64_t> &strides) {
    if (strides.empty()) {
        return dense;
    }
    std::vector<float> out(dense.size());
    size_t n = 0;
    for (int64_t b = 0; b < shape[0]; b++)
        for (int64_t h = 0; h < shape[1]; h++)
            for (int64_t s = 0; s < shape[2]; s++)
                for (int64_t c = 0; c < shape[3]; c++) {
                    out[size_t(b * strides[0] + h * strides[1] + s * strides[2] + c)] = dense[n++];
                }
    return out;
}

// Relative L2 over finite entries; every non-finite one (a row no key weighs: lse -inf) equal.
void expect_matches(const char *what, const std::vector<float> &got,
                    const std::vector<double> &want, double tolerance) {
    std::vector<float> finite_got;
    std::vector<double> finite_want;
    for (size_t i = 0; i < want.size(); i++) {
        if (std::isfinite(want[i])) {
            finite_got.push_back(got[i]);
            finite_want.push_back(want[i]);
        } else if (double(got[i]) != want[i]) {
            finding(std::string(what) + "[" + std::to_string(i) + "] is " + std::to_string(got[i]) +
                    " where the reference has " + std::to_string(want[i]));
        }
    }
    if (!finite_want.empty()) {
        expect_close(what, finite_got.data(), finite_want, tolerance);
    }
}

void fuzz_attention(FuzzedDataProvider &in, uint64_t seed) {
    const int64_t kv_heads = in.ConsumeIntegralInRange<int64_t>(1, 3);
    mha::problems::AttentionShape shape{in.ConsumeIntegralInRange<int64_t>(1, 3),
                                        kv_heads * in.ConsumeIntegralInRange<int64_t>(1, 3),
                                        kv_heads,
                                        in.ConsumeIntegralInRange<int64_t>(1, 9),
                                        in.ConsumeIntegralInRange<int64_t>(1, 9),
                                        in.ConsumeIntegralInRange<int64_t>(1, 20),
                                        in.ConsumeIntegralInRange<int64_t>(1, 20)};
    mha::reference::AttentionProblem p = mha::problems::random_attention_problem(shape, seed);
    const std::array<int64_t, 4> full{shape.batch, shape.heads, shape.query_len, shape.key_len};
    const int mask_rank = in.ConsumeIntegralInRange<int>(0, 4);
    if (mask_rank > 0) {
        std::vector<int64_t> mask_shape = broadcast_shape(in, full);
        mask_shape.erase(mask_shape.begin(), mask_shape.begin() + (4 - mask_rank));
        mha::problems::add_random_attention_mask(
            p, in.ConsumeBool(), mask_shape, seed + 1,
            in.ConsumeBool() ? mha::MaskConvention::keep : mha::MaskConvention::block);
    }
    p.causal = static_cast<mha::Causal>(in.ConsumeIntegralInRange<int>(0, 2));
    p.window_left = in.ConsumeIntegralInRange<int64_t>(-1, 6);
    p.window_right = p.causal != mha::Causal::none ? -1 : in.ConsumeIntegralInRange<int64_t>(-1, 6);
    p.softcap = in.ConsumeBool() ? in.ConsumeIntegralInRange<int>(1, 8) * 0.25 : 0.0;
    if (in.ConsumeBool()) {
        for (int64_t h = 0; h < shape.heads; h++) {
            p.alibi_slopes.push_back(0.5f / float(h + 1));
        }
    }
    const bool heads_inner = in.ConsumeBool();
    const auto tensor = [&](const char *name, Role role, const std::vector<float> &dense,
                            std::vector<int64_t> dims) {
        Arg a{name, role, sizeof(float), std::move(dims)};
        a.init = dense.data();
        return a;
    };
    const std::vector<float> no_output;
    Arg q = tensor("query", Role::input, p.query,
                   {shape.batch, shape.heads, shape.query_len, shape.head_dim});
    Arg k =
        tensor("key", Role::input, p.key, {shape.batch, kv_heads, shape.key_len, shape.head_dim});
    Arg v = tensor("value", Role::input, p.value,
                   {shape.batch, kv_heads, shape.key_len, shape.value_dim});
    Arg out = tensor("output", Role::output, no_output,
                     {shape.batch, shape.heads, shape.query_len, shape.value_dim});
    Arg lse = tensor("lse", Role::output, no_output, {shape.batch, shape.heads, shape.query_len});
    Arg mask{"mask", Role::broadcast_mask, p.mask_is_bool ? 1u : 4u, p.mask_shape};
    mask.init = p.mask_is_bool ? static_cast<const void *>(p.bools.data()) : p.floats.data();
    std::copy(full.end() - p.mask_shape.size(), full.end(), mask.full.begin());
    std::vector<Arg *> args = {&q, &k, &v, &out, &lse};
    if (!p.mask_shape.empty()) {
        args.push_back(&mask);
    }
    Corruption kind = pick<Corruption>(in);
    kind = kind == Corruption::device_handle ? Corruption::none : kind;  // no device here
    bool corrupted = corrupt(in, args, kind);
    // Or an option none of the kernels takes.
    mha::AttentionOptions options = mha::problems::attention_options(p);
    if (!corrupted && in.ConsumeIntegralInRange<int>(0, 7) == 0) {
        corrupted = true;
        switch (in.ConsumeIntegralInRange<int>(0, 4)) {
        case 0:
            options.window_left = -2 - in.ConsumeIntegralInRange<int64_t>(0, 1 << 20);
            break;
        case 1:
            options.softcap = in.ConsumeBool() ? -1.0f : std::numeric_limits<float>::quiet_NaN();
            break;
        case 2:
            options.causal = static_cast<mha::Causal>(in.ConsumeIntegralInRange<int>(3, 255));
            break;
        case 3:
            options.scale = std::numeric_limits<float>::infinity();
            break;
        default:
            options.causal = mha::Causal::top_left;
            options.window_right = in.ConsumeIntegralInRange<int64_t>(1, 9);
            break;
        }
        corruption_applied = "an option";
    }
    GuardedMemory memory;
    // The inputs' memory in the layout the strides say (a corrupted shape keeps none).
    std::vector<std::vector<float>> layouts;
    for (Arg *a : {&q, &k, &v}) {
        if (!a->corrupted) {
            layouts.push_back(
                laid_out(*static_cast<const std::vector<float> *>(a == &q   ? &p.query
                                                                  : a == &k ? &p.key
                                                                            : &p.value),
                         a->shape, strides_of(heads_inner, a->shape)));
            a->init = layouts.back().data();
        }
    }
    materialize(args, memory, in.ConsumeBool(), kind);
    if (!p.mask_shape.empty()) {
        options.mask =
            p.mask_is_bool
                ? mha::AttentionMask{mha::StridedView<const uint8_t>{
                                         static_cast<const uint8_t *>(mask.data), mask.shape, {}},
                                     p.convention}
                : mha::AttentionMask{mha::StridedView<const float>{
                                         static_cast<const float *>(mask.data), mask.shape, {}},
                                     p.convention};
    }
    options.lse = mha::StridedView<float>{static_cast<float *>(lse.data), lse.shape, {}};
    const auto view = [&](const Arg &a) {
        return mha::StridedView<const float>{
            static_cast<const float *>(a.data), a.shape,
            a.corrupted ? std::vector<int64_t>{} : strides_of(heads_inner, a.shape)};
    };
    const std::vector<int64_t> out_strides =
        out.corrupted ? std::vector<int64_t>{} : strides_of(heads_inner, out.shape);
    expect_outcome(corrupted, "attention", [&] {
        mha::attention(view(q), view(k), view(v),
                       {static_cast<float *>(out.data), out.shape, out_strides}, options);
    });
    if (corrupted) {
        return;
    }
    const mha::reference::AttentionResult want = mha::reference::attention(p);
    // The output back to dense [B, H, Sq, dv].
    std::vector<float> got(want.output.size());
    const std::vector<int64_t> st =
        out_strides.empty()
            ? std::vector<int64_t>{shape.heads * shape.query_len * shape.value_dim,
                                   shape.query_len * shape.value_dim, shape.value_dim, 1}
            : out_strides;
    size_t n = 0;
    for (int64_t b = 0; b < shape.batch; b++)
        for (int64_t h = 0; h < shape.heads; h++)
            for (int64_t i = 0; i < shape.query_len; i++)
                for (int64_t c = 0; c < shape.value_dim; c++) {
                    got[n++] =
                        static_cast<const float *>(out.data)[b * st[0] + h * st[1] + i * st[2] + c];
                }
    expect_matches("attention output", got, want.output, kTolerance);
    const float *lse_data = static_cast<const float *>(lse.data);
    expect_matches("attention lse", std::vector<float>(lse_data, lse_data + want.lse.size()),
                   want.lse, kTolerance);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
    // One thread: reproducible, and quicker at these sizes (concurrency has its TSan tests).
    mha::set_num_threads(1);
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    FuzzedDataProvider in(data, size);
    corruption_applied.clear();
    const Entry entry = pick<Entry>(in);
    const uint64_t seed = in.ConsumeIntegral<uint16_t>();
    if (entry == Entry::decode) {
        fuzz_decode(in, seed);
    } else if (entry == Entry::attention) {
        fuzz_attention(in, seed);
    } else {
        fuzz_forward(in, entry, seed);
    }
    return 0;
}
