// One test body for both modes: what a call site sees does not depend on ordered or pooled.
// Then what differs: head-of-line blocking, connection reuse and limits of the pool. Last, a
// struct of the user's own (MSGPACK_DEFINE) as an argument and a result.
#include "ordo/ordo.hpp"

#include <algorithm>
#include <set>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "support/run_test.hpp"
#include "support/silent_listener.hpp"
#include "support/sleep.hpp"

namespace ordo {
namespace {

using namespace std::chrono_literals;
using test::run_test;
using test::sleep_for;
using test::wait_until;

struct service : interface {
    method<int(int)> inc{"inc"};
    method<int(int)> sleep_ms{"sleep_ms"};
    method<int(std::string)> fail{"fail"};
};

struct fixture {
    explicit fixture(net::any_io_executor ex, std::string listen_url = "tcp://127.0.0.1:0")
        : srv(ex) {
        srv.on(service{}.inc, [](int x) { return x + 1; });
        srv.on(service{}.sleep_ms,
               [this](int ms) -> net::awaitable<int> {
                   try {
                       co_await sleep_for(std::chrono::milliseconds(ms));
                   } catch (const std::system_error&) {
                       ++cancelled;
                       throw;
                   }
                   co_return ms;
               },
               {.concurrent = true});
        srv.on(service{}.fail, [](std::string why) -> int { throw std::runtime_error(why); });
        srv.on("echo", [](msgpack::object v) { return v; });
        url = srv.listen(listen_url);
    }
    server srv;
    std::string url;
    int cancelled = 0;
};

class BothModes : public ::testing::TestWithParam<std::string> {
  protected:
    std::string with_mode(const std::string& url) const { return url + GetParam(); }
};

TEST_P(BothModes, CallsErrorsDeadlinesAndStubsBehaveTheSame) {
    run_test([this]() -> net::awaitable<void> {
        fixture f(co_await net::this_coro::executor);
        ordo::channel ch = co_await async_connect(with_mode(f.url));
        auto s = stub<service>(ch);

        EXPECT_EQ(co_await s.inc(1), 2);
        EXPECT_EQ(co_await ch.async_call<int>("inc", 41), 42);
        auto [ec, v] = co_await s.inc(2, net::experimental::as_tuple(net::use_awaitable));
        EXPECT_FALSE(ec);
        EXPECT_EQ(v, 3);

        try {
            co_await s.fail("frozen");
            ADD_FAILURE() << "no error";
        } catch (const rpc_error& e) {
            EXPECT_EQ(e.code(), errc::remote_error);
            EXPECT_EQ(e.detail(), "frozen");
            EXPECT_EQ(e.method(), "fail");
        }
        try {
            co_await ch.async_call<int>("nope");
            ADD_FAILURE() << "no error";
        } catch (const rpc_error& e) {
            EXPECT_EQ(e.code(), errc::method_not_found);
        }
        try {
            co_await s.sleep_ms(30'000, timeout(50ms));
            ADD_FAILURE() << "no timeout";
        } catch (const rpc_error& e) {
            EXPECT_EQ(e.code(), errc::timed_out);
        }
        EXPECT_TRUE(co_await wait_until([&] { return f.cancelled == 1; }));

        // Many calls at once, all matched.
        int ok = 0;
        for (int i = 0; i < 200; ++i)
            s.inc(i, [&, i](std::error_code e, int r) { ok += !e && r == i + 1; });
        EXPECT_TRUE(co_await wait_until([&] { return ok == 200; }));

        // Notifications go through in either mode.
        long total = 0;
        f.srv.on("add", [&](int x) { total += x; });
        for (int i = 0; i < 10; ++i) ch.notify("add", 1);
        EXPECT_TRUE(co_await wait_until([&] { return total == 10; }));
        co_await f.srv.async_stop();
    });
}

INSTANTIATE_TEST_SUITE_P(OrderedAndPooled, BothModes,
                         ::testing::Values("", "?mode=pooled&max_connections=4"),
                         [](const auto& info) {
                             return info.param.empty() ? std::string("ordered")
                                                       : std::string("pooled");
                         });

// A small call made right after a 64 MiB echo: behind it on an ordered channel, ahead of it on a
// pooled one.
net::awaitable<bool> small_call_finishes_first(const std::string& url) {
    auto ch = co_await async_connect(url);
    co_await ch.async_call<int>("inc", 0);  // connected and warm
    const std::string big(64 << 20, 'x');
    int order = 0, big_done = 0, small_done = 0;
    ch.async_call<std::string>("echo", big, [&](std::error_code e, std::string r) {
        EXPECT_FALSE(e) << e.message();
        EXPECT_EQ(r.size(), big.size());
        big_done = ++order;
    });
    ch.async_call<int>("inc", 1, [&](std::error_code e, int r) {
        EXPECT_FALSE(e) << e.message();
        EXPECT_EQ(r, 2);
        small_done = ++order;
    });
    EXPECT_TRUE(co_await wait_until([&] { return order == 2; }, 120s));
    co_return small_done < big_done;
}

TEST(HeadOfLine, ASmallCallWaitsBehindA64MiBCallWhenOrdered) {
    run_test(
        []() -> net::awaitable<void> {
            fixture f(co_await net::this_coro::executor);
            EXPECT_FALSE(co_await small_call_finishes_first(f.url));
            co_await f.srv.async_stop();
        },
        std::chrono::seconds(180));
}

TEST(HeadOfLine, ASmallCallOvertakesA64MiBCallWhenPooled) {
    run_test(
        []() -> net::awaitable<void> {
            fixture f(co_await net::this_coro::executor);
            EXPECT_TRUE(co_await small_call_finishes_first(f.url + "?mode=pooled"));
            co_await f.srv.async_stop();
        },
        std::chrono::seconds(180));
}

TEST(Pool, AThousandSequentialCallsUseOneConnection) {
    run_test([]() -> net::awaitable<void> {
        fixture f(co_await net::this_coro::executor);
        auto s = stub<service>(co_await async_connect(f.url + "?mode=pooled"));
        for (int i = 0; i < 1000; ++i) ORDO_CO_ASSERT_EQ(co_await s.inc(i), i + 1);
        EXPECT_EQ(f.srv.connections_accepted(), 1u);
        co_await f.srv.async_stop();
    });
}

// A closed pool lets go at once of a connection attempt that hangs: the call waiting for it
// fails with closed, and the pool is freed long before its connect_timeout.
TEST(Pool, ClosingCancelsAConnectionAttemptThatHangsAndFreesThePool) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        test::silent_listener silent(ex);
        ORDO_CO_ASSERT_TRUE(co_await silent.fill());
        pool_options o;
        o.connect_timeout = std::chrono::seconds(120);
        auto p = make_pool(ex, silent.url(), o);
        std::weak_ptr<pool> w = p;
        channel ch(p);
        std::error_code heard;
        bool done = false;
        ch.async_call<int>("inc", 1, [&](std::error_code ec, int) {
            heard = ec;
            done = true;
        });
        co_await sleep_for(std::chrono::milliseconds(200));
        ORDO_CO_ASSERT_EQ(p->counters().connecting, 1u);
        p->close();
        ch = channel();
        p.reset();
        EXPECT_TRUE(
            co_await wait_until([&] { return done && w.expired(); }, std::chrono::seconds(10)))
            << "the pool is still held by its connection attempt";
        EXPECT_EQ(heard, errc::closed);
    });
}

