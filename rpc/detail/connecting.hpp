// Pieces of rpc/connect.cpp that pools and routers share: opening a transport within a time
// limit, and the URL parameters that configure a peer.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "ordo/peer.hpp"
#include "ordo/transport.hpp"

namespace ordo::detail {

/// Connects to `url`; throws std::system_error with errc::timed_out naming the URL if it takes
/// longer than `limit`, or the connection error.
net::awaitable<std::unique_ptr<transport>> open_transport_within(std::string url,
                                                                 std::chrono::milliseconds limit,
                                                                 transport_options to);

/// Applies `key=value` if it is a peer parameter (timeout_ms, interval_ms,
/// liveness_timeout_ms, heartbeat_ms); returns false for other keys.
bool apply_peer_parameter(std::string_view url, const std::string& key, const std::string& value,
                          peer_options& o);

/// A peer over `t`, connected to `url`: with o.resume set, its session resumes by reconnecting
/// to `url` (a server that does not resume sessions makes it a plain one).
std::shared_ptr<peer> make_connected_peer(std::unique_ptr<transport> t, const std::string& url,
                                          peer_options o, const handlers* h);

}  // namespace ordo::detail
