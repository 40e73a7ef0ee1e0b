// ordo::router: spreading, per-replica limits, the waiting queue, weighted split, key affinity,
// shadow traffic, failover and replicas added at run time. Replicas are ordo::servers in the
// test's io_context, except in the failover test, which kills ordo-inc-server processes.
#include "ordo/ordo.hpp"

#include <gtest/gtest.h>

#include <map>

#include "support/processes.hpp"
#include "support/cutting_proxy.hpp"
#include "support/run_test.hpp"
#include "support/silent_listener.hpp"
#include "support/sleep.hpp"

namespace ordo {
namespace {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;
using test::run_test;
using test::wait_until;
using test::sleep_for;

struct replica_service : interface {
    method<int()> whoami{"whoami"};
    method<int(int)> work{"work"};            // sleeps ms, concurrent; yields the replica's id
    method<int(std::string, int)> seq{"seq"};  // records (key, n), serial; yields the id
};

// One replica, with server-side counts.
struct replica_server {
    replica_server(net::any_io_executor ex, int id, bool failing = false) : srv(ex), id(id) {
        srv.on(replica_service{}.whoami, [this, failing]() -> int {
            ++calls;
            if (failing) throw std::runtime_error("shadow replica refuses");
            return this->id;
        });
        srv.on(replica_service{}.work,
               [this](int ms) -> net::awaitable<int> {
                   ++calls;
                   max_in_flight = std::max(max_in_flight, ++in_flight);
                   co_await sleep_for(std::chrono::milliseconds(ms));
                   --in_flight;
                   co_return this->id;
               },
               {.concurrent = true});
        srv.on(replica_service{}.seq, [this](std::string key, int n) {
            ++calls;
            log[key].push_back(n);
            return this->id;
        });
        url = srv.listen("tcp://127.0.0.1:0");
    }
    server srv;
    int id;
    std::string url;
    int calls = 0, in_flight = 0, max_in_flight = 0;
    std::map<std::string, std::vector<int>> log;
};

struct replicas {
    replicas(net::any_io_executor ex, int n) {
        for (int i = 0; i < n; ++i) all.push_back(std::make_unique<replica_server>(ex, i));
    }
    net::awaitable<void> stop() {
        for (auto& r : all) co_await r->srv.async_stop();
    }
    std::vector<std::unique_ptr<replica_server>> all;
};

// GCC 12 destroys a braced temporary of a class with strings twice when it is made inside a
// co_await expression: the tests name their options first.
net::awaitable<std::shared_ptr<router>> make(replicas& rs, const router_options& o) {
    auto r = make_router(co_await net::this_coro::executor, o);
    for (auto& s : rs.all) co_await r->async_add_replica(s->url);
    co_return r;
}

// Starts `n` calls of `method`(ms) (work by default) at once; counts outcomes by replica id
// (-1: failed).
struct fan {
    std::map<int, int> by_replica;
    int done = 0;
    std::vector<std::error_code> errors;
    void start(const channel& ch, int n, int ms, const char* method = "work") {
        for (int i = 0; i < n; ++i)
            ch.async_call<int>(method, ms, [this](std::error_code ec, int id) {
                ++done;
                ++by_replica[ec ? -1 : id];
                if (ec) errors.push_back(ec);
            });
    }
};

TEST(Router, LeastLoadedSpreadsConcurrentCallsOverEveryReplicaWithinTheLimit) {
    run_test([]() -> net::awaitable<void> {
        replicas rs(co_await net::this_coro::executor, 4);
        const router_options o{.max_concurrent = 4};
        auto r = co_await make(rs, o);
        channel ch(r);
        fan f;
        f.start(ch, 64, 20);
        // Calls are routed as they are made: the first 16 fill every replica evenly.
        for (auto& rc : r->replicas()) EXPECT_EQ(rc.in_flight, 4u) << rc.url;
        EXPECT_EQ(r->counters().queued, 48u);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return f.done == 64; }));
        EXPECT_EQ(f.by_replica.count(-1), 0u);
        int total = 0;
        for (auto& s : rs.all) {
            EXPECT_GE(s->calls, 4) << "replica " << s->id;
            EXPECT_LE(s->max_in_flight, 4) << "replica " << s->id;
            total += s->calls;
        }
        EXPECT_EQ(total, 64);
        for (auto& rc : r->replicas()) {
            EXPECT_EQ(rc.in_flight, 0u);
            EXPECT_EQ(rc.latency.count, rc.completed);
            EXPECT_GE(rc.latency.p50, 15ms);
            // From the send time the router noted (pending_call::noted) to the answer: not
            // from the clock's epoch.
            EXPECT_LT(rc.latency.p99, 60s);
        }
        co_await rs.stop();
    });
}