// A pool whose last handle goes while it dials (no close()): it closes then, not when the
// dial would have ended. The notification waiting for the dial is reported undelivered at once
// (closed), the dial ends, and nothing the pool started keeps it open.
TEST(Pool, DroppedWhileDialingItClosesAtOnceAndReportsItsWaitingNotification) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        test::silent_listener silent(ex);
        ORDO_CO_ASSERT_TRUE(co_await silent.fill());
        pool_options o;
        o.connect_timeout = std::chrono::seconds(120);
        std::vector<undelivered_notification> lost;
        o.peer.on_undelivered = [&](const undelivered_notification& u) { lost.push_back(u); };
        auto p = make_pool(ex, silent.url(), o);
        channel(p).notify("note", 1);
        co_await sleep_for(std::chrono::milliseconds(200));
        ORDO_CO_ASSERT_EQ(p->counters().connecting, 1u);
        p.reset();
        EXPECT_TRUE(co_await wait_until([&] { return !lost.empty(); }, std::chrono::seconds(30)))
            << "the dropped pool kept its notification waiting for its dial";
        ORDO_CO_ASSERT_EQ(lost.size(), 1u);
        EXPECT_EQ(lost[0].method, "note");
        EXPECT_EQ(lost[0].code, errc::closed) << lost[0].reason;
    });
}

