// Streams both ways (ordo/rpc/stream_call.hpp, docs/protocol.md "Streams both ways"): client
// streams and two-way streams. Order in each direction, backpressure from a handler that does not
// read, cancellation and errors both ways, an early answer, a caller that goes away, and callers
// that call such a method the wrong way.
#include "ordo/ordo.hpp"

#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/read.hpp>
#include <asio/write.hpp>
#include <msgpack.hpp>

#include "support/cutting_proxy.hpp"
#include "support/delay_relay.hpp"
#include "support/run_test.hpp"
#include "support/running_loop.hpp"
#include "support/sleep.hpp"

namespace ordo {
namespace {

using namespace std::chrono_literals;
using test::run_test;
using test::sleep_quietly;
using test::wait_until;

struct store : interface {
    method<upload<int, std::vector<int>>()> collect{"collect"};
    method<upload<std::string, std::uint64_t>(int)> put{"put"};
    method<two_way<int, int>(int)> scale{"scale"};
    method<upload<std::vector<std::string>, std::vector<std::uint64_t>>()> digest{"digest"};
};

// A digest of an item's strings (FNV-1a over their bytes and lengths).
std::uint64_t digest_of(const std::vector<std::string>& item) {
    std::uint64_t h = 14695981039346656037ull;
    for (const auto& s : item) {
        for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
        h = (h ^ s.size()) * 1099511628211ull;
    }
    return h;
}

// What a reading handler saw, for the assertions.
struct reader_log {
    std::uint64_t read = 0;
    bool open = true;       // let the handler read (false: it waits without reading)
    std::error_code ended;  // how its reading ended with an error
    std::string what;
    bool returned = false;
};

// collect(): every item, in order. put(limit): the bytes of the items, answering early after
// `limit` items (0: none), and failing on "boom". scale(k): each item times k, written back.
void serve_store(server& srv, reader_log& log) {
    srv.on(store{}.collect, [](reader<int>& in) -> net::awaitable<std::vector<int>> {
        std::vector<int> got;
        while (auto v = co_await in.next()) got.push_back(*v);
        co_return got;
    });
    srv.on(store{}.put, [&log](reader<std::string>& in, int limit) -> net::awaitable<std::uint64_t> {
        std::uint64_t bytes = 0;
        try {
            for (;;) {
                while (!log.open) co_await sleep_quietly(2ms);
                auto v = co_await in.next();
                if (!v) break;
                ++log.read;
                if (*v == "boom") throw std::runtime_error("the disk is full");
                bytes += v->size();
                if (limit > 0 && log.read == static_cast<std::uint64_t>(limit)) break;
            }
        } catch (const std::system_error& e) {
            log.ended = e.code();
            log.what = e.what();
            throw;
        }
        log.returned = true;
        co_return bytes;
    });
    srv.on(store{}.digest, [](reader<std::vector<std::string>>& in)
                               -> net::awaitable<std::vector<std::uint64_t>> {
        std::vector<std::uint64_t> got;
        while (auto v = co_await in.next()) got.push_back(digest_of(*v));
        co_return got;
    });
    srv.on(store{}.scale, [&log](reader<int>& in, writer<int>& out, int k) -> net::awaitable<void> {
        try {
            while (auto v = co_await in.next()) {
                ++log.read;
                co_await out.write(*v * k);
            }
        } catch (const std::system_error& e) {
            log.ended = e.code();
            log.what = e.what();
            throw;
        }
        log.returned = true;
    });
}

// Writes `item` until write() says the call has ended (true), at most 200,000 times.
net::awaitable<bool> write_until_ended(upload<std::string, std::uint64_t>& up, std::string item) {
    for (int i = 0; i < 200000; ++i) {
        if (!co_await up.write(item)) co_return true;
        if (i % 64 == 0) co_await sleep_quietly(1ms);
    }
    co_return false;
}

// serve_store(srv, log), listening, and a channel to it.
net::awaitable<channel> serve_and_connect(server& srv, reader_log& log) {
    serve_store(srv, log);
    co_return co_await async_connect(srv.listen("tcp://127.0.0.1:0"));
}

TEST(ClientStream, ItemsArriveInOrderAndTheAnswerComesBack) {
    run_test([]() -> net::awaitable<void> {
        server srv(co_await net::this_coro::executor);
        reader_log log;
        auto ch = co_await serve_and_connect(srv, log);
        auto c = stub<store>(ch);
        // More than the window (8192 items), so that credit must come back on the way.
        constexpr int n = 20000;
        auto up = co_await c.collect();
        for (int i = 0; i < n; ++i) EXPECT_TRUE(co_await up.write(i));
        EXPECT_EQ(up.written(), std::uint64_t{n});
        const std::vector<int> got = co_await up.finish();
        ORDO_CO_ASSERT_EQ(got.size(), std::size_t{n});
        for (int i = 0; i < n; ++i)
            if (got[i] != i) {
                ADD_FAILURE() << "item " << i << " came as " << got[i];
                break;
            }
        // Nothing is left behind on either side.
        auto p = std::dynamic_pointer_cast<peer>(ch.impl());
        EXPECT_EQ(p->counters().pending_calls, 0u);
        co_await srv.async_stop();
    });
}

// Items of 64 KiB or more are kept as their bytes until the reader takes them, and read from
// them (dispatcher::inbox): they arrive whole and in order among small ones, nested.
TEST(ClientStream, BigItemsArriveWholeAmongSmallOnes) {
    run_test([]() -> net::awaitable<void> {
        server srv(co_await net::this_coro::executor);
        reader_log log;
        auto ch = co_await serve_and_connect(srv, log);
        auto c = stub<store>(ch);
        std::vector<std::vector<std::string>> items;
        for (int i = 0; i < 24; ++i) {
            const std::size_t big = i % 3 == 0 ? std::size_t(64 << 10) + std::size_t(i) * 40000 : 0;
            std::vector<std::string> item{std::string(big, char('a' + i % 26)), "small",
                                          std::string(std::size_t(i) * 7, 'z')};
            for (std::size_t k = 0; k < item[0].size(); k += 4093) item[0][k] = char(k);
            items.push_back(std::move(item));
        }
        auto up = co_await c.digest();
        for (const auto& item : items) EXPECT_TRUE(co_await up.write(item));
        const std::vector<std::uint64_t> got = co_await up.finish();
        ORDO_CO_ASSERT_EQ(got.size(), items.size());
        for (std::size_t i = 0; i < items.size(); ++i)
            EXPECT_EQ(got[i], digest_of(items[i])) << "item " << i;
        co_await srv.async_stop();
    });
}

TEST(ClientStream, AnEmptyUploadIsAnswered) {
    run_test([]() -> net::awaitable<void> {
        server srv(co_await net::this_coro::executor);
        reader_log log;
        auto ch = co_await serve_and_connect(srv, log);
        auto up = co_await stub<store>(ch).collect();
        EXPECT_TRUE((co_await up.finish()).empty());
        // Closed before the call has gone out: on a fresh connection with a deadline (the
        // request waits for ordo.features), and through a pool that has yet to dial.
        auto fresh = co_await async_connect(srv.listen("tcp://127.0.0.1:0"));
        auto held = co_await stub<store>(fresh).collect(timeout(30s));
        EXPECT_TRUE((co_await held.finish()).empty());
        auto pooled = co_await async_connect(srv.listen("tcp://127.0.0.1:0") + "?mode=pooled");
        auto dialing = co_await stub<store>(pooled).collect();
        EXPECT_TRUE((co_await dialing.finish()).empty());
        co_await srv.async_stop();
    });
}

// A handler that does not read holds its caller at the window: 1 MiB of 64 KiB items is 16
// items, and one more may go (it needs only some bytes left). Reading again lets the rest go.
TEST(ClientStream, AHandlerThatDoesNotReadHoldsTheWriterAtTheWindow) {
    run_test([]() -> net::awaitable<void> {
        server srv(co_await net::this_coro::executor);
        reader_log log;
        log.open = false;
        serve_store(srv, log);
        auto ch = co_await async_connect(srv.listen("tcp://127.0.0.1:0"));
        auto up = co_await stub<store>(ch).put(0);
        const std::string item(64 * 1024, 'x');
        int wrote = 0;
        bool blocked = false;
        auto writes = [&]() -> net::awaitable<void> {
            for (int i = 0; i < 64; ++i) {
                co_await up.write(item);
                ++wrote;
            }
        };
        {
            using namespace net::experimental::awaitable_operators;
            // The writes stop at the window; 2 s later they are still stopped.
            auto r = co_await (writes() || sleep_quietly(2s));
            blocked = r.index() == 1;
        }
        EXPECT_TRUE(blocked);
        // (Its item's bytes only, not the message's few bytes of head: 16 items fill 1 MiB.)
        EXPECT_GE(wrote, 16);
        EXPECT_LE(wrote, 17);
        EXPECT_EQ(log.read, 0u);
        // (The write that was cut off above took no credit: it waited for it.)
        log.open = true;
        for (int i = 0; i < 48; ++i) EXPECT_TRUE(co_await up.write(item));
        EXPECT_EQ(co_await up.finish(), std::uint64_t(wrote + 48) * item.size());
        EXPECT_EQ(log.read, std::uint64_t(wrote + 48));
        co_await srv.async_stop();
    });
}

TEST(ClientStream, AHandlerErrorEndsTheCallersWrites) {
    run_test([]() -> net::awaitable<void> {
        server srv(co_await net::this_coro::executor);
        reader_log log;
        auto ch = co_await serve_and_connect(srv, log);
        auto up = co_await stub<store>(ch).put(0);
        EXPECT_TRUE(co_await up.write("a"));
        EXPECT_TRUE(co_await up.write("boom"));
        // The writes go on until the answer has come back: then write() says the call ended.
        EXPECT_TRUE(co_await write_until_ended(up, "b"));
        try {
            co_await up.finish();
            ADD_FAILURE() << "finish() did not throw";
        } catch (const rpc_error& e) {
            EXPECT_EQ(e.code(), errc::remote_error);
            EXPECT_NE(std::string(e.what()).find("the disk is full"), std::string::npos)
                << e.what();
            EXPECT_NE(std::string(e.what()).find("put"), std::string::npos) << e.what();
        }
        co_await srv.async_stop();
    });
}

TEST(ClientStream, AnEarlyAnswerEndsTheCallersWrites) {
    run_test([]() -> net::awaitable<void> {
        server srv(co_await net::this_coro::executor);
        reader_log log;
        auto ch = co_await serve_and_connect(srv, log);
        auto up = co_await stub<store>(ch).put(2);
        EXPECT_TRUE(co_await write_until_ended(up, "abc"));
        EXPECT_EQ(co_await up.finish(), 6u);
        EXPECT_TRUE(log.returned);
        // The items that came after the answer were dropped, and the connection goes on.
        auto again = co_await stub<store>(ch).put(1);
        EXPECT_TRUE(co_await again.write("xy"));
        EXPECT_EQ(co_await again.finish(), 2u);
        co_await srv.async_stop();
    });
}

TEST(ClientStream, CancellingTheCallEndsTheHandlersRead) {
    run_test([]() -> net::awaitable<void> {
        server srv(co_await net::this_coro::executor);
        reader_log log;
        auto ch = co_await serve_and_connect(srv, log);
        {
            auto up = co_await stub<store>(ch).put(0);
            EXPECT_TRUE(co_await up.write("a"));
            ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return log.read == 1; }));
            // Dropped before finish(): cancelled (ordo.cancel).
        }
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return bool(log.ended); }));
        EXPECT_EQ(log.ended, errc::cancelled);
        EXPECT_FALSE(log.returned);
        co_await srv.async_stop();
    });
}

