// Streaming calls (ordo/stream.hpp, docs/protocol.md "Streams"): order, credit, cancellation,
// errors after items, dead peers, many streams at once, callers that do not stream, and streams
// over pools, routers and resumable sessions.
#include "ordo/ordo.hpp"

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/cutting_proxy.hpp"
#include "support/run_test.hpp"

namespace ordo {
namespace {

using namespace std::chrono_literals;
using test::run_test;
using test::wait_until;

struct numbers : interface {
    method<stream<int>(int)> count_to{"count_to"};
    method<int(int)> inc{"inc"};
};

// What a streaming handler saw, for the assertions.
struct handler_log {
    std::uint64_t written = 0;
    bool cancelled = false;  // a write or a wait threw
    bool ended = false;      // the body returned
    int running = 0;
    int started = 0;
};

std::shared_ptr<peer> peer_of(const channel& c) {
    return std::dynamic_pointer_cast<peer>(c.impl());
}

net::awaitable<void> sleep_for(std::chrono::milliseconds d) {
    net::steady_timer t(co_await net::this_coro::executor, d);
    co_await t.async_wait(use_tuple);
}

// count_to(n) that records its progress in `log`, and `forever` that writes until cancelled.
void serve_numbers(server& srv, handler_log& log, handler_options o = {}) {
    srv.on(
        numbers{}.count_to,
        [&log](writer<int>& out, int n) -> net::awaitable<void> {
            ++log.running;
            ++log.started;
            try {
                for (int i = 0; i < n; ++i) {
                    co_await out.write(i);
                    log.written = out.written();
                }
            } catch (const std::system_error&) {
                log.cancelled = true;
                --log.running;
                throw;
            }
            log.ended = true;
            --log.running;
        },
        o);
    srv.on(numbers{}.inc, [](int x) { return x + 1; });
    srv.on("forever", [&log](writer<int>& out) -> net::awaitable<void> {
        try {
            for (int i = 0;; ++i) {
                co_await out.write(i);
                log.written = out.written();
                co_await sleep_for(1ms);
            }
        } catch (const std::system_error&) {
            log.cancelled = true;
            throw;
        }
    });
}

template <class T>
net::awaitable<std::vector<T>> read_all(stream<T>& s) {
    std::vector<T> got;
    while (auto v = co_await s.next()) got.push_back(*v);
    co_return got;
}

std::vector<int> iota(int n) {
    std::vector<int> v(n);
    for (int i = 0; i < n; ++i) v[i] = i;
    return v;
}

TEST(Stream, ItemsArriveInOrderThenTheEnd) {
    run_test([]() -> net::awaitable<void> {
        server srv(co_await net::this_coro::executor);
        handler_log log;
        serve_numbers(srv, log);
        auto ch = co_await async_connect(srv.listen("tcp://127.0.0.1:0"));
        auto c = stub<numbers>(ch);
        auto s = co_await c.count_to(5000);
        EXPECT_EQ(co_await read_all(s), iota(5000));
        EXPECT_EQ(s.received(), 5000u);
        // An empty stream, and the untyped form with raw values.
        auto e = co_await c.count_to(0);
        EXPECT_FALSE(co_await e.next());
        auto raw = co_await ch.async_stream("count_to", 3);
        int expect = 0;
        while (auto v = co_await raw.next()) EXPECT_EQ(v->get().as<int>(), expect++);
        EXPECT_EQ(expect, 3);
        EXPECT_TRUE(log.ended);
        co_await srv.async_stop();
    });
}

// The reader stops: the handler writes its window and waits; the caller holds no more than
// the window either. Reading on grants more, and everything arrives.
TEST(Stream, CreditBoundsBothSidesWhenTheReaderStops) {
    run_test([]() -> net::awaitable<void> {
        server srv(co_await net::this_coro::executor);
        handler_log log;
        serve_numbers(srv, log);
        auto ch = co_await async_connect(srv.listen("tcp://127.0.0.1:0"));
        auto c = stub<numbers>(ch);
        call_options o;
        o.window = 16;
        auto s = co_await c.count_to(100'000, o);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return log.written == 16; }));
        co_await sleep_for(1500ms);  // a reader that stops for seconds
        EXPECT_EQ(log.written, 16u);
        EXPECT_EQ(s.received(), 16u);
        // Reading half the window grants that much again.
        for (int i = 0; i < 8; ++i) EXPECT_EQ(*co_await s.next(), i);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return log.written == 24; }));
        co_await sleep_for(300ms);
        EXPECT_EQ(log.written, 24u);
        EXPECT_LE(s.received(), 24u);
        std::vector<int> rest;
        while (auto v = co_await s.next()) rest.push_back(*v);
        ORDO_CO_ASSERT_EQ(rest.size(), 100'000u - 8);
        EXPECT_EQ(rest.front(), 8);
        EXPECT_EQ(rest.back(), 99'999);
        EXPECT_TRUE(log.ended);
        co_await srv.async_stop();
    });
}

TEST(Stream, CancelMidStreamReachesTheHandler) {
    run_test([]() -> net::awaitable<void> {
        server srv(co_await net::this_coro::executor);
        handler_log log;
        serve_numbers(srv, log);
        auto ch = co_await async_connect(srv.listen("tcp://127.0.0.1:0"));
        auto s = co_await ch.async_stream<int>("forever");
        for (int i = 0; i < 10; ++i) EXPECT_EQ(*co_await s.next(), i);
        s.cancel();
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return log.cancelled; }));
        // What had arrived is still read, then the stream fails as cancelled.
        std::error_code ec;
        try {
            while (co_await s.next()) {
            }
        } catch (const rpc_error& e) {
            ec = e.code();
            EXPECT_NE(std::string(e.what()).find("forever"), std::string::npos) << e.what();
        }
        EXPECT_EQ(ec, errc::cancelled);
        // The connection is fine afterwards.
        EXPECT_EQ(co_await ch.async_call<int>("inc", 1), 2);
        co_await srv.async_stop();
    });
}

