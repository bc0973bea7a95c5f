#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "kernel_table.h"
#include "mha/mha.h"
#include "scratch_pool.h"

namespace mha::detail {
namespace {

// Where Halide's errors go: the call that raised them, through its user_context.
void route_halide_error(void *user_context, const char *message) {
    if (user_context != nullptr) {
        static_cast<CallContext *>(user_context)->error += message;
    }
}

bool has_feature(const uint64_t *features, halide_target_feature_t f) {
    return (features[f / 64] >> (f % 64)) & 1;
}

// Halide's dispatch decides once per kernel and process, so this is process-wide.
std::atomic<const char *> dispatched{""};
thread_local const char *last_kernel = "";

const char *isa_name(const uint64_t *features) {
    return has_feature(features, halide_target_feature_avx512_skylake) ? "avx512"
           : has_feature(features, halide_target_feature_avx2)        ? "avx2"
           : has_feature(features, halide_target_feature_sse41)       ? "sse41"
                                                                      : "x86-64";
}

// MHA_CPU_ISA=avx2 (or sse41) caps the instruction sets dispatch may pick: for testing the
// lower code paths on a CPU that has more.
bool above_cap(const char *isa) {
    static const char *const order[] = {"x86-64", "sse41", "avx2", "avx512"};
    const char *cap = std::getenv("MHA_CPU_ISA");
    if (cap == nullptr) {
        return false;
    }
    const auto rank = [&](const char *name) {
        return std::find_if(std::begin(order), std::end(order),
                            [&](const char *o) { return std::strcmp(o, name) == 0; }) -
               std::begin(order);
    };
    return rank(isa) > rank(cap);
}

// Halide's multi-target dispatch asks this for each compiled target, best first, and runs the
// first accepted: remember which one that was.
int observe_dispatch(int count, const uint64_t *features) {
    const char *isa = isa_name(features);
    const int usable = !above_cap(isa) && halide_default_can_use_target_features(count, features);
    if (usable) {
        dispatched = isa;
    }
    return usable;
}

}  // namespace

void install_runtime_hooks() {
    static std::once_flag once;
    std::call_once(once, [] {
        halide_set_error_handler(&route_halide_error);
        halide_set_custom_can_use_target_features(&observe_dispatch);
        halide_set_custom_malloc(&scratch_allocate);
        halide_set_custom_free(&scratch_release);
    });
}

const char *dispatched_isa() { return dispatched; }

const char *last_kernel_name() { return last_kernel; }

void check_halide(int result, const CallContext &context, const std::string &what) {
    if (result != 0) {
        throw Error(fmt::format("{} failed (Halide error {}): {}", what, result, context.error));
    }
}

void call_kernel(const ForwardKernel &kernel, CallContext &context,
                 const std::vector<NamedArgument> &named) {
    const halide_filter_metadata_t *md = kernel.metadata();
    void *user_context = &context;
    std::vector<void *> args;
    args.reserve(md->num_arguments);
    for (int a = 0; a < md->num_arguments; a++) {
        const char *name = md->arguments[a].name;
        // The user_context feature adds this argument: it routes errors to `context`.
        void *value = std::strcmp(name, "__user_context") == 0 ? &user_context : nullptr;
        for (const NamedArgument &n : named) {
            if (std::strcmp(n.name, name) == 0) {
                value = n.value;
            }
        }
        if (value == nullptr) {
            throw Error(fmt::format("internal error: kernel {} takes an argument '{}' the runtime "
                                    "does not provide",
                                    md->name, name));
        }
        args.push_back(value);
    }
    last_kernel = md->name;
    check_halide(kernel.call(args.data()), context, fmt::format("kernel {}", md->name));
}

}  // namespace mha::detail