TEST(ClientStream, ACallerThatGoesAwayEndsTheHandlersRead) {
    run_test([]() -> net::awaitable<void> {
        server srv(co_await net::this_coro::executor);
        reader_log log;
        auto ch = co_await serve_and_connect(srv, log);
        auto up = co_await stub<store>(ch).put(0);
        EXPECT_TRUE(co_await up.write("a"));
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return log.read == 1; }));
        // Closed (end of stream, not a reset): no more items can come, and the handler's read
        // says so at once, not after liveness_timeout (10 s).
        const auto closed = std::chrono::steady_clock::now();
        std::dynamic_pointer_cast<peer>(ch.impl())->close();
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return bool(log.ended); }));
        EXPECT_LT(std::chrono::steady_clock::now() - closed, 5s);
        EXPECT_TRUE(log.ended == errc::peer_lost || log.ended == errc::cancelled) << log.ended;
        // The caller is told too.
        try {
            co_await up.finish();
            ADD_FAILURE() << "finish() did not throw";
        } catch (const rpc_error& e) {
            EXPECT_NE(e.code(), std::error_code{});
        }
        co_await srv.async_stop();
    });
}

TEST(TwoWay, EachDirectionKeepsItsOrder) {
    run_test([]() -> net::awaitable<void> {
        server srv(co_await net::this_coro::executor);
        reader_log log;
        auto ch = co_await serve_and_connect(srv, log);
        auto s = co_await stub<store>(ch).scale(3);
        // Writer and reader at once, far more items than either window.
        constexpr int n = 30000;
        std::vector<int> got;
        auto write_all = [&]() -> net::awaitable<void> {
            for (int i = 0; i < n; ++i)
                if (!co_await s.write(i)) co_return;
            s.close();
        };
        auto read_all = [&]() -> net::awaitable<void> {
            while (auto v = co_await s.next()) got.push_back(*v);
        };
        {
            using namespace net::experimental::awaitable_operators;
            co_await (write_all() && read_all());
        }
        ORDO_CO_ASSERT_EQ(got.size(), std::size_t{n});
        for (int i = 0; i < n; ++i)
            if (got[i] != 3 * i) {
                ADD_FAILURE() << "item " << i << " came as " << got[i];
                break;
            }
        EXPECT_TRUE(log.returned);
        EXPECT_EQ(s.written(), std::uint64_t{n});
        EXPECT_EQ(s.received(), std::uint64_t{n});
        co_await srv.async_stop();
    });
}

