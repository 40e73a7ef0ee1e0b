// cutting_proxy (support/cutting_proxy.hpp) between a plain Asio client and a plain Asio echo
// server on loopback, without ordo's transports or rpc.
#include "support/cutting_proxy.hpp"

#include <algorithm>
#include <list>
#include <string>
#include <utility>

#include <gtest/gtest.h>

#include <asio/ip/tcp.hpp>
#include <asio/read.hpp>
#include <asio/write.hpp>

#include "support/run_test.hpp"

namespace ordo {
namespace {

using namespace std::chrono_literals;
using namespace net::experimental::awaitable_operators;
using tcp = net::ip::tcp;
using clock_type = std::chrono::steady_clock;
using test::cut_options;
using test::cutting_proxy;
using test::run_test;
using test::wait_until;

// Echoes every connection on the test's io_context, and records what each one received and
// how it ended.
class echo_server {
  public:
    struct session {
        explicit session(tcp::socket s) : socket(std::move(s)) {}
        tcp::socket socket;
        std::string received;
        bool ended = false;
        std::error_code end;  // the first error (eof included) of a read or a write
    };

    explicit echo_server(net::any_io_executor ex)
        : acceptor_(ex, tcp::endpoint(net::ip::address_v4::loopback(), 0)) {
        net::co_spawn(ex, accept_loop(), [this](std::exception_ptr) { accepting_ = false; });
    }

    std::uint16_t port() const { return acceptor_.local_endpoint().port(); }

    std::list<session> sessions;  // in accept order

    /// Closes the listener and every session, and waits until their coroutines have ended.
    net::awaitable<bool> async_stop() {
        std::error_code ignored;
        acceptor_.close(ignored);
        for (auto& s : sessions) s.socket.close(ignored);
        co_return co_await wait_until([&] { return !accepting_ && all_ended(); }, 2s);
    }

    bool all_ended() const {
        for (auto& s : sessions)
            if (!s.ended) return false;
        return true;
    }

  private:
    net::awaitable<void> accept_loop() {
        for (;;) {
            auto [ec, socket] = co_await acceptor_.async_accept(use_tuple);
            if (ec) co_return;
            auto& s = sessions.emplace_back(std::move(socket));
            net::co_spawn(acceptor_.get_executor(), echo(s),
                          [&s](std::exception_ptr) { s.ended = true; });
        }
    }

    // After a failed write it goes on reading, without echoing, until a read fails: `received`
    // is then everything the kernel received.
    static net::awaitable<void> echo(session& s) {
        char buf[4096];
        for (;;) {
            auto [ec, n] = co_await s.socket.async_read_some(net::buffer(buf), use_tuple);
            s.received.append(buf, n);
            if (ec) {
                if (!s.end) s.end = ec;
                break;
            }
            if (s.end) continue;
            auto [wec, m] = co_await net::async_write(s.socket, net::buffer(buf, n), use_tuple);
            s.end = wec;
        }
        std::error_code ignored;
        s.socket.shutdown(tcp::socket::shutdown_send, ignored);
    }

