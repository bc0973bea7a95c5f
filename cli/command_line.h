// Command lines of the project's programs (mha, mha-tune, the benchmarks), through CLI11, with
// one behaviour: --help prints the options and exits 0; a bad option or value prints the error
// and one usage line and exits 2.
#pragma once

#include <CLI/CLI.hpp>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>

#include "mha_contract.h"

namespace mha::tools {

// A whole number of at least 1.
inline CLI::Validator positive_integer() {
    return CLI::Validator(
        [](std::string &text) -> std::string {
            size_t used = 0;
            long long value = 0;
            try {
                value = std::stoll(text, &used);
            } catch (const std::exception &) {
                used = 0;
            }
            return used == text.size() && used > 0 && value >= 1
                       ? ""
                       : "'" + text + "' is not a whole number of at least 1";
        },
        "");
}

// "B,Sq,Sk,E,H", every value a whole number of at least 1 and H dividing E; nullopt otherwise.
inline std::optional<contract::ProblemShape> parse_problem_shape(const std::string &text) {
    std::istringstream in(text);
    contract::ProblemShape s{};
    char commas[4] = {};
    in >> s.batch >> commas[0] >> s.query_len >> commas[1] >> s.key_len >> commas[2] >>
        s.embed_dim >> commas[3] >> s.num_heads;
    const bool whole = in && in.peek() == EOF && std::string(commas, 4) == ",,,,";
    if (!whole || s.batch < 1 || s.query_len < 1 || s.key_len < 1 || s.embed_dim < 1 ||
        s.num_heads < 1 || s.embed_dim % s.num_heads != 0) {
        return std::nullopt;
    }
    return s;
}

inline CLI::Validator problem_shape() {
    return CLI::Validator(
        [](std::string &text) -> std::string {
            return parse_problem_shape(text) ? ""
                                             : "'" + text +
                                                   "' is not B,Sq,Sk,E,H of whole numbers >= 1 "
                                                   "with H dividing E";
        },
        "");
}

// "usage: mha [--batch N] [--no-weights] ...", from the options `app` has.
inline std::string usage_line(const CLI::App &app) {
    std::string line = "usage: " + app.get_name();
    for (const CLI::Option *option : app.get_options()) {
        std::string name = option->get_name(false, true);
        if (name.empty() || option->get_name() == "--help") {
            continue;
        }
        name = name.substr(0, name.find(','));
        if (!option->get_type_name().empty()) {
            name += " " + option->get_type_name();
        }
        line += option->get_required() ? " " + name : " [" + name + "]";
    }
    return line;
}

// Parses `argv`; returns the exit code when the program should stop now.
inline std::optional<int> parse_command_line(CLI::App &app, int argc, char **argv) {
    try {
        app.parse(argc, argv);
        return std::nullopt;
    } catch (const CLI::CallForHelp &e) {
        return app.exit(e);
    } catch (const CLI::ParseError &e) {
        std::cerr << app.get_name() << ": error: " << e.what() << "\n" << usage_line(app) << "\n";
        return 2;
    }
}

}  // namespace mha::tools
