// ordo::router as a fleet member list: replicas that come back are reconnected with backoff,
// outliers are ejected and return, a key's calls never overtake each other when its replica
// changes, calls wait for a replica with wait_for_replica, and sources add, remove and
// re-weight replicas. Replicas are ordo::servers in the test's io_context, restarted on their
// own ports.
#include "ordo/ordo.hpp"

#include <gtest/gtest.h>

#include <map>
#include <regex>

#include "support/run_test.hpp"
#include "support/sleep.hpp"

namespace ordo {
namespace {

using namespace std::chrono_literals;
using test::run_test;
using test::sleep_for;
using test::wait_until;

struct service : interface {
    method<int()> whoami{"whoami"};
    method<int(std::string, int)> seq{"seq"};  // logs (key, n), then sleeps: serial
};

// A replica that can be stopped and started again on the same URL. `log` is shared by all
// replicas of a test: the order in which handlers began.
struct replica_server {
    replica_server(net::any_io_executor ex, int id, std::vector<std::pair<std::string, int>>* log)
        : ex(ex), id(id), log(log) {
        start("tcp://127.0.0.1:0");
    }
    void start(const std::string& at) {
        srv = std::make_unique<server>(ex);
        srv->on(service{}.whoami, [this]() -> int {
            ++calls;
            if (failing) throw std::runtime_error("replica " + std::to_string(this->id) + " is broken");
            return this->id;
        });
        srv->on(service{}.seq, [this](std::string key, int n) -> net::awaitable<int> {
            ++seq_calls;
            if (log) log->emplace_back(key, n);
            co_await sleep_for(std::chrono::milliseconds(seq_ms));
            co_return this->id;
        });
        url = srv->listen(at);
    }
    net::awaitable<void> stop() { co_await srv->async_stop(); }
    net::any_io_executor ex;
    std::unique_ptr<server> srv;
    int id;
    std::vector<std::pair<std::string, int>>* log;
    std::string url;
    int calls = 0, seq_calls = 0;
    int seq_ms = 0;
    bool failing = false;
};

int state_count(router& r, replica_state s) {
    int n = 0;
    for (auto& rc : r.replicas()) n += rc.state == s;
    return n;
}

TEST(Membership, ALostReplicaReconnectsWithGrowingJitteredDelaysAndTakesCallsAgain) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        replica_server a(ex, 0, nullptr), b(ex, 1, nullptr);
        router_options o;
        o.reconnect_initial = 50ms;
        o.reconnect_max = 200ms;
        auto r = make_router(ex, o);
        std::vector<std::string> events;
        r->on_event([&](const std::string& e) { events.push_back(e); });
        co_await r->async_add_replica(a.url);
        co_await r->async_add_replica(b.url);
        auto s = stub<service>(channel(r));
        co_await a.stop();
        ORDO_CO_ASSERT_TRUE(co_await wait_until(
            [&] { return state_count(*r, replica_state::reconnecting) == 1; }, 10s));
        // While a is down every call goes to b, none fails.
        for (int i = 0; i < 20; ++i) EXPECT_EQ(co_await s.whoami(), 1);
        // Let it fail a few attempts: 50, 80, 128, then 200 ms each (+-20%).
        ORDO_CO_ASSERT_TRUE(co_await wait_until(
            [&] {
                return std::count_if(events.begin(), events.end(), [](auto& e) {
                           return e.find("still down") != std::string::npos;
                       }) >= 5;
            },
            10s));
        std::vector<long> delays;
        const std::regex next(R"(next try in (\d+) ms)");
        for (auto& e : events) {
            std::smatch m;
            if (std::regex_search(e, m, next)) delays.push_back(std::stol(m[1]));
        }
        ORDO_CO_ASSERT_TRUE(delays.size() >= 5u);
        const double expected[] = {50, 80, 128, 200, 200};
        for (std::size_t i = 0; i < 5; ++i) {
            EXPECT_GE(delays[i], expected[i] * 0.8 - 1) << i;
            EXPECT_LE(delays[i], expected[i] * 1.2 + 1) << i;
        }
        // Back on the same address: a is ready again within the backoff cap, and takes calls.
        a.start(a.url);
        ORDO_CO_ASSERT_TRUE(co_await wait_until(
            [&] { return state_count(*r, replica_state::ready) == 2; }, 5s));
        EXPECT_EQ(r->counters().reconnects, 1u);
        EXPECT_EQ(r->counters().replicas_lost, 1u);
        std::map<int, int> by;
        for (int i = 0; i < 20; ++i) ++by[co_await s.whoami()];
        EXPECT_GT(by[0], 0);
        EXPECT_GT(by[1], 0);
        EXPECT_EQ(r->replicas()[0].connects, 2u);
        r->close();
        co_await a.stop();
        co_await b.stop();
    });
}

