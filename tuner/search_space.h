// The values mha-tune tries for each CPU schedule parameter, for one instruction set.
#pragma once

#include <map>
#include <random>
#include <string>
#include <vector>

#include "cpu_params.h"

namespace mha::tune {

class SearchSpace {
public:
    explicit SearchSpace(const contract::CpuIsa &isa);

    // Cost-model pruning: valid parameters whose register tiles fit the register file (tiles
    // that spill are never worth compiling).
    bool plausible(const cpu::ScheduleParams &p) const;
    // Every tunable drawn at random.
    cpu::ScheduleParams random(std::mt19937_64 &rng) const;
    // One or two tunables of `p` moved to a neighbouring value.
    cpu::ScheduleParams neighbour(cpu::ScheduleParams p, std::mt19937_64 &rng) const;
    // A plausible draw of `draw` (at most 1000 tries, then the last one).
    template <typename Draw>
    cpu::ScheduleParams plausible_draw(Draw &&draw) const {
        cpu::ScheduleParams p = draw();
        for (int tries = 1; !plausible(p) && tries < 1000; tries++) {
            p = draw();
        }
        return p;
    }

private:
    cpu::ScheduleParams defaults_;
    int registers_;
    std::map<std::string_view, std::vector<int>> values_;
};

}  // namespace mha::tune
