// The router's waiting queue, earliest deadline first (router_options::queue): urgent calls go
// before relaxed ones, calls without a deadline last and in order, a call whose deadline passes
// while it waits never reaches a replica, and a key's calls keep their order. Replicas are
// ordo::servers in the test's io_context; each records the calls its handlers ran.
#include "ordo/ordo.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <string>
#include <memory>
#include <vector>

#include "support/run_test.hpp"
#include "support/sleep.hpp"

namespace ordo {
namespace {

using namespace std::chrono_literals;
using test::run_test;
using test::wait_until;

// What every replica's handlers ran, in the order they started (one io_context: one order).
struct served_log {
    std::vector<int> ids;
    std::chrono::steady_clock::time_point first_at{};  // when the first take() ran
    int holding = 0;
};

// A replica: hold() waits until the gate opens (it keeps the replica busy); take(id, ms)
// records id, then works ms.
struct held_replica {
    held_replica(net::any_io_executor ex, served_log& log, net::steady_timer& gate) : srv(ex) {
        srv.on("hold", [&log, &gate]() -> net::awaitable<int> {
            ++log.holding;
            co_await gate.async_wait(use_tuple);
            --log.holding;
            co_return 0;
        });
        srv.on("take", [&log](int id, int ms) -> net::awaitable<int> {
            if (log.ids.empty()) log.first_at = std::chrono::steady_clock::now();
            log.ids.push_back(id);
            if (ms > 0) co_await test::sleep_for(std::chrono::milliseconds(ms));
            co_return id;
        });
        srv.on("quick", [&log](int id) {
            log.ids.push_back(id);
            return id;
        });
        url = srv.listen("tcp://127.0.0.1:0");
    }
    server srv;
    std::string url;
};

// n replicas with max_concurrent = 1, a router over them, and the gate their hold() waits on.
struct bench_setup {
    bench_setup(net::any_io_executor ex, int n) : gate(ex, net::steady_timer::time_point::max()) {
        for (int i = 0; i < n; ++i) reps.push_back(std::make_unique<held_replica>(ex, log, gate));
    }
    net::awaitable<void> start(queue_order order) {
        router_options o;
        o.max_concurrent = 1;
        o.queue = order;
        rt = make_router(co_await net::this_coro::executor, o);
        for (auto& r : reps) co_await rt->async_add_replica(r->url);
        ch = channel(rt);
    }
    // Occupies every replica with a hold() call (key: none) and waits until each runs.
    net::awaitable<bool> fill(std::size_t n) {
        for (std::size_t i = 0; i < n; ++i)
            ch.async_call<int>("hold", [this](std::error_code ec, int) { held_ok += !ec; });
        co_return co_await wait_until([&] { return log.holding == static_cast<int>(n); });
    }
    // take(id, ms) with `deadline` (0: none) and `key`; its outcome lands in outcomes[id].
    void take(int id, int ms, std::chrono::milliseconds deadline, std::string key = {}) {
        call_options o;
        o.timeout = deadline;
        o.key = std::move(key);
        ch.async_call<int>("take", id, ms, o, [this, id](std::error_code ec, int) {
            outcomes.emplace_back(id, ec);
        });
    }
    // quick(id): a method that takes no time, with `deadline`.
    void quick(int id, std::chrono::milliseconds deadline) {
        call_options o;
        o.timeout = deadline;
        ch.async_call<int>("quick", id, o, [this, id](std::error_code ec, int) {
            outcomes.emplace_back(id, ec);
        });
    }
    std::error_code outcome(int id) const {
        for (auto& [i, ec] : outcomes)
            if (i == id) return ec;
        return make_error_code(errc::closed);  // not finished
    }
    net::awaitable<void> stop() {
        rt->close();
        for (auto& r : reps) co_await r->srv.async_stop();
    }