// The caller writes but does not read: the handler stops at the caller's window of items, and
// then stops reading, so that the caller's writes stop at the handler's window. Neither side
// holds more than its window.
TEST(TwoWay, AReaderThatStopsHoldsBothSides) {
    run_test([]() -> net::awaitable<void> {
        server srv(co_await net::this_coro::executor);
        reader_log log;
        auto ch = co_await serve_and_connect(srv, log);
        call_options o;
        o.window = 16;
        auto s = co_await stub<store>(ch).scale(1, o);
        int wrote = 0;
        auto writes = [&]() -> net::awaitable<void> {
            for (int i = 0; i < 100000; ++i) {
                if (!co_await s.write(i)) co_return;
                ++wrote;
            }
        };
        bool blocked = false;
        {
            using namespace net::experimental::awaitable_operators;
            auto r = co_await (writes() || sleep_quietly(2s));
            blocked = r.index() == 1;
        }
        EXPECT_TRUE(blocked);
        // The handler wrote 16 and waits in the 17th write, having read 17 of the 8192 its
        // window let the caller write (credit comes back after half of them).
        EXPECT_EQ(log.read, 17u);
        EXPECT_EQ(wrote, 8192);
        EXPECT_EQ(s.received(), 16u);
        s.cancel();
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return bool(log.ended); }));
        EXPECT_EQ(log.ended, errc::cancelled);
        co_await srv.async_stop();
    });
}

