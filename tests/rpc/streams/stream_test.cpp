// Streaming calls (ordo/rpc/stream_call.hpp, docs/protocol.md "Streams"): order, credit,
// cancellation, errors after items, dead peers, many streams at once, callers that do not stream,
// and streams over pools, routers and resumable sessions.
#include "ordo/ordo.hpp"

#include <future>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/write.hpp>
#include <msgpack.hpp>

#include "support/cutting_proxy.hpp"
#include "support/numbers.hpp"
#include "support/peers.hpp"
#include "support/run_test.hpp"
#include "support/running_loop.hpp"
#include "support/sleep.hpp"

namespace ordo {
namespace {

using namespace std::chrono_literals;
using test::iota;
using test::peer_of;
using test::run_test;
using test::sleep_quietly;
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
                co_await sleep_quietly(1ms);
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

// Everything a stream yields, and how it ended (code empty: normally).
template <class T>
struct read_outcome {
    std::vector<T> items;
    std::error_code code;
    std::string what;
};

template <class T>
net::awaitable<read_outcome<T>> read_to_end(stream<T>& s) {
    read_outcome<T> r;
    try {
        while (auto v = co_await s.next()) r.items.push_back(std::move(*v));
    } catch (const rpc_error& e) {
        r.code = e.code();
        r.what = e.what();
    }
    co_return r;
}

// A hand-written server's end of one TCP connection on loopback, speaking msgpack-rpc as
// docs/protocol.md describes it ("Streams"): it reads the caller's messages one at a time and
// writes frames of its own making, so that it can break the protocol where ordo's server never
// would.
class raw_server {
  public:
    explicit raw_server(net::any_io_executor ex)
        : acceptor_(ex, {net::ip::address_v4::loopback(), 0}), socket_(ex) {}

    std::string url() const {
        return "tcp://127.0.0.1:" + std::to_string(acceptor_.local_endpoint().port());
    }
    net::awaitable<void> accept() { co_await acceptor_.async_accept(socket_, net::use_awaitable); }

    /// The caller's next message; throws at the end of its input.
    net::awaitable<msgpack::object_handle> read() {
        msgpack::object_handle m;
        while (!in_.next(m)) {
            in_.reserve_buffer(64 * 1024);
            const std::size_t n = co_await socket_.async_read_some(
                net::buffer(in_.buffer(), in_.buffer_capacity()), net::use_awaitable);
            in_.buffer_consumed(n);
        }
        co_return m;
    }

    /// Reads up to the ordo.stream request and returns its msgid and window.
    net::awaitable<std::pair<std::uint32_t, std::uint32_t>> read_stream_request() {
        for (int i = 0; i < 100; ++i) {
            auto m = co_await read();
            const auto& a = m.get().via.array;
            if (m.get().type == msgpack::type::ARRAY && a.size == 4 && a.ptr[0].as<int>() == 0 &&
                a.ptr[2].as<std::string>() == "ordo.stream")
                co_return std::pair{a.ptr[1].as<std::uint32_t>(),
                                    a.ptr[3].via.array.ptr[2].as<std::uint32_t>()};
        }
        throw std::runtime_error("no ordo.stream request among the caller's first 100 messages");
    }

    /// Reads until the caller sends ordo.cancel for `msgid` (true), or `limit` passes (false).
    net::awaitable<bool> read_until_cancel(std::uint32_t msgid, std::chrono::milliseconds limit) {
        using namespace net::experimental::awaitable_operators;
        const auto deadline = std::chrono::steady_clock::now() + limit;
        while (std::chrono::steady_clock::now() < deadline) {
            auto r = co_await (read() ||
                               sleep_quietly(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   deadline - std::chrono::steady_clock::now())));
            if (r.index() != 0) co_return false;
            const auto& m = std::get<0>(r).get();
            if (m.type == msgpack::type::ARRAY && m.via.array.size == 3 &&
                m.via.array.ptr[0].as<int>() == 2 &&
                m.via.array.ptr[1].as<std::string>() == "ordo.cancel" &&
                m.via.array.ptr[2].via.array.ptr[0].as<std::uint32_t>() == msgid)
                co_return true;
        }
        co_return false;
    }

