// mha-tune: benchmark-driven search over the CPU schedule's parameters (schedules/cpu_params.h)
// for one instruction set of the contract, recorded in a tuning database from which the tuned
// file the build reads is derived (search.h); or, with --compare, the tuned parameters and
// Halide's autoschedulers against the defaults (compare.h).
#include <fmt/format.h>

#include <filesystem>
#include <optional>

#include "candidate.h"
#include "command_line.h"
#include "compare.h"
#include "cpu_isa.h"
#include "search.h"
#include "sweeps.h"
#include "tuned_file.h"

namespace {

template <typename Table>
std::vector<std::string> names_of(const Table &table) {
    std::vector<std::string> names;
    for (const auto &entry : table) {
        names.emplace_back(entry.name);
    }
    return names;
}

}  // namespace

int main(int argc, char **argv) {
    CLI::App app(
        "Tunes the CPU schedule of one instruction set: searches its parameters per "
        "shape bucket, recording every measurement in a tuning database, and writes the "
        "tuned file the build reads. With --compare, times the tuned parameters and "
        "Halide's autoschedulers against the defaults on the benchmark sweep.",
        "mha-tune");
    std::string isa_name, tuning_shape, database, tuned_file;
    std::vector<std::string> bucket_names;
    mha::tune::TuneOptions tune;
    mha::tune::CompareOptions compare;
    bool comparing = false;
    int measure_shape = -1;
    std::string contender;
    std::vector<std::string> isa_names;
    for (const mha::contract::CpuIsa &isa : mha::contract::kCpuIsas) {
        isa_names.emplace_back(isa.name);
    }
    app.add_option("--isa", isa_name,
                   "the instruction set to tune (a bf16 one's: its bf16 kernels, whose "
                   "tile products take only tasks_per_head and parallel)")
        ->required()
        ->check(CLI::IsMember(isa_names))
        ->type_name("ISA");
    app.add_option("--budget-minutes", tune.budget_minutes, "time for all buckets together")
        ->check(CLI::PositiveNumber)
        ->type_name("M")
        ->capture_default_str();
    app.add_option("--seed", tune.seed, "seed of the search (a resumed run needs the same one)")
        ->type_name("N")
        ->capture_default_str();
    app.add_option("--rounds", tune.rounds,
                   "interleaved rounds of each timing against the defaults")
        ->check(CLI::Range(1, 101))
        ->type_name("N")
        ->capture_default_str();
    app.add_option("--bucket", bucket_names, "a bucket to tune (repeatable; default: all)")
        ->check(CLI::IsMember(names_of(mha::contract::kShapeBuckets)))
        ->type_name("BUCKET");
    app.add_option("--tuning-shape", tuning_shape, "tune on this shape instead of the buckets'")
        ->check(mha::tools::problem_shape())
        ->type_name("B,Sq,Sk,E,H");
    app.add_option("--max-candidates", tune.max_candidates, "per bucket (default: no limit)")
        ->check(mha::tools::positive_integer())
        ->type_name("N");
    app.add_flag(
        "--tuning-shape-only", [&](int64_t) { tune.sweep_shapes = false; },
        "time candidates on the tuning shape only, not on the bucket's sweep shapes too");
    app.add_option("--db", database,
                   "tuning database (default schedules/tuned/<isa>.records.jsonl)")
        ->type_name("FILE");
    app.add_option("--out", tuned_file,
                   "tuned file (default schedules/tuned/<isa>.<this CPU's key>.json)")
        ->type_name("FILE");
    app.add_flag("--plot-only", tune.plot_only,
                 "write the plot of this CPU's search (beside the tuned file) and exit");
    app.add_flag("--compare", comparing, "compare tuned, autoscheduled and default schedules");
    app.add_option("--tuned", compare.tuned_file, "--compare: the tuned file (default --out's)")
        ->type_name("FILE");
    app.add_option("--limit-seconds", compare.limit_seconds, "--compare: per measurement")
        ->check(mha::tools::positive_integer())
        ->type_name("S")
        ->capture_default_str();
    app.add_flag(
        "--no-autoschedulers", [&](int64_t) { compare.with_autoschedulers = false; },
        "--compare: tuned against default only");
    // The children of --compare.
    app.add_option("--measure-shape", measure_shape)
        ->check(CLI::Range(0, int(mha::bench::kBenchmarkSweep.size()) - 1))
        ->group("");
    app.add_option("--measure-contender", contender)->group("");
    if (const auto code = mha::tools::parse_command_line(app, argc, argv)) {
        return *code;
    }

    const size_t isa_index = *mha::contract::cpu_isa_index(isa_name);
    const mha::contract::CpuIsa &isa = mha::contract::kCpuIsas[isa_index];
    // Timings are only worth recording on the hardware itself: never through an emulator (qemu
    // runs another architecture's kernels here, at speeds that say nothing about its CPUs).
    if (isa.arch != mha::contract::compiled_cpu_arch()) {
        fmt::print(stderr,
                   "mha-tune: --isa {} is an {} instruction set; tuning times kernels on the CPU "
                   "it runs on, so run mha-tune on an {} machine (not under emulation)\n",
                   isa_name, mha::contract::cpu_arch_name(isa.arch),
                   mha::contract::cpu_arch_name(isa.arch));
        return 1;
    }
    // A bf16 instruction set runs where it or one listed before it (a superset) does. Asking for
    // the matrix engine also asks Linux for its tile state, without which it faults.
    const std::optional<size_t> bf16_isa = mha::detail::bf16_isa(isa.dtype);
    if (isa.dtype != mha::DType::f32 && !(bf16_isa && *bf16_isa <= isa_index)) {
        fmt::print(stderr,
                   "mha-tune: --isa {} needs a CPU with its bf16 products (and, for the matrix "
                   "engine, Linux's permission to use it); this one runs {}\n",
                   isa_name, bf16_isa ? mha::contract::kCpuIsas[*bf16_isa].name : "none of them");
        return 1;
    }
    const std::string tuned_dir = MHA_TUNED_DIR;
    tune.isa = compare.isa = &isa;
    tune.database = database.empty() ? tuned_dir + "/" + isa_name + ".records.jsonl" : database;
    tune.tuned_file = tuned_file.empty()
                          ? mha::cpu::tuned_file_path(tuned_dir, isa, mha::detail::this_cpu())
                          : tuned_file;
    compare.tuned_file = compare.tuned_file.empty() ? tune.tuned_file : compare.tuned_file;
    compare.rounds = tune.rounds;
    for (const std::string &name : bucket_names) {
        tune.buckets.push_back(*mha::contract::bucket_named(name));
    }
    if (tune.buckets.empty()) {
        for (const mha::contract::BucketSpec &b : mha::contract::kShapeBuckets) {
            tune.buckets.push_back(b.bucket);
        }
    }
    if (!tuning_shape.empty()) {
        tune.tuning_shape = mha::tools::parse_problem_shape(tuning_shape);
    }
    tune.command = "mha-tune";
    for (int a = 1; a < argc; a++) {
        tune.command += std::string(" ") + argv[a];
    }
    try {
        if (measure_shape >= 0) {
            mha::tune::load_autoscheduler_plugins();
            return mha::tune::measure_contender(compare, size_t(measure_shape), contender);
        }
        if (comparing) {
            compare.self = std::filesystem::read_symlink("/proc/self/exe").string();
            return mha::tune::compare(compare);
        }
        return mha::tune::tune(tune);
    } catch (const std::exception &e) {
        fmt::print(stderr, "mha-tune: {}\n", e.what());
        return 1;
    }
}