// A replica whose connection fails inside a send (a write the kernel refuses after a reset)
// takes no more calls from that moment: the router hears of it at the first call that fails
// there, not when the event loop next runs, so that the calls made in the same turn go to the
// other replica instead of each failing unsent (issue 50).
TEST(Router, AReplicaWhoseConnectionFailedInsideASendTakesNoMoreCallsThatTurn) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        replicas rs(ex, 2);
        const auto port = static_cast<std::uint16_t>(
            std::stoi(rs.all[0]->url.substr(rs.all[0]->url.rfind(':') + 1)));
        test::cutting_proxy proxy("127.0.0.1", port);
        const router_options o{.policy = route_policy::round_robin};
        auto r = make_router(ex, o);
        co_await r->async_add_replica(proxy.url());
        co_await r->async_add_replica(rs.all[1]->url);
        auto s = stub<replica_service>(channel(r));
        for (int i = 0; i < 4; ++i) (void)co_await s.whoami();
        ORDO_CO_ASSERT_EQ(rs.all[0]->calls, 2);
        proxy.set_refusing(true);
        proxy.cut_all();
        // Large calls without yielding: each fills a batch, which send() writes at once, so the
        // first one for the cut replica meets the reset inside its send.
        const std::string big(128 * 1024, 'x');
        int done = 0, failed = 0;
        for (int i = 0; i < 40; ++i)
            channel(r).async_call<int>("seq", big, i, [&](std::error_code ec, int) {
                ++done;
                if (ec) ++failed;
            });
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return done == 40; }, 30s));
        EXPECT_LE(failed, 1);
        EXPECT_GE(rs.all[1]->calls, 39);
        r->close();
        co_await rs.stop();
    });
}

TEST(Router, RoundRobinSendsSequentialCallsToEachReplicaInTurn) {
    run_test([]() -> net::awaitable<void> {
        replicas rs(co_await net::this_coro::executor, 3);
        const router_options o{.policy = route_policy::round_robin};
        auto r = co_await make(rs, o);
        auto s = stub<replica_service>(channel(r));
        std::vector<int> ids;
        for (int i = 0; i < 30; ++i) ids.push_back(co_await s.whoami());
        for (int i = 3; i < 30; ++i) EXPECT_EQ(ids[i], ids[i - 3]) << "call " << i;
        EXPECT_NE(ids[0], ids[1]);
        EXPECT_NE(ids[1], ids[2]);
        EXPECT_NE(ids[0], ids[2]);
        for (auto& srv : rs.all) EXPECT_EQ(srv->calls, 10);
        co_await rs.stop();
    });
}

TEST(Router, CallsBeyondEveryReplicasLimitWaitInOneQueueAndAllComplete) {
    run_test([]() -> net::awaitable<void> {
        replicas rs(co_await net::this_coro::executor, 2);
        const router_options o{.max_concurrent = 2};
        auto r = co_await make(rs, o);
        channel ch(r);
        fan f;
        f.start(ch, 40, 10);
        // Dispatching is synchronous: the first four are out, the rest wait.
        EXPECT_EQ(r->counters().queued, 36u);
        std::size_t most = 0;
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] {
            for (auto& rc : r->replicas()) most = std::max(most, rc.in_flight);
            return f.done == 40;
        }));
        EXPECT_LE(most, 2u);
        EXPECT_EQ(f.by_replica.count(-1), 0u);
        for (auto& s : rs.all) EXPECT_LE(s->max_in_flight, 2) << "server-side count";
        EXPECT_EQ(rs.all[0]->calls + rs.all[1]->calls, 40);
        EXPECT_EQ(r->counters().queued, 0u);
        co_await rs.stop();
    });
}

TEST(Router, AWaitingCallsDeadlinePassesAndAFullQueueRefusesWithOverloaded) {
    run_test([]() -> net::awaitable<void> {
        replicas rs(co_await net::this_coro::executor, 1);
        const router_options o{.max_concurrent = 1, .max_queued_calls = 1};
        auto r = co_await make(rs, o);
        channel ch(r);
        fan busy;
        busy.start(ch, 1, 1500);
        const auto t0 = clock_type::now();
        try {
            co_await ch.async_call<int>("work", 1, ordo::timeout(100ms));
            ADD_FAILURE() << "no error";
        } catch (const rpc_error& e) {
            EXPECT_EQ(e.code(), errc::timed_out);
            EXPECT_NE(std::string(e.what()).find("no replica had room within 100 ms"),
                      std::string::npos)
                << e.what();
        }
        EXPECT_LT(clock_type::now() - t0, 1400ms);
        fan queued;
        queued.start(ch, 1, 1);  // fills the queue
        try {
            co_await ch.async_call<int>("work", 1);
            ADD_FAILURE() << "no error";
        } catch (const rpc_error& e) {
            EXPECT_EQ(e.code(), errc::overloaded);
            EXPECT_NE(std::string(e.what()).find("max_queued_calls"), std::string::npos);
        }
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return busy.done + queued.done == 2; }));
        EXPECT_EQ(busy.by_replica[0] + queued.by_replica[0], 2);
        co_await rs.stop();
    });
}

TEST(Router, ACallMadeWhileOthersWaitNeverOvertakesThem) {
    run_test([]() -> net::awaitable<void> {
        replicas rs(co_await net::this_coro::executor, 1);
        const router_options o{.max_concurrent = 1};
        auto r = co_await make(rs, o);
        auto s = stub<replica_service>(channel(r));
        int done = 0;
        // 0 runs, 1 waits; 2 is made the moment 0 completes, when the replica has room again.
        s.seq("", 0, [&](std::error_code, int) {
            ++done;
            s.seq("", 2, [&](std::error_code, int) { ++done; });
        });
        s.seq("", 1, [&](std::error_code, int) { ++done; });
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return done == 3; }));
        EXPECT_EQ(rs.all[0]->log[""], (std::vector<int>{0, 1, 2}));
        co_await rs.stop();
    });
}

