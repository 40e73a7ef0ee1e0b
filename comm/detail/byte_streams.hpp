// What the byte-stream transports share (tcp.cpp, unix.cpp, tls.cpp): one transport class for
// the three (stream_transport), the TLS stream it may wrap, tcp's connecting and listening
// (which tls builds on), and the kernel's keepalive settings.
#pragma once

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>

#include <asio/ip/tcp.hpp>
#include <asio/local/stream_protocol.hpp>
#include <asio/ssl.hpp>
#include <asio/write.hpp>

#include "comm/transports.hpp"
#include "ordo/address.hpp"
#include "ordo/comm/transport.hpp"

namespace ordo::detail {

using tcp = net::ip::tcp;
using unix_stream = net::local::stream_protocol;
namespace ssl = net::ssl;

// transport_fail, as the three files say it.
[[noreturn]] inline void fail(std::string_view what, std::string_view url,
                              const std::error_code& ec) {
    transport_fail(what, url, ec);
}

/// tcp://host:port (or `scheme`://) of an endpoint.
std::string tcp_url(const tcp::endpoint& ep, std::string scheme = "tcp");

// A TLS stream and the context it was made from, kept together so that the context outlives it.
struct tls_stream {
    tls_stream(tcp::socket s, std::shared_ptr<ssl::context> c)
        : ctx(std::move(c)), stream(std::move(s), *ctx) {}
    // An established TLS session (its SSL object, a reference of which it takes over) on
    // another socket: a connection moved to another executor.
    tls_stream(tcp::socket s, std::shared_ptr<ssl::context> c, SSL* established)
        : ctx(std::move(c)), stream(std::move(s), established) {}
    std::shared_ptr<ssl::context> ctx;
    ssl::stream<tcp::socket> stream;
};

// The peer's certificate, if it showed one: its subject, SANs and SHA-256 (tls.cpp).
void describe_certificate(const ssl::stream<tcp::socket>& s, identity& who);

inline tcp::socket& lowest(tcp::socket& s) {
    return s;
}
inline unix_stream::socket& lowest(unix_stream::socket& s) {
    return s;
}
inline tcp::socket& lowest(std::shared_ptr<tls_stream>& s) {
    return s->stream.next_layer();
}
inline auto& stream_of(tcp::socket& s) {
    return s;
}
inline auto& stream_of(unix_stream::socket& s) {
    return s;
}
inline auto& stream_of(std::shared_ptr<tls_stream>& s) {
    return s->stream;
}

// Waits until the socket would take bytes again. Defined in transport.cpp, apart from the
// stream transports' code, whose read path GCC then inlines as before.
net::awaitable<std::tuple<std::error_code>> wait_writable(tcp::socket& s);
net::awaitable<std::tuple<std::error_code>> wait_writable(unix_stream::socket& s);

// The kernel's probing of a tcp connection, below ordo's own (transport::set_liveness).
struct keepalive {
    int idle_s;                // TCP_KEEPIDLE: silence before the first probe
    int interval_s;            // TCP_KEEPINTVL: between unanswered probes
    int count;                 // TCP_KEEPCNT
    unsigned user_timeout_ms;  // TCP_USER_TIMEOUT
};

// The keepalive for a connection whose own liveness timeout is `liveness` (tcp.cpp says why).
keepalive keepalive_for(std::chrono::milliseconds liveness);

// tcp, unix and tls streams share everything but their names.
template <class Socket>
class stream_transport final : public transport {
  public:
    stream_transport(Socket s, std::string remote)
        : transport(std::move(remote)), socket_(std::move(s)) {}

    net::awaitable<std::size_t> async_read_some(net::mutable_buffer b,
                                                std::error_code& ec) override {
        auto [e, n] = co_await stream_of(socket_).async_read_some(b, use_tuple);
        ec = e;
        // ordo ends a TLS connection with a TCP FIN after its last message, without a TLS
        // close_notify (one cannot be sent while a read is pending). Message boundaries are
        // checked by the framer, so a stream cut inside a message is still an error.
        if (ec == ssl::error::stream_truncated) ec = net::error::eof;
        co_return n;
    }

    net::awaitable<std::size_t> async_write(net::const_buffer b, std::error_code& ec) override {
        auto [e, n] = co_await net::async_write(stream_of(socket_), b, use_tuple);
        ec = e;
        co_return n;
    }

