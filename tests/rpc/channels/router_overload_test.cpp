// A router under overload and as its replicas' health changes (router_options::
// overload_cooldown, retry_budget_percent, watch_health; docs/design.md 5.12): a call a replica
// refuses as overloaded moves to another replica, the replica is never ejected for it and gets
// fewer calls for a while, and the retry budget bounds what second tries and moves add to a
// fleet that fails every call; a replica whose server says it is not serving gets no new calls.
// The replicas are servers in this process whose concurrency limit is held by calls that wait
// on a gate the test opens.
#include "ordo/ordo.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "support/gate.hpp"
#include "support/run_test.hpp"
#include "support/sleep.hpp"

namespace ordo {
namespace {

using namespace std::chrono_literals;
using test::gate;
using test::run_test;
using test::wait_until;

// A server whose limit is `limit` calls of "work" at once; held() fills it with calls that
// wait on the gate, so that every other call of "work" is answered overloaded.
struct limited_replica {
    explicit limited_replica(net::any_io_executor ex, std::size_t limit = 1)
        : g(ex), srv(ex, options(limit)) {
        handler_options concurrent;
        concurrent.concurrent = true;
        srv.on(
            "work",
            [this](int i) -> net::awaitable<int> {
                ++ran;
                co_await g.pass();
                co_return i;
            },
            concurrent);
        srv.on("inc", [this](int i) {
            ++incs;
            return i + 1;
        });
        // Sleeps `ms` where the replica stalls, else answers at once; counts its cancellations.
        auto slow = [this](int ms) -> net::awaitable<int> {
            ++slow_calls;
            if (stalls)
                co_await test::sleep_counting_cancels(std::chrono::milliseconds(ms), cancelled);
            co_return ms;
        };
        srv.on("slow", slow, concurrent);
        srv.on("slow_once", slow, concurrent);
        url = srv.listen("tcp://127.0.0.1:0");
    }
    static server_options options(std::size_t limit) {
        server_options so;
        so.concurrency = limit;
        return so;
    }
    // Fills the limit with calls made straight to the server (not through the router).
    net::awaitable<void> hold(std::size_t n = 1) {
        direct = co_await async_connect(url);
        for (std::size_t i = 0; i < n; ++i)
            direct.async_call<int>("work", 0, [](std::error_code, int) {});
        co_await wait_until([&] { return g.waiting == static_cast<int>(n); });
    }
    std::uint64_t refused() const { return srv.stats().concurrency.refused; }
    net::awaitable<void> stop() {
        g.open();
        co_await srv.async_stop();
    }

    gate g;
    server srv;
    std::string url;
    channel direct;
    int ran = 0;   // calls of "work" that ran here (the held ones included)
    int incs = 0;  // calls of "inc" that ran here
    bool stalls = false;  // "slow" sleeps here
    int slow_calls = 0, cancelled = 0;
};

replica_counters counters_of(const std::vector<replica_counters>& all, const std::string& url) {
    for (auto& rc : all)
        if (rc.url == url) return rc;
    throw std::runtime_error("no replica " + url);
}

// An overloaded replica's calls go elsewhere and succeed; the replica, refusing every call it is
// sent, stays in (eject_after would have ejected it after two failures).
TEST(RouterOverload, AnOverloadedReplicasCallsMoveAndItIsNeverEjected) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        limited_replica a(ex), b(ex), c(ex);
        co_await a.hold();
        b.g.open();
        c.g.open();
        router_options o;
        o.policy = route_policy::round_robin;
        o.eject_after = 2;
        o.overload_cooldown = 0ms;  // only the server's hint (1 ms here): a is asked again soon
        auto rt = make_router(ex, o);
        for (auto* s : {&a, &b, &c}) co_await rt->async_add_replica(s->url);
        channel ch(rt);
        for (int i = 0; i < 40; ++i) {
            EXPECT_EQ(co_await ch.async_call<int>("work", i), i);
            co_await test::sleep_for(3ms);  // past a's cooling
        }
        const auto rc = counters_of(rt->replicas(), a.url);
        EXPECT_GE(a.refused(), 5u) << "round robin kept asking a";
        EXPECT_EQ(rc.overloaded, a.refused());
        EXPECT_EQ(rt->counters().moved, a.refused());
        EXPECT_EQ(rc.state, replica_state::ready);
        EXPECT_EQ(rt->counters().ejections, 0u);
        EXPECT_EQ(b.ran + c.ran, 40);
        EXPECT_EQ(a.ran, 1) << "only the call that holds a's one slot ran there";
        rt->close();
        for (auto* s : {&a, &b, &c}) co_await s->stop();
    });
}