TEST(Membership, AReplicaFailingEveryCallIsEjectedForAGrowingTimeWithinTheCap) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        replica_server a(ex, 0, nullptr), b(ex, 1, nullptr), c(ex, 2, nullptr), d(ex, 3, nullptr);
        b.failing = c.failing = true;
        router_options o;
        o.policy = route_policy::round_robin;
        o.eject_after = 3;
        o.eject_base = 1000ms;  // long enough that 30 calls fit in it on a loaded machine
        o.max_ejected_percent = 25;  // one of four
        auto r = make_router(ex, o);
        std::vector<std::string> events;
        r->on_event([&](const std::string& e) { events.push_back(e); });
        for (auto* x : {&a, &b, &c, &d}) co_await r->async_add_replica(x->url);
        channel ch(r);
        int failed = 0;
        for (int i = 0; i < 40; ++i) {
            try {
                co_await ch.async_call<int>("whoami");
            } catch (const rpc_error& e) {
                EXPECT_EQ(e.code(), errc::remote_error);
                ++failed;
            }
        }
        // One of the two broken replicas is ejected (the cap keeps the other in).
        EXPECT_EQ(r->counters().ejections, 1u);
        EXPECT_EQ(state_count(*r, replica_state::ejected), 1);
        const int b_calls = b.calls, c_calls = c.calls;
        for (int i = 0; i < 30; ++i) {
            try {
                co_await ch.async_call<int>("whoami");
            } catch (const rpc_error&) {
            }
        }
        // The ejected one got nothing meanwhile.
        EXPECT_TRUE((b.calls == b_calls) != (c.calls == c_calls)) << b.calls << " " << c.calls;
        // The other broken one is mended; the ejected one's time ends, and failing again it is
        // out for twice as long.
        replica_server& out = b.calls == b_calls ? b : c;
        (&out == &b ? c : b).failing = false;
        ORDO_CO_ASSERT_TRUE(co_await wait_until(
            [&] { return state_count(*r, replica_state::ejected) == 0; }, 10s));
        bool twice = false;
        for (int i = 0; i < 200 && !twice; ++i) {
            try {
                co_await ch.async_call<int>("whoami");
            } catch (const rpc_error&) {
            }
            const std::string again =
                "replica " + out.url + " ejected for 2000 ms: its last 3 calls failed";
            for (auto& e : events) twice = twice || e == again;
        }
        EXPECT_TRUE(twice);
        EXPECT_EQ(r->counters().ejections, 2u);
        for (auto& e : events) std::printf("  %s\n", e.c_str());
        r->close();
        for (auto* x : {&a, &b, &c, &d}) co_await x->stop();
    });
}

