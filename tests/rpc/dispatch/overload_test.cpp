// Concurrency limits (ordo/rpc/concurrency.hpp; docs/protocol.md "Overload"). The adaptive
// limit's rule is checked on a simulated clock (a model of a server with a few workers, fed
// calls at made-up times), so what it decides never depends on how busy the machine is; the
// server's use of the limits is checked over loopback, with handlers that wait on a gate the
// test opens.
#include "ordo/ordo.hpp"

#include <gtest/gtest.h>

#include <asio/ip/tcp.hpp>
#include <asio/write.hpp>

#include <algorithm>
#include <deque>
#include <thread>
#include <vector>

#include "rpc/dispatch/admission.hpp"
#include "support/gate.hpp"
#include "support/run_test.hpp"
#include "support/sleep.hpp"

namespace ordo {
namespace {

using namespace std::chrono_literals;
using detail::admission;
using test::gate;
using test::run_test;
using test::wait_until;
using sim_clock = admission::clock;

// A server with `workers` that each take `service` per call, first come first served, fed one
// call every `gap` through `limit`. Calls over the limit are refused at once.
struct model {
    model(admission& l, std::size_t w, sim_clock::duration s) : limit(l), workers(w), service(s) {}
    ~model() {  // the calls still in the model leave, so that the limit can be freed
        for (std::size_t i = 0; i < busy.size() + waiting.size(); ++i) limit.leave({});
    }
    admission& limit;
    std::size_t workers;
    sim_clock::duration service;
    sim_clock::time_point now = sim_clock::time_point{} + 1h;
    std::deque<sim_clock::time_point> waiting;  // admitted, not started: when admitted
    std::vector<std::pair<sim_clock::time_point, sim_clock::time_point>> busy;  // (admitted, ends)
    std::uint64_t offered = 0, refused = 0, served = 0;
    sim_clock::duration longest{};  // the longest call served (wait included), since reset
    double latency_sum_ms = 0;

    void reset_figures() {
        offered = refused = served = 0;
        longest = {};
        latency_sum_ms = 0;
    }