TEST(TwoWay, AHandlerErrorEndsTheCallersSideAfterItsItems) {
    run_test([]() -> net::awaitable<void> {
        server srv(co_await net::this_coro::executor);
        srv.on(store{}.digest, [](reader<std::vector<std::string>>& in)
                               -> net::awaitable<std::vector<std::uint64_t>> {
        std::vector<std::uint64_t> got;
        while (auto v = co_await in.next()) got.push_back(digest_of(*v));
        co_return got;
    });
    srv.on(store{}.scale, [](reader<int>& in, writer<int>& out, int) -> net::awaitable<void> {
            auto v = co_await in.next();
            co_await out.write(*v);
            throw std::runtime_error("no more scaling today");
        });
        auto ch = co_await async_connect(srv.listen("tcp://127.0.0.1:0"));
        auto s = co_await stub<store>(ch).scale(2);
        EXPECT_TRUE(co_await s.write(7));
        EXPECT_EQ(co_await s.next(), std::optional<int>(7));
        try {
            co_await s.next();
            ADD_FAILURE() << "next() did not throw";
        } catch (const rpc_error& e) {
            EXPECT_EQ(e.code(), errc::remote_error);
            EXPECT_NE(std::string(e.what()).find("no more scaling today"), std::string::npos)
                << e.what();
        }
        EXPECT_FALSE(co_await s.write(8));
        co_await srv.async_stop();
    });
}

TEST(TwoWay, AnItemThatDoesNotConvertFailsTheCall) {
    run_test([]() -> net::awaitable<void> {
        server srv(co_await net::this_coro::executor);
        reader_log log;
        auto ch = co_await serve_and_connect(srv, log);
        // The caller's idea of the method: strings in, where the handler reads ints.
        struct wrong : interface {
            method<two_way<std::string, int>(int)> scale{"scale"};
        };
        auto s = co_await stub<wrong>(ch).scale(2);
        EXPECT_TRUE(co_await s.write("seven"));
        try {
            co_await s.next();
            ADD_FAILURE() << "next() did not throw";
        } catch (const rpc_error& e) {
            EXPECT_EQ(e.code(), errc::bad_arguments);
            EXPECT_NE(std::string(e.what()).find("item 1"), std::string::npos) << e.what();
        }
        co_await srv.async_stop();
    });
}

