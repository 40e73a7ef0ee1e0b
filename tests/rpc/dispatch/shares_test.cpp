// A server's concurrency limit shared among its callers (server_options::shares,
// ordo/rpc/concurrency.hpp; docs/protocol.md "Overload"), over loopback: callers are told apart
// by their tokens, and the test lets the handlers end one at a time, so that who gets each slot
// that frees is seen in order.
#include "ordo/ordo.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "support/run_test.hpp"
#include "support/tokens.hpp"

namespace ordo {
namespace {

using namespace std::chrono_literals;
using test::alice_token;
using test::as;
using test::bob_token;
using test::run_test;
using test::wait_until;

// Handlers that hold their calls until the test lets the oldest one end.
struct turns {
    explicit turns(net::any_io_executor ex) : ex(std::move(ex)) {}
    net::any_io_executor ex;
    std::vector<std::string> started;  // who each handler ran for, in the order they started
    std::deque<std::shared_ptr<net::steady_timer>> running;
    net::awaitable<void> hold(const std::string& who) {
        started.push_back(who);
        auto t = std::make_shared<net::steady_timer>(ex, std::chrono::steady_clock::time_point::max());
        running.push_back(t);
        co_await t->async_wait(use_tuple);
    }
    void end_oldest() {
        running.front()->cancel();
        running.pop_front();
    }
    void end_all() {
        while (!running.empty()) end_oldest();
    }
};

// A server with a fixed limit shared among alice and bob, serving hold(who).
struct shared_server {
    shared_server(net::any_io_executor ex, std::size_t limit, caller_shares shares)
        : srv(ex, options(limit, std::move(shares))), t(ex) {
        handler_options concurrent;
        concurrent.concurrent = true;
        srv.on(
            "hold",
            [this](std::string who) -> net::awaitable<std::string> {
                co_await t.hold(who);
                co_return who;
            },
            concurrent);
        srv.on("count", [](writer<int>& out, int n) -> net::awaitable<void> {
            for (int i = 0; i < n; ++i) co_await out.write(i);
        });
        url = srv.listen("tcp://127.0.0.1:0");
    }
    static server_options options(std::size_t limit, caller_shares shares) {
        server_options o;
        o.concurrency = limit;
        o.shares = std::move(shares);
        o.authenticate = authenticate_tokens({{alice_token, "alice"}, {bob_token, "bob"}});
        return o;
    }
    // Lets every handler end as it starts, until `done` holds (within 30 s).
    net::awaitable<bool> end_all_until(std::function<bool()> done) {
        co_return co_await wait_until([this, done] {
            t.end_all();
            return done();
        });
    }
    // The caller's figures (a default one if it is not listed).
    caller_stats of(const std::string& who) {
        for (const auto& c : srv.stats().concurrency.callers)
            if (c.caller == who) return c;
        return {};
    }
    server srv;
    turns t;
    std::string url;
};

// Calls hold(who) n times on `ch`; the outcomes go to `done` as "who" or the error's code.
struct outcomes {
    std::vector<std::string> ok;
    std::vector<std::pair<std::error_code, std::string>> failed;
    std::size_t size() const { return ok.size() + failed.size(); }
};
void call_hold(channel& ch, const std::string& who, int n, outcomes& done,
               call_options o = {}) {
    for (int i = 0; i < n; ++i)
        ch.async_call<std::string>("hold", who, o, [&done](std::error_code ec, std::string v) {
            if (ec)
                done.failed.emplace_back(ec, "");
            else
                done.ok.push_back(std::move(v));
        });
}

// The slot that frees goes to the caller with fewer calls running, not to the call that has
// waited longest: bob's one call runs before alice's four earlier ones.
TEST(Shares, AFreedSlotGoesToTheCallerWithFewerRunning) {
    run_test([]() -> net::awaitable<void> {
        shared_server s(co_await net::this_coro::executor, 2, {.queue = 8});
        auto alice = co_await async_connect(s.url, as(alice_token));
        auto bob = co_await async_connect(s.url, as(bob_token));
        outcomes a, b;
        call_hold(alice, "alice", 6, a);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return s.of("alice").waiting == 4; }));
        EXPECT_EQ(s.t.started.size(), 2u);
        call_hold(bob, "bob", 1, b);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return s.of("bob").waiting == 1; }));
        s.t.end_oldest();
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return s.t.started.size() == 3; }));
        EXPECT_EQ(s.t.started[2], "bob");
        // The rest run as slots free; nobody is refused.
        ORDO_CO_ASSERT_TRUE(co_await s.end_all_until([&] { return a.size() + b.size() == 7; }));
        EXPECT_EQ(a.ok.size(), 6u);
        EXPECT_EQ(b.ok.size(), 1u);
        const auto st = s.of("alice");
        EXPECT_EQ(st.served, 6u);
        EXPECT_EQ(st.queued, 4u);
        EXPECT_EQ(st.refused, 0u);
        EXPECT_EQ(s.of("bob").queued, 1u);
        co_await s.srv.async_stop();
    });
}