// After refusing a call, a replica gets fewer calls for overload_cooldown: with least_loaded
// and idle replicas beside it, none.
TEST(RouterOverload, ARefusingReplicaGetsFewerCallsForAWhile) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        limited_replica a(ex), b(ex), c(ex);
        co_await a.hold();
        b.g.open();
        c.g.open();
        router_options o;
        o.overload_cooldown = 60s;
        o.aperture = false;  // every replica in turn while they tie: a gets a call early
        auto rt = make_router(ex, o);
        for (auto* s : {&a, &b, &c}) co_await rt->async_add_replica(s->url);
        channel ch(rt);
        for (int i = 0; i < 30; ++i) EXPECT_EQ(co_await ch.async_call<int>("work", i), i);
        EXPECT_EQ(a.refused(), 1u);
        EXPECT_EQ(rt->counters().moved, 1u);
        EXPECT_TRUE(counters_of(rt->replicas(), a.url).cooling);
        EXPECT_FALSE(counters_of(rt->replicas(), b.url).cooling);
        rt->close();
        for (auto* s : {&a, &b, &c}) co_await s->stop();
    });
}

// With nowhere to move, the caller gets the replica's answer: errc::overloaded naming the
// replica, with the server's hint (rpc_error::retry_after). Keyed calls never move.
TEST(RouterOverload, WithNowhereToGoTheCallerHearsOverloadedWithTheHint) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        limited_replica a(ex), b(ex);
        co_await a.hold();
        co_await b.hold();
        auto rt = make_router(ex, router_options{});
        co_await rt->async_add_replica(a.url);
        channel ch(rt);
        try {
            co_await ch.async_call<int>("work", 1);
            ADD_FAILURE() << "an overloaded call succeeded";
        } catch (const rpc_error& e) {
            EXPECT_EQ(e.code(), errc::overloaded);
            EXPECT_GE(e.retry_after(), 1ms);
            EXPECT_NE(e.detail().find("replica " + a.url), std::string::npos) << e.what();
        }
        // A keyed call stays with its key's replica even when another has room.
        co_await rt->async_add_replica(b.url);
        b.g.open();
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return b.g.waiting == 0; }));
        int on_a = 0;
        for (int k = 0; k < 40 && on_a < 3; ++k) {
            const auto before = a.refused();
            try {
                co_await ch.async_call<int>("work", k, ordo::key("k" + std::to_string(k)));
            } catch (const rpc_error& e) {
                EXPECT_EQ(e.code(), errc::overloaded) << e.what();
                EXPECT_EQ(a.refused(), before + 1);
                ++on_a;
            }
        }
        EXPECT_EQ(on_a, 3) << "no key of 40 fell on a";
        EXPECT_EQ(rt->counters().moved, 0u);
        rt->close();
        co_await a.stop();
        co_await b.stop();
    });
}

