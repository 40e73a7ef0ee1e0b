// `ordo gateway`: the HTTP gateway (ordo/gateway/gateway.hpp) in front of one channel, until SIGINT
// or SIGTERM.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <ordo/gateway/gateway.hpp>

namespace ordo_tool {

struct gateway_args {
    std::string to;  // the channel's URL
    ordo::gateway_options options;
    long connect_timeout_ms = 10'000;
    bool no_reconnect = false;  // --to as it is, even a plain connection that cannot come back
    std::string auth_tokens;    // --auth-tokens FILE
};

/// The channel the gateway opens for `a`: an ordered tcp://, unix:// or tls:// URL (not pooled,
/// not resumable) becomes a router over that one replica (route+...), which reconnects when the
/// backend is lost or restarts, and answers 503 meanwhile; any other URL, or --no-reconnect,
/// as it is.
std::string channel_url(const gateway_args& a);

/// Adds the subcommand's options to `sub`, filling `a`.
void add_gateway_options(CLI::App* sub, gateway_args& a);
/// Connects to a.to, serves until SIGINT or SIGTERM, stops; the exit status (1 and a line on
/// stderr if the channel or the listener cannot be opened).
int run_gateway(gateway_args a);

}  // namespace ordo_tool