TEST(Pool, SixtyFourConcurrentCallsNeverOpenMoreThanMaxConnections) {
    run_test([]() -> net::awaitable<void> {
        fixture f(co_await net::this_coro::executor);
        auto ch = co_await async_connect(f.url + "?mode=pooled&max_connections=4");
        auto& p = static_cast<pool&>(*ch.impl());
        auto s = stub<service>(ch);
        int ok = 0;
        std::size_t most_open = 0, most_peers = 0;
        for (int i = 0; i < 64; ++i)
            s.sleep_ms(20, [&](std::error_code e, int r) { ok += !e && r == 20; });
        EXPECT_TRUE(co_await wait_until([&] {
            most_open = std::max(most_open, p.counters().open + p.counters().connecting);
            most_peers = std::max(most_peers, f.srv.peer_count());
            return ok == 64;
        }));
        EXPECT_LE(most_open, 4u);
        EXPECT_LE(most_peers, 4u);
        EXPECT_LE(f.srv.connections_accepted(), 4u);
        EXPECT_EQ(p.counters().queued_calls, 0u);
        co_await f.srv.async_stop();
    });
}

TEST(Pool, ACallWhoseDeadlinePassesWhileQueuedFailsWithTimedOut) {
    run_test([]() -> net::awaitable<void> {
        fixture f(co_await net::this_coro::executor);
        auto ch = co_await async_connect(f.url + "?mode=pooled&max_connections=1");
        auto& p = static_cast<pool&>(*ch.impl());
        auto s = stub<service>(ch);
        std::optional<std::error_code> busy;
        s.sleep_ms(2000, [&](std::error_code e, int) { busy = e; });  // holds the one connection
        EXPECT_TRUE(co_await wait_until([&] { return f.srv.peer_count() == 1; }));
        try {
            co_await s.inc(1, timeout(100ms));
            ADD_FAILURE() << "no timeout";
        } catch (const rpc_error& e) {
            EXPECT_EQ(e.code(), errc::timed_out);
            EXPECT_NE(std::string(e.what()).find("became free"), std::string::npos) << e.what();
        }
        EXPECT_EQ(p.counters().queued_calls, 0u);
        EXPECT_TRUE(co_await wait_until([&] { return busy.has_value(); }));
        EXPECT_FALSE(*busy);
        EXPECT_EQ(co_await s.inc(1), 2);
        co_await f.srv.async_stop();
    });
}

TEST(Pool, AFailedOrCancelledCallsConnectionIsClosedNotReused) {
    run_test([]() -> net::awaitable<void> {
        fixture f(co_await net::this_coro::executor);
        auto ch = co_await async_connect(f.url + "?mode=pooled");
        auto& p = static_cast<pool&>(*ch.impl());
        auto s = stub<service>(ch);
        EXPECT_EQ(co_await s.inc(1), 2);
        auto [ec, v] = co_await s.sleep_ms(30'000, timeout(30ms),
                                           net::experimental::as_tuple(net::use_awaitable));
        EXPECT_EQ(ec, errc::timed_out);
        EXPECT_TRUE(co_await wait_until([&] { return p.counters().connections_discarded == 1; }));
        EXPECT_TRUE(co_await wait_until([&] { return f.cancelled == 1; }));  // its handler ended
        EXPECT_EQ(co_await s.inc(2), 3);
        EXPECT_EQ(f.srv.connections_accepted(), 2u);
        co_await f.srv.async_stop();
    });
}