// Writes `n` items to `s` (0, 1, ...) while reading its echoes, which must be k * i in order;
// calls `each` after every echo read. Returns the echoes read.
net::awaitable<int> echo_through(two_way<int, int>& s, int n, int k, std::function<void(int)> each) {
    int got = 0;
    bool in_order = true;
    auto write_all = [&]() -> net::awaitable<void> {
        for (int i = 0; i < n; ++i)
            if (!co_await s.write(i)) co_return;
        s.close();
    };
    auto read_all = [&]() -> net::awaitable<void> {
        while (auto v = co_await s.next()) {
            in_order = in_order && *v == k * got;
            each(++got);
        }
    };
    using namespace net::experimental::awaitable_operators;
    co_await (write_all() && read_all());
    EXPECT_TRUE(in_order);
    co_return got;
}

// The writer and the reader on threads other than the connection's (each a loop of its own):
// items are handed to the connection's loop in the order written, credit comes back across, and
// both directions keep their order.
TEST(TwoWay, AWriterAndAReaderOnOtherThreads) {
    test::running_loop conn, writer_loop, reader_loop;
    server srv(conn.io.get_executor());
    reader_log log;
    std::string url;
    conn.run([&]() -> net::awaitable<void> {
        serve_store(srv, log);
        url = srv.listen("tcp://127.0.0.1:0");
        co_return;
    });
    auto ch = conn.run([&]() -> net::awaitable<channel> { co_return co_await async_connect(url); });
    auto s = conn.run(
        [&]() -> net::awaitable<two_way<int, int>> { co_return co_await stub<store>(ch).scale(3); });
    constexpr int n = 20000;
    auto wrote = net::co_spawn(
        writer_loop.io,
        [&]() -> net::awaitable<int> {
            int i = 0;
            for (; i < n; ++i)
                if (!co_await s.write(i)) break;
            s.close();
            co_return i;
        },
        net::use_future);
    auto read = net::co_spawn(
        reader_loop.io,
        [&]() -> net::awaitable<int> {
            int got = 0;
            while (auto v = co_await s.next()) {
                if (*v != 3 * got) co_return -1;
                ++got;
            }
            co_return got;
        },
        net::use_future);
    ASSERT_EQ(wrote.wait_for(60s), std::future_status::ready);
    ASSERT_EQ(read.wait_for(60s), std::future_status::ready);
    EXPECT_EQ(wrote.get(), n);
    EXPECT_EQ(read.get(), n);
    conn.run([&]() -> net::awaitable<void> {
        s = {};
        ch = {};
        co_await srv.async_stop();
    });
}

// Items both ways are messages like any other: a resumable session carries a two-way stream
// over cut connections, every item once and in order in each direction.
TEST(TwoWay, SurvivesCutConnectionsOnAResumableSession) {
    run_test([]() -> net::awaitable<void> {
        server srv(co_await net::this_coro::executor);
        reader_log log;
        serve_store(srv, log);
        const auto url = srv.listen("tcp://127.0.0.1:0");
        test::cutting_proxy proxy(
            "127.0.0.1", static_cast<std::uint16_t>(std::stoi(url.substr(url.rfind(':') + 1))));
        auto ch = co_await async_connect(proxy.url() + "?resume_ms=20000");
        call_options o;
        o.window = 64;
        auto s = co_await stub<store>(ch).scale(2, o);
        const int got = co_await echo_through(s, 20'000, 2, [&](int i) {
            if (i % 2'000 == 0) proxy.cut_all();
        });
        EXPECT_EQ(got, 20'000);
        EXPECT_EQ(log.read, 20'000u);  // each once: none lost, none twice
        EXPECT_TRUE(log.returned);
        EXPECT_GE(std::dynamic_pointer_cast<peer>(ch.impl())->counters().resumes, 1u);
        co_await srv.async_stop();
    });
}

// A pool lends a connection for the whole call; a router keeps a keyed call on its key's
// replica.
TEST(TwoWay, WorksOverPoolsAndRouters) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        server a(ex), b(ex);
        reader_log log_a, log_b;
        serve_store(a, log_a);
        serve_store(b, log_b);
        const auto url_a = a.listen("tcp://127.0.0.1:0");
        const auto url_b = b.listen("tcp://127.0.0.1:0");
        auto pooled = co_await async_connect(url_a + "?mode=pooled&max_connections=2");
        {
            auto s = co_await stub<store>(pooled).scale(5);
            EXPECT_EQ(co_await echo_through(s, 3000, 5, [](int) {}), 3000);
            auto up = co_await stub<store>(pooled).put(0);
            EXPECT_TRUE(co_await up.write("abc"));
            EXPECT_EQ(co_await up.finish(), 3u);
        }
        auto routed =
            co_await async_connect("route+tcp://" + url_a.substr(6) + "," + url_b.substr(6));
        const auto before_a = log_a.read, before_b = log_b.read;
        for (int i = 0; i < 4; ++i) {
            auto s = co_await stub<store>(routed).scale(1, key("user-42"));
            EXPECT_EQ(co_await echo_through(s, 500, 1, [](int) {}), 500);
        }
        const auto on_a = log_a.read - before_a, on_b = log_b.read - before_b;
        EXPECT_TRUE((on_a == 2000 && on_b == 0) || (on_a == 0 && on_b == 2000))
            << on_a << " " << on_b;
        co_await a.async_stop();
        co_await b.async_stop();
    });
}