TEST(Router, AWeightedSplitOfNinetyToTenHoldsOverTenThousandCalls) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        replicas rs(ex, 2);
        auto r = make_router(ex, {.max_concurrent = 64, .policy = route_policy::weighted});
        co_await r->async_add_replica(rs.all[0]->url, 90, "stable");
        co_await r->async_add_replica(rs.all[1]->url, 10, "canary");
        channel ch(r);
        int done = 0, started = 0, failed = 0;
        std::function<void()> next = [&] {
            if (started == 10'000) return;
            ++started;
            ch.async_call<int>("whoami", [&](std::error_code ec, int) {
                ++done;
                if (ec) ++failed;
                next();
            });
        };
        for (int i = 0; i < 64; ++i) next();
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return done == 10'000; }, 60s));
        EXPECT_EQ(failed, 0);
        const double canary = rs.all[1]->calls / 10'000.0;
        EXPECT_NEAR(canary, 0.10, 0.02) << rs.all[0]->calls << " / " << rs.all[1]->calls;
        co_await rs.stop();
    });
}

TEST(Router, CallsWithOneKeyKeepTheirOrderOnOneReplicaWhileKeysSpreadOverFour) {
    run_test([]() -> net::awaitable<void> {
        replicas rs(co_await net::this_coro::executor, 4);
        // A small limit makes most keyed calls wait in the queue.
        const router_options o{.max_concurrent = 2};
        auto r = co_await make(rs, o);
        auto s = stub<replica_service>(channel(r));
        constexpr int keys = 40, per_key = 25;
        int done = 0, failed = 0;
        std::map<std::string, std::set<int>> served_by;
        for (int n = 0; n < per_key; ++n)
            for (int k = 0; k < keys; ++k) {
                const std::string key = "user-" + std::to_string(k);
                s.seq(key, n, ordo::key(key), [&, key](std::error_code ec, int id) {
                    ++done;
                    if (ec) ++failed;
                    served_by[key].insert(id);
                });
            }
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return done == keys * per_key; }));
        EXPECT_EQ(failed, 0);
        int replicas_used = 0;
        for (auto& srv : rs.all) {
            if (!srv->log.empty()) ++replicas_used;
            for (auto& [key, ns] : srv->log) {
                EXPECT_EQ(ns.size(), std::size_t(per_key)) << key << " split over replicas";
                EXPECT_TRUE(std::is_sorted(ns.begin(), ns.end())) << key << " out of order";
            }
        }
        for (auto& [key, ids] : served_by) EXPECT_EQ(ids.size(), 1u) << key;
        EXPECT_GE(replicas_used, 3) << "40 keys should spread over the ring";
        co_await rs.stop();
    });
}

TEST(Router, ShadowTrafficIsCountedAndItsResultsAndErrorsNeverReachCallers) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        replicas rs(ex, 1);
        replica_server shadow(ex, 99, /*failing=*/true);
        auto r = make_router(ex, {.shadow_group = "dark", .shadow_fraction = 0.5});
        co_await r->async_add_replica(rs.all[0]->url);
        co_await r->async_add_replica(shadow.url, 1, "dark");
        auto s = stub<replica_service>(channel(r));
        for (int i = 0; i < 100; ++i) EXPECT_EQ(co_await s.whoami(), 0);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] {
            const auto& c = r->counters();
            return c.shadow_ok + c.shadow_errors == c.shadow_sent;
        }));
        const auto& c = r->counters();
        EXPECT_EQ(c.shadow_sent + c.shadow_skipped, 50u);
        EXPECT_GT(c.shadow_sent, 0u);
        EXPECT_EQ(c.shadow_errors, c.shadow_sent);
        EXPECT_EQ(std::uint64_t(shadow.calls), c.shadow_sent);
        EXPECT_EQ(rs.all[0]->calls, 100);
        co_await rs.stop();
        co_await shadow.srv.async_stop();
    });
}

TEST(Router, AReplicaAddedAtRunTimeTakesLoadAndARemovedOneFinishesItsCalls) {
    run_test([]() -> net::awaitable<void> {
        replicas rs(co_await net::this_coro::executor, 2);
        const router_options o{.max_concurrent = 4};
        auto r = make_router(co_await net::this_coro::executor, o);
        co_await r->async_add_replica(rs.all[0]->url);
        channel ch(r);
        fan first;
        first.start(ch, 8, 10);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return first.done == 8; }));
        EXPECT_EQ(rs.all[1]->calls, 0);

        co_await r->async_add_replica(rs.all[1]->url);
        fan second;
        second.start(ch, 8, 200);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return rs.all[1]->in_flight > 0; }));
        EXPECT_TRUE(r->remove_replica(rs.all[1]->url));  // its calls in flight still finish
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return second.done == 8; }));
        EXPECT_EQ(second.by_replica.count(-1), 0u);
        EXPECT_EQ(second.by_replica[1], 4);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return r->replicas().size() == 1; }));
        fan third;
        third.start(ch, 8, 1);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return third.done == 8; }));
        EXPECT_EQ(third.by_replica[0], 8);
        EXPECT_FALSE(r->remove_replica("tcp://127.0.0.1:1"));
        co_await rs.stop();
    });
}

