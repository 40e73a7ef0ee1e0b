// ordo::sync_client: blocking calls from plain threads, against a server on an io_context thread
// of the test's own.
#include "ordo/rpc/sync_client.hpp"

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <asio/ip/tcp.hpp>

#include "ordo/ordo.hpp"
#include "support/numbers.hpp"
#include "support/sleep.hpp"

namespace ordo {
namespace {

using namespace std::chrono_literals;
using test::iota;

// A server on a thread of its own: add, sleep_ms (cancellable), log (notification), logged;
// streams count_to(n), pause_after(n, ms) (n items, a cancellable pause, one more), forever
// (until cancelled), fail_after(n) (n items, then throws) and words (strings).
class server_thread {
  public:
    server_thread() {
        srv_.on("count_to", [](writer<int>& out, int n) -> net::awaitable<void> {
            for (int i = 0; i < n; ++i) co_await out.write(i);
        });
        srv_.on("pause_after", [this](writer<int>& out, int n, int ms) -> net::awaitable<void> {
            try {
                for (int i = 0; i < n; ++i) co_await out.write(i);
                co_await test::sleep_for(std::chrono::milliseconds(ms));
                co_await out.write(n);
            } catch (const std::system_error&) {
                ++streams_cancelled;
                throw;
            }
        });
        srv_.on("forever", [this](writer<int>& out) -> net::awaitable<void> {
            ++streams_started;
            try {
                for (int i = 0;; ++i) {
                    co_await out.write(i);
                    written = out.written();
                }
            } catch (const std::system_error&) {
                ++streams_cancelled;
                throw;
            }
        });
        srv_.on("fail_after", [](writer<int>& out, int n) -> net::awaitable<void> {
            for (int i = 0; i < n; ++i) co_await out.write(i);
            throw std::runtime_error("the well ran dry");
        });
        srv_.on("words", [this](writer<std::string>& out) -> net::awaitable<void> {
            try {
                for (;;) co_await out.write("abc");
            } catch (const std::system_error&) {
                ++streams_cancelled;
                throw;
            }
        });
        // Streams both ways: sum (a client stream), scale(k) (two-way), hold (reads nothing until
        // cancelled), five_is_too_many (throws at the item 5).
        srv_.on("sum", [](reader<long>& in) -> net::awaitable<long> {
            long n = 0;
            while (auto v = co_await in.next()) n += *v;
            co_return n;
        });
        srv_.on("scale", [](reader<long>& in, writer<long>& out, long k) -> net::awaitable<void> {
            while (auto v = co_await in.next()) co_await out.write(*v * k);
        });
        srv_.on("hold", [this](reader<std::string>&) -> net::awaitable<int> {
            try {
                co_await test::sleep_for(60s);
            } catch (const std::system_error&) {
                ++streams_cancelled;
                throw;
            }
            co_return 0;
        });
        srv_.on("five_is_too_many", [](reader<int>& in) -> net::awaitable<int> {
            while (auto v = co_await in.next())
                if (*v == 5) throw std::runtime_error("five is too many");
            co_return 0;
        });
        srv_.on("add", [](int a, int b) { return a + b; });
        srv_.on("word", [] { return std::string("abc"); });
        srv_.on("sleep_ms", [this](int ms) -> net::awaitable<int> {
            ++sleeping;
            co_await test::sleep_counting_cancels(std::chrono::milliseconds(ms), cancelled);
            co_return ms;
        });
        srv_.on("log", [this](std::string s) { logged.push_back(std::move(s)); });
        srv_.on("logged", [this] { return logged; });
        url = srv_.listen("tcp://127.0.0.1:0");
        thread_ = std::thread([this] { io_.run(); });
    }
    ~server_thread() {
        net::co_spawn(io_, srv_.async_stop(), net::use_future).get();
        // A stopped server's io_context keeps some timer for ~2.5 s more: not waited for here.
        io_.stop();
        thread_.join();
    }

    std::string url;
    std::atomic<int> sleeping{0};
    std::atomic<int> cancelled{0};
    std::atomic<int> streams_started{0};
    std::atomic<int> streams_cancelled{0};
    std::atomic<std::uint64_t> written{0};  // by the last `forever`
    std::vector<std::string> logged;        // on the server's thread