    // Runs for `span`, a call arriving every `gap`; the model steps in 10 µs ticks.
    void run(sim_clock::duration span, sim_clock::duration gap) {
        const auto end = now + span;
        auto next_arrival = now;
        while (now < end) {
            for (auto it = busy.begin(); it != busy.end();) {
                if (it->second <= now) {
                    limit.leave_at(it->first, it->second);
                    ++served;
                    longest = std::max(longest, it->second - it->first);
                    latency_sum_ms +=
                        std::chrono::duration<double, std::milli>(it->second - it->first).count();
                    it = busy.erase(it);
                } else {
                    ++it;
                }
            }
            while (next_arrival <= now) {
                ++offered;
                if (limit.try_enter())
                    waiting.push_back(now);
                else
                    ++refused;
                next_arrival += gap;
            }
            while (busy.size() < workers && !waiting.empty()) {
                busy.emplace_back(waiting.front(), now + service);
                waiting.pop_front();
            }
            now += 10us;
        }
    }
};

// Twice what the workers can serve: a fixed limit as large as a router's max_concurrent lets
// a queue of its size form, whose wait is many times a call's own time; the adaptive one keeps
// the wait within its tolerance, refuses the rest, and still keeps every worker busy.
TEST(AdaptiveLimit, AtTwiceCapacityKeepsLatencyNearItsFloorAndTheWorkersBusy) {
    adaptive_limit settings;
    settings.initial = 64;
    auto owner = admission::make(settings);
    admission& limit = *owner;
    model m{limit, 4, 2ms};
    m.run(3s, 250us);  // 4,000 calls/s offered; 2,000/s served at most
    m.reset_figures();
    m.run(20s, 250us);
    const double mean_ms = m.latency_sum_ms / static_cast<double>(m.served);
    EXPECT_GT(m.refused, m.offered / 3) << "about half of what is offered cannot be served";
    // Every worker busy but for the probes (two windows of a quarter of the limit per 10 s).
    EXPECT_GT(m.served, 20 * 2000 * 9 / 10);
    EXPECT_LE(mean_ms, 2.0 * settings.tolerance * 2.0) << "limit " << limit.limit();
    EXPECT_GE(limit.limit(), 4u);
    EXPECT_LE(limit.limit(), 24u);
    EXPECT_GT(limit.stats().no_load_us, 1900u);
    EXPECT_LT(limit.stats().no_load_us, 3000u);

    auto fixed = admission::make(1024);
    model f{*fixed, 4, 2ms};
    f.run(3s, 250us);
    f.reset_figures();
    f.run(20s, 250us);
    EXPECT_GT(f.longest, 400ms);
}

// A limit that starts small grows to what the workers can take, as long as latency stays at
// its floor; and follows them when there are more of them.
TEST(AdaptiveLimit, GrowsWhileLatencyStaysAtItsFloor) {
    adaptive_limit settings;
    settings.initial = 2;
    auto owner = admission::make(settings);
    admission& limit = *owner;
    model m{limit, 16, 2ms};
    m.run(10s, 100us);  // 10,000 calls/s offered, 8,000/s served at most
    EXPECT_GE(limit.limit(), 16u);
    m.reset_figures();
    m.run(10s, 100us);
    EXPECT_GT(m.served, 10 * 8000 * 9 / 10);
    m.workers = 64;  // 32,000/s
    m.reset_figures();
    m.run(20s, 40us);  // 25,000/s offered: all can be served
    EXPECT_GE(limit.limit(), 50u);
    m.reset_figures();
    m.run(10s, 40us);
    EXPECT_LT(m.refused, m.offered / 20);
}

// A workload that becomes slower: the probe learns the new floor, so the limit does not shut
// out calls that are merely slower now.
TEST(AdaptiveLimit, ALaterSlowerWorkloadIsLearnedByTheProbe) {
    auto owner = admission::make(adaptive);
    admission& limit = *owner;
    model m{limit, 8, 1ms};
    m.run(5s, 250us);  // 4,000/s offered, 8,000/s served at most
    m.service = 4ms;   // now 2,000/s at most
    m.run(25s, 250us);
    EXPECT_GE(limit.stats().no_load_us, 3900u);
    m.reset_figures();
    m.run(10s, 250us);
    EXPECT_GT(m.served, 10 * 2000 * 85 / 100);
}

TEST(Overload, CallsOverAFixedServerLimitAreRefusedAtOnceAndTheRestRun) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        server_options so;
        so.concurrency = 4;
        server srv(ex, so);
        gate g(ex);
        int plain = 0;
        handler_options concurrent;
        concurrent.concurrent = true;
        srv.on(
            "hold",
            [&](int i) -> net::awaitable<int> {
                co_await g.pass();
                co_return i;
            },
            concurrent);
        srv.on("plain", [&](int i) { return plain += i; });  // not counted: runs to its end
        auto ch = co_await async_connect(srv.listen("tcp://127.0.0.1:0"));
        std::vector<int> answered;
        std::vector<std::string> refused;
        for (int i = 0; i < 10; ++i)
            ch.async_call<int>("hold", i, [&, i](std::error_code ec, int v) {
                if (!ec) {
                    EXPECT_EQ(v, i);
                    answered.push_back(i);
                } else {
                    EXPECT_EQ(ec, errc::overloaded);
                    refused.push_back(ec.message());
                }
            });
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return refused.size() == 6; }));
        EXPECT_EQ(g.waiting, 4);
        EXPECT_TRUE(answered.empty());
        // Plain functions still run; the connection goes on.
        EXPECT_EQ(co_await ch.async_call<int>("plain", 5), 5);
        auto st = srv.stats();
        EXPECT_EQ(st.concurrency.what, concurrency_limit::kind::fixed);
        EXPECT_EQ(st.concurrency.limit, 4u);
        EXPECT_EQ(st.concurrency.in_flight, 4u);
        EXPECT_EQ(st.concurrency.refused, 6u);
        const auto hold = std::find_if(st.methods.begin(), st.methods.end(),
                                       [](const method_stats& m) { return m.name == "hold"; });
        ORDO_CO_ASSERT_TRUE(hold != st.methods.end());
        EXPECT_EQ(hold->requests[static_cast<int>(errc::overloaded)], 6u);
        g.open();
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return answered.size() == 4; }));
        EXPECT_EQ(answered, (std::vector<int>{0, 1, 2, 3}));
        EXPECT_EQ(srv.stats().concurrency.in_flight, 0u);
        // Room again: the next calls run.
        EXPECT_EQ(co_await ch.async_call<int>("hold", 42), 42);
        co_await srv.async_stop();
    });
}