    /// Items `first` .. `first + n - 1` of the stream `msgid`, whatever the credit, in one
    /// write.
    net::awaitable<void> write_items(std::uint32_t msgid, int first, int n) {
        msgpack::sbuffer b;
        msgpack::packer<msgpack::sbuffer> p(b);
        for (int i = first; i < first + n; ++i) {
            p.pack_array(3);
            p.pack(2);
            p.pack(std::string("ordo.item"));
            p.pack_array(2);
            p.pack(msgid);
            p.pack(i);
        }
        co_await net::async_write(socket_, net::buffer(b.data(), b.size()), net::use_awaitable);
    }
    /// The stream's end: its response, counting `items`.
    net::awaitable<void> write_end(std::uint32_t msgid, int items) {
        msgpack::sbuffer b;
        msgpack::packer<msgpack::sbuffer> p(b);
        p.pack_array(4);
        p.pack(1);
        p.pack(msgid);
        p.pack_nil();
        p.pack(items);
        co_await net::async_write(socket_, net::buffer(b.data(), b.size()), net::use_awaitable);
    }

  private:
    net::ip::tcp::acceptor acceptor_;
    net::ip::tcp::socket socket_;
    msgpack::unpacker in_;
};

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
        co_await sleep_quietly(1500ms);  // a reader that stops for seconds
        EXPECT_EQ(log.written, 16u);
        EXPECT_EQ(s.received(), 16u);
        // Reading half the window grants that much again.
        for (int i = 0; i < 8; ++i) EXPECT_EQ(*co_await s.next(), i);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return log.written == 24; }));
        co_await sleep_quietly(300ms);
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
        const auto r = co_await read_to_end(s);
        EXPECT_EQ(r.code, errc::cancelled);
        EXPECT_NE(r.what.find("forever"), std::string::npos) << r.what;
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
        const auto r = co_await read_to_end(s);
        EXPECT_EQ(r.items, (std::vector<std::string>{"a", "b", "c"}));
        EXPECT_EQ(r.code, errc::remote_error);
        EXPECT_NE(r.what.find("the model ran out of tokens"), std::string::npos) << r.what;
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
        const auto r = co_await read_to_end(s);
        EXPECT_EQ(r.code, errc::timed_out);
        EXPECT_GT(r.items.size(), 0u);
        EXPECT_EQ(r.items, iota(static_cast<int>(r.items.size())));
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
            co_await sleep_quietly(60s);
        });
        handler_log log;
        serve_numbers(srv, log);
        const auto url = srv.listen("tcp://127.0.0.1:0");
        auto ch = co_await async_connect(url);
        auto s = co_await ch.async_stream<int>("five_then_hang");
        for (int i = 0; i < 5; ++i) EXPECT_EQ(*co_await s.next(), i);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return served != nullptr; }));
        served->abort();
        const auto r = co_await read_to_end(s);
        EXPECT_TRUE(r.items.empty());
        EXPECT_EQ(r.code, errc::peer_lost);

        auto ch2 = co_await async_connect(url);
        auto s2 = co_await ch2.async_stream<int>("forever");
        EXPECT_EQ(*co_await s2.next(), 0);
        peer_of(ch2)->abort();
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return log.cancelled; }));
        co_await srv.async_stop();
    });
}

// The window in bytes: large items stop the handler after about window_bytes, however many
// items the window would allow.
TEST(Stream, AWindowInBytesBoundsLargeItems) {
    run_test([]() -> net::awaitable<void> {
        server srv(co_await net::this_coro::executor);
        std::uint64_t written = 0;
        srv.on("kilobytes", [&](writer<std::string>& out, int n) -> net::awaitable<void> {
            for (int i = 0; i < n; ++i) {
                co_await out.write(std::string(1000, char('a' + i % 26)));
                written = out.written();
            }
        });
        auto ch = co_await async_connect(srv.listen("tcp://127.0.0.1:0"));
        call_options o;
        o.window = 1000;
        o.window_bytes = 4096;
        auto s = co_await ch.async_stream<std::string>("kilobytes", 200, o);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return written >= 4; }));
        co_await sleep_quietly(500ms);
        EXPECT_LE(written, 5u);  // four fit in 4096 bytes, and one more while some were left
        EXPECT_LE(s.received(), 5u);
        int n = 0;
        while (auto v = co_await s.next()) {
            ORDO_CO_ASSERT_EQ(v->size(), 1000u);
            ORDO_CO_ASSERT_EQ(v->front(), char('a' + n % 26));
            ++n;
        }
        EXPECT_EQ(n, 200);
        co_await srv.async_stop();
    });
}