  private:
    net::io_context io_;
    net::executor_work_guard<net::io_context::executor_type> work_{io_.get_executor()};
    server srv_{io_.get_executor()};
    std::thread thread_;
};

// Waits for `cond` for at most `limit`: a bounded wait, not a sleep to let things settle.
template <class F>
bool wait_for(F cond, std::chrono::milliseconds limit = 10s) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (!cond() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(2ms);
    return cond();
}

TEST(SyncClient, CallsBlockForTypedResultsAndNotificationsKeepTheirPlace) {
    server_thread s;
    sync_client c(s.url);
    EXPECT_EQ(c.call<int>("add", 2, 3), 5);
    EXPECT_EQ(c.call("add", 40, 2).get().as<int>(), 42);  // untyped: the raw value
    c.notify("log", "one");
    c.notify("log", "two");
    // Sent after the notifications on the same ordered connection: it sees both.
    EXPECT_EQ(c.call<std::vector<std::string>>("logged"), (std::vector<std::string>{"one", "two"}));
    c.call<void>("add", 1, 1);
    EXPECT_EQ(c.remote_address().substr(0, 16), "tcp://127.0.0.1:");
}

TEST(SyncClient, FailuresAreRpcErrorsAndTheClientGoesOn) {
    server_thread s;
    sync_client c(s.url);
    try {
        c.call<int>("nope", 1);
        ADD_FAILURE() << "no error";
    } catch (const rpc_error& e) {
        EXPECT_EQ(e.code(), errc::method_not_found) << e.what();
        EXPECT_EQ(e.method(), "nope");
    }
    try {
        c.call<int>("word");
        ADD_FAILURE() << "no error";
    } catch (const rpc_error& e) {
        EXPECT_EQ(e.code(), errc::bad_result) << e.what();
        EXPECT_EQ(e.method(), "word");
        EXPECT_NE(std::string(e.what()).find("expected int, got str"), std::string::npos)
            << e.what();
    }
    EXPECT_EQ(c.call<int>("add", 1, 2), 3);
}

TEST(SyncClient, ARefusedConnectionThrowsFromTheConstructor) {
    try {
        sync_client c("tcp://127.0.0.1:1");
        ADD_FAILURE() << "connected";
    } catch (const rpc_error& e) {
        EXPECT_EQ(e.code(), errc::peer_lost) << e.what();
        EXPECT_NE(std::string(e.what()).find("connect to tcp://127.0.0.1:1"), std::string::npos)
            << e.what();
    }
    EXPECT_THROW(sync_client("tcp://127.0.0.1:1?colour=blue"), rpc_error);
}

TEST(SyncClient, ACallPastItsTimeoutFailsWithTimedOutAndItsHandlerIsCancelled) {
    server_thread s;
    sync_client c(s.url);
    const auto t0 = std::chrono::steady_clock::now();
    try {
        c.call<int>("sleep_ms", 30'000, timeout(50ms));
        ADD_FAILURE() << "no timeout";
    } catch (const rpc_error& e) {
        EXPECT_EQ(e.code(), errc::timed_out) << e.what();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
    EXPECT_TRUE(wait_for([&] { return s.cancelled == 1; }));
    EXPECT_EQ(c.call<int>("add", 1, 2), 3);
}

TEST(SyncClient, SeveralThreadsCallAtOnce) {
    server_thread s;
    sync_client c(s.url);
    constexpr int threads = 8, calls = 300;
    std::atomic<int> wrong{0};
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t)
        ts.emplace_back([&, t] {
            for (int i = 0; i < calls; ++i)
                if (c.call<int>("add", t * 1000, i) != t * 1000 + i) ++wrong;
        });
    for (auto& t : ts) t.join();
    EXPECT_EQ(wrong, 0);
}

TEST(SyncClient, DestroyingTheClientFailsAPendingCallWithClosedInsteadOfHanging) {
    server_thread s;
    auto c = std::make_unique<sync_client>(s.url);
    auto pending = std::async(std::launch::async, [&]() -> std::error_code {
        try {
            c->call<int>("sleep_ms", 30'000);
            return {};
        } catch (const rpc_error& e) {
            return e.code();
        }
    });
    ASSERT_TRUE(wait_for([&] { return s.sleeping == 1; }));
    const auto t0 = std::chrono::steady_clock::now();
    c.reset();
    ASSERT_EQ(pending.wait_for(10s), std::future_status::ready);
    EXPECT_EQ(pending.get(), errc::closed);
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
}

// A TCP listener on loopback that takes one connection and neither reads, answers nor closes it
// until destroyed: a remote side that has stopped.
class mute_server {
  public:
    mute_server() {
        url = "tcp://127.0.0.1:" + std::to_string(acceptor_.local_endpoint().port());
        acceptor_.async_accept(socket_, [](std::error_code) {});
        thread_ = std::thread([this] { io_.run(); });  // until the accept is done
    }
    ~mute_server() { thread_.join(); }

    std::string url;

  private:
    net::io_context io_;
    net::ip::tcp::acceptor acceptor_{io_, {net::ip::address_v4::loopback(), 0}};
    net::ip::tcp::socket socket_{io_};
    std::thread thread_;
};

// Everything a sync stream yields, and how it ended (code empty: normally).
struct sync_outcome {
    std::vector<int> items;
    std::error_code code;
    std::string what;
};

sync_outcome read_to_end(sync_stream<int>& s) {
    sync_outcome r;
    try {
        while (auto v = s.next(30s)) r.items.push_back(*v);
    } catch (const rpc_error& e) {
        r.code = e.code();
        r.what = e.what();
    }
    return r;
}

bool contains(const std::string& s, const std::string& part) {
    return s.find(part) != std::string::npos;
}

TEST(SyncClient, StreamItemsArriveInOrderThenTheEnd) {
    server_thread s;
    sync_client c(s.url);
    // A window of 16 for 5000 items: the reader's credit goes back and forth many times.
    call_options o;
    o.window = 16;
    auto st = c.stream<int>("count_to", 5000, o);
    const auto r = read_to_end(st);
    EXPECT_FALSE(r.code) << r.what;
    EXPECT_EQ(r.items, iota(5000));
    EXPECT_EQ(st.received(), 5000u);
    EXPECT_EQ(st.method(), "count_to");
    EXPECT_EQ(st.remote_address(), c.remote_address());
    EXPECT_FALSE(st.next(1s));  // the end stays the end

    // The blocking iterator, an empty stream, and the untyped form with raw values.
    std::vector<int> got;
    for (int v : c.stream<int>("count_to", 300)) got.push_back(v);
    EXPECT_EQ(got, iota(300));
    auto empty = c.stream<int>("count_to", 0);
    EXPECT_FALSE(empty.next(30s));
    auto raw = c.stream("count_to", 3);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(raw.next(30s)->get().as<int>(), i);
    EXPECT_FALSE(raw.next(30s));
    // Calls and streams share the client.
    EXPECT_EQ(c.call<int>("add", 1, 2), 3);
}

TEST(SyncClient, ANextPastItsWaitThrowsTimedOutAndTheStreamGoesOn) {
    server_thread s;
    sync_client c(s.url);
    auto st = c.stream<int>("pause_after", 2, 1500);
    EXPECT_EQ(st.next(30s), 0);
    EXPECT_EQ(st.next(30s), 1);
    const auto t0 = std::chrono::steady_clock::now();
    try {
        st.next(100ms);
        ADD_FAILURE() << "no timeout";
    } catch (const rpc_error& e) {
        EXPECT_EQ(e.code(), errc::timed_out) << e.what();
        EXPECT_EQ(e.method(), "pause_after");
        EXPECT_EQ(e.peer(), c.remote_address());
        EXPECT_TRUE(contains(e.what(), "no stream item came within 100 ms (2 read so far"))
            << e.what();
    }
    EXPECT_GE(std::chrono::steady_clock::now() - t0, 100ms);
    // Nothing was taken: the item after the pause, then the end.
    EXPECT_EQ(st.next(30s), 2);
    EXPECT_FALSE(st.next(30s));
    EXPECT_EQ(s.streams_cancelled, 0);
}

TEST(SyncClient, AStreamPastItsDeadlineFailsWithTimedOutAndItsHandlerIsCancelled) {
    server_thread s;
    sync_client c(s.url);
    auto st = c.stream<int>("pause_after", 3, 30'000, timeout(3s));
    const auto t0 = std::chrono::steady_clock::now();
    const auto r = read_to_end(st);
    EXPECT_EQ(r.items, iota(3));
    EXPECT_EQ(r.code, errc::timed_out) << r.what;
    EXPECT_TRUE(contains(r.what, "pause_after")) << r.what;
    EXPECT_TRUE(contains(r.what, c.remote_address())) << r.what;
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 20s);
    EXPECT_TRUE(wait_for([&] { return s.streams_cancelled == 1; }));
}

TEST(SyncClient, DestroyingAStreamMidwayEndsTheServersWriter) {
    server_thread s;
    sync_client c(s.url);
    {
        call_options o;
        o.window = 8;
        auto st = c.stream<int>("forever", o);
        for (int i = 0; i < 100; ++i) ASSERT_EQ(st.next(30s), i);
        // The writer waits for credit now, at most 8 items ahead of the reader.
        ASSERT_TRUE(wait_for([&] { return s.written >= 100; }));
        EXPECT_LE(s.written, 108u);
    }
    // ordo.cancel reached the handler: its write threw and it ended.
    EXPECT_TRUE(wait_for([&] { return s.streams_cancelled == 1; }));
    EXPECT_EQ(s.streams_started, 1);
    // The client goes on: a call, and a stream that reads to its end.
    EXPECT_EQ(c.call<int>("add", 2, 2), 4);
    auto st = c.stream<int>("count_to", 10);
    EXPECT_EQ(read_to_end(st).items, iota(10));
}

TEST(SyncClient, AHandlersErrorReachesTheReaderAfterTheItemsBeforeIt) {
    server_thread s;
    sync_client c(s.url);
    auto st = c.stream<int>("fail_after", 3);
    const auto r = read_to_end(st);
    EXPECT_EQ(r.items, iota(3));
    EXPECT_EQ(r.code, errc::remote_error) << r.what;
    EXPECT_TRUE(contains(r.what, "the well ran dry")) << r.what;
    EXPECT_TRUE(contains(r.what, "fail_after")) << r.what;
    EXPECT_TRUE(contains(r.what, c.remote_address())) << r.what;

    auto missing = c.stream<int>("nope");
    const auto m = read_to_end(missing);
    EXPECT_TRUE(m.items.empty());
    EXPECT_EQ(m.code, errc::method_not_found) << m.what;
}

TEST(SyncClient, AnItemThatDoesNotConvertFailsTheStreamAndCancelsIt) {
    server_thread s;
    sync_client c(s.url);
    auto st = c.stream<int>("words");
    for (int round = 0; round < 2; ++round) {
        try {
            st.next(30s);
            ADD_FAILURE() << "converted";
        } catch (const rpc_error& e) {
            EXPECT_EQ(e.code(), errc::bad_result) << e.what();
            EXPECT_EQ(e.method(), "words");
            EXPECT_TRUE(contains(e.what(), "item 1 does not convert")) << e.what();
        }
    }
    EXPECT_TRUE(wait_for([&] { return s.streams_cancelled == 1; }));
}

TEST(SyncClient, DestroyingTheClientEndsABlockedReaderWithClosed) {
    server_thread s;
    auto c = std::make_unique<sync_client>(s.url);
    auto st = c->stream<int>("pause_after", 1, 30'000);
    ASSERT_EQ(st.next(30s), 0);
    auto pending = std::async(std::launch::async, [&]() -> std::string {
        try {
            // Bounded, so that a reader left blocked fails the test instead of hanging it.
            st.next(20s);
            return "no error";
        } catch (const rpc_error& e) {
            return e.code() == errc::closed ? std::string() : e.what();
        }
    });
    // The reader is blocked (the handler pauses for 30 s); the client goes away.
    EXPECT_EQ(pending.wait_for(200ms), std::future_status::timeout);
    const auto t0 = std::chrono::steady_clock::now();
    c.reset();
    ASSERT_EQ(pending.wait_for(10s), std::future_status::ready);
    EXPECT_EQ(pending.get(), "");
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
    // The connection closed: the server cancelled the handler. The stream outlives its client.
    EXPECT_TRUE(wait_for([&] { return s.streams_cancelled == 1; }));
    EXPECT_THROW(st.next(1s), rpc_error);
    st.cancel();
}

// A server that has stopped (it neither reads nor answers the resumable session's handshake):
// the destructor still wakes the reader, with closed.
TEST(SyncClient, DestroyingTheClientEndsAReaderWhenTheServerHasStopped) {
    mute_server m;
    auto c = std::make_unique<sync_client>(m.url + "?resume_ms=5000");
    auto st = c->stream<int>("count_to", 3);
    auto pending = std::async(std::launch::async, [&]() -> std::string {
        try {
            st.next(20s);  // bounded: a reader left blocked fails the test
            return "no error";
        } catch (const rpc_error& e) {
            return e.code() == errc::closed ? std::string() : e.what();
        }
    });
    EXPECT_EQ(pending.wait_for(200ms), std::future_status::timeout);
    c.reset();  // gives up on the server after 2 s
    ASSERT_EQ(pending.wait_for(15s), std::future_status::ready);
    EXPECT_EQ(pending.get(), "");
    st.cancel();  // ended: nothing left to do (the client's io_context is gone)
}

// ---- streams both ways ----

TEST(SyncClient, AnUploadAndATwoWayStreamKeepTheirOrder) {
    server_thread s;
    sync_client c(s.url);
    auto up = c.upload<long, long>("sum");
    for (long i = 0; i < 20'000; ++i) ASSERT_TRUE(up.write(i));
    EXPECT_EQ(up.finish(), 20'000L * 19'999 / 2);
    EXPECT_EQ(up.written(), 20'000u);
    // Two-way: the writer on a thread of its own, the reader here.
    auto tw = c.two_way<long, long>("scale", 3L);
    std::thread writer([&] {
        for (long i = 0; i < 30'000; ++i)
            if (!tw.write(i)) return;
        tw.close();
    });
    long expect = 0;
    for (long v : tw) {
        ASSERT_EQ(v, 3 * expect);
        ++expect;
    }
    writer.join();
    EXPECT_EQ(expect, 30'000);
}

TEST(SyncClient, AHandlerThatDoesNotReadBlocksTheWriterUntilItsCallEnds) {
    server_thread s;
    sync_client c(s.url);
    auto up = c.upload<std::string, int>("hold");
    const std::string item(64 * 1024, 'x');
    std::atomic<int> done{0};
    auto writes = std::async(std::launch::async, [&] {
        int ok = 0;
        for (int i = 0; i < 1000; ++i) {
            if (!up.write(item)) break;
            ++ok;
        }
        done = 1;
        return ok;
    });
    // The first grant is 1 MiB: 16 items of 64 KiB and one more, then the writer blocks.
    ASSERT_TRUE(wait_for([&] { return up.written() >= 16; }));
    std::this_thread::sleep_for(300ms);
    EXPECT_EQ(done.load(), 0);
    EXPECT_LE(up.written(), 17u);
    up.cancel();  // the call ends: the blocked write returns false
    ASSERT_EQ(writes.wait_for(10s), std::future_status::ready);
    EXPECT_LE(writes.get(), 17);
    EXPECT_TRUE(wait_for([&] { return s.streams_cancelled == 1; }));
    try {
        up.finish();
        ADD_FAILURE() << "finish() of a cancelled upload returned";
    } catch (const rpc_error& e) {
        EXPECT_EQ(e.code(), errc::cancelled) << e.what();
    }
}

TEST(SyncClient, AHandlersErrorEndsTheWritesAndFinishThrowsIt) {
    server_thread s;
    sync_client c(s.url);
    auto up = c.upload<int, int>("five_is_too_many");
    int i = 0;
    while (i < 100'000 && up.write(i)) ++i;
    EXPECT_LT(i, 100'000);  // the handler's error ended the call: write() said so
    try {
        up.finish();
        ADD_FAILURE() << "finish() returned";
    } catch (const rpc_error& e) {
        EXPECT_EQ(e.code(), errc::remote_error);
        EXPECT_NE(std::string(e.what()).find("five_is_too_many"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("five is too many"), std::string::npos) << e.what();
    }
}

TEST(SyncClient, DestroyingTheClientEndsABlockedWriterWithClosed) {
    server_thread s;
    auto c = std::make_unique<sync_client>(s.url);
    auto up = c->upload<std::string, int>("hold");
    const std::string item(64 * 1024, 'x');
    auto writes = std::async(std::launch::async, [&] {
        for (int i = 0; i < 1000; ++i)
            if (!up.write(item)) return i;
        return 1000;
    });
    ASSERT_TRUE(wait_for([&] { return up.written() >= 16; }));
    EXPECT_EQ(writes.wait_for(200ms), std::future_status::timeout);
    c.reset();
    ASSERT_EQ(writes.wait_for(10s), std::future_status::ready);
    EXPECT_LT(writes.get(), 1000);
    try {
        up.finish();
        ADD_FAILURE() << "finish() returned";
    } catch (const rpc_error& e) {
        EXPECT_EQ(e.code(), errc::closed) << e.what();
    }
}

}  // namespace
}  // namespace ordo
