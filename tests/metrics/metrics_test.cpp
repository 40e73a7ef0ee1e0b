// The Prometheus exporter (ordo/metrics/prometheus.hpp): scraped over HTTP while a server serves.
#include "ordo/metrics/prometheus.hpp"

#include <asio/ip/tcp.hpp>
#include <asio/write.hpp>

#include <future>
#include <string>

#include <gtest/gtest.h>

#include "ordo/ordo.hpp"
#include "support/run_test.hpp"

namespace ordo {
namespace {

using namespace std::chrono_literals;
using test::run_test;
using test::wait_until;

// GET http://HOST:PORT/metrics with a blocking socket: the body, or "" on failure.
std::string scrape(const std::string& url) {
    const std::string rest = url.substr(std::string("http://").size());
    const auto colon = rest.find(':');
    const auto slash = rest.find('/');
    const std::string host = rest.substr(0, colon);
    const std::string port = rest.substr(colon + 1, slash - colon - 1);
    try {
        net::io_context io;
        net::ip::tcp::socket s(io);
        s.connect({net::ip::make_address(host), static_cast<unsigned short>(std::stoi(port))});
        const std::string req =
            "GET /metrics HTTP/1.0\r\nHost: " + host + "\r\nConnection: close\r\n\r\n";
        net::write(s, net::buffer(req));
        std::string out;
        std::error_code ec;
        char buf[4096];
        for (int i = 0; i < 100'000; ++i) {
            const auto n = s.read_some(net::buffer(buf), ec);
            out.append(buf, n);
            if (ec) break;
        }
        const auto body = out.find("\r\n\r\n");
        return body == std::string::npos ? "" : out.substr(body + 4);
    } catch (const std::exception&) {
        return "";
    }
}

// The value of the sample line that starts with `series` (name and labels), or -1.
double sample(const std::string& text, const std::string& series) {
    auto at = text.find("\n" + series + " ");
    if (at == std::string::npos) return -1;
    at += series.size() + 2;
    return std::stod(text.substr(at, text.find('\n', at) - at));
}

// Scrapes on another thread (the exporter reads the server on this one's executor).
net::awaitable<std::string> scrape_async(const std::string& url) {
    auto f = std::async(std::launch::async, [url] { return scrape(url); });
    co_await wait_until([&] { return f.wait_for(0s) == std::future_status::ready; }, 30s);
    co_return f.wait_for(0s) == std::future_status::ready ? f.get() : std::string();
}

TEST(Prometheus, ScrapesShowRequestsAndLatencyMoving) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        server srv(ex);
        srv.on("inc", [](int x) { return x + 1; });
        srv.on("fail", [](int) -> int { throw std::runtime_error("no"); });
        prometheus_exporter metrics("127.0.0.1:0");
        metrics.add(srv, "main");
        EXPECT_EQ(metrics.url().rfind("http://127.0.0.1:", 0), 0u) << metrics.url();
        EXPECT_EQ(metrics.url().find(":0/"), std::string::npos) << metrics.url();
        const std::string url = srv.listen("tcp://127.0.0.1:0");
        auto ch = co_await async_connect(url);
        for (int i = 0; i < 3; ++i) co_await ch.async_call<int>("inc", i);
        auto [ec, r] = co_await ch.async_call<int>("fail", 1, use_tuple);
        EXPECT_EQ(ec, errc::remote_error);

        const std::string first = co_await scrape_async(metrics.url());
        EXPECT_EQ(
            sample(first, R"(ordo_server_requests_total{server="main",method="inc",code="ok"})"), 3)
            << first;
        EXPECT_EQ(
            sample(
                first,
                R"(ordo_server_requests_total{server="main",method="fail",code="remote_error"})"),
            1);
        EXPECT_EQ(
            sample(first,
                   R"(ordo_server_request_duration_seconds_count{server="main",method="inc"})"),
            3);
        EXPECT_EQ(sample(first, R"(ordo_server_connections{server="main"})"), 1);
        EXPECT_GT(sample(first, R"(ordo_server_received_bytes_total{server="main"})"), 0);
        EXPECT_NE(first.find("# TYPE ordo_server_request_duration_seconds histogram"),
                  std::string::npos);

        for (int i = 0; i < 4; ++i) co_await ch.async_call<int>("inc", i);
        const std::string second = co_await scrape_async(metrics.url());
        EXPECT_EQ(
            sample(second, R"(ordo_server_requests_total{server="main",method="inc",code="ok"})"),
            7);
        EXPECT_EQ(
            sample(second,
                   R"(ordo_server_request_duration_seconds_count{server="main",method="inc"})"),
            7);
        co_await srv.async_stop();
    });
}