// A reader waiting in next() can be cancelled (here by a timer that wins): it throws and takes
// nothing, and the stream reads on afterwards.
TEST(Stream, AWaitingReaderCanBeCancelled) {
    run_test([]() -> net::awaitable<void> {
        using namespace net::experimental::awaitable_operators;
        server srv(co_await net::this_coro::executor);
        bool go = false;
        srv.on("later", [&](writer<int>& out) -> net::awaitable<void> {
            while (!go) co_await sleep_quietly(5ms);
            co_await out.write(7);
        });
        auto ch = co_await async_connect(srv.listen("tcp://127.0.0.1:0"));
        auto s = co_await ch.async_stream<int>("later");
        net::steady_timer t(co_await net::this_coro::executor, 100ms);
        auto first = co_await (s.next() || t.async_wait(net::use_awaitable));
        EXPECT_EQ(first.index(), 1u);  // the timer won: next() was cancelled
        go = true;
        auto v = co_await s.next();
        ORDO_CO_ASSERT_TRUE(v.has_value());
        EXPECT_EQ(*v, 7);
        EXPECT_FALSE(co_await s.next());
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
        co_await sleep_quietly(200ms);
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
        const std::vector<int> none;
        EXPECT_EQ(co_await ch.async_call<std::vector<int>>("count_to", 0), none);
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

        auto plain = co_await ch.async_stream<int>("inc", 1);
        const auto r = co_await read_to_end(plain);
        EXPECT_EQ(r.code, errc::bad_arguments);
        EXPECT_NE(r.what.find("does not stream"), std::string::npos) << r.what;
        // Items that do not convert fail the stream, naming the item.
        auto strings = co_await ch.async_stream<std::string>("count_to", 3);
        const auto bad = co_await read_to_end(strings);
        EXPECT_EQ(bad.code, errc::bad_result);
        EXPECT_NE(bad.what.find("item 1"), std::string::npos) << bad.what;
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

// ---- streaming batch handlers ----

// What a streaming batch handler saw: per batch, the open callers' arguments at each step.
struct batch_log {
    std::vector<std::vector<std::vector<int>>> batches;  // batch -> step -> open callers' n
    bool running = false;
};

// count(n) in batches: step k gives item k, or the end at n; a caller with n == 13 gets an
// element_error at step 2; n < 0 makes the whole handler throw at step 1. Each step is followed
// by `pause`.
void serve_batch_count(server& srv, batch_log& log, batch_options o,
                       std::chrono::milliseconds pause = 1ms) {
    srv.on_batch_stream(
        "count", o,
        [&log, pause](batch_writer<int>& out, std::vector<int> ns) -> net::awaitable<void> {
            log.batches.emplace_back();
            log.running = true;
            for (int k = 0; !out.open().empty(); ++k) {
                std::vector<int> seen;
                std::vector<stream_step<int>> step;
                for (std::size_t i : out.open()) {
                    seen.push_back(ns[i]);
                    if (ns[i] < 0 && k == 1) throw std::runtime_error("negative count");
                    if (ns[i] == 13 && k == 2)
                        step.emplace_back(element_error{errc::remote_error, "13 is unlucky"});
                    else if (k < ns[i] || ns[i] < 0)
                        step.emplace_back(k);
                    else
                        step.emplace_back(stream_end{});
                }
                log.batches.back().push_back(seen);
                co_await out.step(std::move(step));
                if (pause.count() > 0) co_await sleep_quietly(pause);
            }
            log.running = false;
        });
}

// Callers that end at different steps, one that fails alone, one that cancels: each gets its
// own items; ended and cancelled callers leave the later steps; a later call does not join.
TEST(BatchStream, CallersEndAtTheirOwnStepsAndACancelStopsOnlyItsOwn) {
    run_test([]() -> net::awaitable<void> {
        server srv(co_await net::this_coro::executor);
        batch_log log;
        serve_batch_count(srv, log, {.max_batch_size = 16, .max_wait = 100ms});
        auto ch = co_await async_connect(srv.listen("tcp://127.0.0.1:0"));
        const std::vector<int> counts = {1, 3, 5, 13, 100};
        std::vector<stream<int>> open;
        for (int n : counts) open.push_back(co_await ch.async_stream<int>("count", n));
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return log.running; }));
        // A call made while the batch runs waits for a batch of its own.
        auto late = co_await ch.async_stream<int>("count", 2);
        // The caller of 100 reads three items, then cancels.
        for (int i = 0; i < 3; ++i) EXPECT_EQ(*co_await open[4].next(), i);
        open[4].cancel();
        for (std::size_t c = 0; c < 3; ++c)
            EXPECT_EQ(co_await read_all(open[c]), iota(counts[c])) << "caller " << c;
        const auto unlucky = co_await read_to_end(open[3]);
        EXPECT_EQ(unlucky.items, iota(2));
        EXPECT_NE(unlucky.what.find("13 is unlucky"), std::string::npos) << unlucky.what;
        EXPECT_EQ((co_await read_to_end(open[4])).code, errc::cancelled);
        EXPECT_EQ(co_await read_all(late), iota(2));
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return !log.running; }));
        ORDO_CO_ASSERT_EQ(log.batches.size(), 2u);
        const auto& steps = log.batches[0];
        ORDO_CO_ASSERT_GE(steps.size(), 6u);
        EXPECT_EQ(steps[0], (std::vector<int>{1, 3, 5, 13, 100}));
        EXPECT_EQ(steps[1], (std::vector<int>{1, 3, 5, 13, 100}));  // 1 gets its end here
        EXPECT_EQ(steps[2], (std::vector<int>{3, 5, 13, 100}));     // 13 fails here
        EXPECT_EQ(steps[3].size() >= 2 && steps[3][0] == 3 && steps[3][1] == 5, true);
        // 5 ends at step 5; after it only the cancelled caller can be left, and it leaves the
        // batch long before its 100 items.
        for (std::size_t k = 6; k < steps.size(); ++k)
            EXPECT_EQ(steps[k], (std::vector<int>{100})) << "step " << k;
        EXPECT_LT(steps.size(), 100u);
        EXPECT_EQ(log.batches[1], (std::vector<std::vector<int>>{{2}, {2}, {2}}));
        co_await srv.async_stop();
    });
}