TEST(Pool, AConnectionWhoseServerWentAwayIsDiscardedAndTheNextCallOpensANewOne) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        auto first = std::make_unique<fixture>(ex);
        const std::string url = first->url;
        auto ch = co_await async_connect(url + "?mode=pooled");
        auto& p = static_cast<pool&>(*ch.impl());
        auto s = stub<service>(ch);
        EXPECT_EQ(co_await s.inc(1), 2);
        co_await first->srv.async_stop();
        first.reset();
        EXPECT_TRUE(co_await wait_until([&] { return p.counters().open == 0; }));
        fixture second(ex, url);  // the same port
        EXPECT_EQ(co_await s.inc(5), 6);
        EXPECT_EQ(second.srv.connections_accepted(), 1u);
        co_await second.srv.async_stop();
    });
}

// A pool closed and dropped with a call in flight: the call completes when its connection ends,
// after the pool has gone, and must not let the connection go while the connection is still
// failing its calls (a use after free, seen by ASan, when a Python process exited so).
TEST(Pool, APoolDroppedWithACallInFlightLetsItsConnectionEndSafely) {
    run_test([]() -> net::awaitable<void> {
        fixture f(co_await net::this_coro::executor);
        auto ch = co_await async_connect(f.url + "?mode=pooled");
        EXPECT_EQ(co_await ch.async_call<int>("inc", 1), 2);  // one idle connection
        bool done = false;
        std::error_code got;
        ch.async_call<int>("sleep_ms", 30'000, [&](std::error_code ec, int) {
            got = ec;
            done = true;
        });
        static_cast<pool&>(*ch.impl()).close();
        ch = channel();  // the pool goes; its connection ends with the call pending
        EXPECT_TRUE(co_await wait_until([&] { return done; }));
        EXPECT_TRUE(got);
        co_await f.srv.async_stop();
    });
}

TEST(Connect, UnknownParametersAndBadValuesAreRejectedByName) {
    run_test([]() -> net::awaitable<void> {
        fixture f(co_await net::this_coro::executor);
        for (std::string q : {"?mode=sideways", "?max_connections=lots", "?colour=blue"}) {
            try {
                co_await async_connect(f.url + q);
                ADD_FAILURE() << q << " accepted";
            } catch (const std::system_error& e) {
                EXPECT_EQ(e.code(), errc::bad_address);
                EXPECT_NE(std::string(e.what()).find(q.substr(1, q.find('=') - 1)),
                          std::string::npos)
                    << e.what();
            }
        }
        co_await f.srv.async_stop();
    });
}

// Every parameter a channel's URL documents is taken (rpc/channels/connect.cpp's table): one
// the table lost would be refused as unknown.
TEST(Connect, EveryChannelParameterIsTaken) {
    run_test([]() -> net::awaitable<void> {
        fixture f(co_await net::this_coro::executor);
        for (std::string q :
             {"?mode=ordered&lane=bulk&timeout_ms=5000&interval_ms=0&liveness_timeout_ms=9000"
              "&heartbeat_ms=3000&max_unacked_bytes=1000000&piece_bytes=65536&lane_window=1",
              "?mode=pooled&max_connections=2&max_idle=1&idle_timeout_ms=5000"
              "&connect_timeout_ms=5000&max_queued=10"}) {
            auto ch = co_await async_connect(f.url + q);
            EXPECT_EQ(co_await ch.async_call<int>("inc", 1), 2) << q;
        }
        co_await f.srv.async_stop();
    });
}

