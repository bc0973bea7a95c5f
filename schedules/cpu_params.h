// The tunables of the CPU schedule (cpu_schedule.h), without Halide: the build reads them from
// tuned files, mha-tune searches them, the generators apply them. Sizes are in f32 lanes of the
// instruction set's vector registers ("vectors") or in rows.
#pragma once

#include <array>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "mha_contract.h"

namespace mha::cpu {

struct ScheduleParams {
    int vector_lanes = 8;       // the instruction set's, not tunable
    int vector_registers = 16;  // the same
    // How its bf16 kernels' tile products run (the instruction set's, not tunable).
    contract::Bf16Products bf16_products = contract::Bf16Products::none;
    // Projections: register tile of proj_vectors x proj_rows accumulators.
    int proj_vectors = 2;
    int proj_rows = 6;
    int proj_block_tiles = 16;  // row tiles sharing one weight panel while in cache
    // Attention: query rows per tile whose scores and softmax stay in a tile buffer.
    int attention_rows = 8;
    int tasks_per_head = 4;  // parallel tasks per (batch, head), each a run of query tiles
    // Q·Kᵀ register tile: qk_vectors of keys x qk_rows queries.
    int qk_vectors = 2;
    int qk_rows = 4;
    // weights·V register tile: pv_vectors of head features x pv_rows queries.
    int pv_vectors = 2;
    int pv_rows = 4;
    // Keys the tile's rows take in turn: Q·Kᵀ's columns of keys, and weights·V's blocks of
    // shared_keys keys, each used by every row of the tile while in L1 (weights·V then adds its
    // blocks into the tile's context in memory). 0: each register tile's rows run over all the
    // keys, which read K and V once per qk_rows or pv_rows rows.
    int shared_keys = 0;
    // 1: normalized softmax weights are computed per tile; 0: folded into weights·V.
    int materialize_weights = 1;
    // Which loops run on every core: 2 all (tiles, heads, batch rows), 1 those that stream
    // weights or a KV cache only (projections, a decode step's pass over the cache), 0 none
    // (waking the other cores costs microseconds, more than the smallest calls' work).
    int parallel = 2;

    using Field = int ScheduleParams::*;
    static constexpr std::array<std::pair<std::string_view, Field>, 12> kTunables = {{
        {"proj_vectors", &ScheduleParams::proj_vectors},
        {"proj_rows", &ScheduleParams::proj_rows},
        {"proj_block_tiles", &ScheduleParams::proj_block_tiles},
        {"attention_rows", &ScheduleParams::attention_rows},
        {"tasks_per_head", &ScheduleParams::tasks_per_head},
        {"qk_vectors", &ScheduleParams::qk_vectors},
        {"qk_rows", &ScheduleParams::qk_rows},
        {"pv_vectors", &ScheduleParams::pv_vectors},
        {"pv_rows", &ScheduleParams::pv_rows},
        {"shared_keys", &ScheduleParams::shared_keys},
        {"materialize_weights", &ScheduleParams::materialize_weights},
        {"parallel", &ScheduleParams::parallel},
    }};

    // The hand-written defaults for an instruction set.
    static ScheduleParams defaults(const contract::CpuIsa &isa) {
        ScheduleParams p;
        p.vector_lanes = isa.f32_lanes;
        p.vector_registers = isa.vector_registers;
        p.bf16_products = isa.bf16_products;
        if (isa.vector_registers >= 32) {  // room for taller register tiles
            p.proj_rows = 12;
            p.qk_rows = 8;
            p.pv_rows = 8;
        }
        return p;
    }

    // The attention kernels' (F.scaled_dot_product_attention's level), which the tuner, timing
    // the forward pass, never sees: their calls are the long sequences whose K and V outgrow L2,
    // so tiles of many query rows share each block of keys (bench/RESULTS.md measures them).
    static ScheduleParams attention_defaults(const contract::CpuIsa &isa) {
        ScheduleParams p = defaults(isa);
        p.shared_keys = 256;
        if (isa.vector_registers >= 32) {
            p.attention_rows = 48;
            p.qk_vectors = 4;
            p.qk_rows = 6;
        } else {
            p.attention_rows = 32;
        }
        return p;
    }

    // A tunable by name, or null.
    static const Field *field(std::string_view name) {
        for (const auto &[n, f] : kTunables) {
            if (n == name) {
                return &f;
            }
        }
        return nullptr;
    }

    // "proj_vectors:2,proj_rows:6,...", the form generator params take (they cannot hold '=').
    std::string to_string() const {
        std::string out;
        for (const auto &[name, f] : kTunables) {
            out += (out.empty() ? "" : ",") + std::string(name) + ":" + std::to_string(this->*f);
        }
        return out;
    }

    // Sets one tunable; throws std::invalid_argument for an unknown name.
    void set(std::string_view name, int value) {
        const Field *f = field(name);
        if (f == nullptr) {
            throw std::invalid_argument("unknown schedule parameter '" + std::string(name) +
                                        "' (the parameters are " + ScheduleParams().to_string() +
                                        ")");
        }
        this->*(*f) = value;
    }

    // Applies "name:value,..." assignments, then checks the result; throws std::invalid_argument.
    void apply(std::string_view assignments) {
        while (!assignments.empty()) {
            const size_t end = std::min(assignments.find(','), assignments.size());
            const std::string item(assignments.substr(0, end));
            assignments.remove_prefix(std::min(end + 1, assignments.size()));
            const size_t colon = item.find(':');
            size_t used = 0;
            int value = 0;
            try {
                value = std::stoi(item.substr(colon + 1), &used);
            } catch (const std::exception &) {
                used = 0;
            }
            if (colon == std::string::npos || field(item.substr(0, colon)) == nullptr ||
                used == 0 || used != item.size() - colon - 1) {
                throw std::invalid_argument("bad schedule parameter '" + item +
                                            "': expected <name>:<integer>, names being those of " +
                                            ScheduleParams().to_string());
            }
            set(item.substr(0, colon), value);
        }
        check();
    }

    // Why these parameters cannot build a correct pipeline; empty when they can.
    std::string invalid_because() const {
        for (const auto &[name, f] : kTunables) {
            const int largest = name == "materialize_weights" ? 1 : name == "parallel" ? 2 : 0;
            if (largest > 0 && (this->*f < 0 || this->*f > largest)) {
                return std::string(name) + " must be 0 to " + std::to_string(largest);
            }
            if (name == "shared_keys") {
                if (shared_keys < 0 || shared_keys % vector_lanes != 0) {
                    return "shared_keys must be 0 or a positive multiple of " +
                           std::to_string(vector_lanes) + " (a causal key block)";
                }
            } else if (largest == 0 && this->*f < 1) {
                return std::string(name) + " must be positive";
            }
        }
        const int max_tile = contract::kMaxTile;
        if (max_tile % (vector_lanes * proj_vectors) != 0 ||
            max_tile % (vector_lanes * pv_vectors) != 0) {
            return "projection and weights·V tiles must divide " + std::to_string(max_tile) +
                   " features (the weights' padding)";
        }
        if (attention_rows % qk_rows != 0 || attention_rows % pv_rows != 0) {
            return "attention_rows must be a multiple of qk_rows and pv_rows";
        }
        return "";
    }

    void check() const {
        const std::string why = invalid_because();
        if (!why.empty()) {
            throw std::invalid_argument("schedule parameters " + to_string() +
                                        " are invalid: " + why);
        }
    }

    bool operator==(const ScheduleParams &o) const { return to_string() == o.to_string(); }
};

}  // namespace mha::cpu