// Keyed calls queued on a slow replica: a replica added meanwhile takes the key over, and the
// key's next calls wait until those on the first replica have finished.
TEST(Membership, AKeysCallsNeverOvertakeEachOtherWhenItsReplicaChanges) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        std::vector<std::pair<std::string, int>> log;
        replica_server a(ex, 0, &log), b(ex, 1, &log);
        a.seq_ms = 30;
        router_options o;
        o.max_concurrent = 64;
        auto r = make_router(ex, o);
        co_await r->async_add_replica(a.url);
        // A key that b will own once added: try keys on a throwaway router with both.
        std::string key;
        {
            auto probe = make_router(ex, o);
            co_await probe->async_add_replica(a.url);
            co_await probe->async_add_replica(b.url);
            for (int i = 0; i < 1000 && key.empty(); ++i) {
                const std::string k = "k" + std::to_string(i);
                if (co_await channel(probe).async_call<int>("whoami", ordo::key(k)) == 1) key = k;
            }
            probe->close();
        }
        ORDO_CO_ASSERT_TRUE(!key.empty());
        channel ch(r);
        int done = 0, failed = 0;
        auto call = [&](int n) {
            ch.async_call<int>("seq", key, n, ordo::key(key), [&](std::error_code ec, int) {
                ++done;
                failed += ec ? 1 : 0;
            });
        };
        for (int n = 0; n < 10; ++n) call(n);  // on a, 300 ms of work
        co_await r->async_add_replica(b.url);  // the key now belongs to b
        for (int n = 10; n < 20; ++n) call(n);
        EXPECT_GE(r->counters().key_waits, 1u);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return done == 20; }, 20s));
        EXPECT_EQ(failed, 0);
        ORDO_CO_ASSERT_EQ(log.size(), 20u);
        for (int n = 0; n < 20; ++n) EXPECT_EQ(log[n].second, n);
        EXPECT_EQ(a.seq_calls, 10);
        EXPECT_EQ(b.seq_calls, 10);
        r->close();
        co_await a.stop();
        co_await b.stop();
    });
}

TEST(Membership, WithWaitForReplicaACallOutlivesTheOnlyReplicasRestart) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        replica_server a(ex, 0, nullptr);
        router_options o;
        o.reconnect_initial = 20ms;
        o.reconnect_max = 100ms;
        o.wait_for_replica = 5000ms;
        auto r = make_router(ex, o);
        co_await r->async_add_replica(a.url);
        router_options fast = o;
        fast.wait_for_replica = 0ms;
        auto plain = make_router(ex, fast);
        co_await plain->async_add_replica(a.url);
        co_await a.stop();
        ORDO_CO_ASSERT_TRUE(co_await wait_until(
            [&] {
                return state_count(*r, replica_state::reconnecting) == 1 &&
                       state_count(*plain, replica_state::reconnecting) == 1;
            },
            10s));
        // Without it, a call fails at once.
        try {
            co_await channel(plain).async_call<int>("whoami");
            ADD_FAILURE() << "no error";
        } catch (const rpc_error& e) {
            EXPECT_EQ(e.code(), errc::peer_lost);
        }
        int ok = 0, failed = 0;
        for (int i = 0; i < 5; ++i)
            channel(r).async_call<int>("whoami", [&](std::error_code ec, int) { ++(ec ? failed : ok); });
        co_await sleep_for(300ms);
        EXPECT_EQ(ok + failed, 0);  // still waiting
        a.start(a.url);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return ok + failed == 5; }, 10s));
        EXPECT_EQ(ok, 5);
        // A call that waits longer than wait_for_replica fails, saying so.
        co_await a.stop();
        router_options brief = o;
        brief.wait_for_replica = 200ms;
        auto r2 = make_router(ex, brief);
        r2->add_replica(a.url);
        ORDO_CO_ASSERT_TRUE(co_await wait_until(
            [&] { return state_count(*r2, replica_state::reconnecting) == 1; }, 10s));
        try {
            co_await channel(r2).async_call<int>("whoami");
            ADD_FAILURE() << "no error";
        } catch (const rpc_error& e) {
            EXPECT_EQ(e.code(), errc::peer_lost);
            EXPECT_NE(std::string(e.what()).find("wait_for_replica"), std::string::npos) << e.what();
        }
        r->close();
        r2->close();
        plain->close();
    });
}