// Every parameter a route+ URL documents sets its option, on the routes that take it.
TEST(RouteUrl, EveryParameterSetsItsOptionAndOnlyWhereItApplies) {
    const route_spec s = parse_route_url(
        "route+tls://127.0.0.1:1,127.0.0.1:2?max_concurrent=3&max_queued=40&queue=fifo"
        "&policy=round_robin&aperture=all&idempotent=a,b&weights=1,2&shadow=127.0.0.1:3"
        "&shadow_fraction=0.5&connect_timeout_ms=11&reconnect_ms=12&reconnect_max_ms=13"
        "&eject_after=4&eject_ms=14&eject_max_ms=15&max_ejected_percent=30"
        "&wait_for_replica_ms=16&hedge_after_ms=17&hedge=m:18&token_hosts=127.0.0.1"
        "&health=off&overload_cooldown_ms=19&retry_budget_percent=25&min_retries_per_s=2.5"
        "&timeout_ms=20&interval_ms=21&liveness_timeout_ms=22&heartbeat_ms=23&resume_ms=24"
        "&max_unacked_bytes=1000&piece_bytes=2000&lane_window=3000&ca=/no/ca.pem&verify=none",
        {});
    const router_options& o = s.options;
    EXPECT_EQ(o.max_concurrent, 3u);
    EXPECT_EQ(o.max_queued_calls, 40u);
    EXPECT_EQ(o.queue, queue_order::fifo);
    EXPECT_EQ(o.policy, route_policy::round_robin);
    EXPECT_FALSE(o.aperture);
    EXPECT_EQ(o.idempotent_methods, (std::set<std::string>{"a", "b"}));
    EXPECT_EQ(o.shadow_fraction, 0.5);
    EXPECT_EQ(o.shadow_group, "shadow");
    EXPECT_EQ(o.connect_timeout, 11ms);
    EXPECT_EQ(o.reconnect_initial, 12ms);
    EXPECT_EQ(o.reconnect_max, 13ms);
    EXPECT_EQ(o.eject_after, 4u);
    EXPECT_EQ(o.eject_base, 14ms);
    EXPECT_EQ(o.eject_max, 15ms);
    EXPECT_EQ(o.max_ejected_percent, 30u);
    EXPECT_EQ(o.wait_for_replica, 16ms);
    EXPECT_EQ(o.hedge.after, 17ms);
    ASSERT_EQ(o.hedge_methods.count("m"), 1u);
    EXPECT_EQ(o.hedge_methods.at("m").after, 18ms);
    EXPECT_EQ(o.token_hosts, std::vector<std::string>{"127.0.0.1"});
    EXPECT_FALSE(o.watch_health);
    EXPECT_EQ(o.overload_cooldown, 19ms);
    EXPECT_EQ(o.retry_budget_percent, 25);
    EXPECT_EQ(o.min_retries_per_s, 2.5);
    EXPECT_EQ(o.peer.default_timeout, 20ms);
    EXPECT_EQ(o.peer.comm.interval, 21ms);
    EXPECT_EQ(o.peer.liveness_timeout, 22ms);
    EXPECT_EQ(o.peer.heartbeat_interval, 23ms);
    EXPECT_EQ(o.peer.resume, 24ms);
    EXPECT_EQ(o.peer.max_unacked_bytes, 1000u);
    EXPECT_EQ(o.peer.piece_bytes, 2000u);
    EXPECT_EQ(o.peer.lane_window, 3000u);
    ASSERT_EQ(s.replicas.size(), 3u);
    EXPECT_EQ(s.replicas[1].url, "tls://127.0.0.1:2?ca=/no/ca.pem&verify=none");
    EXPECT_EQ(s.replicas[1].weight, 2);
    EXPECT_EQ(s.replicas[2].group, "shadow");
    // A transport parameter goes to every replica as it was written.
    EXPECT_EQ(parse_route_url("route+tls://127.0.0.1:1?verify", {}).replicas.at(0).url,
              "tls://127.0.0.1:1?verify");
    // A source's own parameters, each on the sources that take it.
    EXPECT_TRUE(parse_route_url("route+dns+tcp://svc.test:7000?dns_server=127.0.0.1:53"
                                "&refresh_ms=100&min_refresh_ms=50",
                                {})
                    .source);
    EXPECT_TRUE(parse_route_url("route+file:///no/replicas?refresh_ms=100", {}).source);
    EXPECT_TRUE(parse_route_url("route+etcd://127.0.0.1:2379/svc/?etcd_user=u&etcd_ca=/no/ca"
                                "&etcd_cert=/no/c&etcd_key=/no/k&refresh_ms=100",
                                {})
                    .source);
    for (const char* url :
         {"route+tcp://127.0.0.1:1?dns_server=127.0.0.1:53", "route+tcp://127.0.0.1:1?etcd_user=u",
          "route+file:///no/replicas?min_refresh_ms=5", "route+tcp://127.0.0.1:1?refresh_ms=5",
          "route+tcp://127.0.0.1:1?mode=pooled", "route+tcp://127.0.0.1:1?max_idle=1"}) {
        try {
            parse_route_url(url, {});
            ADD_FAILURE() << url << " accepted";
        } catch (const std::system_error& e) {
            EXPECT_EQ(e.code(), errc::bad_address) << url;
            EXPECT_NE(std::string(e.what()).find("unknown parameter"), std::string::npos)
                << e.what();
        }
    }
}