// The refusal names the limit and says when to come back, in words and, for programs, as
// `retry_after_ms` in the error map.
TEST(Overload, TheRefusalCarriesARetryAfterHint) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        server srv(ex);
        gate g(ex);
        handler_options ho;
        ho.concurrency = 1;
        ho.concurrent = true;
        srv.on(
            "hold", [&]() -> net::awaitable<void> { co_await g.pass(); }, ho);
        const std::string url = srv.listen("tcp://127.0.0.1:0");
        auto ch = co_await async_connect(url);
        bool first_done = false;
        ch.async_call<void>("hold", [&](std::error_code ec) {
            EXPECT_FALSE(ec);
            first_done = true;
        });
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return g.waiting == 1; }));
        // A raw msgpack-rpc caller sees the map.
        asio::ip::tcp::socket s(ex);
        const auto port = static_cast<unsigned short>(std::stoi(url.substr(url.rfind(':') + 1)));
        co_await s.async_connect({asio::ip::make_address("127.0.0.1"), port}, net::use_awaitable);
        msgpack::sbuffer req;
        msgpack::packer<msgpack::sbuffer> pk(req);
        pk.pack_array(4).pack(0).pack(7).pack(std::string("hold"));
        pk.pack_array(0);
        co_await asio::async_write(s, asio::buffer(req.data(), req.size()), net::use_awaitable);
        msgpack::unpacker up;
        msgpack::object_handle oh;
        while (!up.next(oh)) {
            up.reserve_buffer(4096);
            const std::size_t n = co_await s.async_read_some(
                asio::buffer(up.buffer(), up.buffer_capacity()), net::use_awaitable);
            up.buffer_consumed(n);
        }
        const auto& resp = oh.get().via.array;
        ORDO_CO_ASSERT_EQ(resp.size, 4u);
        const auto& err = resp.ptr[2];
        ORDO_CO_ASSERT_EQ(err.type, msgpack::type::MAP);
        std::int64_t code = 0, retry = -1;
        std::string message;
        for (std::uint32_t i = 0; i < err.via.map.size; ++i) {
            const auto& kv = err.via.map.ptr[i];
            const std::string k = kv.key.as<std::string>();
            if (k == "code") code = kv.val.as<std::int64_t>();
            if (k == "retry_after_ms") retry = kv.val.as<std::int64_t>();
            if (k == "message") message = kv.val.as<std::string>();
        }
        EXPECT_EQ(code, static_cast<int>(errc::overloaded));
        EXPECT_GE(retry, 1);
        EXPECT_NE(message.find("method \"hold\" has 1 calls running, its limit "
                               "(handler_options::concurrency, 1); retry after"),
                  std::string::npos)
            << message;
        // An ordo caller reads the same words in its rpc_error.
        try {
            co_await ch.async_call<void>("hold");
            ADD_FAILURE() << "not refused";
        } catch (const rpc_error& e) {
            EXPECT_EQ(e.code(), errc::overloaded);
            EXPECT_NE(e.detail().find("retry after"), std::string::npos) << e.what();
        }
        s.close();
        g.open();
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return first_done; }));
        co_await srv.async_stop();
    });
}