TEST(BatchStream, AHandlerThatThrowsFailsTheCallersStillOpen) {
    run_test([]() -> net::awaitable<void> {
        server srv(co_await net::this_coro::executor);
        batch_log log;
        serve_batch_count(srv, log, {.max_batch_size = 16, .max_wait = 50ms});
        auto ch = co_await async_connect(srv.listen("tcp://127.0.0.1:0"));
        auto none = co_await ch.async_stream<int>("count", 0);  // ends at step 0
        auto bad = co_await ch.async_stream<int>("count", -1);  // throws at step 1
        auto two = co_await ch.async_stream<int>("count", 2);   // open at the throw
        EXPECT_EQ(co_await read_all(none), iota(0));
        for (auto* s : {&bad, &two}) {
            const auto r = co_await read_to_end(*s);
            EXPECT_EQ(r.items, iota(1));
            EXPECT_NE(r.what.find("negative count"), std::string::npos) << r.what;
        }
        co_await srv.async_stop();
    });
}

// A caller that stops reading holds the batch once its window and 16 buffered items are used;
// after a second of sending nothing it is left behind: the batch goes on for the others, and
// the items for it wait until it reads (issue 69: a stalled caller held its whole batch).
TEST(BatchStream, AStalledReaderIsLeftBehindAndTheBatchGoesOn) {
    run_test([]() -> net::awaitable<void> {
        server srv(co_await net::this_coro::executor);
        batch_log log;
        serve_batch_count(srv, log, {.max_batch_size = 16, .max_wait = 50ms});
        auto ch = co_await async_connect(srv.listen("tcp://127.0.0.1:0"));
        call_options o;
        o.window = 4;
        auto stalled = co_await ch.async_stream<int>("count", 1000, o);
        auto other = co_await ch.async_stream<int>("count", 1000, o);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return log.running; }));
        EXPECT_EQ(co_await read_all(other), iota(1000));
        EXPECT_LE(stalled.received(), 4u);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return !log.running; }));
        EXPECT_EQ(co_await read_all(stalled), iota(1000));  // nothing lost
        co_await srv.async_stop();
    });
}

