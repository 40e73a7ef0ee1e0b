// Pieces of rpc/channels/connect.cpp that pools and routers share: opening a transport within a
// time limit, and a peer connected to a URL.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>

#include "ordo/error.hpp"
#include "ordo/rpc/peer.hpp"
#include "ordo/comm/transport.hpp"

namespace ordo::detail {

/// Connects to `url`; throws std::system_error with errc::timed_out naming the URL if it takes
/// longer than `limit`, or the connection error.
net::awaitable<std::unique_ptr<transport>> open_transport_within(std::string url,
                                                                 std::chrono::milliseconds limit,
                                                                 transport_options to);

/// A failure to open a connection to `url`, as ordo reports it: an rpc_error with an empty
/// method and an ordo::errc code. OS errors (refused, unreachable, reset, handshake...) become
/// errc::peer_lost and an unknown host errc::bad_address, the OS's reason kept in the detail;
/// errors that already carry an errc (bad_address, timed_out...) keep it. Called while a
/// std::system_error is handled (in its catch block): that is the failure.
rpc_error connect_error(std::string_view url);

/// A peer over `t`, connected to `url`: with o.resume set, its session resumes by reconnecting
/// to `url` (a server that does not resume sessions makes it a plain one).
/// Throws errc::bad_address naming `url` when `resume` asks for a session over a transport
/// that cannot keep one (zmq+).
void check_resume_scheme(std::string_view url, std::chrono::milliseconds resume);

std::shared_ptr<peer> make_connected_peer(std::unique_ptr<transport> t, const std::string& url,
                                          peer_options o, const handlers* h);

}  // namespace ordo::detail
