// tcp:// connections and listeners (comm/detail/byte_streams.hpp holds the transport they share
// with unix and tls), and the keepalive settings of tcp sockets.
#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>

#include <asio/connect.hpp>

#include "comm/detail/byte_streams.hpp"

namespace ordo::detail {

std::string tcp_url(const tcp::endpoint& ep, std::string scheme) {
    address a;
    a.scheme = std::move(scheme);
    a.host = ep.address().to_string();
    a.port = ep.port();
    return a.to_string();
}

// Only connections with nothing pending rely on this: while calls are pending or handlers run,
// ordo pings and gives up after `liveness` itself (rpc/connection/liveness.cpp). So the probes can
// be rare, and must never end a healthy connection:
//  - The first probe comes after 6 x liveness of silence (60 s by default), plus up to half as
//    much again, spread evenly over the sockets. Without the spread, connections opened together
//    probe together forever (the kernel's timers round to the same tick), and a burst of
//    thousands of probes overflows the receive backlog (net.core.netdev_max_backlog, 1000 by
//    default; on loopback the probes and their answers both pass through it).
//  - With TCP_USER_TIMEOUT set, Linux ignores TCP_KEEPCNT: it ends the connection at the first
//    probe time after user_timeout of silence. user_timeout is therefore idle + 3 intervals, so
//    that three probes in a row must go unanswered (were it below idle, one lost probe would do).
//    This also bounds how long a half-open idle peer holds its slot: 90-120 s by default.
//  - The cost: data left unacknowledged with nothing pending at the ordo level (notifications,
//    a response to a client that vanished) ends the connection after that same user_timeout,
//    not after 2 x liveness. The kernel couples the two; a user_timeout short enough for
//    unacknowledged data would need a probe at least that often on every idle connection.
keepalive keepalive_for(std::chrono::milliseconds liveness) {
    // The kernel refuses more than 32767 s of idle or interval.
    const auto seconds = [](long long ms) {
        return static_cast<int>(std::clamp(ms / 1000, 1LL, 32767LL));
    };
    static std::atomic<std::uint32_t> sockets{0};
    // The golden-ratio sequence spreads any run of consecutive sockets evenly over [0, 1).
    const double spread =
        (sockets.fetch_add(1, std::memory_order_relaxed) * 2654435769u) / 4294967296.0;
    const int idle = seconds(6 * liveness.count());
    keepalive k;
    k.idle_s = std::min(32767, idle + static_cast<int>(spread * (idle / 2 + 1)));
    k.interval_s = seconds(liveness.count());
    k.count = 3;  // used only if the socket refuses TCP_USER_TIMEOUT
    const long long user_timeout = std::max(1000LL * (k.idle_s + k.count * k.interval_s),
                                            2 * static_cast<long long>(liveness.count()));
    k.user_timeout_ms = static_cast<unsigned>(std::min<long long>(user_timeout, INT_MAX));
    return k;
}

// Connects to the first of a.host's addresses that accepts, on the current executor, with
// Nagle's delay off (batched_comm does its own batching). Throws what transport_fail throws:
// "cannot resolve" or "cannot connect to", naming the URL.
net::awaitable<tcp_connection> connect_tcp(const address& a) {
    auto ex = co_await net::this_coro::executor;
    tcp::resolver r(ex);
    auto [rec, endpoints] = co_await r.async_resolve(a.host, std::to_string(a.port), use_tuple);
    if (rec) fail("cannot resolve", a.to_string(), rec);
    tcp::socket s(ex);
    auto [ec, ep] = co_await net::async_connect(s, endpoints, use_tuple);
    if (ec) fail("cannot connect to", a.to_string(), ec);
    s.set_option(tcp::no_delay(true), ec);
    co_return tcp_connection{std::move(s), ep};
}

tcp::acceptor open_acceptor(const net::any_io_executor& ex, const address& a) {
    tcp::acceptor acceptor(ex);
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
    acceptor.open(ep.protocol(), ec);
    if (!ec) acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) acceptor.bind(ep, ec);
    if (!ec) acceptor.listen(net::socket_base::max_listen_connections, ec);
    if (ec) fail("cannot listen on", a.to_string(), ec);
    return acceptor;
}

namespace {

class tcp_listener final : public listener {
  public:
    tcp_listener(const net::any_io_executor& ex, const address& a)
        : acceptor_(open_acceptor(ex, a)) {
        local_ = tcp_url(acceptor_.local_endpoint());
    }

    net::awaitable<std::unique_ptr<transport>> async_accept() override {
        auto [ec, s] = co_await acceptor_.async_accept(place(acceptor_.get_executor()), use_tuple);
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

}  // namespace

net::awaitable<std::unique_ptr<transport>> connect_tcp_transport(const address& a) {
    tcp_connection c = co_await connect_tcp(a);
    co_return std::make_unique<stream_transport<tcp::socket>>(std::move(c.socket),
                                                              tcp_url(c.remote));
}

std::unique_ptr<listener> listen_tcp(const net::any_io_executor& ex, const address& a) {
    return std::make_unique<tcp_listener>(ex, a);
}

}  // namespace ordo::detail