// A caller left behind holds at most a window's worth (8192 items, 1 MiB): then its stream
// fails, with why, after the items it holds.
TEST(BatchStream, ACallerLeftBehindFailsOnceItHoldsAWindow) {
    run_test([]() -> net::awaitable<void> {
        server srv(co_await net::this_coro::executor);
        batch_log log;
        serve_batch_count(srv, log, {.max_batch_size = 16, .max_wait = 50ms}, 0ms);
        auto ch = co_await async_connect(srv.listen("tcp://127.0.0.1:0"));
        call_options o;
        o.window = 4;
        auto stalled = co_await ch.async_stream<int>("count", 20000, o);
        auto other = co_await ch.async_stream<int>("count", 20000);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return log.running; }));
        EXPECT_EQ(co_await read_all(other), iota(20000));
        const auto r = co_await read_to_end(stalled);
        EXPECT_EQ(r.code, errc::overloaded);
        EXPECT_NE(r.what.find("reads too slowly"), std::string::npos) << r.what;
        EXPECT_NE(r.what.find("count"), std::string::npos) << r.what;
        EXPECT_GE(r.items.size(), static_cast<std::size_t>(default_stream_window));
        EXPECT_LE(r.items.size(), 4u + detail::stream_batch::max_buffered + default_stream_window);
        EXPECT_EQ(r.items, iota(static_cast<int>(r.items.size())));
        co_await srv.async_stop();
    });
}

// Issue 69's attack: bob opens a streaming batch call and never reads; alice's calls, on a
// connection of her own, wait for the next batch, which bob's holds up for a second and then
// for as long as its handler takes to give him a window's worth (here about no time).
TEST(BatchStream, AStalledCallerDoesNotLockOutTheOthers) {
    run_test([]() -> net::awaitable<void> {
        server srv(co_await net::this_coro::executor);
        batch_log log;
        serve_batch_count(srv, log, {.max_batch_size = 16, .max_wait = 20ms}, 0ms);
        const auto url = srv.listen("tcp://127.0.0.1:0");
        auto bob_ch = co_await async_connect(url);
        auto alice_ch = co_await async_connect(url);
        call_options bob_o;
        bob_o.window = 1;
        auto bob = co_await bob_ch.async_stream<int>("count", 100000, bob_o);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return log.running; }));
        call_options alice_o;
        alice_o.timeout = 20s;  // generous: a loaded machine; held by bob, it never ends
        for (int i = 0; i < 3; ++i) {
            auto s = co_await alice_ch.async_stream<int>("count", 3, alice_o);
            EXPECT_EQ(co_await read_all(s), iota(3)) << "alice's call " << i;
        }
        const auto r = co_await read_to_end(bob);
        EXPECT_EQ(r.code, errc::overloaded) << r.what;
        co_await srv.async_stop();
    });
}

// A caller that reads slowly (its credit comes back each half window: here 16 items, 1.1 s)
// is left behind while another caller reads: the other is not held at its pace, and the slow
// one gets every item (it holds far less than a window).
TEST(BatchStream, ASlowReaderIsLeftBehindAndGetsEveryItem) {
    run_test([]() -> net::awaitable<void> {
        server srv(co_await net::this_coro::executor);
        batch_log log;
        serve_batch_count(srv, log, {.max_batch_size = 16, .max_wait = 50ms});
        auto ch = co_await async_connect(srv.listen("tcp://127.0.0.1:0"));
        call_options o;
        o.window = 32;
        auto slow = co_await ch.async_stream<int>("count", 100, o);
        auto other = co_await ch.async_stream<int>("count", 100, o);
        std::vector<int> got;
        bool slow_done = false;
        net::co_spawn(
            co_await net::this_coro::executor,
            [&]() -> net::awaitable<void> {
                while (auto v = co_await slow.next()) {
                    got.push_back(*v);
                    co_await sleep_quietly(70ms);
                }
                slow_done = true;
            },
            net::detached);
        EXPECT_EQ(co_await read_all(other), iota(100));
        // Held at the slow one's pace, `other` would end only after it read 64 items.
        EXPECT_LT(got.size(), 40u);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return slow_done; }, 30s));
        EXPECT_EQ(got, iota(100));
        co_await srv.async_stop();
    });
}

// A caller alone in its batch that stops reading is waited for, however long: nobody would
// gain from going on without it, so it is not left behind and does not fail.
TEST(BatchStream, ALoneStalledReaderIsWaitedFor) {
    run_test([]() -> net::awaitable<void> {
        server srv(co_await net::this_coro::executor);
        batch_log log;
        serve_batch_count(srv, log, {.max_batch_size = 16, .max_wait = 20ms}, 0ms);
        auto ch = co_await async_connect(srv.listen("tcp://127.0.0.1:0"));
        call_options o;
        o.window = 4;
        auto s = co_await ch.async_stream<int>("count", 20000, o);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return log.running; }));
        co_await sleep_quietly(1500ms);  // longer than a caller is waited for when others gain
        EXPECT_LE(log.batches[0].size(), 4u + detail::stream_batch::max_buffered + 2);
        EXPECT_EQ(co_await read_all(s), iota(20000));
        co_await srv.async_stop();
    });
}