// call_options::max_window_bytes: a stream that waits for credit (a fast handler, a reader that
// keeps up, a window of four items) gets a larger window as it runs, up to the maximum; a reader
// that then stops still holds the handler at the window it has, plus one item.
TEST(Stream, AWindowGrowsToThePathAndStillHoldsAReaderThatStops) {
    run_test([]() -> net::awaitable<void> {
        server srv(co_await net::this_coro::executor);
        std::uint64_t written = 0;
        srv.on("chunks", [&](writer<std::string>& out, int n) -> net::awaitable<void> {
            for (int i = 0; i < n; ++i) {
                co_await out.write(std::string(16 * 1024, 'c'));
                written = out.written();
            }
        });
        auto ch = co_await async_connect(srv.listen("tcp://127.0.0.1:0"));
        // A fixed window stays as it was.
        call_options fixed;
        fixed.window_bytes = 64 * 1024;
        auto f = co_await ch.async_stream<std::string>("chunks", 3000, fixed);
        for (int i = 0; i < 3000; ++i) ORDO_CO_ASSERT_TRUE(co_await f.next());
        EXPECT_EQ(f.window_bytes(), 64u * 1024);
        EXPECT_FALSE(co_await f.next());

        call_options o;
        o.window_bytes = 64 * 1024;
        o.max_window_bytes = 1024 * 1024;
        auto s = co_await ch.async_stream<std::string>("chunks", 1'000'000, o);
        std::uint64_t read = 0;
        // Read until the window has grown (a bounded number of items).
        while (s.window_bytes() <= 64u * 1024 && read < 200'000) {
            ORDO_CO_ASSERT_TRUE(co_await s.next());
            ++read;
        }
        EXPECT_GT(s.window_bytes(), 64u * 1024);
        EXPECT_LE(s.window_bytes(), 1024u * 1024);
        // The reader stops: the handler stops at the window (each item is 16 KiB and a few bytes
        // of head), one more item at most; it grows no more, as the reader is behind.
        co_await sleep_quietly(500ms);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return written == s.received(); }));
        co_await sleep_quietly(300ms);
        const std::uint64_t window = s.window_bytes();
        EXPECT_LE(written - read, window / (16 * 1024) + 1) << window;
        EXPECT_LE(window, 1024u * 1024);
        s.cancel();
        co_await srv.async_stop();
    });
}

// Over a path of 5 ms each way, a client stream's credit grows when the caller asks for it
// (call_options::max_window_bytes): the caller waited for each grant while the handler had read
// everything. A handler that then stops still holds the writer at the grown window and one item;
// without the option the credit stays at 1 MiB.
struct held_upload : interface {
    method<upload<std::string_view, std::uint64_t>()> hold_after{"hold_after"};
};

// hold_after: reads `stop_at` items (counting them in `read`), then no more until cancelled.
void serve_hold_after(server& srv, std::uint64_t& read, std::uint64_t stop_at) {
    srv.on("hold_after",
           [&read, stop_at](reader<std::string_view>& in) -> net::awaitable<std::uint64_t> {
               while (read < stop_at && co_await in.next()) ++read;
               co_await sleep_quietly(60s);  // until cancelled
               co_return read;
           });
}