TEST(Router, AReplicaAddedWithoutWaitingTakesCallsOnceConnectedOrKeepsTryingWithAnEvent) {
    run_test([]() -> net::awaitable<void> {
        replicas rs(co_await net::this_coro::executor, 1);
        auto r = make_router(co_await net::this_coro::executor);
        std::vector<std::string> events;
        r->on_event([&](const std::string& e) { events.push_back(e); });
        r->add_replica(rs.all[0]->url);
        r->add_replica("tcp://127.0.0.1:1");  // nothing listens there
        // A call made while both connect waits for the one that comes up.
        auto s = stub<replica_service>(channel(r));
        EXPECT_EQ(co_await s.whoami(), 0);
        // A refused connection is reported at once, not after connect_timeout (10 s), and the
        // replica stays a member, trying again with backoff.
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return events.size() >= 3; }, 5s));
        std::string all;
        for (auto& e : events) all += e + "\n";
        EXPECT_NE(all.find("replica " + rs.all[0]->url + " added"), std::string::npos) << all;
        EXPECT_NE(all.find("replica tcp://127.0.0.1:1 cannot connect: "), std::string::npos) << all;
        EXPECT_NE(all.find("replica tcp://127.0.0.1:1 still down: "), std::string::npos) << all;
        const auto reps = r->replicas();
        ORDO_CO_ASSERT_EQ(reps.size(), 2u);
        EXPECT_EQ(reps[0].state, replica_state::ready);
        EXPECT_EQ(reps[1].state, replica_state::reconnecting);
        EXPECT_NE(reps[1].last_error.find("refused"), std::string::npos) << reps[1].last_error;
        // Calls go to the one that is up meanwhile.
        for (int i = 0; i < 10; ++i) EXPECT_EQ(co_await s.whoami(), 0);
        EXPECT_TRUE(r->remove_replica("tcp://127.0.0.1:1"));
        EXPECT_EQ(r->replicas().size(), 1u);
        co_await rs.stop();
    });
}

TEST(Router, WithNoReplicaLeftCallsFailAtOnceWithPeerLostNamingTheLastLoss) {
    run_test([]() -> net::awaitable<void> {
        replicas rs(co_await net::this_coro::executor, 1);
        const router_options o{.max_concurrent = 1};
        auto r = co_await make(rs, o);
        channel ch(r);
        fan f;
        f.start(ch, 3, 5000);  // one in flight, two waiting
        co_await rs.stop();    // the replica goes away
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return f.done == 3; }, 10s));
        EXPECT_EQ(f.by_replica[-1], 3);
        try {
            co_await ch.async_call<int>("whoami");
            ADD_FAILURE() << "no error";
        } catch (const rpc_error& e) {
            EXPECT_EQ(e.code(), errc::peer_lost);
            EXPECT_NE(std::string(e.what()).find("no live replica"), std::string::npos) << e.what();
            EXPECT_NE(std::string(e.what()).find(rs.all[0]->url), std::string::npos) << e.what();
        }
        EXPECT_EQ(r->counters().replicas_lost, 1u);
    });
}

TEST(Router, AUrlBuildsARouterAndBadParametersAreRefusedByName) {
    run_test([]() -> net::awaitable<void> {
        replicas rs(co_await net::this_coro::executor, 2);
        const std::string hosts = rs.all[0]->url.substr(6) + "," + rs.all[1]->url.substr(6);
        channel ch = co_await async_connect("route+tcp://" + hosts +
                                            "?max_concurrent=3&policy=round_robin&timeout_ms=5000");
        auto s = stub<replica_service>(ch);
        std::set<int> ids;
        for (int i = 0; i < 4; ++i) ids.insert(co_await s.whoami());
        EXPECT_EQ(ids.size(), 2u);
        EXPECT_EQ(ch.remote_address(), "route:" + rs.all[0]->url + "," + rs.all[1]->url);

        route_spec spec = parse_route_url(
            "route+tcp://a:1,b:2?weights=9,1&idempotent=inc,total"
            "&shadow=c:3&shadow_fraction=0.25&aperture=all",
            peer_options{});
        EXPECT_FALSE(spec.options.aperture);
        EXPECT_TRUE(parse_route_url("route+tcp://a:1?aperture=adaptive", {}).options.aperture);
        ORDO_CO_ASSERT_EQ(spec.replicas.size(), 3u);
        EXPECT_EQ(spec.replicas[0].url, "tcp://a:1");
        EXPECT_EQ(spec.replicas[0].weight, 9);
        EXPECT_EQ(spec.replicas[2].group, "shadow");
        EXPECT_EQ(spec.options.shadow_fraction, 0.25);
        EXPECT_EQ(spec.options.idempotent_methods.count("total"), 1u);
        for (const char* bad : {"route+tcp://" "a:1?policy=random", "route+tcp://a:1?bogus=1",
                                "route+tcp://a:1?aperture=2", "route+tcp://a:1,b:2?weights=1",
                                "route+tcp://a:1,?x=", "route+tcp://a?max_concurrent=1"}) {
            try {
                parse_route_url(bad, peer_options{});
                ADD_FAILURE() << bad << " was accepted";
            } catch (const std::system_error& e) {
                EXPECT_EQ(e.code(), errc::bad_address) << bad;
            }
        }
        co_await rs.stop();
    });
}

// Replicas for the aperture: `step` is serial on each connection. Sharing, they share one CPU
// the way replicas of one machine do: a call costs 0.1 ms of the test's one thread, and 2 ms
// more when the previous call ran on another replica (its wake-up and cold caches), so that
// spreading slows calls. Apart, a call waits 2 ms on a timer: replicas work in parallel, so
// that spreading speeds calls up.
struct shared_cpu {
    bool sharing = true;
    int last = -1;
    std::vector<std::unique_ptr<server>> servers;
    std::vector<std::string> urls;
    shared_cpu(net::any_io_executor ex, int n) {
        for (int id = 0; id < n; ++id) {
            auto s = std::make_unique<server>(ex);
            s->on(replica_service{}.work, [this, id](int) -> net::awaitable<int> {
                if (sharing) {
                    std::this_thread::sleep_for(last == id ? 100us : 2100us);
                    last = id;
                } else {
                    co_await sleep_for(2ms);
                }
                co_return id;
            });
            urls.push_back(s->listen("tcp://127.0.0.1:0"));
            servers.push_back(std::move(s));
        }
    }
    net::awaitable<void> stop() {
        for (auto& s : servers) co_await s->async_stop();
    }
};