// A call must pass its method's limit and the server's. One that its method admits and the
// server refuses gives its method's slot back; a method's limit leaves other methods alone.
TEST(Overload, MethodAndServerLimitsTogether) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        server_options so;
        so.concurrency = 3;
        server srv(ex, so);
        gate g(ex);
        handler_options two;
        two.concurrency = 2;
        two.concurrent = true;
        handler_options five;
        five.concurrency = adaptive_limit{.initial = 5};
        five.concurrent = true;
        handler_options any;
        any.concurrent = true;
        srv.on(
            "a", [&]() -> net::awaitable<void> { co_await g.pass(); }, two);
        srv.on(
            "b", [&]() -> net::awaitable<void> { co_await g.pass(); }, five);
        srv.on(
            "c", [&]() -> net::awaitable<void> { co_await g.pass(); }, any);
        auto ch = co_await async_connect(srv.listen("tcp://127.0.0.1:0"));
        std::vector<std::pair<std::string, std::error_code>> results;
        auto call = [&](std::string m) {
            ch.async_call<void>(m, [&, m](std::error_code ec) { results.emplace_back(m, ec); });
        };
        call("a");
        call("a");
        call("a");  // over a's limit of 2
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return results.size() == 1; }));
        EXPECT_EQ(results[0].first, "a");
        EXPECT_EQ(results[0].second, errc::overloaded);
        call("c");  // the server's third
        call("b");  // b has room, the server has none: b's slot goes back
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return results.size() == 2; }));
        EXPECT_EQ(results[1].first, "b");
        EXPECT_EQ(results[1].second, errc::overloaded);
        EXPECT_EQ(g.waiting, 3);
        auto st = srv.stats();
        for (const auto& m : st.methods) {
            if (m.name == "a") {
                EXPECT_EQ(m.concurrency.what, concurrency_limit::kind::fixed);
                EXPECT_EQ(m.concurrency.in_flight, 2u);
                EXPECT_EQ(m.concurrency.refused, 1u);
            } else if (m.name == "b") {
                EXPECT_EQ(m.concurrency.what, concurrency_limit::kind::adaptive);
                EXPECT_EQ(m.concurrency.in_flight, 0u);
                EXPECT_EQ(m.concurrency.refused, 0u);
            } else {
                EXPECT_EQ(m.concurrency.what, concurrency_limit::kind::none);
            }
        }
        EXPECT_EQ(st.concurrency.refused, 1u);
        g.open();
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return results.size() == 5; }));
        for (std::size_t i = 2; i < 5; ++i) EXPECT_FALSE(results[i].second) << results[i].first;
        co_await srv.async_stop();
    });
}

// A notification over the limit is dropped, and the server says so (on_event: dropped); later
// messages of the connection are served in order.
TEST(Overload, ANotificationOverTheLimitIsDroppedAndReported) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        server_options so;
        std::vector<std::string> dropped;
        so.on_event = [&](const server_event& e) {
            if (e.what == server_event::kind::dropped) dropped.push_back(e.reason);
        };
        server srv(ex, so);
        gate g(ex);
        handler_options one;
        one.concurrency = 1;
        one.concurrent = true;
        std::vector<int> seen;
        srv.on(
            "note",
            [&](int i) -> net::awaitable<void> {
                seen.push_back(i);
                co_await g.pass();
            },
            one);
        auto ch = co_await async_connect(srv.listen("tcp://127.0.0.1:0"));
        ch.notify("note", 1);
        ch.notify("note", 2);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return dropped.size() == 1; }));
        EXPECT_NE(dropped[0].find("overloaded"), std::string::npos) << dropped[0];
        g.open();
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return g.waiting == 0; }));
        ch.notify("note", 3);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return seen.size() == 2; }));
        EXPECT_EQ(seen, (std::vector<int>{1, 3}));
        g.open();
        co_await srv.async_stop();
    });
}

