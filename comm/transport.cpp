#include "ordo/transport.hpp"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

#include <asio/connect.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/local/stream_protocol.hpp>
#include <asio/write.hpp>

#include "ordo/error.hpp"

namespace ordo {
namespace {

using tcp = net::ip::tcp;
using unix_stream = net::local::stream_protocol;

std::string tcp_url(const tcp::endpoint& ep) {
    address a;
    a.scheme = "tcp";
    a.host = ep.address().to_string();
    a.port = ep.port();
    return a.to_string();
}

[[noreturn]] void fail(std::string_view what, std::string_view url, const std::error_code& ec) {
    throw std::system_error(ec, "ordo: " + std::string(what) + " " + std::string(url));
}

// tcp and unix sockets share everything but their names.
template <class Socket>
class stream_transport final : public transport {
  public:
    stream_transport(Socket s, std::string remote)
        : transport(std::move(remote)), socket_(std::move(s)) {}

    net::awaitable<std::size_t> async_read_some(net::mutable_buffer b,
                                                std::error_code& ec) override {
        auto [e, n] = co_await socket_.async_read_some(b, use_tuple);
        ec = e;
        co_return n;
    }

    net::awaitable<std::size_t> async_write(net::const_buffer b, std::error_code& ec) override {
        auto [e, n] = co_await net::async_write(socket_, b, use_tuple);
        ec = e;
        co_return n;
    }

    void shutdown_send() noexcept override {
        std::error_code ignored;
        socket_.shutdown(Socket::shutdown_send, ignored);
    }

    void close() noexcept override {
        std::error_code ignored;
        socket_.close(ignored);
    }

    net::any_io_executor get_executor() override { return socket_.get_executor(); }

    void reset() noexcept override {
        if constexpr (std::is_same_v<Socket, tcp::socket>) {
            std::error_code ignored;
            socket_.set_option(net::socket_base::linger(true, 0), ignored);
        }
        close();
    }

    void set_liveness(std::chrono::milliseconds liveness) noexcept override {
        if constexpr (std::is_same_v<Socket, tcp::socket>) {
            const int fd = socket_.native_handle();
            const int on = 1;
            const int idle = std::max(1, static_cast<int>(liveness.count() / 1000));
            const int interval = std::max(1, idle / 3);
            const int count = 3;
            const unsigned user_timeout =
                static_cast<unsigned>(std::max<long long>(2000, 2 * liveness.count()));
            // Best effort: a socket that refuses an option keeps ordo's own probing.
            ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
            ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
            ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
            ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
            ::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof user_timeout);
        }
    }

  private:
    Socket socket_;
};

class tcp_listener final : public listener {
  public:
    tcp_listener(const net::any_io_executor& ex, const address& a) : acceptor_(ex) {
        std::error_code ec;
        auto ip = net::ip::make_address(a.host, ec);
        tcp::endpoint ep;
        if (!ec) {
            ep = tcp::endpoint(ip, a.port);
        } else {
            tcp::resolver r(ex);
            auto results = r.resolve(a.host, std::to_string(a.port), ec);
            if (ec || results.empty()) fail("cannot resolve listen address", a.to_string(), ec);
            ep = *results.begin();
        }
        acceptor_.open(ep.protocol(), ec);
        if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
        if (!ec) acceptor_.bind(ep, ec);
        if (!ec) acceptor_.listen(net::socket_base::max_listen_connections, ec);
        if (ec) fail("cannot listen on", a.to_string(), ec);
        local_ = tcp_url(acceptor_.local_endpoint());
    }

    net::awaitable<std::unique_ptr<transport>> async_accept() override {
        auto [ec, s] = co_await acceptor_.async_accept(use_tuple);
        if (ec) fail("accept failed on", local_, ec);
        s.set_option(tcp::no_delay(true), ec);
        auto remote = tcp_url(s.remote_endpoint(ec));
        co_return std::make_unique<stream_transport<tcp::socket>>(std::move(s), std::move(remote));
    }

    void close() noexcept override {
        std::error_code ignored;
        acceptor_.close(ignored);
    }

  private:
    tcp::acceptor acceptor_;
};

class unix_listener final : public listener {
  public:
    unix_listener(const net::any_io_executor& ex, const address& a) : acceptor_(ex), path_(a.path) {
        remove_stale_socket(ex);
        std::error_code ec;
        unix_stream::endpoint ep(path_);
        acceptor_.open(ep.protocol(), ec);
        if (!ec) acceptor_.bind(ep, ec);
        if (!ec) acceptor_.listen(net::socket_base::max_listen_connections, ec);
        if (ec) fail("cannot listen on", a.to_string(), ec);
        local_ = a.to_string();
    }

    ~unix_listener() override { close(); }

    net::awaitable<std::unique_ptr<transport>> async_accept() override {
        auto [ec, s] = co_await acceptor_.async_accept(use_tuple);
        if (ec) fail("accept failed on", local_, ec);
        co_return std::make_unique<stream_transport<unix_stream::socket>>(std::move(s), local_);
    }

    void close() noexcept override {
        if (!acceptor_.is_open()) return;
        std::error_code ignored;
        acceptor_.close(ignored);
        ::unlink(path_.c_str());
    }

  private:
    // A socket file left by a process that died refuses connections: remove it. One that accepts
    // belongs to a live server, and bind will fail with "address in use" as it should.
    void remove_stale_socket(const net::any_io_executor& ex) {
        struct stat st {};
        if (::stat(path_.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode)) return;
        unix_stream::socket probe(ex);
        std::error_code ec;
        probe.connect(unix_stream::endpoint(path_), ec);
        if (ec == net::error::connection_refused) ::unlink(path_.c_str());
    }

    unix_stream::acceptor acceptor_;
    std::string path_;
};

}  // namespace

transport::~transport() = default;
listener::~listener() = default;

net::awaitable<std::unique_ptr<transport>> async_connect_transport(std::string_view url) {
    const address a = parse_address(url);
    auto ex = co_await net::this_coro::executor;
    if (a.scheme == "unix") {
        unix_stream::socket s(ex);
        auto [ec] = co_await s.async_connect(unix_stream::endpoint(a.path), use_tuple);
        if (ec) fail("cannot connect to", a.to_string(), ec);
        co_return std::make_unique<stream_transport<unix_stream::socket>>(std::move(s),
                                                                          a.to_string());
    }
    tcp::resolver r(ex);
    auto [rec, endpoints] = co_await r.async_resolve(a.host, std::to_string(a.port), use_tuple);
    if (rec) fail("cannot resolve", a.to_string(), rec);
    tcp::socket s(ex);
    auto [ec, ep] = co_await net::async_connect(s, endpoints, use_tuple);
    if (ec) fail("cannot connect to", a.to_string(), ec);
    s.set_option(tcp::no_delay(true), ec);
    co_return std::make_unique<stream_transport<tcp::socket>>(std::move(s), tcp_url(ep));
}

std::unique_ptr<listener> listen(const net::any_io_executor& ex, std::string_view url) {
    const address a = parse_address(url);
    if (a.scheme == "unix") return std::make_unique<unix_listener>(ex, a);
    return std::make_unique<tcp_listener>(ex, a);
}

}  // namespace ordo
