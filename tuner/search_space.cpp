#include "search_space.h"

#include <algorithm>

namespace mha::tune {

SearchSpace::SearchSpace(const contract::CpuIsa &isa)
    : defaults_(cpu::ScheduleParams::defaults(isa)), registers_(isa.vector_registers) {
    std::vector<int> vectors;  // vectors per tile whose width divides the weights' padding
    for (int v : {1, 2, 4, 8}) {
        if (contract::kMaxTile % (v * isa.f32_lanes) == 0) {
            vectors.push_back(v);
        }
    }
    values_ = {{"proj_vectors", vectors},
               {"proj_rows", {2, 3, 4, 6, 8, 12, 14}},
               {"proj_block_tiles", {4, 8, 16, 32, 64}},
               {"attention_rows", {4, 8, 12, 16, 24, 32, 48}},
               {"tasks_per_head", {1, 2, 4, 8}},
               {"qk_vectors", vectors},
               {"qk_rows", {1, 2, 3, 4, 6, 8, 12}},
               {"pv_vectors", vectors},
               {"pv_rows", {1, 2, 3, 4, 6, 8, 12}},
               {"shared_keys", {0, 128, 256, 512}},
               {"materialize_weights", {0, 1}},
               {"parallel", {0, 1, 2}}};
    // A matrix engine's kernels are tile products (projections, Q·Kᵀ, weights·V) in 16 x 16
    // tiles, which only the task split and the parallel loops of these parameters shape.
    if (isa.dtype != DType::f32) {
        for (const auto &[name, field] : cpu::ScheduleParams::kTunables) {
            if (name != "tasks_per_head" && name != "parallel") {
                values_.at(name) = {defaults_.*field};
            }
        }
    }
}

bool SearchSpace::plausible(const cpu::ScheduleParams &p) const {
    const int budget = registers_ - 2;  // accumulators, leaving room for the operands
    return p.invalid_because().empty() && p.proj_vectors * p.proj_rows <= budget &&
           p.qk_vectors * p.qk_rows <= budget && p.pv_vectors * p.pv_rows <= budget;
}

cpu::ScheduleParams SearchSpace::random(std::mt19937_64 &rng) const {
    cpu::ScheduleParams p = defaults_;
    for (const auto &[name, field] : cpu::ScheduleParams::kTunables) {
        const std::vector<int> &choices = values_.at(name);
        p.*field = choices[rng() % choices.size()];
    }
    return p;
}

cpu::ScheduleParams SearchSpace::neighbour(cpu::ScheduleParams p, std::mt19937_64 &rng) const {
    const auto &tunables = cpu::ScheduleParams::kTunables;
    for (int moves = 1 + int(rng() % 2); moves > 0; moves--) {
        const auto &[name, field] = tunables[rng() % tunables.size()];
        const std::vector<int> &choices = values_.at(name);
        const auto at = std::find(choices.begin(), choices.end(), p.*field);
        const int index = at == choices.end() ? 0 : int(at - choices.begin());
        const int step = (rng() % 2) ? 1 : -1;
        p.*field = choices[std::clamp(index + step, 0, int(choices.size()) - 1)];
    }
    return p;
}

}  // namespace mha::tune