// Keeps `width` calls of work in flight until stopped, or until `limit` calls have been made.
struct closed_loop {
    closed_loop(const channel& ch, int width, int limit) : ch(ch), width(width), limit(limit) {}
    const channel& ch;
    int width, limit;
    int started = 0, done = 0, failed = 0;
    bool stopping = false;
    std::map<int, int> by_replica;
    void start() {
        for (int i = 0; i < width; ++i) next();
    }
    void next() {
        if (stopping || started >= limit) return;
        ++started;
        ch.async_call<int>("work", 0, [this](std::error_code ec, int id) {
            ++done;
            if (ec) ++failed;
            ++by_replica[ec ? -1 : id];
            next();
        });
    }
    net::awaitable<bool> stop() {
        stopping = true;
        co_return co_await wait_until([&] { return done == started; }, 30s);
    }
};

TEST(Router, TheApertureNarrowsWhileSpreadingSlowsCallsAndWidensWhenSpreadingSpeedsThemUp) {
    run_test([]() -> net::awaitable<void> {
        shared_cpu rs(co_await net::this_coro::executor, 3);
        const router_options o{.max_concurrent = 16};
        auto r = make_router(co_await net::this_coro::executor, o);
        std::vector<std::string> events;
        r->on_event([&](const std::string& e) { events.push_back(e); });
        for (auto& u : rs.urls) co_await r->async_add_replica(u);
        EXPECT_EQ(r->counters().aperture, 3u);  // it starts at every replica
        channel ch(r);
        closed_loop loop{ch, 12, 200'000};
        loop.start();
        // Sharing a CPU: one replica answers faster than two or three (kept twice).
        ORDO_CO_ASSERT_TRUE(co_await wait_until(
            [&] { return r->counters().aperture == 1 && r->counters().aperture_changes >= 2; },
            120s));
        EXPECT_TRUE(std::any_of(events.begin(), events.end(), [](const std::string& e) {
            return e.find("aperture 2 -> 1 replicas: calls took") != std::string::npos;
        }));
        EXPECT_GE(r->counters().aperture_trials, r->counters().aperture_changes);
        ORDO_CO_ASSERT_TRUE(co_await loop.stop());
        // Beyond the aperture's room, calls go to the others at once: none waits in the queue.
        // (16 on the aperture's replica, 12 on each of the others; or 16, 16 and 8 if a trial
        // of two is on. Spread over all three, none would have 16.)
        fan f;
        f.start(ch, 40, 0);
        std::size_t most = 0, total = 0;
        for (auto& rc : r->replicas()) {
            EXPECT_GT(rc.in_flight, 0u) << rc.url;
            most = std::max(most, rc.in_flight);
            total += rc.in_flight;
        }
        EXPECT_EQ(most, 16u);
        EXPECT_EQ(total, 40u);
        EXPECT_EQ(r->counters().queued, 0u);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return f.done == 40; }, 30s));
        EXPECT_EQ(f.by_replica.count(-1), 0u);
        // Apart: each replica added answers calls sooner, and the aperture opens again.
        rs.sharing = false;
        const auto changes = r->counters().aperture_changes;
        loop.stopping = false;
        loop.width = 12;
        loop.limit = loop.started + 200'000;
        loop.by_replica.clear();
        loop.start();
        ORDO_CO_ASSERT_TRUE(co_await wait_until(
            [&] {
                return r->counters().aperture == 3 && r->counters().aperture_changes >= changes + 2;
            },
            120s));
        const int before = loop.done;
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return loop.done >= before + 300; }, 30s));
        ORDO_CO_ASSERT_TRUE(co_await loop.stop());
        EXPECT_EQ(loop.failed, 0);
        for (int id = 0; id < 3; ++id) EXPECT_GT(loop.by_replica[id], 0) << id;
        co_await rs.stop();
    }, 360s);
}

// Calls one at a time, whose time falls with every call whichever replica runs them: the
// router feeds its aperture the calls' real times, and trials run on live calls without failing
// any. Whether a trial keeps its size depends on times a busy machine bends: that the drift
// moves nothing is aperture_test.cpp's TrialsDoNotTakeCallsGettingFasterForAFasterSize, on a
// simulated clock.
TEST(Router, ApertureTrialsRunOnLiveCallsAndFailNone) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        double cost_us = 3000;
        std::vector<std::unique_ptr<server>> servers;
        auto r = make_router(ex, router_options{});
        std::vector<std::string> events;
        r->on_event([&](const std::string& e) { events.push_back(e); });
        for (int id = 0; id < 3; ++id) {
            auto s = std::make_unique<server>(ex);
            s->on(replica_service{}.work, [&cost_us, id](int) -> net::awaitable<int> {
                const auto took = std::chrono::microseconds(std::lround(cost_us));
                cost_us = std::max(500.0, cost_us * 0.99);
                net::steady_timer t(co_await net::this_coro::executor, took);
                co_await t.async_wait(net::use_awaitable);
                co_return id;
            });
            co_await r->async_add_replica(s->listen("tcp://127.0.0.1:0"));
            servers.push_back(std::move(s));
        }
        channel ch(r);
        closed_loop loop{ch, 1, 2500};
        loop.start();
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return loop.done == 2500; }, 120s));
        EXPECT_EQ(loop.failed, 0);
        EXPECT_GE(r->counters().aperture_trials, 2u);
        EXPECT_GE(r->counters().aperture_trials, r->counters().aperture_changes);
        EXPECT_EQ(r->counters().aperture_changes,
                  std::count_if(events.begin(), events.end(), [](const std::string& e) {
                      return e.rfind("aperture ", 0) == 0;
                  }));
        for (auto& s : servers) co_await s->async_stop();
    }, 300s);
}

