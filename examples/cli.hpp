// The command lines of the example programs and benchmarks, parsed with CLI11 (as tools/ordo.cpp
// is): `--flag value` or `--flag=value`, `--help`, and a clear error naming the flag for a bad
// value or an unknown flag.
#pragma once

#include <charconv>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>

namespace ordo_cli {

/// What every flag of these programs shares: --help shows its default, and a flag given twice
/// keeps its last value (a list flag such as `--listen` opts out with `take_all()`). Call before
/// adding the flags.
inline void use_defaults(CLI::App& app) {
    app.option_defaults()->always_capture_default()->multi_option_policy(
        CLI::MultiOptionPolicy::TakeLast);
}

/// A whole decimal number of at least `min`: `--calls ten` fails with "--calls: ten is not a
/// whole number >= 0". (CLI11's own conversion would read 010 as octal.)
inline CLI::Validator at_least(long min) {
    return CLI::Validator(
        [min](std::string& s) -> std::string {
            long n = 0;
            const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
            if (ec != std::errc{} || end != s.data() + s.size() || n < min)
                return s + " is not a whole number >= " + std::to_string(min);
            s = std::to_string(n);
            return {};
        },
        min == 0   ? "NONNEGATIVE"
        : min == 1 ? "POSITIVE"
                   : ">=" + std::to_string(min));
}

/// Parses the command line into the options declared on `app`. Returns the status to exit with
/// when the program should stop: 0 after --help (printed on stdout), `usage_status` after a usage
/// error (CLI11's message on stderr); std::nullopt to go on.
inline std::optional<int> parse(CLI::App& app, int argc, char** argv, int usage_status) {
    try {
        app.parse(argc, argv);
        return std::nullopt;
    } catch (const CLI::ParseError& e) {
        return app.exit(e) == 0 ? 0 : usage_status;
    }
}

}  // namespace ordo_cli
