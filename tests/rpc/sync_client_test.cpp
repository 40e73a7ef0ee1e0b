// ordo::sync_client: blocking calls from plain threads, against a server on an io_context thread
// of the test's own.
#include "ordo/sync_client.hpp"

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "ordo/ordo.hpp"
#include "support/sleep.hpp"

namespace ordo {
namespace {

using namespace std::chrono_literals;

// A server on a thread of its own: add, sleep_ms (cancellable), log (notification), logged.
class server_thread {
  public:
    server_thread() {
        srv_.on("add", [](int a, int b) { return a + b; });
        srv_.on("word", [] { return std::string("abc"); });
        srv_.on("sleep_ms", [this](int ms) -> net::awaitable<int> {
            ++sleeping;
            try {
                co_await test::sleep_for(std::chrono::milliseconds(ms));
            } catch (const std::system_error&) {
                ++cancelled;
                throw;
            }
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
    std::vector<std::string> logged;  // on the server's thread

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

}  // namespace
}  // namespace ordo
