// Server-side batch handlers: single calls in, one vectorized handler call per batch.
#include "ordo/ordo.hpp"

#include <numeric>

#include <gtest/gtest.h>

#include "support/run_test.hpp"

namespace ordo {
namespace {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;
using test::run_test;
using test::wait_until;

// The handler's own record of what it was given.
struct record {
    std::vector<std::vector<int>> batches;
    std::vector<int> all() const {
        std::vector<int> v;
        for (const auto& b : batches) v.insert(v.end(), b.begin(), b.end());
        return v;
    }
};

struct calls_log {
    int ok = 0, failed = 0;
    std::vector<std::error_code> errors;
    std::map<int, int> results;
    auto recorder(int arg) {
        return [this, arg](std::error_code ec, int v) {
            if (ec) {
                ++failed;
                errors.push_back(ec);
            } else {
                ++ok;
                results[arg] = v;
            }
        };
    }
};

TEST(Batch, ABurstIsCutIntoBatchesNoLargerThanMaxBatchSizeAndResultsReachTheirCallers) {
    run_test([]() -> net::awaitable<void> {
        server srv(co_await net::this_coro::executor);
        record rec;
        auto h = srv.on_batch("square", {.max_batch_size = 32, .max_wait = 20ms},
                              [&](std::vector<int> xs) {
                                  rec.batches.push_back(xs);
                                  for (auto& x : xs) x *= x;
                                  return xs;
                              });
        const auto url = srv.listen("tcp://127.0.0.1:0");
        auto a = co_await async_connect(url);
        auto b = co_await async_connect(url);
        calls_log log;
        for (int i = 0; i < 200; ++i) (i % 2 ? a : b).async_call<int>("square", i, log.recorder(i));
        EXPECT_TRUE(co_await wait_until([&] { return log.ok + log.failed == 200; }));
        EXPECT_EQ(log.ok, 200);
        for (int i = 0; i < 200; ++i) EXPECT_EQ(log.results[i], i * i);
        std::size_t biggest = 0;
        for (const auto& batch : rec.batches) biggest = std::max(biggest, batch.size());
        EXPECT_LE(biggest, 32u);
        EXPECT_EQ(biggest, 32u) << "a burst of 200 never filled a batch";
        EXPECT_LT(rec.batches.size(), 50u);
        EXPECT_EQ(h.stats().calls, 200u);
        co_await srv.async_stop();
    });
}

TEST(Batch, ATrickleRunsEachCallAloneAfterMaxWait) {
    run_test([]() -> net::awaitable<void> {
        server srv(co_await net::this_coro::executor);
        record rec;
        srv.on_batch("square", {.max_batch_size = 32, .max_wait = 50ms}, [&](std::vector<int> xs) {
            rec.batches.push_back(xs);
            for (auto& x : xs) x *= x;
            return xs;
        });
        auto ch = co_await async_connect(srv.listen("tcp://127.0.0.1:0"));
        for (int i = 0; i < 10; ++i) {
            const auto t0 = clock_type::now();
            EXPECT_EQ(co_await ch.async_call<int>("square", i), i * i);
            const auto took = clock_type::now() - t0;
            EXPECT_GE(took, 50ms) << "ran before max_wait with a batch that was not full";
            EXPECT_LT(took, 50ms + 5s);
        }
        ORDO_CO_ASSERT_EQ(rec.batches.size(), 10u);
        for (const auto& batch : rec.batches) EXPECT_EQ(batch.size(), 1u);
        co_await srv.async_stop();
    });
}

TEST(Batch, LimitsChangeAtRunTime) {
    run_test([]() -> net::awaitable<void> {
        server srv(co_await net::this_coro::executor);
        record rec;
        auto h =
            srv.on_batch("id", {.max_batch_size = 100, .max_wait = 10s}, [&](std::vector<int> xs) {
                rec.batches.push_back(xs);
                return xs;
            });
        auto ch = co_await async_connect(srv.listen("tcp://127.0.0.1:0"));
        calls_log log;
        for (int i = 0; i < 10; ++i) ch.async_call<int>("id", i, log.recorder(i));
        EXPECT_TRUE(co_await wait_until([&] { return h.stats().queued == 10; }));
        h.set_max_batch_size(4);  // two batches of 4 run now; 2 calls wait
        EXPECT_TRUE(co_await wait_until([&] { return log.ok == 8; }));
        h.set_max_wait(1ms);  // and now the rest
        EXPECT_TRUE(co_await wait_until([&] { return log.ok == 10; }));
        ORDO_CO_ASSERT_EQ(rec.batches.size(), 3u);
        EXPECT_EQ(rec.batches[0].size(), 4u);
        EXPECT_EQ(rec.batches[2].size(), 2u);
        co_await srv.async_stop();
    });
}

TEST(Batch, CallsFromOnePeerKeepTheirOrderInsideAndAcrossBatches) {
    run_test([]() -> net::awaitable<void> {
        server srv(co_await net::this_coro::executor);
        record rec;
        srv.on_batch("id", {.max_batch_size = 7, .max_wait = 1ms},
                     [&](std::vector<int> xs) -> net::awaitable<std::vector<int>> {
                         rec.batches.push_back(xs);
                         net::steady_timer t(co_await net::this_coro::executor, 1ms);
                         co_await t.async_wait(net::use_awaitable);
                         co_return xs;
                     });
        auto ch = co_await async_connect(srv.listen("tcp://127.0.0.1:0"));
        calls_log log;
        for (int i = 0; i < 500; ++i) ch.async_call<int>("id", i, log.recorder(i));
        EXPECT_TRUE(co_await wait_until([&] { return log.ok == 500; }));
        auto seen = rec.all();
        std::vector<int> expected(500);
        std::iota(expected.begin(), expected.end(), 0);
        EXPECT_EQ(seen, expected);
        co_await srv.async_stop();
    });
}

TEST(Batch, PerElementErrorsFailOnlyTheirCallsAndWholeBatchErrorsFailThemAll) {
    run_test([]() -> net::awaitable<void> {
        server srv(co_await net::this_coro::executor);
        srv.on_batch("sqrt", {.max_batch_size = 8, .max_wait = 5ms}, [](std::vector<int> xs) {
            std::vector<element<int>> out;
            for (int x : xs) {
                if (x < 0)
                    out.push_back(
                        element_error{errc::bad_arguments, "negative: " + std::to_string(x)});
                else
                    out.push_back(x / 2);
            }
            return out;
        });
        srv.on_batch("explode", {.max_batch_size = 8, .max_wait = 5ms},
                     [](std::vector<int>) -> std::vector<int> {
                         throw std::runtime_error("gpu fell over");
                     });
        srv.on_batch("short", {.max_batch_size = 8, .max_wait = 5ms}, [](std::vector<int> xs) {
            xs.pop_back();
            return xs;
        });
        auto ch = co_await async_connect(srv.listen("tcp://127.0.0.1:0"));
        EXPECT_EQ(co_await ch.async_call<int>("sqrt", 8), 4);
        calls_log log;
        for (int i : {4, -1, 6, -3}) ch.async_call<int>("sqrt", i, log.recorder(i));
        EXPECT_TRUE(co_await wait_until([&] { return log.ok + log.failed == 4; }));
        EXPECT_EQ(log.ok, 2);
        EXPECT_EQ(log.failed, 2);
        for (auto ec : log.errors) EXPECT_EQ(ec, errc::bad_arguments);
        try {
            co_await ch.async_call<int>("sqrt", -5);
            ADD_FAILURE() << "no error";
        } catch (const rpc_error& e) {
            EXPECT_EQ(e.detail(), "negative: -5");
        }
        for (const char* m : {"explode", "short"}) {
            calls_log all;
            for (int i = 0; i < 3; ++i) ch.async_call<int>(m, i, all.recorder(i));
            EXPECT_TRUE(co_await wait_until([&] { return all.failed == 3; }));
            EXPECT_EQ(all.ok, 0);
        }
        try {
            co_await ch.async_call<int>("short", 1);
            ADD_FAILURE() << "no error";
        } catch (const rpc_error& e) {
            EXPECT_NE(e.detail().find("short"), std::string::npos) << e.what();
            EXPECT_NE(e.detail().find("returned 0 results for 1 calls"), std::string::npos)
                << e.what();
        }
        try {
            co_await ch.async_call<int>("explode", 1);
            ADD_FAILURE() << "no error";
        } catch (const rpc_error& e) {
            EXPECT_NE(e.detail().find("gpu fell over"), std::string::npos) << e.what();
            EXPECT_NE(e.detail().find("batch of 1"), std::string::npos) << e.what();
        }
        co_await srv.async_stop();
    });
}

TEST(Batch, ACancelledCallLeavesABatchNotYetStartedAndOneInARunningBatchIsDropped) {
    run_test([]() -> net::awaitable<void> {
        server srv(co_await net::this_coro::executor);
        record rec;
        auto h = srv.on_batch("slow", {.max_batch_size = 4, .max_wait = 10s},
                              [&](std::vector<int> xs) -> net::awaitable<std::vector<int>> {
                                  rec.batches.push_back(xs);
                                  net::steady_timer t(co_await net::this_coro::executor, 300ms);
                                  co_await t.async_wait(use_tuple);
                                  co_return xs;
                              });
        auto ch = co_await async_connect(srv.listen("tcp://127.0.0.1:0"));
        // Before: the call's deadline passes while its batch waits to fill.
        auto [ec, v] = co_await ch.async_call<int>("slow", 99, timeout(50ms),
                                                   net::experimental::as_tuple(net::use_awaitable));
        EXPECT_EQ(ec, errc::timed_out);
        EXPECT_TRUE(co_await wait_until([&] { return h.stats().queued == 0; }));
        // During: a batch of four starts; one of its callers gives up meanwhile.
        calls_log log;
        ch.async_call<int>("slow", 1, timeout(100ms), log.recorder(1));
        for (int i = 2; i <= 4; ++i) ch.async_call<int>("slow", i, log.recorder(i));
        EXPECT_TRUE(co_await wait_until([&] { return log.ok + log.failed == 4; }));
        EXPECT_EQ(log.ok, 3);
        ORDO_CO_ASSERT_EQ(log.errors.size(), 1u);
        EXPECT_EQ(log.errors[0], errc::timed_out);
        ORDO_CO_ASSERT_EQ(rec.batches.size(), 1u);
        EXPECT_EQ(rec.batches[0], (std::vector<int>{1, 2, 3, 4}));  // 99 never ran
        co_await srv.async_stop();
    });
}

TEST(Batch, ADeadPeersQueuedCallsAreRemoved) {
    run_test([]() -> net::awaitable<void> {
        server srv(co_await net::this_coro::executor);
        record rec;
        auto h =
            srv.on_batch("id", {.max_batch_size = 3, .max_wait = 10s}, [&](std::vector<int> xs) {
                rec.batches.push_back(xs);
                return xs;
            });
        const auto url = srv.listen("tcp://127.0.0.1:0");
        {
            auto doomed = co_await async_connect(url);
            for (int i = 100; i < 102; ++i)
                doomed.async_call<int>("id", i, [](std::error_code, int) {});
            EXPECT_TRUE(co_await wait_until([&] { return h.stats().queued == 2; }));
            static_cast<peer&>(*doomed.impl()).abort();
        }
        EXPECT_TRUE(co_await wait_until([&] { return h.stats().queued == 0; }));
        auto ch = co_await async_connect(url);
        calls_log log;
        for (int i = 0; i < 3; ++i) ch.async_call<int>("id", i, log.recorder(i));
        EXPECT_TRUE(co_await wait_until([&] { return log.ok == 3; }));
        ORDO_CO_ASSERT_EQ(rec.batches.size(), 1u);
        EXPECT_EQ(rec.batches[0], (std::vector<int>{0, 1, 2}));
        co_await srv.async_stop();
    });
}

TEST(Batch, StoppingTheServerFailsQueuedCallsWithShuttingDown) {
    run_test([]() -> net::awaitable<void> {
        server srv(co_await net::this_coro::executor);
        int ran = 0;
        auto h =
            srv.on_batch("id", {.max_batch_size = 100, .max_wait = 10s}, [&](std::vector<int> xs) {
                ++ran;
                return xs;
            });
        auto ch = co_await async_connect(srv.listen("tcp://127.0.0.1:0"));
        calls_log log;
        for (int i = 0; i < 5; ++i) ch.async_call<int>("id", i, log.recorder(i));
        EXPECT_TRUE(co_await wait_until([&] { return h.stats().queued == 5; }));
        co_await srv.async_stop();
        EXPECT_TRUE(co_await wait_until([&] { return log.failed == 5; }));
        for (auto ec : log.errors) EXPECT_EQ(ec, errc::shutting_down);
        EXPECT_EQ(ran, 0);
    });
}

TEST(Batch, AHandlerThrowingANonStandardExceptionFailsItsCallsAndFreesItsSlot) {
    run_test([]() -> net::awaitable<void> {
        server srv(co_await net::this_coro::executor);
        bool fail = true;
        srv.on_batch("id", {.max_batch_size = 1, .max_wait = 1ms}, [&](std::vector<int> xs) {
            if (fail) throw 42;
            return xs;
        });
        auto ch = co_await async_connect(srv.listen("tcp://127.0.0.1:0"));
        auto [ec, v] = co_await ch.async_call<int>("id", 1, use_tuple);
        EXPECT_EQ(ec, errc::remote_error);
        fail = false;
        EXPECT_EQ(co_await ch.async_call<int>("id", 2), 2);  // the one concurrent batch is free
        co_await srv.async_stop();
    });
}

}  // namespace
}  // namespace ordo