// Returns once a writer's count `n` has stood still for 300 ms: it has used what was granted.
net::awaitable<void> until_still(const std::uint64_t& n) {
    std::uint64_t seen = ~std::uint64_t{0};
    while (seen != n) {
        seen = n;
        co_await sleep_quietly(300ms);
    }
}

TEST(ClientStream, ItsCreditGrowsOverALongPathAndStillHoldsAReaderThatStops) {
    run_test([]() -> net::awaitable<void> {
        server srv(co_await net::this_coro::executor);
        std::uint64_t read = 0;
        constexpr std::uint64_t stop_at = 400;  // 25 MiB of 64 KiB items, then no more reads
        serve_hold_after(srv, read, stop_at);
        const std::string url = srv.listen("tcp://127.0.0.1:0");
        test::delay_relay relay(static_cast<std::uint16_t>(std::stoi(url.substr(url.rfind(':') + 1))),
                                5ms);
        auto ch = co_await async_connect("tcp://127.0.0.1:" + std::to_string(relay.port()));
        const std::string item(64 * 1024, 'g');
        for (const std::uint64_t grow_to : {std::uint64_t{0}, std::uint64_t{8} << 20}) {
            read = 0;
            call_options o;
            o.max_window_bytes = grow_to;
            auto up = co_await stub<held_upload>(ch).hold_after(o);
            std::uint64_t written = 0;
            auto ex = co_await net::this_coro::executor;
            net::co_spawn(ex, [&]() -> net::awaitable<void> {
                for (int i = 0; i < 100'000; ++i) {
                    if (!co_await up.write(std::string_view(item))) co_return;
                    ++written;
                }
            }, net::detached);
            ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return read == stop_at; }, 60s));
            co_await until_still(written);  // the writer stops
            if (grow_to == 0) {
                EXPECT_LE(written - read, 17u) << "a credit that was not to grow grew";
            } else {
                // Grown past 1 MiB (16 items); how far depends on the machine's speed (8 MiB
                // here, 4 MiB under AddressSanitizer). A writer that never waits does not make it
                // grow (ASteadyWriterThatNeverWaitsDoesNotGrowItsCredit).
                EXPECT_GT(written - read, 17u) << "the credit did not grow";
                EXPECT_LE(written - read, grow_to / item.size() + 1);
            }
            up.cancel();
            co_await sleep_quietly(50ms);
        }
        co_await srv.async_stop();
    });
}

// A writer that never waits for credit (64 KiB every 2 ms, on loopback) does not make it grow,
// though it asks for growth: a handler that then stops holds it at the window of 1 MiB.
TEST(ClientStream, ASteadyWriterThatNeverWaitsDoesNotGrowItsCredit) {
    run_test([]() -> net::awaitable<void> {
        server srv(co_await net::this_coro::executor);
        std::uint64_t read = 0;
        constexpr std::uint64_t stop_at = 150;
        serve_hold_after(srv, read, stop_at);
        auto ch = co_await async_connect(srv.listen("tcp://127.0.0.1:0"));
        call_options o;
        o.max_window_bytes = std::uint64_t{8} << 20;
        auto up = co_await stub<held_upload>(ch).hold_after(o);
        const std::string item(64 * 1024, 's');
        std::uint64_t written = 0;
        net::co_spawn(co_await net::this_coro::executor, [&]() -> net::awaitable<void> {
            for (int i = 0; i < 1000; ++i) {
                if (!co_await up.write(std::string_view(item))) co_return;
                ++written;
                if (written < stop_at) co_await sleep_quietly(2ms);
            }
        }, net::detached);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return read == stop_at; }, 60s));
        co_await until_still(written);
        EXPECT_LE(written - read, 17u) << "a writer that never waited made the credit grow";
        up.cancel();
        co_await sleep_quietly(50ms);
        co_await srv.async_stop();
    });
}