TEST(Prometheus, ARoutersReplicasShowTheirStateAndItsLossesAndReconnectsAreCounted) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        server srv(ex);
        srv.on("inc", [](int x) { return x + 1; });
        const std::string up = srv.listen("tcp://127.0.0.1:0");
        router_options o;
        o.reconnect_initial = 5000ms;  // stays down for the scrape
        auto r = make_router(ex, o);
        co_await r->async_add_replica(up);
        r->add_replica("tcp://127.0.0.1:1");  // nothing listens there
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] {
            for (auto& rc : r->replicas())
                if (rc.state == replica_state::connecting) return false;
            return true;
        }));
        prometheus_exporter metrics("127.0.0.1:0");
        metrics.add(r, "fleet");
        co_await channel(r).async_call<int>("inc", 1);
        const std::string text = co_await scrape_async(metrics.url());
        const std::string rl = R"({router="fleet",replica=")";
        EXPECT_EQ(sample(text, "ordo_router_replica_state" + rl + up + R"(",state="ready"})"), 1)
            << text;
        EXPECT_EQ(sample(text, "ordo_router_replica_state" + rl + up + R"(",state="reconnecting"})"),
                  0);
        EXPECT_EQ(sample(text, "ordo_router_replica_state" + rl +
                                   R"(tcp://127.0.0.1:1",state="reconnecting"})"),
                  1);
        EXPECT_EQ(sample(text, R"(ordo_router_reconnects_total{router="fleet"})"), 0);
        EXPECT_EQ(sample(text, R"(ordo_router_ejections_total{router="fleet"})"), 0);
        EXPECT_EQ(sample(text, R"(ordo_router_moved_total{router="fleet"})"), 0);
        EXPECT_EQ(sample(text, R"(ordo_router_over_budget_total{router="fleet"})"), 0);
        EXPECT_EQ(sample(text, "ordo_router_replica_overloaded_total" + rl + up + R"("})"), 0);
        // Of the two, one takes calls: the aperture (every replica that does) is one.
        EXPECT_EQ(sample(text, R"(ordo_router_aperture{router="fleet"})"), 1);
        EXPECT_EQ(sample(text, R"(ordo_router_aperture_trials_total{router="fleet"})"), 0);
        EXPECT_EQ(sample(text, R"(ordo_router_aperture_changes_total{router="fleet"})"), 0);
        r->close();
        co_await srv.async_stop();
    });
}

// A limit shared among callers: the limit, and each caller's calls by outcome.
TEST(Prometheus, ASharedLimitShowsEachCaller) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        server_options so;
        so.concurrency = 1;
        so.shares.queue = 4;
        so.authenticate = authenticate_tokens({{"alice-token-0123456789", "alice"}});
        server srv(ex, so);
        net::steady_timer hold(ex, std::chrono::steady_clock::time_point::max());
        handler_options concurrent;
        concurrent.concurrent = true;
        srv.on(
            "hold",
            [&]() -> net::awaitable<int> {
                co_await hold.async_wait(use_tuple);
                co_return 1;
            },
            concurrent);
        prometheus_exporter metrics("127.0.0.1:0");
        metrics.add(srv, "main");
        peer_options po;
        po.credentials.token = "alice-token-0123456789";
        auto ch = co_await async_connect(srv.listen("tcp://127.0.0.1:0"), po);
        int done = 0;
        for (int i = 0; i < 3; ++i) ch.async_call<int>("hold", [&](std::error_code, int) { ++done; });
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] {
            const auto c = srv.stats().concurrency.callers;
            return !c.empty() && c[0].waiting == 2;
        }));
        const std::string text = co_await scrape_async(metrics.url());
        EXPECT_EQ(sample(text, R"(ordo_server_concurrency_limit{server="main"})"), 1) << text;
        EXPECT_EQ(sample(text, R"(ordo_server_concurrency_in_flight{server="main"})"), 1);
        EXPECT_EQ(sample(text, R"(ordo_server_caller_running{server="main",caller="alice"})"), 1);
        EXPECT_EQ(sample(text, R"(ordo_server_caller_waiting{server="main",caller="alice"})"), 2);
        EXPECT_EQ(sample(text, R"(ordo_server_caller_calls_total{server="main",caller="alice",)"
                               R"(outcome="queued"})"),
                  2);
        EXPECT_EQ(sample(text, R"(ordo_server_caller_calls_total{server="main",caller="alice",)"
                               R"(outcome="served"})"),
                  1);
        hold.cancel();
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] {
            hold.cancel();
            return done == 3;
        }));
        co_await srv.async_stop();
    });
}

TEST(Prometheus, AnAddressInUseIsAClearError) {
    prometheus_exporter first("127.0.0.1:0");
    const std::string url = first.url();
    const std::string port =
        url.substr(url.rfind(':') + 1, url.find("/metrics") - url.rfind(':') - 1);
    try {
        prometheus_exporter second("127.0.0.1:" + port);
        ADD_FAILURE() << "a second exporter listened on " << port;
    } catch (const rpc_error& e) {
        EXPECT_EQ(e.code(), errc::bad_address);
        EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + port), std::string::npos) << e.what();
    }
    EXPECT_THROW(prometheus_exporter("no-port"), rpc_error);
}

}  // namespace
}  // namespace ordo