    served_log log;
    net::steady_timer gate;
    std::vector<std::unique_ptr<held_replica>> reps;
    std::shared_ptr<router> rt;
    channel ch;
    int held_ok = 0;
    std::vector<std::pair<int, std::error_code>> outcomes;
};

// The scenario: 3 saturated replicas, 1,000 calls with 10 s deadlines waiting, then an
// urgent one: with 5 s in EDF order (an ordering question, which no busy machine can answer
// late), with 20 ms in FIFO order (where expiring unsent behind the queue is the point).
// Returns 1 if the urgent call was served first (EDF) or expired unsent (FIFO), 0 if it expired
// unsent before any relaxed call ran (EDF: inconclusive), -1 otherwise.
net::awaitable<int> urgent_scenario(queue_order order) {
    bench_setup s(co_await net::this_coro::executor, 3);
    co_await s.start(order);
    EXPECT_TRUE(co_await s.fill(3));
    for (int i = 0; i < 1000; ++i) s.take(i, 1, 10s);
    const std::chrono::milliseconds urgent = order == queue_order::fifo ? 20ms : 5000ms;
    s.take(-1, 0, urgent);
    const auto urgent_due = std::chrono::steady_clock::now() + urgent;
    EXPECT_EQ(s.rt->counters().queued, 1001u);
    s.gate.cancel();  // the replicas free up: the queue is served
    EXPECT_TRUE(co_await wait_until([&] { return s.outcomes.size() == 1001; }, 60s));
    const bool never_sent = std::find(s.log.ids.begin(), s.log.ids.end(), -1) == s.log.ids.end();
    const bool expired = s.outcome(-1) == errc::timed_out && never_sent;
    int verdict = -1;
    if (order == queue_order::fifo)
        verdict = expired ? 1 : -1;
    else if (!s.log.ids.empty() && s.log.ids.front() == -1 && !s.outcome(-1))
        verdict = 1;
    else if (expired && s.log.first_at >= urgent_due)
        verdict = 0;
    if (verdict < 0 && !s.log.ids.empty())
        ADD_FAILURE() << "first served: " << s.log.ids.front() << ", urgent call: "
                      << s.outcome(-1).message();
    co_await s.stop();
    co_return verdict;
}

TEST(Edf, AnUrgentCallIsServedBeforeAThousandRelaxedOnes) {
    run_test([]() -> net::awaitable<void> {
        // An urgent call that expired unsent would prove nothing either way: try again. (With
        // 5 s to go, only a machine stalled for seconds gets there.)
        for (int attempt = 0; attempt < 3; ++attempt) {
            const int v = co_await urgent_scenario(queue_order::earliest_deadline);
            if (v == 1) co_return;
            ORDO_CO_ASSERT_TRUE(v == 0);  // -1: a relaxed call went first
        }
        ADD_FAILURE() << "the urgent call expired unsent three times (machine too slow)";
    }, 180s);
}

// The same load in FIFO order: the urgent call waits behind the thousand and expires unsent.
TEST(Edf, InFifoOrderTheUrgentCallExpiresUnsent) {
    run_test([]() -> net::awaitable<void> {
        EXPECT_EQ(co_await urgent_scenario(queue_order::fifo), 1);
    }, 120s);
}

TEST(Edf, CallsWhoseDeadlinePassesWhileWaitingNeverReachAReplica) {
    run_test([]() -> net::awaitable<void> {
        bench_setup s(co_await net::this_coro::executor, 3);
        co_await s.start(queue_order::earliest_deadline);
        ORDO_CO_ASSERT_TRUE(co_await s.fill(3));
        for (int i = 0; i < 100; ++i) s.take(i, 0, 30ms);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return s.outcomes.size() == 100; }));
        for (auto& [id, ec] : s.outcomes) EXPECT_EQ(ec, errc::timed_out) << id;
        EXPECT_EQ(s.rt->counters().expired_in_queue, 100u);
        EXPECT_EQ(s.rt->counters().queued, 0u);
        s.gate.cancel();
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return s.held_ok == 3; }));
        // A call after them runs: the replicas were free, and none of the expired ones came.
        s.take(1000, 0, 10s);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return s.outcomes.size() == 101; }));
        EXPECT_EQ(s.log.ids, std::vector<int>{1000});
        co_await s.stop();
    });
}