TEST(Membership, AReplicaThatDrainsTakesNoNewCallsFinishesItsOwnAndIsReconnectedWhenBack) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        std::vector<std::pair<std::string, int>> log;
        replica_server a(ex, 0, &log), b(ex, 1, &log);
        a.seq_ms = b.seq_ms = 5;
        router_options o;
        o.reconnect_initial = 20ms;
        o.reconnect_max = 200ms;
        auto r = make_router(ex, o);
        std::vector<std::string> events;
        r->on_event([&](const std::string& e) { events.push_back(e); });
        co_await r->async_add_replica(a.url);
        co_await r->async_add_replica(b.url);
        channel ch(r);
        int done = 0, failed = 0;
        std::string first_error;
        std::map<std::string, int> next;
        auto call = [&](int i) {
            const std::string k = "k" + std::to_string(i % 8);
            ch.async_call<int>("seq", k, next[k]++, ordo::key(k), [&](std::error_code ec, int) {
                ++done;
                if (ec && failed++ == 0) first_error = ec.message();
            });
        };
        for (int i = 0; i < 200; ++i) call(i);
        // a drains with calls in flight and queued; more calls keep coming meanwhile.
        bool drained = false;
        net::co_spawn(ex, [&]() -> net::awaitable<void> {
            co_await a.srv->async_drain(10s);
            drained = true;
        }, net::detached);
        for (int i = 200; i < 400; ++i) call(i);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return drained && done == 400; }, 30s));
        EXPECT_EQ(failed, 0) << first_error;
        EXPECT_EQ(r->counters().drains, 1u);
        EXPECT_EQ(r->counters().replicas_lost, 0u);
        // Each key's calls ran in order, over both replicas.
        std::map<std::string, int> last;
        for (auto& [k, n] : log) {
            if (last.count(k)) {
                EXPECT_GT(n, last[k]) << k;
            }
            last[k] = n;
        }
        EXPECT_EQ(log.size(), 400u);
        // a is down: reconnecting. Back on its address, it is ready again and takes calls.
        ORDO_CO_ASSERT_TRUE(co_await wait_until(
            [&] { return state_count(*r, replica_state::reconnecting) == 1; }, 10s));
        a.start(a.url);
        ORDO_CO_ASSERT_TRUE(co_await wait_until(
            [&] { return state_count(*r, replica_state::ready) == 2; }, 10s));
        const int before = a.seq_calls;
        for (int i = 0; i < 64; ++i) co_await ch.async_call<int>("seq", std::string("x"), i);
        EXPECT_GT(a.seq_calls, before);
        std::string all;
        for (auto& e : events) all += e + "\n";
        EXPECT_NE(all.find("replica " + a.url + " is going away (draining): draining"),
                  std::string::npos) << all;
        EXPECT_NE(all.find("replica " + a.url + " drained; next try in "), std::string::npos) << all;
        EXPECT_NE(all.find("replica " + a.url + " back"), std::string::npos) << all;
        r->close();
        co_await a.stop();
        co_await b.stop();
    });
}

// A source the test drives by hand.
struct hand_source final : replica_source {
    std::function<void(std::vector<member>)> update;
    std::function<void(const std::string&)> problem;
    int refreshes = 0;
    bool stopped = false;
    void start(std::function<void(std::vector<member>)> u,
               std::function<void(const std::string&)> p) override {
        update = std::move(u);
        problem = std::move(p);
    }
    void refresh_now() override { ++refreshes; }
    void stop() override { stopped = true; }
    std::string describe() const override { return "hand"; }
    source_counters counters() const override { return {}; }
};