// Weights 3:1, both waiting: as slots free, they settle at three of alice's running for one of
// bob's (equal weights settle at two and two: SlotsSettleAtTheWeights checks both).
net::awaitable<std::pair<std::size_t, std::size_t>> settle(caller_shares shares) {
    shared_server s(co_await net::this_coro::executor, 4, std::move(shares));
    auto alice = co_await async_connect(s.url, as(alice_token));
    auto bob = co_await async_connect(s.url, as(bob_token));
    outcomes a, b;
    call_hold(alice, "alice", 8, a);
    EXPECT_TRUE(co_await wait_until([&] { return s.of("alice").waiting == 4; }));
    call_hold(bob, "bob", 4, b);
    EXPECT_TRUE(co_await wait_until([&] { return s.of("bob").waiting == 4; }));
    // Alice's four end one by one; each freed slot goes to whoever is furthest below its share.
    for (std::size_t i = 0; i < 4; ++i) {
        s.t.end_oldest();
        EXPECT_TRUE(co_await wait_until([&] { return s.t.started.size() == 5 + i; }));
    }
    const std::pair<std::size_t, std::size_t> running{s.of("alice").running, s.of("bob").running};
    EXPECT_TRUE(co_await s.end_all_until([&] { return a.size() + b.size() == 12; }));
    EXPECT_EQ(a.ok.size() + b.ok.size(), 12u);
    co_await s.srv.async_stop();
    co_return running;
}

TEST(Shares, SlotsSettleAtTheWeights) {
    run_test([]() -> net::awaitable<void> {
        caller_shares weighted;
        weighted.queue = 8;
        weighted.weights["alice"] = 3;
        const auto w = co_await settle(weighted);
        EXPECT_EQ(w.first, 3u);
        EXPECT_EQ(w.second, 1u);
        caller_shares even;
        even.queue = 8;
        const auto e = co_await settle(even);
        EXPECT_EQ(e.first, 2u);
        EXPECT_EQ(e.second, 2u);
    });
}

// A caller's queue is bounded: one more call is refused at once, overloaded, saying why.
TEST(Shares, ACallerWithAFullQueueIsRefused) {
    run_test([]() -> net::awaitable<void> {
        shared_server s(co_await net::this_coro::executor, 1, {.queue = 2});
        auto alice = co_await async_connect(s.url, as(alice_token));
        outcomes a;
        call_hold(alice, "alice", 3, a);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return s.of("alice").waiting == 2; }));
        try {
            co_await alice.async_call<std::string>("hold", "alice");
            ADD_FAILURE() << "a fourth call ran";
        } catch (const rpc_error& e) {
            EXPECT_EQ(e.code(), errc::overloaded);
            EXPECT_NE(std::string(e.what()).find("queue is full"), std::string::npos) << e.what();
            EXPECT_NE(std::string(e.what()).find("caller alice"), std::string::npos) << e.what();
            EXPECT_GE(e.retry_after().count(), 1);
        }
        EXPECT_EQ(s.of("alice").refused, 1u);
        ORDO_CO_ASSERT_TRUE(co_await s.end_all_until([&] { return a.size() == 3; }));
        EXPECT_EQ(a.ok.size(), 3u);
        co_await s.srv.async_stop();
    });
}

// With as many calls waiting as the limit queues (here 4), the next one to wait costs the
// caller furthest over its share its newest waiting call: alice (2 running, 4 waiting) loses
// one, and bob's call waits.
TEST(Shares, WhenTheQueueIsFullTheCallerFurthestOverItsShareIsRefused) {
    run_test([]() -> net::awaitable<void> {
        shared_server s(co_await net::this_coro::executor, 2, {.queue = 4});
        auto alice = co_await async_connect(s.url, as(alice_token));
        auto bob = co_await async_connect(s.url, as(bob_token));
        outcomes a, b;
        call_hold(alice, "alice", 6, a);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return s.of("alice").waiting == 4; }));
        call_hold(bob, "bob", 1, b);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return a.failed.size() == 1; }));
        EXPECT_EQ(a.failed[0].first, errc::overloaded);
        EXPECT_EQ(s.of("bob").waiting, 1u);
        EXPECT_EQ(s.of("alice").waiting, 3u);
        EXPECT_EQ(s.of("alice").refused, 1u);
        EXPECT_TRUE(b.failed.empty());
        s.t.end_oldest();
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return s.t.started.size() == 3; }));
        EXPECT_EQ(s.t.started[2], "bob");
        ORDO_CO_ASSERT_TRUE(
            co_await s.end_all_until([&] { return a.size() == 6 && b.size() == 1; }));
        EXPECT_EQ(a.ok.size(), 5u);
        EXPECT_EQ(b.ok.size(), 1u);
        co_await s.srv.async_stop();
    });
}