// A server that stops closes its running streaming batches: their callers end with cancelled
// (not with the connection, 2 s later), the handler's writer reports closed and its stop token
// is requested.
TEST(BatchStream, StoppingTheServerEndsItsRunningBatches) {
    run_test([]() -> net::awaitable<void> {
        server srv(co_await net::this_coro::executor);
        bool running = false, closed = false, stop_seen = false;
        srv.on_batch_stream("endless", {.max_batch_size = 2, .max_wait = 1s},
                            [&](batch_writer<int>& out, std::vector<int>,
                                std::stop_token st) -> net::awaitable<void> {
                                running = true;
                                try {
                                    for (int k = 0; !out.open().empty() && k < 1'000'000; ++k) {
                                        std::vector<stream_step<int>> step(out.open().size(),
                                                                           stream_step<int>(k));
                                        co_await out.step(std::move(step));
                                        co_await sleep_quietly(1ms);
                                    }
                                } catch (const std::system_error&) {
                                    // Cancelled where it awaits (after the stop, any co_await
                                    // throws).
                                }
                                closed = out.closed();
                                stop_seen = st.stop_requested();
                                running = false;
                            });
        auto ch = co_await async_connect(srv.listen("tcp://127.0.0.1:0"));
        auto a = co_await ch.async_stream<int>("endless", 1);
        auto b = co_await ch.async_stream<int>("endless", 2);
        for (int i = 0; i < 5; ++i) {
            EXPECT_EQ(*co_await a.next(), i);
            EXPECT_EQ(*co_await b.next(), i);
        }
        ORDO_CO_ASSERT_TRUE(running);
        bool stopped = false;
        net::co_spawn(
            co_await net::this_coro::executor,
            [&]() -> net::awaitable<void> {
                co_await srv.async_stop();
                stopped = true;
            },
            net::detached);
        for (auto* s : {&a, &b}) {
            const auto r = co_await read_to_end(*s);
            EXPECT_EQ(r.code, errc::cancelled) << r.what;
            EXPECT_NE(r.what.find("endless"), std::string::npos) << r.what;
        }
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return stopped; }));
        EXPECT_FALSE(running);
        EXPECT_TRUE(closed);
        EXPECT_TRUE(stop_seen);
    });
}

// A plain msgpack-rpc call to a streaming batch method gets its items as one array.
TEST(BatchStream, APlainCallerGetsAnArray) {
    run_test([]() -> net::awaitable<void> {
        server srv(co_await net::this_coro::executor);
        batch_log log;
        serve_batch_count(srv, log, {.max_batch_size = 16, .max_wait = 5ms});
        auto ch = co_await async_connect(srv.listen("tcp://127.0.0.1:0"));
        EXPECT_EQ(co_await ch.async_call<std::vector<int>>("count", 4), iota(4));
        co_await srv.async_stop();
    });
}

