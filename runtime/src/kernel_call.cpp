#include <fmt/format.h>

#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "kernel_table.h"
#include "mha/mha.h"

namespace mha::detail {
namespace {

// Where a kernel's Halide errors go: the call that raised them, through its user_context.
struct CallContext {
    std::string error;
};

void route_halide_error(void *user_context, const char *message) {
    if (user_context != nullptr) {
        static_cast<CallContext *>(user_context)->error += message;
    }
}

}  // namespace

void install_error_handler() {
    static std::once_flag once;
    std::call_once(once, [] { halide_set_error_handler(&route_halide_error); });
}

void call_kernel(const ForwardKernel &kernel, std::initializer_list<NamedArgument> named) {
    const halide_filter_metadata_t *md = kernel.metadata();
    CallContext context;
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
    const int result = kernel.call(args.data());
    if (result != 0) {
        throw Error(fmt::format("kernel {} failed (Halide error {}): {}", md->name, result,
                                context.error));
    }
}

}  // namespace mha::detail