TEST(Router, WithTheApertureAtAllCallsSpreadOverEveryReplicaEvenWhenThatSlowsThem) {
    run_test([]() -> net::awaitable<void> {
        shared_cpu rs(co_await net::this_coro::executor, 3);
        const router_options o{.aperture = false};
        auto r = make_router(co_await net::this_coro::executor, o);
        for (auto& u : rs.urls) co_await r->async_add_replica(u);
        channel ch(r);
        // About 3 s of calls sharing the CPU: the adaptive aperture is at 1 well within that.
        closed_loop loop{ch, 12, 6000};
        loop.start();
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return loop.done == 6000; }, 120s));
        EXPECT_EQ(loop.failed, 0);
        for (int id = 0; id < 3; ++id) EXPECT_GE(loop.by_replica[id], 1000) << id;
        EXPECT_EQ(r->counters().aperture, 3u);
        EXPECT_EQ(r->counters().aperture_changes, 0u);
        co_await rs.stop();
    }, 180s);
}

// An ordo-inc-server process (killed by PID) as a replica.
TEST(Router, UrlsNameTheirSourceAndItsParametersAndBadOnesAreRefusedByName) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        const peer_options none{};
        auto spec = parse_route_url(
            "route+dns+tcp://svc.test:7000?dns_server=127.0.0.1:5353&refresh_ms=300"
            "&reconnect_ms=50&reconnect_max_ms=800&eject_after=3&eject_ms=100&eject_max_ms=900"
            "&max_ejected_percent=30&wait_for_replica_ms=2500",
            none);
        EXPECT_TRUE(spec.replicas.empty());
        ORDO_CO_ASSERT_TRUE(bool(spec.source));
        EXPECT_EQ(spec.source(ex)->describe().rfind("dns:svc.test", 0), 0u)
            << spec.source(ex)->describe();
        EXPECT_EQ(spec.options.reconnect_initial, 50ms);
        EXPECT_EQ(spec.options.reconnect_max, 800ms);
        EXPECT_EQ(spec.options.eject_after, 3u);
        EXPECT_EQ(spec.options.eject_base, 100ms);
        EXPECT_EQ(spec.options.eject_max, 900ms);
        EXPECT_EQ(spec.options.max_ejected_percent, 30u);
        EXPECT_EQ(spec.options.wait_for_replica, 2500ms);
        spec = parse_route_url("route+dns+tls://_ordo._tcp.svc.test?ca=ca.pem", none);
        EXPECT_NE(spec.source(ex)->describe().find("_ordo._tcp.svc.test"), std::string::npos);
        spec = parse_route_url("route+file:///etc/ordo/replicas", none);
        EXPECT_NE(spec.source(ex)->describe().find("/etc/ordo/replicas"), std::string::npos);
        spec = parse_route_url("route+etcd://127.0.0.1:2379/ordo/svc/", none);
        EXPECT_NE(spec.source(ex)->describe().find("/ordo/svc/"), std::string::npos);
        for (const char* bad :
             {"route+dns+tcp://svc.test", "route+dns+tcp://svc.test:0", "route+dns+tcp://:7000",
              "route+dns+bogus://svc.test:7000", "route+dns+tcp://svc.test:7000?weights=1",
              "route+file://relative/path", "route+etcd://127.0.0.1:2379",
              "route+etcd://127.0.0.1:2379/", "route+tcp://a:1?dns_server=127.0.0.1"}) {
            try {
                parse_route_url(bad, none);
                ADD_FAILURE() << bad << " was accepted";
            } catch (const std::system_error& e) {
                EXPECT_EQ(e.code(), errc::bad_address) << bad;
                EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << bad << ": " << e.what();
            }
        }
        co_return;
    });
}

struct replica_process {
    std::string url;
    test::child* proc;
    void kill() const { proc->signal(SIGKILL); }
};