TEST(Membership, ASourcesSetsAddRemoveAndReweightReplicasAndItsProblemsKeepTheLastSet) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        replica_server a(ex, 0, nullptr), b(ex, 1, nullptr), c(ex, 2, nullptr);
        router_options o;
        o.policy = route_policy::weighted;
        auto r = make_router(ex, o);
        std::vector<std::string> events;
        r->on_event([&](const std::string& e) { events.push_back(e); });
        auto owned = std::make_unique<hand_source>();
        hand_source& src = *owned;
        r->follow(std::move(owned));
        src.update({{a.url, 1, ""}, {b.url, 1, ""}});
        ORDO_CO_ASSERT_TRUE(co_await wait_until(
            [&] { return state_count(*r, replica_state::ready) == 2; }, 10s));
        EXPECT_EQ(r->replicas()[0].source, "hand");
        // b goes, c comes, a weighs 3.
        src.update({{a.url, 3, ""}, {c.url, 1, ""}});
        ORDO_CO_ASSERT_TRUE(co_await wait_until(
            [&] { return r->replicas().size() == 2 && state_count(*r, replica_state::ready) == 2; },
            10s));
        std::map<int, int> by;
        for (int i = 0; i < 400; ++i) ++by[co_await channel(r).async_call<int>("whoami")];
        EXPECT_EQ(by[1], 0);
        EXPECT_EQ(by[0], 300);
        EXPECT_EQ(by[2], 100);
        // A problem is an event; the set stays.
        src.problem("lookup failed: timeout");
        EXPECT_EQ(r->counters().source_problems, 1u);
        EXPECT_EQ(r->replicas().size(), 2u);
        EXPECT_NE(events.back().find("source hand: lookup failed: timeout"), std::string::npos);
        // A lost replica asks the source to look again.
        co_await c.stop();
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return src.refreshes >= 1; }, 10s));
        r->close();
        EXPECT_TRUE(src.stopped);
        co_await a.stop();
        co_await b.stop();
    });
}

// The ring is kept up to date piece by piece (points off, points merged in): after adds,
// removals and re-weights, every key lands where a router made with the final set puts it.
TEST(Membership, AfterManyChangesEveryKeyLandsWhereAFreshRouterPutsIt) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        std::vector<std::unique_ptr<replica_server>> rs;
        for (int i = 0; i < 6; ++i) rs.push_back(std::make_unique<replica_server>(ex, i, nullptr));
        auto m = [&](int i, double w = 1) { return member{rs[i]->url, w, ""}; };
        auto changed = make_router(ex);
        auto owned = std::make_unique<hand_source>();
        hand_source& src = *owned;
        changed->follow(std::move(owned));
        const std::vector<std::vector<member>> steps = {
            {m(0), m(1), m(2), m(3)},
            {m(0), m(1), m(2), m(3), m(4)},
            {m(0), m(2), m(3), m(4)},
            {m(0), m(2, 3), m(3), m(4)},
            {m(0), m(2, 3), m(3), m(4), m(5)},
            {m(2, 3), m(3), m(4), m(5)},
        };
        for (auto& set : steps) {
            src.update(set);
            ORDO_CO_ASSERT_TRUE(co_await wait_until(
                [&] {
                    return changed->replicas().size() == set.size() &&
                           state_count(*changed, replica_state::ready) == static_cast<int>(set.size());
                },
                10s));
        }
        auto fresh = make_router(ex);
        auto owned2 = std::make_unique<hand_source>();
        hand_source& src2 = *owned2;
        fresh->follow(std::move(owned2));
        src2.update(steps.back());
        ORDO_CO_ASSERT_TRUE(co_await wait_until(
            [&] { return state_count(*fresh, replica_state::ready) == 4; }, 10s));
        std::map<int, int> spread;
        for (int k = 0; k < 300; ++k) {
            const std::string key = "key-" + std::to_string(k);
            const int a = co_await channel(changed).async_call<int>("whoami", ordo::key(key));
            const int b = co_await channel(fresh).async_call<int>("whoami", ordo::key(key));
            EXPECT_EQ(a, b) << key;
            ++spread[a];
        }
        EXPECT_EQ(spread.size(), 4u);
        EXPECT_GT(spread[2], spread[3]);  // weight 3 against 1
        changed->close();
        fresh->close();
        for (auto& r : rs) co_await r->stop();
    });
}

}  // namespace
}  // namespace ordo