TEST(Stream, DroppingTheStreamCancelsIt) {
    run_test([]() -> net::awaitable<void> {
        server srv(co_await net::this_coro::executor);
        handler_log log;
        serve_numbers(srv, log);
        auto ch = co_await async_connect(srv.listen("tcp://127.0.0.1:0"));
        {
            auto s = co_await ch.async_stream<int>("forever");
            EXPECT_EQ(*co_await s.next(), 0);
        }
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return log.cancelled; }));
        EXPECT_EQ(peer_of(ch)->counters().pending_calls, 0u);
        co_await srv.async_stop();
    });
}

TEST(Stream, AHandlerErrorComesAfterTheItemsBeforeIt) {
    run_test([]() -> net::awaitable<void> {
        server srv(co_await net::this_coro::executor);
        srv.on("three_then_fail", [](writer<std::string>& out) -> net::awaitable<void> {
            co_await out.write("a");
            co_await out.write("b");
            co_await out.write("c");
            throw std::runtime_error("the model ran out of tokens");
        });
        auto ch = co_await async_connect(srv.listen("tcp://127.0.0.1:0"));
        auto s = co_await ch.async_stream<std::string>("three_then_fail");
        std::vector<std::string> got;
        std::string what;
        try {
            while (auto v = co_await s.next()) got.push_back(*v);
        } catch (const rpc_error& e) {
            what = e.what();
            EXPECT_EQ(e.code(), errc::remote_error);
        }
        EXPECT_EQ(got, (std::vector<std::string>{"a", "b", "c"}));
        EXPECT_NE(what.find("the model ran out of tokens"), std::string::npos) << what;
        co_await srv.async_stop();
    });
}

TEST(Stream, ADeadlineEndsTheStreamAfterItsItems) {
    run_test([]() -> net::awaitable<void> {
        server srv(co_await net::this_coro::executor);
        handler_log log;
        serve_numbers(srv, log);
        auto ch = co_await async_connect(srv.listen("tcp://127.0.0.1:0"));
        auto s = co_await ch.async_stream<int>("forever", timeout(300ms));
        int n = 0;
        std::error_code ec;
        try {
            while (auto v = co_await s.next()) EXPECT_EQ(*v, n++);
        } catch (const rpc_error& e) {
            ec = e.code();
        }
        EXPECT_EQ(ec, errc::timed_out);
        EXPECT_GT(n, 0);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return log.cancelled; }));
        co_await srv.async_stop();
    });
}