    // tcp and unix: one non-blocking send(2). tls: not supported (its records are written by
    // the TLS layer, which writes only through Asio's asynchronous operations here).
    std::size_t try_write(net::const_buffer b, std::error_code& ec) noexcept override {
        if constexpr (std::is_same_v<Socket, std::shared_ptr<tls_stream>>) {
            return transport::try_write(b, ec);
        } else {
            for (;;) {
                const ssize_t n = ::send(socket_.native_handle(), b.data(), b.size(),
                                         MSG_DONTWAIT | MSG_NOSIGNAL);
                if (n >= 0) return std::size_t(n);
                if (errno == EINTR) continue;
                if (errno != EAGAIN && errno != EWOULDBLOCK)
                    ec = std::error_code(errno, net::error::get_system_category());
                return 0;
            }
        }
    }

    net::awaitable<std::tuple<std::error_code>> async_wait_writable() override {
        if constexpr (std::is_same_v<Socket, std::shared_ptr<tls_stream>>)
            return transport::async_wait_writable();
        else
            return wait_writable(socket_);
    }

    void shutdown_send() noexcept override {
        std::error_code ignored;
        lowest(socket_).shutdown(net::socket_base::shutdown_send, ignored);
    }

    void close() noexcept override {
        std::error_code ignored;
        lowest(socket_).close(ignored);
    }

    net::any_io_executor get_executor() override { return lowest(socket_).get_executor(); }

    void describe(identity& who) const override {
        if constexpr (std::is_same_v<Socket, std::shared_ptr<tls_stream>>) {
            describe_certificate(socket_->stream, who);
        } else if constexpr (std::is_same_v<Socket, unix_stream::socket>) {
            ::ucred c{};
            ::socklen_t n = sizeof c;
            auto& s = const_cast<unix_stream::socket&>(socket_);
            if (::getsockopt(s.native_handle(), SOL_SOCKET, SO_PEERCRED, &c, &n) == 0)
                who.unix_peer = unix_credentials{c.uid, c.gid, c.pid};
        }
    }

    void reset() noexcept override {
        if constexpr (!std::is_same_v<Socket, unix_stream::socket>) {
            std::error_code ignored;
            lowest(socket_).set_option(net::socket_base::linger(true, 0), ignored);
        }
        close();
    }

    void set_liveness(std::chrono::milliseconds liveness) noexcept override {
        if constexpr (!std::is_same_v<Socket, unix_stream::socket>) {
            const keepalive k = keepalive_for(liveness);
            const int fd = lowest(socket_).native_handle();
            const int on = 1;
            // Best effort: a socket that refuses an option keeps ordo's own probing.
            ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
            ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &k.idle_s, sizeof k.idle_s);
            ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &k.interval_s, sizeof k.interval_s);
            ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &k.count, sizeof k.count);
            ::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &k.user_timeout_ms,
                         sizeof k.user_timeout_ms);
        }
    }

    std::unique_ptr<transport> rehome(const net::any_io_executor& ex) override {
        if constexpr (std::is_same_v<Socket, std::shared_ptr<tls_stream>>) {
            SSL* ssl = socket_->stream.native_handle();
            // What OpenSSL holds that the peer sent and nobody read yet, or that it made and
            // nobody wrote, would stay behind with the old buffers.
            if (::SSL_pending(ssl) > 0 || ::BIO_ctrl_pending(::SSL_get_rbio(ssl)) > 0 ||
                ::BIO_ctrl_wpending(::SSL_get_wbio(ssl)) > 0)
                return nullptr;
            auto s = move_socket(socket_->stream.next_layer(), ex);
            if (!s) return nullptr;
            ::SSL_up_ref(ssl);
            auto moved = std::make_shared<tls_stream>(std::move(*s), socket_->ctx, ssl);
            return std::make_unique<stream_transport>(std::move(moved), remote_address());
        } else {
            auto s = move_socket(socket_, ex);
            if (!s) return nullptr;
            return std::make_unique<stream_transport>(std::move(*s), remote_address());
        }
    }

  private:
    // The socket's descriptor on a new socket object of `ex` (this one is left closed).
    template <class S>
    static std::optional<S> move_socket(S& from, const net::any_io_executor& ex) {
        std::error_code ec;
        const auto protocol = from.local_endpoint(ec).protocol();
        if (ec) return std::nullopt;
        const auto fd = from.release(ec);
        if (ec) return std::nullopt;
        S to(ex);
        to.assign(protocol, fd, ec);
        if (ec) {
            ::close(fd);
            return std::nullopt;
        }
        return std::optional<S>(std::move(to));
    }

    Socket socket_;
};

// A connected tcp socket and the endpoint it reached.
struct tcp_connection {
    tcp::socket socket;
    tcp::endpoint remote;
};

// Connects to the first of a.host's addresses that accepts, on the current executor, with
// Nagle's delay off (batched_comm does its own batching). Throws what transport_fail throws:
// "cannot resolve" or "cannot connect to", naming the URL.
net::awaitable<tcp_connection> connect_tcp(const address& a);

tcp::acceptor open_acceptor(const net::any_io_executor& ex, const address& a);

}  // namespace ordo::detail