// A fleet that refuses every call: each call may be tried on every replica, three sends a
// call. The budget (20%, no per-second allowance here) keeps what reaches the fleet within
// 1.2 times the calls made; without it the fleet sees about three times as many.
TEST(RouterOverload, AFailingFleetSeesAtMostTheBudgetOfRetries) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        for (const bool budget : {true, false}) {
            limited_replica a(ex), b(ex), c(ex);
            for (auto* s : {&a, &b, &c}) co_await s->hold();
            router_options o;
            o.overload_cooldown = 0ms;
            o.min_retries_per_s = 0;
            o.retry_budget_percent = budget ? 20 : -1;
            auto rt = make_router(ex, o);
            for (auto* s : {&a, &b, &c}) co_await rt->async_add_replica(s->url);
            channel ch(rt);
            constexpr int calls = 200;
            int failed = 0;
            std::string last;
            for (int i = 0; i < calls; ++i) {
                try {
                    co_await ch.async_call<int>("work", i);
                } catch (const rpc_error& e) {
                    EXPECT_EQ(e.code(), errc::overloaded);
                    ++failed;
                    last = e.what();
                }
                co_await test::sleep_for(2ms);  // past the replicas' cooling (their 1 ms hint)
            }
            EXPECT_EQ(failed, calls);
            const auto sent = a.refused() + b.refused() + c.refused();
            const auto& rc = rt->counters();
            EXPECT_EQ(sent, calls + rc.moved);
            if (budget) {
                EXPECT_LE(sent, calls * 12 / 10) << "budget " << budget;
                EXPECT_GT(rc.over_budget, 0u);
                EXPECT_NE(last.find("retry budget is spent"), std::string::npos) << last;
            } else {
                EXPECT_GT(sent, calls * 5 / 2) << "without a budget every replica is asked";
                EXPECT_EQ(rc.over_budget, 0u);
            }
            rt->close();
            for (auto* s : {&a, &b, &c}) co_await s->stop();
        }
    });
}

// With no percentage, the per-second allowance alone lets a few tries through: a second's worth
// at first, then as time passes.
TEST(RouterOverload, TheBudgetStartsWithASecondsAllowance) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        limited_replica a(ex), b(ex);
        co_await a.hold();
        co_await b.hold();
        router_options o;
        o.overload_cooldown = 0ms;
        o.retry_budget_percent = 0;
        o.min_retries_per_s = 3;
        auto rt = make_router(ex, o);
        co_await rt->async_add_replica(a.url);
        co_await rt->async_add_replica(b.url);
        channel ch(rt);
        const auto start = std::chrono::steady_clock::now();
        for (int i = 0; i < 10; ++i) {
            auto [ec, v] = co_await ch.async_call<int>("work", i, use_tuple);
            EXPECT_EQ(ec, errc::overloaded);
            (void)v;
            co_await test::sleep_for(2ms);  // past the replicas' cooling (their 1 ms hint)
        }
        const double took_s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        // Each call's first refusal finds the other replica thawed and asks the budget. Three
        // moves come from the first second's allowance, and 3 a second of the time taken more.
        const auto& rc = rt->counters();
        EXPECT_GE(rc.moved, 3u);
        EXPECT_LE(static_cast<double>(rc.moved), 3 + 3 * took_s + 1e-9);
        EXPECT_GE(rc.moved + rc.over_budget, 10u);
        EXPECT_GT(rc.over_budget, 0u);
        rt->close();
        co_await a.stop();
        co_await b.stop();
    });
}

// A router over a and b (every replica in turn while they tie) that records its events.
net::awaitable<std::shared_ptr<router>> router_over(net::any_io_executor ex, limited_replica& a,
                                                    limited_replica& b,
                                                    std::vector<std::string>& events) {
    router_options o;
    o.aperture = false;
    auto rt = make_router(ex, o);
    rt->on_event([&events](const std::string& e) { events.push_back(e); });
    co_await rt->async_add_replica(a.url);
    co_await rt->async_add_replica(b.url);
    co_return rt;
}