TEST(Edf, CallsWithADeadlineGoFirstThenTheOthersInArrivalOrder) {
    run_test([]() -> net::awaitable<void> {
        bench_setup s(co_await net::this_coro::executor, 1);
        co_await s.start(queue_order::earliest_deadline);
        ORDO_CO_ASSERT_TRUE(co_await s.fill(1));
        s.take(1, 0, 0ms);
        s.take(2, 0, 20s);
        s.take(3, 0, 0ms);
        s.take(4, 0, 10s);
        s.take(5, 0, 30s);
        s.take(6, 0, 0ms);
        s.gate.cancel();
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return s.outcomes.size() == 6; }));
        EXPECT_EQ(s.log.ids, (std::vector<int>{4, 2, 5, 1, 3, 6}));
        EXPECT_EQ(s.rt->counters().expired_in_queue, 0u);
        co_await s.stop();
    });
}

// take() calls take ~40 ms here; a waiting one whose turn comes with less of its deadline left
// than twice that would time out on the replica: it fails at once, unsent. The estimate is per
// method: a quick() call with the same deadline goes.
TEST(Edf, ACallThatCouldNotFinishInTimeIsNotSent) {
    run_test([]() -> net::awaitable<void> {
        bench_setup s(co_await net::this_coro::executor, 1);
        co_await s.start(queue_order::earliest_deadline);
        for (int i = 0; i < 24; ++i) {  // the router learns how long calls take
            s.take(100 + i, 40, 10s);
            ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return s.outcomes.size() == std::size_t(i + 1); }));
        }
        ORDO_CO_ASSERT_TRUE(co_await s.fill(1));
        s.take(1, 40, 60ms);  // at most 60 ms left when its turn comes: calls take ~40
        s.take(2, 0, 10s);
        s.quick(3, 60ms);
        s.gate.cancel();
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return s.outcomes.size() == 27; }));
        EXPECT_EQ(s.outcome(1), errc::timed_out);
        EXPECT_EQ(s.outcome(2), std::error_code());
        EXPECT_EQ(s.outcome(3), std::error_code());
        EXPECT_EQ(std::count(s.log.ids.begin(), s.log.ids.end(), 1), 0);
        EXPECT_EQ(s.rt->counters().expired_in_queue, 1u);
        co_await s.stop();
    });
}

// EDF across keys, never within one: key k's calls (deadlines 30 s, 20 s, 10 s) keep their
// order; key j's single 5 s call, made last, goes before all of them; k's turn comes at 10 s.
TEST(Edf, AKeysCallsKeepTheirOrderWhileKeysAreServedByDeadline) {
    run_test([]() -> net::awaitable<void> {
        bench_setup s(co_await net::this_coro::executor, 1);
        co_await s.start(queue_order::earliest_deadline);
        ORDO_CO_ASSERT_TRUE(co_await s.fill(1));
        s.take(1, 0, 30s, "k");
        s.take(2, 0, 20s, "k");
        s.take(3, 0, 10s, "k");
        s.take(4, 0, 15s);
        s.take(5, 0, 5s, "j");
        s.gate.cancel();
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return s.outcomes.size() == 5; }));
        // j (5 s); then k's oldest, at k's earliest deadline (10 s): 1; then k's next, whose
        // turn (10 s still) comes before 4 (15 s): 2, 3; then 4.
        EXPECT_EQ(s.log.ids, (std::vector<int>{5, 1, 2, 3, 4}));
        co_await s.stop();
    });
}

// A replica whose calls each wait until the test ends the oldest one: who is served, in order.
struct turn_server {
    explicit turn_server(net::any_io_executor ex) : srv(ex) {
        handler_options concurrent;
        concurrent.concurrent = true;
        srv.on(
            "call",
            [this](std::string who) -> net::awaitable<std::string> {
                served.push_back(who);
                auto t = std::make_shared<net::steady_timer>(
                    co_await net::this_coro::executor, net::steady_timer::time_point::max());
                running.push_back(t);
                co_await t->async_wait(use_tuple);
                co_return who;
            },
            concurrent);
        url = srv.listen("tcp://127.0.0.1:0");
    }
    void end_oldest() {
        running.front()->cancel();
        running.pop_front();
    }
    server srv;
    std::string url;
    std::vector<std::string> served;
    std::deque<std::shared_ptr<net::steady_timer>> running;
};

// call(who) through `ch` as caller `who` (call_options::caller); outcomes by who.
void call_as(channel& ch, const std::string& who, std::vector<std::pair<std::string, std::error_code>>& out) {
    call_options o;
    o.caller = who;
    ch.async_call<std::string>("call", who, o, [&out, who](std::error_code ec, std::string) {
        out.emplace_back(who, ec);
    });
}

