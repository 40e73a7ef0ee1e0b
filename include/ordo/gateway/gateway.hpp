// ordo::gateway: HTTP/1.1 in front of any ordo channel (libordo-gateway), served on the
// channel's own event loop.
//
//   POST /METHOD            body: the params as a JSON array, or one JSON value for a
//                           one-parameter method (an array argument alone: [[1, 2]]); no body:
//                           no params. 200 with the result as JSON.
//   ... ?notify=1           (or header Ordo-Notify: 1) a one-way message: 202 once taken.
//   ... ?stream=1           (or header Ordo-Stream: 1; implied for methods that ordo.methods
//                           marks as streams) 200, chunked, one JSON item a line (NDJSON).
//   ... ?relative_slo_ms=N  the call's deadline, N ms from now; ?absolute_slo_ms=N: at N ms since
//                           the Unix epoch (the names of Ray Serve's HTTP proxy); or the headers
//                           Ordo-Relative-Slo-Ms / Ordo-Absolute-Slo-Ms. One at most; > 0.
//   ... ?key=K              (or header Ordo-Key: K) the call's affinity key (routers).
//   GET /-/routes           the methods ordo.methods lists: path, signature, whether it streams.
//   GET /-/healthz          200 when the channel answers ordo.ping, else 503 with the reason.
//   GET /metrics            the gateway's counters in Prometheus' text format (metrics = true).
//
// Errors answer {"code": NAME, "message": TEXT} with TEXT as ordo prints the failure and NAME
// the errc in snake_case (http_status() gives the table, docs/gateway.md, "Errors", shows it).
// HTTP-level failures (a limit, a malformed request) answer text/plain and close that connection.
#pragma once

#include "ordo/config.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "ordo/rpc/channel.hpp"
#include "ordo/identity.hpp"

namespace ordo {

struct gateway_options {
    /// http://HOST:PORT to listen on (PORT 0: any free port; gateway::url() says which), or
    /// https://HOST:PORT?cert=F&key=F: HTTPS with that certificate and key (PEM); with &ca=F,
    /// clients must also show a certificate that CA signed.
    std::string listen = "http://127.0.0.1:8080";
    /// Connections open at once. One more closes the oldest connection that has not sent a
    /// whole request yet (silent or slow: a stranger), or, when every connection has, is
    /// answered 503 and closed. Each costs a few KiB and no thread.
    std::size_t max_connections = 10'000;
    /// Connections open at once from one address (an IPv4 address or an IPv6 /64); one more
    /// closes that address's oldest stranger, or is answered 503. 0: no cap.
    std::size_t max_connections_per_address = 256;
    /// A request line and headers larger than this: 431, connection closed.
    std::size_t max_header_bytes = 16 * 1024;
    /// A body larger than this: 413, connection closed.
    std::size_t max_body_bytes = 1024 * 1024;
    /// A request's headers, and then its body, must each arrive within this (slow clients):
    /// else 408, connection closed. A new connection must begin its first request within it.
    std::chrono::milliseconds request_timeout{10'000};
    /// A keep-alive connection with no request for this long is closed; so is one whose client
    /// does not take a response within it.
    std::chrono::milliseconds idle_timeout{30'000};
    /// The deadline of calls that carry none (0: none, or the channel's default).
    std::chrono::milliseconds default_timeout{30'000};
    /// Serve GET /metrics.
    bool metrics = false;
    /// Let HTTP clients call the reserved `ordo.*` methods (ordo.cancel, ordo.goaway,
    /// ordo.stats, ...). Off, they answer 404: through one shared connection, one client's
    /// ordo.cancel could cancel another's call and ordo.goaway end the connection for all.
    bool expose_admin = false;
    /// The one origin granted cross-origin calls (CORS: its preflights are answered and its
    /// responses carry Access-Control-Allow-Origin). Empty: none, so that a web page of another
    /// origin cannot read what a gateway on the user's machine answers.
    std::string cors_origin;
    /// When not empty, requests whose Host header (port aside) is none of these are 403: a
    /// name an attacker's DNS points at 127.0.0.1 (DNS rebinding) does not reach the gateway.
    std::vector<std::string> allowed_hosts;
    /// Bearer tokens (token -> subject, as ordo::read_token_file reads them). When not empty,
    /// every request but GET /-/healthz needs `Authorization: Bearer TOKEN` with one of them:
    /// else 401 unauthenticated (two Authorization headers: 400). /-/healthz then tells a
    /// caller without one only whether the backend serves.
    std::map<std::string, std::string> auth_tokens;
    /// With auth_tokens: opens the channel that carries one caller's calls, presenting its
    /// token to the backend, which then names the caller itself (its own token table, e.g. the
    /// same file). Called once per token, on the gateway channel's executor. Null: every call
    /// goes over the gateway's own channel, and the backend sees the gateway as the caller.
    std::function<net::awaitable<channel>(const credentials&)> connect_as;
    /// Called (on the channel's executor) with a line for each connection refused or closed by
    /// a limit and each failed TLS handshake, naming the client's address; at most 10 a
    /// second, then one line that counts the rest.
    std::function<void(const std::string&)> on_event{};
};

struct gateway_counters {
    std::uint64_t requests = 0;           ///< answered, any status
    std::uint64_t calls = 0;              ///< calls and streams started on the channel
    std::uint64_t notifications = 0;
    std::uint64_t status_2xx = 0, status_4xx = 0, status_5xx = 0;
    std::uint64_t refused_connections = 0;  ///< over max_connections or the per-address cap
    std::uint64_t limit_closes = 0;       ///< connections closed by a size or time limit
    std::uint64_t streams_abandoned = 0;  ///< streams cancelled because their client went away
    std::uint64_t calls_abandoned = 0;    ///< calls cancelled because their client went away
    std::size_t connections = 0;          ///< open now
    std::size_t in_flight = 0;            ///< requests being served now
};

/// The HTTP status for a failed call's code: method_not_found 404, bad_arguments 400,
/// timed_out 504, overloaded / shutting_down / closed / cancelled 503, peer_lost /
/// session_lost / protocol_error / bad_result 502 (a router's "no live replica" 503),
/// remote_error 500, anything else 500. `detail` is the failure's reason.
int http_status(std::error_code ec, const std::string& detail);
/// The errc's name in snake_case ("method_not_found"), or the code's message for other codes.
std::string code_name(std::error_code ec);

/// Serves HTTP/1.1 on the channel's executor: ordo's tcp:// or tls:// listener (with its
/// handshake caps), one coroutine pair per connection and no thread, requests read in order
/// (pipelining included) and answered in order, calls started and awaited on that executor.
/// The channel's executor must keep running while the gateway lives. Not copyable or movable.
class gateway {
  public:
    /// Listens at once. Throws std::system_error (errc::bad_address) for a bad listen URL or
    /// one that cannot be bound, naming it. Any thread.
    gateway(channel ch, gateway_options o);
    /// stop().
    ~gateway();
    gateway(const gateway&) = delete;
    gateway& operator=(const gateway&) = delete;

    /// http://HOST:PORT with the port bound.
    const std::string& url() const noexcept;
    gateway_counters counters() const;
    /// Stops listening, closes the connections and waits for the requests in flight (their
    /// calls are cancelled, and complete on the channel's executor, which must still run).
    /// Idempotent. Not from the channel's executor (it waits for it).
    void stop();

    struct state;

  private:
    std::shared_ptr<state> s_;  // and the coroutines that run on its executor
    bool stopped_ = false;      // stop() has completed (touched by its caller's thread only)
};

}  // namespace ordo