// ordo.health answers the server's state and its services'; ordo.health_watch streams a
// service's state, then each change, in order.
TEST(Health, AnswersAndWatchesTheServerAndItsServices) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        server srv(ex);
        srv.on("inc", [](int x) { return x + 1; });
        auto ch = co_await async_connect(srv.listen("tcp://127.0.0.1:0"));
        EXPECT_EQ(co_await ch.async_call<std::string>("ordo.health"), "serving");
        try {
            co_await ch.async_call<std::string>("ordo.health", std::string("db"));
            ADD_FAILURE() << "an unknown service answered";
        } catch (const rpc_error& e) {
            EXPECT_EQ(e.code(), errc::method_not_found);
            EXPECT_NE(e.detail().find("no service \"db\""), std::string::npos) << e.what();
        }
        srv.set_health("db", health_state::not_serving);
        EXPECT_EQ(co_await ch.async_call<std::string>("ordo.health", std::string("db")),
                  "not_serving");
        EXPECT_EQ(co_await ch.async_call<std::string>("ordo.health"), "serving");
        auto watch = co_await ch.async_stream<std::string>("ordo.health_watch", std::string("db"));
        EXPECT_EQ(co_await watch.next(), std::optional<std::string>("not_serving"));
        srv.set_health("db", health_state::serving);
        EXPECT_EQ(co_await watch.next(), std::optional<std::string>("serving"));
        // The same state again is no change; a change after it is the next item.
        srv.set_health("db", health_state::serving);
        srv.set_health("db", health_state::not_serving);
        EXPECT_EQ(co_await watch.next(), std::optional<std::string>("not_serving"));
        // Set from another thread, as a handler on a worker would.
        std::thread([&] { srv.set_health("db", health_state::serving); }).join();
        EXPECT_EQ(co_await watch.next(), std::optional<std::string>("serving"));
        // The reserved names are not among the application's methods.
        for (const auto& m : srv.stats().methods) EXPECT_FALSE(m.name.starts_with("ordo."));
        watch.cancel();
        EXPECT_EQ(co_await ch.async_call<int>("inc", 1), 2);
        co_await srv.async_stop();
    });
}

// A drain turns every service to draining before any connection is told to go away: a watcher
// hears it first, and ordo.health says so to a caller that asks in the grace.
TEST(Health, ADrainIsSeenBeforeTheGoaway) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        server srv(ex);
        srv.set_health("db", health_state::serving);
        gate g(ex);
        handler_options concurrent;
        concurrent.concurrent = true;
        srv.on(
            "hold", [&]() -> net::awaitable<void> { co_await g.pass(); }, concurrent);
        const std::string url = srv.listen("tcp://127.0.0.1:0");
        std::vector<std::string> order;
        auto ch = co_await async_connect(url);
        auto p = std::dynamic_pointer_cast<peer>(ch.impl());
        ORDO_CO_ASSERT_TRUE(p != nullptr);
        p->on_goaway(
            [&](std::chrono::milliseconds, const std::string&) { order.push_back("goaway"); });
        auto watch = co_await ch.async_stream<std::string>("ordo.health_watch");
        EXPECT_EQ(co_await watch.next(), std::optional<std::string>("serving"));
        bool held = false;
        ch.async_call<void>("hold", [&](std::error_code ec) {
            EXPECT_FALSE(ec);
            held = true;
        });
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return g.waiting == 1; }));
        bool drained = false;
        net::co_spawn(ex, srv.async_drain(10s, "test"),
                      [&](std::exception_ptr) { drained = true; });
        auto next = co_await watch.next();
        order.push_back(next ? *next : "end");
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return order.size() == 2; }));
        EXPECT_EQ(order, (std::vector<std::string>{"draining", "goaway"}));
        EXPECT_EQ(srv.health(), health_state::draining);
        EXPECT_EQ(srv.health("db"), health_state::draining);
        watch.cancel();
        g.open();
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return held && drained; }));
    });
}

}  // namespace
}  // namespace ordo