TEST(Connect, ARefusedConnectionFailsAtOnceInBothModesNotAfterTheConnectTimeout) {
    run_test([]() -> net::awaitable<void> {
        for (std::string url : {"tcp://127.0.0.1:1", "tcp://127.0.0.1:1?mode=pooled"}) {
            const auto t0 = std::chrono::steady_clock::now();
            try {
                co_await async_connect(url);
                ADD_FAILURE() << url << " connected";
            } catch (const std::system_error& e) {
                EXPECT_NE(std::string(e.what()).find("127.0.0.1:1"), std::string::npos) << e.what();
            }
            EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s) << url;
        }
    });
}

// The custom type of docs/calls-and-channels.md: msgpack-c's MSGPACK_DEFINE packs it as the array
// [x, y, label].
struct point {
    double x = 0;
    double y = 0;
    std::string label;
    MSGPACK_DEFINE(x, y, label)
};

struct geometry : interface {
    method<point(point)> mirror{"mirror"};
    method<point(std::vector<point>)> farthest{"farthest"};
};

TEST(CustomTypes, AStructWithMsgpackDefineIsAnArgumentAndAResultInBothModes) {
    run_test([]() -> net::awaitable<void> {
        server srv(co_await net::this_coro::executor);
        srv.on(geometry{}.mirror, [](point p) {
            p.x = -p.x;
            p.label += "'";
            return p;
        });
        srv.on(geometry{}.farthest, [](std::vector<point> ps) {
            if (ps.empty()) throw std::invalid_argument("no points");
            return *std::max_element(ps.begin(), ps.end(), [](const point& a, const point& b) {
                return a.x * a.x + a.y * a.y < b.x * b.x + b.y * b.y;
            });
        });
        const std::string url = srv.listen("tcp://127.0.0.1:0");
        for (const std::string params : {"", "?mode=pooled"}) {
            ordo::channel ch = co_await async_connect(url + params);
            auto g = stub<geometry>(ch);
            const point p{1.5, 2, "a"};  // named: no braced temporary inside co_await (GCC 12)
            const point q = co_await g.mirror(p);
            EXPECT_EQ(q.x, -1.5);
            EXPECT_EQ(q.y, 2);
            EXPECT_EQ(q.label, "a'");
            const point r = co_await ch.async_call<point>("mirror", q);  // untyped, the same
            EXPECT_EQ(r.x, 1.5);
            EXPECT_EQ(r.label, "a''");
            const std::vector<point> ps{{1, 1, "near"}, {-3, 4, "far"}, {0, 2, "mid"}};
            EXPECT_EQ((co_await g.farthest(ps)).label, "far");
            // Anything else where a point is expected is refused, naming the signature: not an
            // array, or a member of the wrong type.
            const auto wrong_member = std::make_tuple(std::string("x"), 2.0, std::string("a"));
            for (int i = 0; i < 2; ++i) {
                try {
                    if (i == 0)
                        co_await ch.async_call<point>("mirror", 42);
                    else
                        co_await ch.async_call<point>("mirror", wrong_member);
                    ADD_FAILURE() << "a wrong argument was taken for a point";
                } catch (const rpc_error& e) {
                    EXPECT_EQ(e.code(), errc::bad_arguments) << e.what();
                    EXPECT_NE(std::string(e.what()).find("point"), std::string::npos) << e.what();
                }
            }
        }
        co_await srv.async_stop();
    });
}

