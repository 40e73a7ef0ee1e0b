// A small HTTP client on libcurl's multi-socket interface, driven by Asio: every transfer runs on
// one executor, with no thread per request and no blocking call. Used to reach etcd's v3 JSON
// gateway (fleet/etcd.cpp). Private to libordo: its users never see curl.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>

#include "ordo/net.hpp"

namespace ordo::detail {

struct http_request {
    std::string url;
    /// Errors read "<label> <url>: <reason>" (e.g. label "etcd"); empty: "<url>: <reason>".
    std::string label;
    /// The body of a POST (Content-Type: application/json); none: a GET.
    std::optional<std::string> post;
    /// A whole request may take this long (connecting included); a stream may take this long
    /// to connect, then runs until it ends or is cancelled.
    std::chrono::milliseconds timeout{2'000};
    /// A longer body fails the request (errc::protocol_error) instead of growing without bound.
    std::size_t max_body = 16 * 1024 * 1024;
    /// https://: the CA to trust (empty: the system's), a client certificate and its key.
    std::string ca_file, cert_file, key_file;
    /// The Authorization header's value, if not empty.
    std::string authorization;
};

struct http_response {
    long status = 0;
    std::string body;
};

/// Transfers in flight on one executor. Not thread-safe: every member is called on `ex`.
/// Must outlive every coroutine suspended in one of its operations; destroying it aborts the
/// transfers still registered (a coroutine frame destroyed with its io_context unregisters its
/// own).
class curl_multi {
  public:
    explicit curl_multi(net::any_io_executor ex);
    ~curl_multi();
    curl_multi(const curl_multi&) = delete;
    curl_multi& operator=(const curl_multi&) = delete;

    /// Performs `r` and yields the status and body, whatever the status. Throws
    /// std::system_error whose what() names the URL and the reason: errc::timed_out past
    /// r.timeout, errc::protocol_error for a body over r.max_body, errc::cancelled when the
    /// awaiting coroutine is cancelled (the transfer is then aborted), errc::peer_lost for any
    /// other failure (refused, reset, unknown host...).
    net::awaitable<http_response> async_request(http_request r);

    /// Performs `r` as a stream: `on_chunk` gets each piece of the body as it arrives, on the
    /// executor, in order (not split on any boundary). Yields the status once the server ends
    /// the body. `on_chunk` may throw to end the stream: the transfer is aborted and the
    /// exception comes out of async_stream. It must not destroy this object. Cancelling the
    /// awaiting coroutine aborts the transfer (errc::cancelled); other failures throw as
    /// async_request does. r.max_body bounds nothing here: the consumer bounds what it keeps.
    net::awaitable<long> async_stream(http_request r,
                                      std::function<void(std::string_view)> on_chunk);

    net::any_io_executor get_executor() const { return ex_; }

    struct transfer;
    struct socket_state;

  private:
    net::awaitable<long> perform(transfer& t);
    void add(transfer& t);
    void remove(transfer& t) noexcept;
    void socket_action(int fd, int events);
    void finish_done();
    void watch(socket_state& s);

    static int on_socket(void* easy, int fd, int what, void* self, void* socketp);
    static int on_timer(void* multi, long timeout_ms, void* self);

    net::any_io_executor ex_;
    void* multi_ = nullptr;  // CURLM*
    net::steady_timer timer_;
    std::map<int, std::shared_ptr<socket_state>> sockets_;
    std::set<transfer*> transfers_;
    // Shared with pending socket and timer handlers: null once this object is gone.
    std::shared_ptr<curl_multi*> self_;
};

}  // namespace ordo::detail