// The router's queue is shared among its callers: as room frees up, the caller with fewer
// calls in flight goes first (bob's one call before alice's four older ones), and a full queue
// pushes out the newest call of the caller furthest over its share (alice's), not the
// newcomer's.
TEST(Edf, TheQueueIsSharedAmongCallers) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        turn_server rep(ex);
        router_options o;
        o.max_concurrent = 2;
        o.max_queued_calls = 4;
        auto rt = make_router(ex, o);
        co_await rt->async_add_replica(rep.url);
        channel ch(rt);
        std::vector<std::pair<std::string, std::error_code>> out;
        for (int i = 0; i < 6; ++i) call_as(ch, "alice", out);  // 2 in flight, 4 waiting
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return rep.served.size() == 2; }));
        EXPECT_EQ(rt->counters().queued, 4u);
        call_as(ch, "bob", out);  // the queue is full: alice's newest is pushed out
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return out.size() == 1; }));
        EXPECT_EQ(out[0].first, "alice");
        EXPECT_EQ(out[0].second, errc::overloaded);
        EXPECT_EQ(rt->counters().queued, 4u);
        rep.end_oldest();  // alice has 1 in flight, bob none: bob's goes
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return rep.served.size() == 3; }));
        EXPECT_EQ(rep.served[2], "bob");
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] {
            if (!rep.running.empty()) rep.end_oldest();
            return out.size() == 7;
        }));
        EXPECT_EQ(std::count(rep.served.begin(), rep.served.end(), "alice"), 5);
        for (std::size_t i = 1; i < out.size(); ++i) EXPECT_FALSE(out[i].second) << i;
        // A caller alone is refused when the queue is full: nobody else to push out.
        for (int i = 0; i < 6; ++i) call_as(ch, "alice", out);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return rep.served.size() == 8; }));
        call_as(ch, "alice", out);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return out.size() == 8; }));
        EXPECT_EQ(out[7].second, errc::overloaded);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] {
            if (!rep.running.empty()) rep.end_oldest();
            return out.size() == 14;
        }));
        rt->close();
        co_await rep.srv.async_stop();
    });
}

// Weights: `heavy` 3, bob 1, both waiting on a router with 4 calls in flight: as room frees,
// they settle at three of heavy's in flight for one of bob's. Gives bob's count among the
// four.
net::awaitable<long> bobs_in_flight_at_weights(std::string heavy) {
    auto ex = co_await net::this_coro::executor;
    turn_server rep(ex);
    router_options o;
    o.max_concurrent = 4;
    o.caller_weights = {{heavy, 3}};
    auto rt = make_router(ex, o);
    co_await rt->async_add_replica(rep.url);
    channel ch(rt);
    std::vector<std::pair<std::string, std::error_code>> out;
    for (int i = 0; i < 8; ++i) call_as(ch, heavy, out);  // 4 in flight, 4 waiting
    EXPECT_TRUE(co_await wait_until([&] { return rep.served.size() == 4; }));
    for (int i = 0; i < 4; ++i) call_as(ch, "bob", out);
    EXPECT_TRUE(co_await wait_until([&] { return rt->counters().queued == 8; }));
    for (std::size_t i = 0; i < 4; ++i) {
        rep.end_oldest();
        EXPECT_TRUE(co_await wait_until([&] { return rep.served.size() == 5 + i; }));
    }
    const long bobs = std::count(rep.served.begin() + 4, rep.served.end(), "bob");
    EXPECT_TRUE(co_await wait_until([&] {
        if (!rep.running.empty()) rep.end_oldest();
        return out.size() == 12;
    }));
    rt->close();
    co_await rep.srv.async_stop();
    co_return bobs;
}

// Of the four in flight once they settle: three of the heavy caller's, one of bob's (with even
// weights it would be two each). The router's own calls (no caller, "") weigh as set too.
TEST(Edf, CallersSettleAtTheirWeights) {
    run_test([]() -> net::awaitable<void> {
        EXPECT_EQ(co_await bobs_in_flight_at_weights("alice"), 1);
        EXPECT_EQ(co_await bobs_in_flight_at_weights(""), 1);
    });
}

}  // namespace
}  // namespace ordo