// A replica whose connection ends cleanly (an end of stream, as from a process that died with
// nothing unread) while calls are in flight on it and others wait: its calls fail at once,
// it is lost at once, and the waiting calls go to the other replica, none to it.
TEST(Router, AReplicaWhoseStreamEndsIsLostAtOnceAndTheWaitingCallsMove) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        replicas rs(ex, 1);
        // A replica that reads the calls sent to it, answers none, and closes once it has
        // read two requests and nothing more came for 200 ms: a FIN, not a reset.
        net::ip::tcp::acceptor acc(ex, {net::ip::make_address("127.0.0.1"), 0});
        const std::string fin_url = "tcp://127.0.0.1:" + std::to_string(acc.local_endpoint().port());
        std::size_t requests = 0;
        net::co_spawn(
            ex,
            [&]() -> net::awaitable<void> {
                auto sock = co_await acc.async_accept(net::use_awaitable);
                acc.close();  // the router's reconnects are refused
                msgpack::unpacker u;
                for (;;) {
                    net::steady_timer quiet(sock.get_executor(), 200ms);
                    u.reserve_buffer(4096);
                    using namespace net::experimental::awaitable_operators;
                    auto got = co_await (
                        sock.async_read_some(net::buffer(u.buffer(), 4096),
                                             use_tuple) ||
                        quiet.async_wait(use_tuple));
                    if (got.index() == 1) {
                        if (requests >= 2) break;
                        continue;
                    }
                    auto [ec, n] = std::get<0>(got);
                    if (ec) co_return;
                    u.buffer_consumed(n);
                    msgpack::object_handle h;
                    while (u.next(h)) {
                        const auto& m = h.get();  // [0, msgid, "work", [ms]]; pings aside
                        if (m.via.array.size == 4 && m.via.array.ptr[0].as<int>() == 0 &&
                            m.via.array.ptr[2].as<std::string>() == "work")
                            ++requests;
                    }
                }
                sock.shutdown(net::ip::tcp::socket::shutdown_both);
                sock.close();
            },
            net::detached);
        const router_options o{.max_concurrent = 2, .policy = route_policy::round_robin};
        auto r = make_router(ex, o);
        co_await r->async_add_replica(fin_url);
        co_await r->async_add_replica(rs.all[0]->url);
        channel ch(r);
        // 2 s calls: the other replica is still busy with its two when the stream ends, so
        // that the two waiting could only go to the replica that ended, if it were not lost.
        fan f;
        f.start(ch, 6, 2000);
        EXPECT_EQ(r->counters().queued, 2u);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return f.done == 6; }, 30s));
        // The two sent to it fail; the two waiting, and the two on the other, succeed there.
        EXPECT_EQ(f.by_replica[-1], 2);
        EXPECT_EQ(f.by_replica[0], 4);
        for (auto& ec : f.errors) EXPECT_EQ(ec, errc::peer_lost);
        EXPECT_EQ(requests, 2u);
        EXPECT_EQ(r->counters().replicas_lost, 1u);
        r->close();
        co_await rs.stop();
    });
}

TEST(Router, AKilledReplicasQueuedCallsMoveItsIdempotentCallsRetryAndTheRestFail) {
    std::unique_ptr<test::child> a_proc, b_proc;
    const replica_process a{test::start_server(a_proc), a_proc.get()};
    const replica_process b{test::start_server(b_proc), b_proc.get()};
    run_test([&]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        // Two routers over the same two replicas: one marks sleep_ms idempotent.
        router_options plain{.max_concurrent = 2, .policy = route_policy::round_robin};
        router_options retrying = plain;
        retrying.idempotent_methods = {"sleep_ms"};
        auto r1 = make_router(ex, plain), r2 = make_router(ex, retrying);
        std::vector<std::string> events;
        clock_type::time_point lost_at{};
        r1->on_event([&](const std::string& e) {
            events.push_back(e);
            if (e.find(" lost: ") != std::string::npos) lost_at = clock_type::now();
        });
        for (auto* r : {&r1, &r2}) {
            co_await (*r)->async_add_replica(a.url);
            co_await (*r)->async_add_replica(b.url);
        }
        // sleep_ms is serial on the server: 2 in flight on each replica, 2 waiting, for each
        // router; and keyed calls whose key lives on a, waiting for a's room.
        std::string key_on_a;
        for (int i = 0; i < 1000 && key_on_a.empty(); ++i) {
            co_await channel(r1).async_call<int>("inc", 1, ordo::key("k" + std::to_string(i)));
            for (auto& rc : r1->replicas())
                if (rc.url == a.url && rc.completed == 1) key_on_a = "k" + std::to_string(i);
        }
        ORDO_CO_ASSERT_TRUE(!key_on_a.empty());
        fan f1, f2;
        f1.start(channel(r1), 6, 400, "sleep_ms");
        f2.start(channel(r2), 6, 400, "sleep_ms");
        int keyed_ok = 0, keyed_failed = 0;
        for (int i = 0; i < 3; ++i)
            channel(r1).async_call<int>("inc", i, ordo::key(key_on_a),
                                        [&](std::error_code ec, int) { ++(ec ? keyed_failed : keyed_ok); });
        EXPECT_EQ(r1->counters().queued, 5u);
        const auto killed_at = clock_type::now();
        a.kill();
        ORDO_CO_ASSERT_TRUE(co_await wait_until(
            [&] { return f1.done == 6 && f2.done == 6 && keyed_ok + keyed_failed == 3; }, 20s));
        // Not idempotent: the two in flight on a fail, naming a; the rest ran on b.
        EXPECT_EQ(f1.by_replica[-1], 2);
        for (auto& ec : f1.errors) EXPECT_EQ(ec, errc::peer_lost);
        // Idempotent: all succeed, two of them on their second try.
        EXPECT_EQ(f2.by_replica[-1], 0);
        EXPECT_EQ(r2->counters().retried, 2u);
        // Keyed calls waiting for a moved to b.
        EXPECT_EQ(keyed_ok, 3);
        EXPECT_EQ(r1->counters().replicas_lost, 1u);
        // a stays a member, out of the ring, trying to connect again.
        const auto reps = r1->replicas();
        ORDO_CO_ASSERT_EQ(reps.size(), 2u);
        EXPECT_EQ(reps[0].url, a.url);
        EXPECT_EQ(reps[0].state, replica_state::reconnecting);
        EXPECT_FALSE(reps[0].live);
        EXPECT_EQ(reps[1].url, b.url);
        EXPECT_EQ(reps[1].state, replica_state::ready);
        EXPECT_NE(lost_at, clock_type::time_point{});
        const auto failover_ms =
            std::chrono::duration_cast<std::chrono::milliseconds>(lost_at - killed_at).count();
        EXPECT_LT(failover_ms, 5000);
        std::printf("failover: replica removed %lld ms after SIGKILL\n",
                    static_cast<long long>(failover_ms));
        try {
            co_await channel(r1).async_call<int>("sleep_ms", 1000, ordo::key(key_on_a));
        } catch (const rpc_error& e) {
            ADD_FAILURE() << e.what();
        }
        r1->close();
        r2->close();
    });
}