// A replica whose server says it is not serving gets no new call, and no call fails; it gets
// calls again once it says it is serving.
TEST(RouterHealth, ANotServingReplicaGetsNoNewCallsAndNoCallFails) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        limited_replica a(ex, 64), b(ex, 64);
        std::vector<std::string> events;
        auto rt = co_await router_over(ex, a, b, events);
        channel ch(rt);
        auto state_of = [&](const std::string& url) {
            return counters_of(rt->replicas(), url).state;
        };
        for (int i = 0; i < 20; ++i) EXPECT_EQ(co_await ch.async_call<int>("inc", i), i + 1);
        EXPECT_GT(a.incs, 0);
        a.srv.set_health("", health_state::not_serving);
        ORDO_CO_ASSERT_TRUE(
            co_await wait_until([&] { return state_of(a.url) == replica_state::not_serving; }));
        const int on_a = a.incs;
        for (int i = 0; i < 40; ++i) EXPECT_EQ(co_await ch.async_call<int>("inc", i), i + 1);
        EXPECT_EQ(a.incs, on_a) << "a said it was not serving";
        EXPECT_EQ(b.incs, 60 - on_a);
        EXPECT_EQ(rt->counters().calls, 60u);
        EXPECT_STREQ(to_string(replica_state::not_serving), "not_serving");
        a.srv.set_health("", health_state::serving);
        ORDO_CO_ASSERT_TRUE(
            co_await wait_until([&] { return state_of(a.url) == replica_state::ready; }));
        for (int i = 0; i < 20; ++i) EXPECT_EQ(co_await ch.async_call<int>("inc", i), i + 1);
        EXPECT_GT(a.incs, on_a);
        const auto said = std::find_if(events.begin(), events.end(), [](const std::string& e) {
            return e.find("says it is not_serving") != std::string::npos;
        });
        EXPECT_NE(said, events.end());
        rt->close();
        co_await a.stop();
        co_await b.stop();
    });
}

// A replica's drain is heard as its health first: it takes no new calls from then on, before
// its server says it is going away, and nothing fails.
TEST(RouterHealth, ADrainIsHeardBeforeTheGoawayAndNothingFails) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        limited_replica a(ex, 64), b(ex, 64);
        std::vector<std::string> events;
        auto rt = co_await router_over(ex, a, b, events);
        channel ch(rt);
        // A call held on a keeps its drain going until the gate opens.
        int held = 0;
        for (int i = 0; i < 4; ++i)
            ch.async_call<int>("work", i, [&](std::error_code ec, int) {
                EXPECT_FALSE(ec) << ec.message();
                ++held;
            });
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return a.g.waiting >= 1; }));
        bool drained = false;
        // A grace shorter than a connection's close_timeout (5 s): a router that left the
        // watch running on the server would hold the connection past it.
        net::co_spawn(ex, a.srv.async_drain(3s, "test"),
                      [&](std::exception_ptr) { drained = true; });
        auto index_of = [&](const std::string& what) {
            for (std::size_t i = 0; i < events.size(); ++i)
                if (events[i].find(what) != std::string::npos) return static_cast<long>(i);
            return -1L;
        };
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return index_of("is going away") >= 0; }));
        EXPECT_GE(index_of("says it is draining"), 0);
        EXPECT_LT(index_of("says it is draining"), index_of("is going away"));
        const int on_a = a.incs;
        for (int i = 0; i < 20; ++i) EXPECT_EQ(co_await ch.async_call<int>("inc", i), i + 1);
        EXPECT_EQ(a.incs, on_a);
        a.g.open();
        b.g.open();
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return held == 4 && drained; }));
        EXPECT_EQ(a.srv.stats().connections_closed_by_grace, 0u)
            << "the router closed its connection once its calls were done, watch and all";
        rt->close();
        co_await b.stop();
    });
}

TEST(RouterHealth, AURLTurnsTheWatchOff) {
    EXPECT_TRUE(parse_route_url("route+tcp://127.0.0.1:1", {}).options.watch_health);
    EXPECT_FALSE(parse_route_url("route+tcp://127.0.0.1:1?health=off", {}).options.watch_health);
    EXPECT_THROW(parse_route_url("route+tcp://127.0.0.1:1?health=maybe", {}), std::system_error);
}

