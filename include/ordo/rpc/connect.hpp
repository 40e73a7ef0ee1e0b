// ordo::async_connect: a channel from a URL. The URL chooses ordered or pooled; call sites do not
// change.
#pragma once

#include "ordo/config.hpp"

#include <string_view>

#include "ordo/rpc/channel.hpp"

namespace ordo {

// Declared in ordo/rpc/peer.hpp and ordo/rpc/handlers.hpp: include them to pass options or
// handlers. A call site that only connects and calls compiles without them.
struct peer_options;
class handlers;

/// Connects to `url` (tcp://host:port or unix:///path) and returns a channel, on the calling
/// coroutine's executor.
///
/// `mode=ordered` (default): one ordered connection (an ordo::peer), opened now. `h`
/// (optional) serves requests the remote side sends back; it must outlive the channel.
/// `mode=pooled`: an ordo::pool; one connection is opened now, so that a wrong address fails
/// here. Pooled notifications are not ordered.
///
/// `route+SCHEME://a,b,...?...`: an ordo::router over the replicas SCHEME://a, SCHEME://b...,
/// all connected now (see parse_route_url for its parameters). `h` is not used.
///
/// URL parameters (all optional; they override the fields of `o`):
///
/// | parameter | modes | meaning |
/// | --- | --- | --- |
/// | mode | both | ordered or pooled |
/// | timeout_ms | both | default deadline of calls (0: none) |
/// | interval_ms | both | batching interval of each connection |
/// | liveness_timeout_ms | both | silence that declares a busy peer lost (default 10000) |
/// | heartbeat_ms | both | silence before ordo.ping is sent (default a quarter of the above) |
/// | max_connections | pooled | connections open at once (default 16) |
/// | max_idle | pooled | idle connections kept (default 16) |
/// | idle_timeout_ms | pooled | idle connections closed after this (default 30000) |
/// | connect_timeout_ms | pooled | limit on opening one connection (default 10000) |
/// | max_queued | pooled | calls waiting for a connection (default 65536) |
/// | cert, key, ca, verify, server_name, handshake_timeout_ms | tls:// | see ordo::tls_options |
/// | zmq_heartbeat_ms | zmq+tcp://, zmq+ipc:// | see ordo::zmq_options |
///
/// Every failure throws ordo::rpc_error with an empty method, peer() the URL as given, and
/// what() like `ordo: connect to tcp://127.0.0.1:1 failed: connection refused`. Codes:
/// errc::bad_address (unknown parameter, bad value, unusable TLS settings, unknown host),
/// errc::timed_out (connect_timeout_ms passed), errc::peer_lost (refused, unreachable, reset,
/// TLS handshake failed: the OS's or OpenSSL's reason is in detail()).
net::awaitable<channel> async_connect(std::string_view url, peer_options o,
                                      const handlers* h = nullptr);
/// The same with default options (an overload, not a default argument: docs/calls-and-channels.md,
/// "GCC 12 note").
net::awaitable<channel> async_connect(std::string_view url);

}  // namespace ordo