// A waiting call that its caller cancels (its timeout passes) leaves the queue; so do the
// waiting calls of a connection that closes. Slots then go to what still waits.
TEST(Shares, CancelledAndOrphanedWaitingCallsLeaveTheQueue) {
    run_test([]() -> net::awaitable<void> {
        shared_server s(co_await net::this_coro::executor, 1, {.queue = 4});
        auto alice = co_await async_connect(s.url, as(alice_token));
        outcomes first, timed;
        call_hold(alice, "alice", 1, first);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return s.t.started.size() == 1; }));
        call_options quick;
        quick.timeout = 200ms;
        call_hold(alice, "alice", 1, timed, quick);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return timed.size() == 1; }));
        EXPECT_EQ(timed.failed.at(0).first, errc::timed_out);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return s.of("alice").waiting == 0; }));
        outcomes b;  // outlives bob's channel: its calls end after the block, as it closes
        {
            auto bob = co_await async_connect(s.url, as(bob_token));
            call_hold(bob, "bob", 3, b);
            ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return s.of("bob").waiting == 3; }));
            bob.impl()->close();
        }
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return s.of("bob").waiting == 0; }));
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return b.size() == 3; }));
        for (const auto& f : b.failed) EXPECT_EQ(f.first, errc::closed);
        s.t.end_oldest();
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return first.size() == 1; }));
        EXPECT_EQ(first.ok.size(), 1u);
        // Nothing was left holding a slot: the next call runs.
        outcomes next;
        call_hold(alice, "alice", 1, next);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return s.t.started.size() == 2; }));
        s.t.end_all();
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return next.size() == 1; }));
        EXPECT_EQ(s.srv.stats().concurrency.in_flight, 0u);
        co_await s.srv.async_stop();
    });
}

// A stream call that waits for a slot, and is cancelled or refused instead, ends cleanly: its
// writer, made before it waited, goes with it (the sanitizers watch), and the streams that
// follow run.
TEST(Shares, AWaitingStreamCallThatIsCancelledOrRefusedEndsCleanly) {
    run_test([]() -> net::awaitable<void> {
        shared_server s(co_await net::this_coro::executor, 1, {.queue = 1});
        auto alice = co_await async_connect(s.url, as(alice_token));
        auto bob = co_await async_connect(s.url, as(bob_token));
        outcomes held;
        call_hold(alice, "alice", 1, held);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return s.t.started.size() == 1; }));
        call_options quick;
        quick.timeout = 200ms;
        auto timed = co_await alice.async_stream<int>("count", 3, quick);
        try {
            while (co_await timed.next()) {
            }
            ADD_FAILURE() << "a stream that waited for its timeout ended well";
        } catch (const rpc_error& e) {
            EXPECT_EQ(e.code(), errc::timed_out) << e.what();
        }
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return s.of("alice").waiting == 0; }));
        // Alice's stream waits; bob's call makes two waiting where the limit queues one, and
        // alice, furthest over her share, loses hers.
        auto refused = co_await alice.async_stream<int>("count", 3);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return s.of("alice").waiting == 1; }));
        outcomes b;
        call_hold(bob, "bob", 1, b);
        try {
            while (co_await refused.next()) {
            }
            ADD_FAILURE() << "alice's waiting stream was not refused";
        } catch (const rpc_error& e) {
            EXPECT_EQ(e.code(), errc::overloaded) << e.what();
            EXPECT_NE(std::string(e.what()).find("furthest over its share"), std::string::npos)
                << e.what();
        }
        ORDO_CO_ASSERT_TRUE(
            co_await s.end_all_until([&] { return held.size() == 1 && b.size() == 1; }));
        auto after = co_await alice.async_stream<int>("count", 3);
        std::vector<int> got;
        while (auto v = co_await after.next()) got.push_back(*v);
        EXPECT_EQ(got, (std::vector<int>{0, 1, 2}));
        co_await s.srv.async_stop();
    });
}

}  // namespace
}  // namespace ordo