// A hedged call on a replica that stalls for a second goes to another after 200 ms, which
// answers; the stalled copy is cancelled on its server. A method that is not idempotent is
// never hedged.
TEST(RouterHedge, AHedgeWinsAgainstAStalledReplicaAndItsLoserIsCancelled) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        limited_replica a(ex, 64), b(ex, 64);
        a.stalls = true;
        router_options o;
        o.policy = route_policy::round_robin;  // a first, then b, in turn
        o.idempotent_methods = {"slow"};
        o.hedge_methods["slow"] = hedge_policy{200ms, false};
        o.hedge_methods["slow_once"] = hedge_policy{200ms, false};
        auto rt = make_router(ex, o);
        co_await rt->async_add_replica(a.url);
        co_await rt->async_add_replica(b.url);
        channel ch(rt);
        EXPECT_EQ(co_await ch.async_call<int>("slow", 1000), 1000);
        EXPECT_EQ(rt->counters().hedged, 1u);
        EXPECT_EQ(rt->counters().hedge_wins, 1u);
        EXPECT_EQ(b.slow_calls, 1);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return a.cancelled == 1; }));
        EXPECT_EQ(co_await ch.async_call<int>("slow", 1000), 1000);  // b's turn: at once
        EXPECT_EQ(rt->counters().hedged, 1u);
        // Not idempotent: on a, it waits out the stall.
        EXPECT_EQ(co_await ch.async_call<int>("slow_once", 400), 400);
        EXPECT_EQ(a.slow_calls, 2);
        EXPECT_EQ(rt->counters().hedged, 1u);
        EXPECT_EQ(a.cancelled, 1);
        rt->close();
        co_await a.stop();
        co_await b.stop();
    });
}

// hedge_after=p95: no hedge until 100 answers are known, then after the method's recent 95th
// percentile; a hedge the budget has no room for is not sent.
TEST(RouterHedge, AfterTheP95OnceKnownAndWithinTheBudget) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        for (const bool budget : {true, false}) {
            limited_replica a(ex, 64), b(ex, 64);
            a.stalls = true;
            router_options o;
            o.policy = route_policy::round_robin;
            o.idempotent_methods = {"slow"};
            o.hedge = hedge_policy{0ms, true};
            if (!budget) o.retry_budget_percent = o.min_retries_per_s = 0;
            auto rt = make_router(ex, o);
            co_await rt->async_add_replica(a.url);
            co_await rt->async_add_replica(b.url);
            channel ch(rt);
            EXPECT_EQ(co_await ch.async_call<int>("slow", 200), 200);  // on a, waited out
            EXPECT_EQ(rt->counters().hedged, 0u);
            // Past 100 answers, the slowest 5% of these may be hedged too.
            for (int i = 0; i < 120; ++i) EXPECT_EQ(co_await ch.async_call<int>("slow", 0), 0);
            const auto before = rt->counters();
            // One of the two lands on a, and is hedged about a millisecond later.
            for (int i = 0; i < 2; ++i) EXPECT_EQ(co_await ch.async_call<int>("slow", 1000), 1000);
            const auto& after = rt->counters();
            if (budget) {
                EXPECT_GE(after.hedged, before.hedged + 1);
                EXPECT_GE(after.hedge_wins, before.hedge_wins + 1);
            } else {
                EXPECT_EQ(after.hedged, 0u);
                EXPECT_GE(after.over_budget, before.over_budget + 1);
            }
            rt->close();
            co_await a.stop();
            co_await b.stop();
        }
    });
}

TEST(RouterHedge, AURLSetsTheHedgePolicies) {
    const auto o =
        parse_route_url("route+tcp://127.0.0.1:1?idempotent=a,b&hedge_after_ms=20&hedge=a:p95,b:7",
                        {})
            .options;
    EXPECT_EQ(o.hedge.after, 20ms);
    EXPECT_FALSE(o.hedge.p95);
    EXPECT_TRUE(o.hedge_methods.at("a").p95);
    EXPECT_EQ(o.hedge_methods.at("b").after, 7ms);
    EXPECT_TRUE(parse_route_url("route+tcp://127.0.0.1:1?hedge_after=p95", {}).options.hedge.p95);
    EXPECT_THROW(parse_route_url("route+tcp://127.0.0.1:1?hedge=a", {}), std::system_error);
    EXPECT_THROW(parse_route_url("route+tcp://127.0.0.1:1?hedge_after=p99", {}), std::system_error);
}

}  // namespace
}  // namespace ordo
