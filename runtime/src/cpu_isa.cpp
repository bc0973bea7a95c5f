#include "cpu_isa.h"

#include <fmt/format.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "HalideBuffer.h"
#include "mha/mha.h"
#include "mha_contract.h"
#include "mha_cpu_isa_probe.h"

namespace mha::detail {
namespace {

struct IsaChoice {
    std::optional<size_t> isa;
    std::string error;
};

IsaChoice choose() {
    auto probed = Halide::Runtime::Buffer<int32_t, 0>::make_scalar();
    if (mha_cpu_isa_probe(probed) != 0) {
        return {std::nullopt, "the CPU instruction set probe failed"};
    }
    const size_t best = size_t(probed());
    const char *cap = std::getenv("MHA_CPU_ISA");
    if (cap == nullptr) {
        return {best, ""};
    }
    const std::optional<size_t> capped = contract::cpu_isa_index(cap);
    if (!capped) {
        std::string allowed;
        for (const contract::CpuIsa &isa : contract::kCpuIsas) {
            allowed += fmt::format("{}{}", allowed.empty() ? "" : ", ", isa.name);
        }
        return {std::nullopt,
                fmt::format("MHA_CPU_ISA is '{}', which is not one of {}", cap, allowed)};
    }
    // Instruction sets are listed best first: the cap can only lower the choice.
    return {std::max(best, *capped), ""};
}

}  // namespace

size_t cpu_isa() {
    static const IsaChoice choice = choose();
    if (!choice.isa) {
        throw Error(choice.error);
    }
    return *choice.isa;
}

}  // namespace mha::detail