// A plain call of a method that reads, and a writing caller of one that does not, are answered
// bad_arguments saying how to call it.
TEST(TwoWay, CallersOfTheWrongShapeAreToldHow) {
    run_test([]() -> net::awaitable<void> {
        server srv(co_await net::this_coro::executor);
        reader_log log;
        serve_store(srv, log);
        srv.on("inc", [](int x) { return x + 1; });
        auto ch = co_await async_connect(srv.listen("tcp://127.0.0.1:0"));
        try {
            co_await ch.async_call<std::uint64_t>("put", 0);
            ADD_FAILURE() << "a plain call of put was answered";
        } catch (const rpc_error& e) {
            EXPECT_EQ(e.code(), errc::bad_arguments);
            EXPECT_NE(std::string(e.what()).find("reads a stream"), std::string::npos)
                << e.what();
        }
        struct wrong : interface {
            method<upload<int, int>(int)> inc{"inc"};
        };
        auto up = co_await stub<wrong>(ch).inc(1);
        try {
            co_await up.finish();
            ADD_FAILURE() << "an upload to inc was answered";
        } catch (const rpc_error& e) {
            EXPECT_EQ(e.code(), errc::bad_arguments);
            EXPECT_NE(std::string(e.what()).find("reads no items"), std::string::npos)
                << e.what();
        }
        EXPECT_EQ(co_await ch.async_call<int>("inc", 1), 2);
        co_await srv.async_stop();
    });
}

// A caller that ignores the credit (a hand-written msgpack-rpc client on loopback): it writes
// 20,000 items at once where the window is 8192, while the handler has not read yet (which
// would grant more). The handler then reads the window's items, its read fails with
// protocol_error, and what followed was dropped rather than held.
TEST(ClientStream, ACallerBeyondTheCreditFailsTheReadWithProtocolError) {
    run_test([]() -> net::awaitable<void> {
        const auto ex = co_await net::this_coro::executor;
        server srv(ex);
        std::uint64_t read = 0;
        std::string failure;
        bool go = false;
        srv.on("count", [&](reader<int>& in) -> net::awaitable<std::uint64_t> {
            while (!go) co_await sleep_quietly(2ms);
            try {
                while (co_await in.next()) ++read;
            } catch (const std::system_error& e) {
                failure = e.what();
                throw;
            }
            co_return read;
        });
        const std::string url = srv.listen("tcp://127.0.0.1:0");
        net::ip::tcp::socket sock(ex);
        co_await sock.async_connect(
            {net::ip::address_v4::loopback(),
             static_cast<unsigned short>(std::stoi(url.substr(url.rfind(':') + 1)))},
            net::use_awaitable);
        msgpack::sbuffer b;
        msgpack::packer<msgpack::sbuffer> p(b);
        p.pack_array(4);
        p.pack(0);
        p.pack(5);
        p.pack(std::string("ordo.stream"));
        p.pack_array(5);
        p.pack(std::string("count"));
        p.pack_array(0);
        p.pack(1);
        p.pack(0);
        p.pack(true);
        for (int i = 0; i < 20000; ++i) {
            p.pack_array(3);
            p.pack(2);
            p.pack(std::string("ordo.in"));
            p.pack_array(2);
            p.pack(5);
            p.pack(i);
        }
        co_await net::async_write(sock, net::buffer(b.data(), b.size()), net::use_awaitable);
        ORDO_CO_ASSERT_TRUE(
            co_await wait_until([&] { return srv.stats().bytes_received >= b.size(); }));
        go = true;
        // The answer: an error response to msgid 5 (after ordo.in_credit and any others).
        msgpack::unpacker un;
        std::optional<std::string> error;
        const auto deadline = std::chrono::steady_clock::now() + 30s;
        while (!error && std::chrono::steady_clock::now() < deadline) {
            un.reserve_buffer(64 * 1024);
            const std::size_t n = co_await sock.async_read_some(
                net::buffer(un.buffer(), un.buffer_capacity()), net::use_awaitable);
            un.buffer_consumed(n);
            msgpack::object_handle m;
            while (un.next(m)) {
                const auto& a = m.get().via.array;
                if (a.size == 4 && a.ptr[0].as<int>() == 1 && a.ptr[1].as<int>() == 5)
                    error = a.ptr[2].type == msgpack::type::NIL
                                ? std::string("no error")
                                : a.ptr[2].as<std::map<std::string, msgpack::object>>()
                                      .at("message")
                                      .as<std::string>();
            }
        }
        ORDO_CO_ASSERT_TRUE(error.has_value());
        EXPECT_NE(error->find("beyond the credit"), std::string::npos) << *error;
        EXPECT_EQ(read, 8192u);
        EXPECT_NE(failure.find("item 8193"), std::string::npos) << failure;
        co_await srv.async_stop();
    });
}

}  // namespace
}  // namespace ordo
