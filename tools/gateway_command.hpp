// `ordo gateway`: the HTTP gateway (ordo/gateway.hpp) in front of one channel, until SIGINT or
// SIGTERM.
#pragma once

#include <string>

#include <CLI/CLI.hpp>
#include <ordo/gateway.hpp>

namespace ordo_tool {

struct gateway_args {
    std::string to;  // the channel's URL
    ordo::gateway_options options;
    long connect_timeout_ms = 10'000;
};

/// Adds the subcommand's options to `sub`, filling `a`.
void add_gateway_options(CLI::App* sub, gateway_args& a);
/// Connects to a.to, serves until SIGINT or SIGTERM, stops; the exit status (1 and a line on
/// stderr if the channel or the listener cannot be opened).
int run_gateway(gateway_args a);

}  // namespace ordo_tool