// The server's side goes away mid-stream: the reader gets the items, then peer_lost. The
// caller's side goes away: the handler is cancelled.
TEST(Stream, ADeadPeerEndsItsStreamsOnBothSides) {
    run_test([]() -> net::awaitable<void> {
        server srv(co_await net::this_coro::executor);
        std::shared_ptr<peer> served;
        srv.on("five_then_hang", [&](peer& p, writer<int>& out) -> net::awaitable<void> {
            for (int i = 0; i < 5; ++i) co_await out.write(i);
            served = p.shared_from_this();
            co_await sleep_for(60s);
        });
        handler_log log;
        serve_numbers(srv, log);
        const auto url = srv.listen("tcp://127.0.0.1:0");
        auto ch = co_await async_connect(url);
        auto s = co_await ch.async_stream<int>("five_then_hang");
        for (int i = 0; i < 5; ++i) EXPECT_EQ(*co_await s.next(), i);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return served != nullptr; }));
        served->abort();
        std::error_code ec;
        try {
            co_await s.next();
        } catch (const rpc_error& e) {
            ec = e.code();
        }
        EXPECT_EQ(ec, errc::peer_lost);

        auto ch2 = co_await async_connect(url);
        auto s2 = co_await ch2.async_stream<int>("forever");
        EXPECT_EQ(*co_await s2.next(), 0);
        peer_of(ch2)->abort();
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return log.cancelled; }));
        co_await srv.async_stop();
    });
}

// 10,000 streams open at once on one connection (a concurrent handler), read interleaved.
TEST(Stream, TenThousandStreamsAtOnceOnOneConnection) {
    run_test([]() -> net::awaitable<void> {
        server srv(co_await net::this_coro::executor);
        handler_log log;
        serve_numbers(srv, log, {.concurrent = true});
        auto ch = co_await async_connect(srv.listen("tcp://127.0.0.1:0"));
        auto c = stub<numbers>(ch);
        call_options o;
        o.window = 2;
        std::vector<stream<int>> all;
        for (int i = 0; i < 10'000; ++i) all.push_back(co_await c.count_to(3, o));
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return log.running == 10'000; }));
        for (int step = 0; step < 3; ++step)
            for (auto& s : all) ORDO_CO_ASSERT_EQ(*co_await s.next(), step);
        for (auto& s : all) ORDO_CO_ASSERT_TRUE(!co_await s.next());
        EXPECT_EQ(log.running, 0);
        co_await srv.async_stop();
    });
}

// Order on an ordered connection: a serial streaming handler (the default) holds the messages
// after it until its last item; a concurrent one lets them run while it waits for credit.
TEST(Stream, ASerialStreamKeepsItsPlaceAmongTheConnectionsMessages) {
    run_test([]() -> net::awaitable<void> {
        server srv(co_await net::this_coro::executor);
        handler_log serial_log, concurrent_log;
        std::vector<std::string> order;
        srv.on("serial", [&](writer<int>& out, int n) -> net::awaitable<void> {
            for (int i = 0; i < n; ++i) co_await out.write(i);
            order.push_back("serial end");
        });
        srv.on("concurrent",
               [&](writer<int>& out, int n) -> net::awaitable<void> {
                   for (int i = 0; i < n; ++i) co_await out.write(i);
                   order.push_back("concurrent end");
               },
               {.concurrent = true});
        srv.on("mark", [&](std::string m) { order.push_back(m); });
        auto ch = co_await async_connect(srv.listen("tcp://127.0.0.1:0"));
        call_options o;
        o.window = 4;
        auto s = co_await ch.async_stream<int>("serial", 10, o);
        ch.notify("mark", std::string("after serial"));
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return s.received() == 4; }));
        co_await sleep_for(200ms);
        EXPECT_TRUE(order.empty());  // the notification waits behind the stream
        std::vector<int> got = co_await read_all(s);
        EXPECT_EQ(got, iota(10));
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return order.size() == 2; }));
        EXPECT_EQ(order, (std::vector<std::string>{"serial end", "after serial"}));

        order.clear();
        auto t = co_await ch.async_stream<int>("concurrent", 10, o);
        ch.notify("mark", std::string("after concurrent"));
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return order.size() == 1; }));
        EXPECT_EQ(order.front(), "after concurrent");
        EXPECT_EQ(co_await read_all(t), iota(10));
        co_await srv.async_stop();
    });
}