    tcp::acceptor acceptor_;
    bool accepting_ = true;
};

net::awaitable<tcp::socket> connect_to(std::uint16_t port) {
    tcp::socket s(co_await net::this_coro::executor);
    co_await s.async_connect(tcp::endpoint(net::ip::address_v4::loopback(), port),
                             net::use_awaitable);
    co_return s;
}

// Bytes that show where they came from: byte i of a stream is i * 7 mod 251.
std::string pattern(std::size_t n) {
    std::string s(n, '\0');
    for (std::size_t i = 0; i < n; ++i) s[i] = static_cast<char>(i * 7 % 251);
    return s;
}

// Writes `data` (ignoring a failure: a cut connection may refuse it), then half-closes if asked.
net::awaitable<void> send_all(tcp::socket& s, const std::string& data, bool then_shutdown) {
    co_await net::async_write(s, net::buffer(data), use_tuple);
    if (then_shutdown) {
        std::error_code ignored;
        s.shutdown(tcp::socket::shutdown_send, ignored);
    }
}

struct ending {
    std::string received;
    std::error_code end;
};

// Reads until EOF or an error.
net::awaitable<ending> read_to_end(tcp::socket& s) {
    ending e;
    char buf[4096];
    for (;;) {
        auto [ec, n] = co_await s.async_read_some(net::buffer(buf), use_tuple);
        e.received.append(buf, n);
        if (ec) {
            e.end = ec;
            co_return e;
        }
    }
}

bool is_cut(const std::error_code& ec) {
    return ec == net::error::connection_reset || ec == net::error::eof;
}

TEST(CuttingProxy, ForwardsEveryByteUnchangedBothWaysWhenNoCutIsSet) {
    run_test(
        [&]() -> net::awaitable<void> {
            echo_server echo(co_await net::this_coro::executor);
            {
                cutting_proxy proxy("127.0.0.1", echo.port());
                auto c = co_await connect_to(proxy.port());
                const std::string sent = pattern(300'000);
                auto got = co_await (send_all(c, sent, true) && read_to_end(c));
                EXPECT_EQ(got.end, net::error::eof);  // the echo's EOF, passed on
                EXPECT_TRUE(got.received == sent) << got.received.size() << " bytes back";
                EXPECT_TRUE(co_await wait_until([&] { return echo.all_ended(); }, 2s));
                ORDO_CO_ASSERT_EQ(echo.sessions.size(), 1u);
                EXPECT_TRUE(echo.sessions.front().received == sent);
                EXPECT_EQ(echo.sessions.front().end, net::error::eof);  // the client's EOF
                EXPECT_EQ(proxy.connections(), 1u);
                EXPECT_EQ(proxy.cuts(), 0u);
                EXPECT_EQ(proxy.url(), "tcp://127.0.0.1:" + std::to_string(proxy.port()));
            }
            EXPECT_TRUE(co_await echo.async_stop());
        },
        5s);
}

TEST(CuttingProxy, CutsAfterExactlyTheBudgetOfForwardedBytesAndBothEndsSeeTheEnd) {
    run_test(
        [&]() -> net::awaitable<void> {
            echo_server echo(co_await net::this_coro::executor);
            {
                cut_options o;
                o.min_bytes = o.max_bytes = 1000;
                cutting_proxy proxy("127.0.0.1", echo.port(), o);
                auto c = co_await connect_to(proxy.port());
                // In lockstep, 150 bytes up and their echo down: three rounds forward 900 bytes,
                // and the cut falls 100 bytes into the fourth chunk, on its way up.
                const std::string sent = pattern(5000);
                std::string back;
                std::error_code end;
                for (std::size_t at = 0; at < sent.size() && !end; at += 150) {
                    const std::size_t n = std::min<std::size_t>(150, sent.size() - at);
                    auto [wec, w] =
                        co_await net::async_write(c, net::buffer(sent.data() + at, n), use_tuple);
                    std::string chunk(n, '\0');
                    auto [rec, r] = co_await net::async_read(c, net::buffer(chunk), use_tuple);
                    back.append(chunk, 0, r);
                    end = wec ? wec : rec;
                }
                EXPECT_TRUE(is_cut(end)) << end.message();
                EXPECT_TRUE(back == sent.substr(0, 450)) << back.size() << " bytes back";
                EXPECT_TRUE(co_await wait_until([&] { return echo.all_ended(); }, 2s));
                ORDO_CO_ASSERT_EQ(echo.sessions.size(), 1u);
                const auto& server = echo.sessions.front();
                EXPECT_TRUE(is_cut(server.end)) << server.end.message();
                EXPECT_TRUE(server.received == sent.substr(0, 550))
                    << server.received.size() << " bytes received";
                EXPECT_EQ(proxy.cuts(), 1u);
            }
            EXPECT_TRUE(co_await echo.async_stop());
        },
        5s);
}

TEST(CuttingProxy, BytesForwardedBeforeTheCutReachAPeerThatReadsLate) {
    run_test(
        [&]() -> net::awaitable<void> {
            echo_server echo(co_await net::this_coro::executor);
            {
                cut_options o;
                o.min_bytes = o.max_bytes = 20'000 + 12'000;
                cutting_proxy proxy("127.0.0.1", echo.port(), o);
                // A small receive window, and no reading until the cut is counted: most of the
                // echo forwarded before the cut (12000 bytes or more) waits in the proxy's send
                // queue, which a reset would discard.
                tcp::socket c(co_await net::this_coro::executor);
                c.open(tcp::v4());
                c.set_option(net::socket_base::receive_buffer_size(2048));
                co_await c.async_connect(
                    tcp::endpoint(net::ip::address_v4::loopback(), proxy.port()),
                    net::use_awaitable);
                const std::string sent = pattern(20'000);
                co_await send_all(c, sent, false);
                EXPECT_TRUE(co_await wait_until([&] { return proxy.cuts() == 1; }, 2s));
                auto got = co_await read_to_end(c);
                EXPECT_EQ(got.end, net::error::connection_reset);
                EXPECT_TRUE(co_await wait_until([&] { return echo.all_ended(); }, 2s));
                ORDO_CO_ASSERT_EQ(echo.sessions.size(), 1u);
                const auto& server = echo.sessions.front();
                // How the 32000 bytes split between the directions depends on scheduling.
                EXPECT_EQ(server.received.size() + got.received.size(), 32'000u)
                    << got.received.size() << " bytes back";
                EXPECT_TRUE(server.received == sent.substr(0, server.received.size()));
                EXPECT_TRUE(got.received == sent.substr(0, got.received.size()));
            }
            EXPECT_TRUE(co_await echo.async_stop());
        },
        5s);
}

TEST(CuttingProxy, CutAllResetsALiveConnection) {
    run_test(
        [&]() -> net::awaitable<void> {
            echo_server echo(co_await net::this_coro::executor);
            {
                cutting_proxy proxy("127.0.0.1", echo.port());
                auto c = co_await connect_to(proxy.port());
                co_await net::async_write(c, net::buffer(std::string("hello")), net::use_awaitable);
                char back[5];
                co_await net::async_read(c, net::buffer(back), net::use_awaitable);
                EXPECT_EQ(std::string(back, 5), "hello");
                EXPECT_EQ(proxy.cuts(), 0u);
                proxy.cut_all();
                EXPECT_EQ(proxy.cuts(), 1u);  // counted when cut_all returns
                auto got = co_await read_to_end(c);
                EXPECT_EQ(got.end, net::error::connection_reset);
                EXPECT_EQ(got.received, "");
                EXPECT_TRUE(co_await wait_until([&] { return echo.all_ended(); }, 2s));
                ORDO_CO_ASSERT_EQ(echo.sessions.size(), 1u);
                EXPECT_EQ(echo.sessions.front().end, net::error::connection_reset);
            }
            EXPECT_TRUE(co_await echo.async_stop());
        },
        5s);
}

TEST(CuttingProxy, ARefusingProxyResetsNewConnectionsAtOnceAndForwardsAgainAfterwards) {
    run_test(
        [&]() -> net::awaitable<void> {
            echo_server echo(co_await net::this_coro::executor);
            {
                cutting_proxy proxy("127.0.0.1", echo.port());
                proxy.set_refusing(true);
                const auto t0 = clock_type::now();
                tcp::socket c(co_await net::this_coro::executor);
                // The reset can come before connect() has reported success.
                auto [ec] = co_await c.async_connect(
                    tcp::endpoint(net::ip::address_v4::loopback(), proxy.port()), use_tuple);
                if (!ec) {
                    auto got = co_await read_to_end(c);
                    EXPECT_EQ(got.received, "");
                    ec = got.end;
                }
                EXPECT_TRUE(is_cut(ec)) << ec.message();
                EXPECT_LT(clock_type::now() - t0, 1s);
                EXPECT_EQ(proxy.connections(), 1u);
                EXPECT_EQ(proxy.refused(), 1u);
                EXPECT_EQ(proxy.cuts(), 0u);
                EXPECT_TRUE(echo.sessions.empty());

                proxy.set_refusing(false);
                auto d = co_await connect_to(proxy.port());
                auto again = co_await (send_all(d, "ping", true) && read_to_end(d));
                EXPECT_EQ(again.received, "ping");
                EXPECT_EQ(again.end, net::error::eof);
                EXPECT_EQ(proxy.connections(), 2u);
            }
            EXPECT_TRUE(co_await echo.async_stop());
        },
        5s);
}

TEST(CuttingProxy, StallThenResetForwardsNothingDuringTheStall) {
    run_test(
        [&]() -> net::awaitable<void> {
            echo_server echo(co_await net::this_coro::executor);
            {
                cut_options o;
                o.min_bytes = o.max_bytes = 5;
                o.mode = cut_options::how::stall_then_reset;
                o.stall = 150ms;
                cutting_proxy proxy("127.0.0.1", echo.port(), o);
                auto c = co_await connect_to(proxy.port());
                const auto t0 = clock_type::now();
                // The budget ends inside this write: the server gets "hello", its echo is stalled.
                auto got = co_await (send_all(c, "hello world", false) && read_to_end(c));
                EXPECT_GE(clock_type::now() - t0, 150ms);
                EXPECT_EQ(got.end, net::error::connection_reset);
                EXPECT_EQ(got.received, "");
                EXPECT_TRUE(co_await wait_until([&] { return echo.all_ended(); }, 2s));
                ORDO_CO_ASSERT_EQ(echo.sessions.size(), 1u);
                EXPECT_EQ(echo.sessions.front().received, "hello");
                EXPECT_EQ(proxy.cuts(), 1u);
            }
            EXPECT_TRUE(co_await echo.async_stop());
        },
        5s);
}

TEST(CuttingProxy, DropUpstreamDirectionDiscardsClientBytesButForwardsServerBytesUntilTheReset) {
    run_test(
        [&]() -> net::awaitable<void> {
            echo_server echo(co_await net::this_coro::executor);
            {
                cut_options o;
                o.min_bytes = o.max_bytes = 5;
                o.mode = cut_options::how::drop_upstream_direction;
                o.stall = 150ms;
                cutting_proxy proxy("127.0.0.1", echo.port(), o);
                auto c = co_await connect_to(proxy.port());
                const auto t0 = clock_type::now();
                // "hello" spends the budget on the way up; its echo still comes down.
                co_await net::async_write(c, net::buffer(std::string("hello")), net::use_awaitable);
                char back[5];
                co_await net::async_read(c, net::buffer(back), net::use_awaitable);
                EXPECT_EQ(std::string(back, 5), "hello");
                EXPECT_EQ(proxy.cuts(), 1u);
                // Dropped on the way up: the server never sees it, so nothing comes back.
                auto got = co_await (send_all(c, "lost", false) && read_to_end(c));
                EXPECT_EQ(got.end, net::error::connection_reset);
                EXPECT_EQ(got.received, "");
                EXPECT_GE(clock_type::now() - t0, 150ms);
                EXPECT_TRUE(co_await wait_until([&] { return echo.all_ended(); }, 2s));
                ORDO_CO_ASSERT_EQ(echo.sessions.size(), 1u);
                EXPECT_EQ(echo.sessions.front().received, "hello");
            }
            EXPECT_TRUE(co_await echo.async_stop());
        },
        5s);
}

TEST(CuttingProxy, BudgetsStayWithinTheirBoundsAndMaxCutsStopsTheCutting) {
    run_test(
        [&]() -> net::awaitable<void> {
            echo_server echo(co_await net::this_coro::executor);
            {
                cut_options o;
                o.seed = 42;
                o.min_bytes = 10;
                o.max_bytes = 50;
                o.max_cuts = 2;
                cutting_proxy proxy("127.0.0.1", echo.port(), o);
                const std::string sent = pattern(2000);
                std::size_t through[3] = {};
                for (auto& n : through) {
                    auto c = co_await connect_to(proxy.port());
                    auto got = co_await (send_all(c, sent, true) && read_to_end(c));
                    n = got.received.size();
                    EXPECT_TRUE(got.received == sent.substr(0, n));
                }
                EXPECT_EQ(proxy.cuts(), 2u);
                EXPECT_EQ(through[2], sent.size());  // after max_cuts, forwarded whole
                EXPECT_TRUE(co_await wait_until([&] { return echo.all_ended(); }, 2s));
                ORDO_CO_ASSERT_EQ(echo.sessions.size(), 3u);
                std::size_t i = 0;
                for (auto& s : echo.sessions) {
                    if (i < 2) {
                        const std::size_t budget = s.received.size() + through[i];
                        EXPECT_GE(budget, 10u);
                        EXPECT_LE(budget, 50u);
                    }
                    ++i;
                }
            }
            EXPECT_TRUE(co_await echo.async_stop());
        },
        5s);
}

}  // namespace
}  // namespace ordo