// Threads (also run under ThreadSanitizer by .ci/run): the server on two loops of its own with
// its streaming batches on a worker pool, the caller's connection on a third thread, and the
// readers on the test's thread.
TEST(BatchStream, ReadersBatchesAndConnectionsOnDifferentThreads) {
    // The readers' loop goes last: the other loops post to it until their threads are joined.
    test::running_loop reader_loop;
    test::running_loop server_loop, client_loop;
    worker_pool workers(2);
    std::unique_ptr<server> srv;
    batch_log log;
    std::string url;
    net::post(server_loop.io, [&] {
        server_options so;
        so.threads = 2;
        srv = std::make_unique<server>(server_loop.io.get_executor(), so);
        serve_batch_count(*srv, log,
                          {.max_batch_size = 6, .max_wait = 2s, .run_on = workers.get_executor()});
        // Concurrent: read in step, two serial streams of one connection would wait for each
        // other (the second starts when the first has ended).
        srv->on("count_to",
                [](writer<int>& out, int n) -> net::awaitable<void> {
                    for (int i = 0; i < n; ++i) co_await out.write(i);
                },
                {.concurrent = true});
        url = srv->listen("tcp://127.0.0.1:0");
    });
    net::post(server_loop.io, net::use_future).get();
    auto ch = net::co_spawn(client_loop.io, async_connect(url), net::use_future).get();
    auto reading = net::co_spawn(
        reader_loop.io,
        [&]() -> net::awaitable<void> {
            call_options o;
            o.window = 8;
            std::vector<stream<int>> open;
            // One batch of six (read in step, the streams of two batches would wait for each
            // other: a batch moves at the pace of its slowest reader, and the next one waits).
            for (int i = 0; i < 6; ++i)
                open.push_back(co_await ch.async_stream<int>("count", 200, o));
            for (int i = 0; i < 2; ++i)
                open.push_back(co_await ch.async_stream<int>("count_to", 3000, o));
            for (int step = 0; step < 200; ++step)
                for (auto& s : open) ORDO_CO_ASSERT_EQ(*co_await s.next(), step);
            for (std::size_t i = 0; i < 6; ++i) ORDO_CO_ASSERT_TRUE(!co_await open[i].next());
            for (std::size_t i = 6; i < open.size(); ++i) {
                int next = 200;
                while (auto v = co_await open[i].next()) ORDO_CO_ASSERT_EQ(*v, next++);
                EXPECT_EQ(next, 3000);
            }
            // A stream dropped mid-way from this thread.
            auto dropped = co_await ch.async_stream<int>("count_to", 1'000'000, o);
            EXPECT_EQ(*co_await dropped.next(), 0);
        },
        net::use_future);
    ASSERT_EQ(reading.wait_for(std::chrono::seconds(120)), std::future_status::ready)
        << "the readers did not finish within 120 s";
    reading.get();
    // The channel ends on its own loop.
    net::post(client_loop.io, [&] {
        std::dynamic_pointer_cast<peer>(ch.impl())->close();
        ch = channel{};
    });
    net::post(client_loop.io, net::use_future).get();
    net::co_spawn(
        server_loop.io, [&]() -> net::awaitable<void> { co_await srv->async_stop(); },
        net::use_future)
        .get();
    net::post(server_loop.io, net::use_future).get();
    net::post(server_loop.io, [&] { srv.reset(); });
    net::post(server_loop.io, net::use_future).get();
    workers.join();
}

// A stream read on one io_context and carried by another, whose reader's io_context is
// destroyed while the carrier's thread may be waking the reader for its next item: the reader
// is woken or let go, once, and nothing of it is touched after it has gone (run under
// ThreadSanitizer and ASan by .ci/run). The gap before the item and the wait before the
// destruction vary from round to round, so that the two threads meet in either order.
TEST(Stream, AReadersIoContextDestroyedWhileItsCarrierWakesIt) {
    test::running_loop server_loop, client_loop;
    std::unique_ptr<server> srv;
    std::string url;
    net::post(server_loop.io, [&] {
        srv = std::make_unique<server>(server_loop.io.get_executor());
        srv->on("two",
                [](writer<int>& out, int gap_us) -> net::awaitable<void> {
                    co_await out.write(0);
                    net::steady_timer t(co_await net::this_coro::executor,
                                        std::chrono::microseconds(gap_us));
                    co_await t.async_wait(net::use_awaitable);
                    co_await out.write(1);
                },
                {.concurrent = true});
        url = srv->listen("tcp://127.0.0.1:0");
    });
    net::post(server_loop.io, net::use_future).get();
    auto ch = net::co_spawn(client_loop.io, async_connect(url), net::use_future).get();
    int read_both = 0;
    for (int round = 0; round < 60; ++round) {
        std::atomic<bool> first{false}, second{false};
        {
            net::io_context reader;
            auto guard = net::make_work_guard(reader);
            net::co_spawn(
                reader,
                [&, gap = (round % 20) * 50]() -> net::awaitable<void> {
                    auto s = co_await ch.async_stream<int>("two", gap);
                    if (co_await s.next() == 0) first = true;
                    if (co_await s.next() == 1) second = true;
                },
                [](std::exception_ptr) {});
            std::thread t([&] { reader.run(); });
            const auto deadline = std::chrono::steady_clock::now() + 30s;
            while (!first && std::chrono::steady_clock::now() < deadline)
                std::this_thread::sleep_for(50us);
            std::this_thread::sleep_for(std::chrono::microseconds((round % 7) * 100));
            reader.stop();
            t.join();
            ASSERT_TRUE(first) << "round " << round << ": the first item did not come in 30 s";
            read_both += second ? 1 : 0;
        }  // the reader's io_context goes, maybe while the carrier wakes its reader
    }
    RecordProperty("rounds_that_read_both_items", read_both);
    // The connection is whole: a stream read on its own loop.
    auto all = net::co_spawn(
                   client_loop.io,
                   [&]() -> net::awaitable<std::vector<int>> {
                       std::vector<int> got;
                       auto s = co_await ch.async_stream<int>("two", 0);
                       while (auto v = co_await s.next()) got.push_back(*v);
                       co_return got;
                   },
                   net::use_future)
                   .get();
    EXPECT_EQ(all, (std::vector<int>{0, 1}));
    net::post(client_loop.io, [&] { ch = channel{}; });
    net::post(client_loop.io, net::use_future).get();
    net::co_spawn(
        server_loop.io, [&]() -> net::awaitable<void> { co_await srv->async_stop(); },
        net::use_future)
        .get();
    net::post(server_loop.io, [&] { srv.reset(); });
    net::post(server_loop.io, net::use_future).get();
}