// A caller that does not stream gets the items as one array; calling a plain method as a
// stream is refused clearly; so is a collection that would be too long.
TEST(Stream, PlainCallersAndPlainMethodsGetDefinedAnswers) {
    run_test([]() -> net::awaitable<void> {
        server srv(co_await net::this_coro::executor);
        handler_log log;
        serve_numbers(srv, log);
        srv.on("big", [](writer<std::string>& out, int n) -> net::awaitable<void> {
            for (int i = 0; i < n; ++i) co_await out.write(std::string(1 << 20, 'x'));
        });
        auto ch = co_await async_connect(srv.listen("tcp://127.0.0.1:0"));
        EXPECT_EQ(co_await ch.async_call<std::vector<int>>("count_to", 5), iota(5));
        EXPECT_EQ(co_await ch.async_call<std::vector<int>>("count_to", 0), std::vector<int>{});
        std::string what;
        try {
            co_await ch.async_call<std::vector<std::string>>("big", 40);
        } catch (const rpc_error& e) {
            what = e.what();
            EXPECT_EQ(e.code(), errc::overloaded);
        }
        EXPECT_NE(what.find("call it as a stream"), std::string::npos) << what;
        // But streamed, 40 MiB go through in steps of the window.
        auto big = co_await ch.async_stream<std::string>("big", 40);
        EXPECT_EQ((co_await read_all(big)).size(), 40u);

        what.clear();
        try {
            auto s = co_await ch.async_stream<int>("inc", 1);
            co_await s.next();
        } catch (const rpc_error& e) {
            what = e.what();
            EXPECT_EQ(e.code(), errc::bad_arguments);
        }
        EXPECT_NE(what.find("does not stream"), std::string::npos) << what;
        // Items that do not convert fail the stream, naming the item.
        what.clear();
        try {
            auto s = co_await ch.async_stream<std::string>("count_to", 3);
            co_await s.next();
        } catch (const rpc_error& e) {
            what = e.what();
            EXPECT_EQ(e.code(), errc::bad_result);
        }
        EXPECT_NE(what.find("item 1"), std::string::npos) << what;
        EXPECT_EQ(co_await ch.async_call<int>("inc", 1), 2);
        co_await srv.async_stop();
    });
}

TEST(Stream, WorksOverPoolsAndRouters) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        server a(ex), b(ex);
        handler_log log_a, log_b;
        serve_numbers(a, log_a, {.concurrent = true});
        serve_numbers(b, log_b, {.concurrent = true});
        const auto url_a = a.listen("tcp://127.0.0.1:0");
        const auto url_b = b.listen("tcp://127.0.0.1:0");
        auto pooled = co_await async_connect(url_a + "?mode=pooled&max_connections=2");
        {
            auto c = stub<numbers>(pooled);
            std::vector<stream<int>> open;
            for (int i = 0; i < 4; ++i) open.push_back(co_await c.count_to(300));
            for (auto& s : open) EXPECT_EQ(co_await read_all(s), iota(300));
        }
        // Keyed streams stay on their key's replica.
        auto routed =
            co_await async_connect("route+tcp://" + url_a.substr(6) + "," + url_b.substr(6));
        const int before_a = log_a.started, before_b = log_b.started;
        auto c = stub<numbers>(routed);
        std::vector<stream<int>> open;
        for (int i = 0; i < 4; ++i) open.push_back(co_await c.count_to(300, key("user-42")));
        for (auto& s : open) EXPECT_EQ(co_await read_all(s), iota(300));
        const int on_a = log_a.started - before_a, on_b = log_b.started - before_b;
        EXPECT_TRUE((on_a == 4 && on_b == 0) || (on_a == 0 && on_b == 4)) << on_a << " " << on_b;
        co_await a.async_stop();
        co_await b.async_stop();
    });
}

// Items are messages like any other: a resumable session carries a stream over cut connections,
// every item once and in order.
TEST(Stream, SurvivesCutConnectionsOnAResumableSession) {
    run_test([]() -> net::awaitable<void> {
        server srv(co_await net::this_coro::executor);
        handler_log log;
        serve_numbers(srv, log);
        const auto url = srv.listen("tcp://127.0.0.1:0");
        test::cutting_proxy proxy(
            "127.0.0.1", static_cast<std::uint16_t>(std::stoi(url.substr(url.rfind(':') + 1))));
        auto ch = co_await async_connect(proxy.url() + "?resume_ms=20000");
        auto c = stub<numbers>(ch);
        call_options o;
        o.window = 64;
        auto s = co_await c.count_to(20'000, o);
        int next = 0;
        while (auto v = co_await s.next()) {
            ORDO_CO_ASSERT_EQ(*v, next);
            if (++next % 2'000 == 0) proxy.cut_all();
        }
        EXPECT_EQ(next, 20'000);
        EXPECT_GE(peer_of(ch)->counters().resumes, 1u);
        co_await srv.async_stop();
    });
}

}  // namespace
}  // namespace ordo