// Connect failures and call failures are one story: an rpc_error with an ordo::errc code, and a
// what() naming the address and the reason.
TEST(Connect, EveryConnectFailureIsAnRpcErrorNamingTheAddressAndTheReason) {
    run_test([]() -> net::awaitable<void> {
        fixture f(co_await net::this_coro::executor);
        const auto port = std::to_string(parse_address(f.url).port);
        struct expected {
            std::string url;
            errc code;
            std::string reason;
        };
        const std::vector<expected> cases{
            {"tcp://127.0.0.1:1", errc::peer_lost, "connection refused"},
            {"tcp://127.0.0.1:1?mode=pooled", errc::peer_lost, "connection refused"},
            {f.url + "?colour=blue", errc::bad_address, "unknown parameter \"colour\""},
            {"tcp://127.0.0.1", errc::bad_address, "missing :port"},
            {"route+tcp://127.0.0.1:1", errc::peer_lost, "connection refused"},
            // A TLS client to a plaintext server: the handshake fails.
            {"tls://127.0.0.1:" + port + "?verify=none", errc::peer_lost, "TLS handshake"},
        };
        for (const auto& c : cases) {
            try {
                co_await async_connect(c.url);
                ADD_FAILURE() << c.url << " connected";
            } catch (const rpc_error& e) {
                EXPECT_EQ(e.code(), c.code) << e.what();
                EXPECT_TRUE(e.method().empty()) << e.what();
                const std::string what = e.what();
                EXPECT_NE(what.find("connect to " + c.url.substr(0, c.url.find('?'))),
                          std::string::npos)
                    << what;
                EXPECT_NE(what.find(c.reason), std::string::npos) << what;
            } catch (const std::exception& e) {
                ADD_FAILURE() << c.url << ": not an rpc_error: " << e.what();
            }
        }
        co_await f.srv.async_stop();
    });
}

// What a call to a server that has gone away fails with does not depend on the mode: the
// ordered channel's connection ends, the pool cannot open one; both say peer_lost.
TEST_P(BothModes, ACallToAServerThatIsGoneFailsWithPeerLostAndTheReason) {
    run_test([this]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        auto f = std::make_unique<fixture>(ex);
        auto ch = co_await async_connect(with_mode(f->url));
        auto s = stub<service>(ch);
        EXPECT_EQ(co_await s.inc(1), 2);
        co_await f->srv.async_stop();
        f.reset();
        std::error_code ec;
        for (int i = 0; i < 50 && ec != errc::peer_lost; ++i) {
            try {
                co_await s.inc(1);
                co_await sleep_for(10ms);  // the ordered peer may not have seen the close yet
            } catch (const rpc_error& e) {
                ec = e.code();
                EXPECT_EQ(e.code(), errc::peer_lost) << e.what();
                if (GetParam().find("pooled") != std::string::npos) {
                    EXPECT_NE(std::string(e.what()).find("connection refused"), std::string::npos)
                        << e.what();
                }
            } catch (const std::exception& e) {
                ADD_FAILURE() << "not an rpc_error: " << e.what();
                break;
            }
        }
        EXPECT_EQ(ec, errc::peer_lost);
    });
}

}  // namespace
}  // namespace ordo