// A caller of count_to on `raw`'s connection, with `window` items of credit (as its request
// says), and the msgid the server saw.
struct raw_call {
    channel ch;
    stream<int> s;
    std::uint32_t msgid = 0;
};

net::awaitable<raw_call> call_count_to(raw_server& raw, std::uint32_t window) {
    raw_call c;
    c.ch = co_await async_connect(raw.url());
    co_await raw.accept();
    call_options o;
    o.window = window;
    c.s = co_await c.ch.async_stream<int>("count_to", 100, o);
    const auto [msgid, asked] = co_await raw.read_stream_request();
    if (asked != window)
        throw std::runtime_error("the request asked for a window of " + std::to_string(asked));
    c.msgid = msgid;
    co_return c;
}

// docs/protocol.md, "Streams": a server that sends beyond the credit fails the stream on the
// caller's side. Credit is what the caller has granted (the window, and what it has sent back
// in ordo.credit), not what happens to be queued: this server sends 9 items for a window of 8
// while the reader has taken 3, which no credit had yet been returned for.
TEST(Stream, AServerThatSendsBeyondTheCreditFailsTheStreamWithProtocolError) {
    run_test([]() -> net::awaitable<void> {
        raw_server raw(co_await net::this_coro::executor);
        auto [ch, s, msgid] = co_await call_count_to(raw, 8);
        co_await raw.write_items(msgid, 0, 3);
        for (int i = 0; i < 3; ++i) ORDO_CO_ASSERT_EQ(*co_await s.next(), i);
        co_await raw.write_items(msgid, 3, 6);  // 9 in all: one beyond the credit
        // The caller tells the server to stop.
        EXPECT_TRUE(co_await raw.read_until_cancel(msgid, 10s));
        co_await raw.write_end(msgid, 9);
        const auto r = co_await read_to_end(s);
        EXPECT_EQ(r.items, (std::vector<int>{3, 4, 5, 6, 7}));  // up to the credit
        EXPECT_EQ(r.code, errc::protocol_error) << r.what;
        EXPECT_NE(r.what.find("call count_to to " + ch.remote_address()), std::string::npos)
            << r.what;
        EXPECT_NE(r.what.find("item 9 beyond the credit granted"), std::string::npos) << r.what;
    });
}

// The same server flooding a reader that has stopped: the caller holds at most the window.
TEST(Stream, AFloodBeyondTheCreditIsNotBuffered) {
    run_test([]() -> net::awaitable<void> {
        raw_server raw(co_await net::this_coro::executor);
        auto [ch, s, msgid] = co_await call_count_to(raw, 16);
        // About 2 MB, far more than the sockets hold: the caller reads all of it.
        for (int i = 0; i < 20; ++i) co_await raw.write_items(msgid, i * 10'000, 10'000);
        EXPECT_TRUE(co_await raw.read_until_cancel(msgid, 10s));
        co_await raw.write_end(msgid, 200'000);
        // The call is over on the caller's side, which received no more than the window.
        EXPECT_TRUE(co_await wait_until(
            [&, &ch = ch] { return peer_of(ch)->counters().pending_calls == 0; }));
        EXPECT_EQ(s.received(), 16u);
        const auto r = co_await read_to_end(s);
        EXPECT_EQ(r.items, iota(16));
        EXPECT_EQ(r.code, errc::protocol_error) << r.what;
        EXPECT_NE(r.what.find(ch.remote_address()), std::string::npos) << r.what;
    });
}

}  // namespace
}  // namespace ordo