TEST(Router, AnInFlightCallOnAKilledReplicaNamesThatReplica) {
    std::unique_ptr<test::child> a_proc, b_proc;
    const replica_process a{test::start_server(a_proc), a_proc.get()};
    const replica_process b{test::start_server(b_proc), b_proc.get()};
    run_test([&]() -> net::awaitable<void> {
        const router_options o{.policy = route_policy::round_robin};
        auto r = make_router(co_await net::this_coro::executor, o);
        co_await r->async_add_replica(a.url);
        co_await r->async_add_replica(b.url);
        channel ch(r);
        std::string what;
        bool done = false;
        ch.async_call<int>("sleep_ms", 5000, [&](std::error_code, int) {});  // to a
        co_spawn(co_await net::this_coro::executor,
                 [&]() -> net::awaitable<void> {
                     try {
                         co_await ch.async_call<int>("sleep_ms", 5000);  // to b
                     } catch (const rpc_error& e) {
                         what = e.what();
                     }
                     done = true;
                 },
                 net::detached);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] {
            for (auto& rc : r->replicas())
                if (rc.in_flight == 0) return false;
            return true;
        }));
        b.kill();
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return done; }, 10s));
        EXPECT_NE(what.find("peer lost"), std::string::npos) << what;
        EXPECT_NE(what.find("replica " + b.url), std::string::npos) << what;
        EXPECT_NE(what.find("call sleep_ms"), std::string::npos) << what;
        r->close();
    });
}

// A closed router lets go at once of the work it started: a connection attempt that hangs (a
// listener whose accept queue is full drops the SYN) is cancelled, and the router is freed
// long before its connect_timeout.
TEST(Router, ClosingCancelsAConnectionAttemptThatHangsAndFreesTheRouter) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        test::silent_listener silent(ex);
        ORDO_CO_ASSERT_TRUE(co_await silent.fill());
        router_options o;
        o.connect_timeout = 120s;
        auto r = make_router(ex, o);
        std::weak_ptr<router> w = r;
        r->add_replica(silent.url());
        co_await sleep_for(200ms);
        ORDO_CO_ASSERT_EQ(r->replicas().at(0).state, replica_state::connecting);
        r->close();
        r.reset();
        EXPECT_TRUE(co_await wait_until([&] { return w.expired(); }, 10s))
            << "the router is still held by its connection attempt";
    });
}

// A router whose last handle goes while it dials (no close()) closes then, not when the dial
// would have ended: the call waiting for a replica fails with closed at once.
TEST(Router, DroppedWhileDialingItClosesAtOnceAndFailsTheWaitingCall) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        test::silent_listener silent(ex);
        ORDO_CO_ASSERT_TRUE(co_await silent.fill());
        router_options o;
        o.connect_timeout = 120s;
        o.wait_for_replica = 120s;
        auto r = make_router(ex, o);
        r->add_replica(silent.url());
        std::optional<std::error_code> heard;
        channel(r).async_call<int>("inc", 1, [&](std::error_code ec, int) { heard = ec; });
        co_await sleep_for(200ms);
        ORDO_CO_ASSERT_EQ(r->replicas().at(0).state, replica_state::connecting);
        r.reset();
        EXPECT_TRUE(co_await wait_until([&] { return heard.has_value(); }, 30s))
            << "the dropped router kept its call waiting for its dial";
        ORDO_CO_ASSERT_TRUE(heard.has_value());
        EXPECT_EQ(*heard, errc::closed) << heard->message();
    });
}

// A replica that could never connect as the router's options ask (a resumable session over
// zmq+, which ZeroMQ's own reconnects would make lossy) is refused by name as it is added, not
// tried again and again in the connect loop.
TEST(Router, AReplicaThatCannotKeepASessionIsRefusedAsItIsAdded) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        router_options o;
        o.peer.resume = 5s;
        auto r = make_router(ex, o);
        std::vector<std::string> events;
        r->on_event([&](const std::string& e) { events.push_back(e); });
        r->add_replica("zmq+tcp://127.0.0.1:9");
        EXPECT_TRUE(r->replicas().empty());
        ORDO_CO_ASSERT_EQ(events.size(), 1u);
        EXPECT_NE(events[0].find("replica zmq+tcp://127.0.0.1:9 not added"), std::string::npos)
            << events[0];
        EXPECT_NE(events[0].find("resume_ms is not supported over zmq+"), std::string::npos)
            << events[0];
        try {
            co_await r->async_add_replica("zmq+tcp://127.0.0.1:9");
            ADD_FAILURE() << "added";
        } catch (const std::system_error& e) {
            EXPECT_EQ(e.code(), errc::bad_address) << e.what();
        }
        EXPECT_TRUE(r->replicas().empty());
        r->close();
    });
}

}  // namespace
}  // namespace ordo
