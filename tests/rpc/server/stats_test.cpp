// Per-method counters and server figures: server::stats(), the reserved method ordo.stats, and
// what a server drops told through server_options::on_event.
#include "ordo/ordo.hpp"

#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/run_test.hpp"

namespace ordo {
namespace {

using namespace std::chrono_literals;
using test::run_test;
using test::wait_until;

// The value under `key` in a msgpack map, or nil.
msgpack::object field(const msgpack::object& map, const std::string& key) {
    if (map.type != msgpack::type::MAP) return {};
    for (std::uint32_t i = 0; i < map.via.map.size; ++i) {
        const auto& kv = map.via.map.ptr[i];
        if (kv.key.type == msgpack::type::STR && kv.key.as<std::string>() == key) return kv.val;
    }
    return {};
}

const method_stats* find(const std::vector<method_stats>& v, const std::string& name) {
    for (const auto& m : v)
        if (m.name == name) return &m;
    return nullptr;
}

void serve_sample_methods(server& srv) {
    srv.on("inc", [](int x) { return x + 1; });
    srv.on("fail", [](int) -> int { throw std::runtime_error("no"); });
    srv.on("later", [](int x) -> net::awaitable<int> {
        net::steady_timer t(co_await net::this_coro::executor, 1ms);
        co_await t.async_wait(use_tuple);
        co_return x * 2;
    });
    srv.on("note", [](int x) {
        if (x < 0) throw std::invalid_argument("negative");
    });
}

TEST(Stats, CountRequestsAndNotificationsByMethodAndOutcome) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        server srv(ex);
        serve_sample_methods(srv);
        const std::string url = srv.listen("tcp://127.0.0.1:0");
        auto ch = co_await async_connect(url);
        for (int i = 0; i < 3; ++i) EXPECT_EQ(co_await ch.async_call<int>("inc", i), i + 1);
        EXPECT_EQ(co_await ch.async_call<int>("later", 4), 8);
        auto [ec1, r1] = co_await ch.async_call<int>("fail", 1, use_tuple);
        EXPECT_EQ(ec1, errc::remote_error);
        auto [ec2, r2] = co_await ch.async_call<int>("inc", "not a number", use_tuple);
        EXPECT_EQ(ec2, errc::bad_arguments);
        auto [ec3, r3] = co_await ch.async_call<int>("nothing", 1, use_tuple);
        EXPECT_EQ(ec3, errc::method_not_found);
        ch.notify("note", 1);
        ch.notify("note", -1);
        ch.notify("nobody", 1);
        co_await ch.async_call<int>("inc", 0);  // the notifications are handled before it

        const server_stats st = srv.stats();
        EXPECT_EQ(st.connections, 1u);
        EXPECT_EQ(st.connections_accepted, 1u);
        EXPECT_GT(st.bytes_received, 0u);
        EXPECT_GT(st.bytes_sent, 0u);
        EXPECT_EQ(st.unknown_requests, 1u);
        EXPECT_EQ(st.unknown_notifications, 1u);
        const auto* inc = find(st.methods, "inc");
        const auto* fail = find(st.methods, "fail");
        const auto* later = find(st.methods, "later");
        const auto* note = find(st.methods, "note");
        if (!inc || !fail || !later || !note) {
            ADD_FAILURE() << "a method is missing from stats()";
            co_return;
        }
        EXPECT_EQ(inc->requests[0], 4u);
        EXPECT_EQ(inc->requests[static_cast<int>(errc::bad_arguments)], 1u);
        EXPECT_EQ(inc->requests_total(), 5u);
        EXPECT_EQ(fail->requests[static_cast<int>(errc::remote_error)], 1u);
        EXPECT_EQ(fail->requests[0], 0u);
        EXPECT_EQ(later->requests[0], 1u);
        EXPECT_EQ(note->notifications, 2u);
        EXPECT_EQ(note->notification_errors, 1u);
        // Latency is measured only when asked for.
        EXPECT_EQ(inc->latency_count, 0u);

        // The same over the wire.
        auto v = co_await ch.async_call<value>("ordo.stats");
        const auto& o = v.get();
        const auto methods = field(o, "methods");
        EXPECT_EQ(field(field(methods, "inc"), "requests").as<int>(), 5);
        EXPECT_EQ(field(field(field(methods, "inc"), "errors"), "bad arguments").as<int>(), 1);
        EXPECT_EQ(field(field(field(methods, "fail"), "errors"), "remote error").as<int>(), 1);
        EXPECT_EQ(field(field(methods, "note"), "notification_errors").as<int>(), 1);
        EXPECT_EQ(field(o, "unknown_requests").as<int>(), 1);
        EXPECT_EQ(field(o, "unknown_notifications").as<int>(), 1);
        const auto server_part = field(o, "server");
        EXPECT_EQ(field(server_part, "connections").as<int>(), 1);
        EXPECT_GT(field(server_part, "bytes_received").as<std::uint64_t>(), 0u);

        co_await srv.async_stop();
    });
}

TEST(Stats, AServerShowsTheRoutersItFrontsWithEachReplicasState) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        server backend(ex);
        backend.on("inc", [](int x) { return x + 1; });
        const std::string up = backend.listen("tcp://127.0.0.1:0");
        router_options o;
        o.reconnect_initial = std::chrono::milliseconds(5000);
        auto r = make_router(ex, o);
        co_await r->async_add_replica(up);
        r->add_replica("tcp://127.0.0.1:1");  // nothing listens there
        co_await channel(r).async_call<int>("inc", 1);
        ORDO_CO_ASSERT_TRUE(co_await test::wait_until([&] {
            return r->replicas()[1].state == replica_state::reconnecting;
        }));
        server front(ex);
        front.show_router(r, "backend");
        const std::string url = front.listen("tcp://127.0.0.1:0");
        auto ch = co_await async_connect(url);
        auto v = co_await ch.async_call<value>("ordo.stats");
        const auto routers = field(field(v.get(), "server"), "routers");
        const auto backend_part = field(routers, "backend");
        EXPECT_EQ(field(backend_part, "calls").as<int>(), 1);
        const auto reps = field(backend_part, "replicas");
        ORDO_CO_ASSERT_EQ(reps.type, msgpack::type::ARRAY);
        ORDO_CO_ASSERT_EQ(reps.via.array.size, 2u);
        EXPECT_EQ(field(reps.via.array.ptr[0], "url").as<std::string>(), up);
        EXPECT_EQ(field(reps.via.array.ptr[0], "state").as<std::string>(), "ready");
        EXPECT_EQ(field(reps.via.array.ptr[0], "completed").as<int>(), 1);
        EXPECT_EQ(field(reps.via.array.ptr[1], "state").as<std::string>(), "reconnecting");
        EXPECT_NE(field(reps.via.array.ptr[1], "last_error").as<std::string>().find("refused"),
                  std::string::npos);
        r->close();
        co_await front.async_stop();
        co_await backend.async_stop();
    });
}

TEST(Stats, TimedCallsFillTheLatencyHistogram) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        server srv(ex);
        serve_sample_methods(srv);
        srv.handlers().time_calls(true);
        const std::string url = srv.listen("tcp://127.0.0.1:0");
        auto ch = co_await async_connect(url);
        for (int i = 0; i < 5; ++i) co_await ch.async_call<int>("later", i);
        co_await ch.async_call<int>("inc", 1);
        const server_stats st = srv.stats();
        const auto* later = find(st.methods, "later");
        if (!later) {
            ADD_FAILURE() << "later is missing";
            co_return;
        }
        EXPECT_EQ(later->latency_count, 5u);
        std::uint64_t in_buckets = 0;
        for (std::size_t i = 0; i < later->latency_buckets.size(); ++i) {
            in_buckets += later->latency_buckets[i];
            // Each call waited 1 ms on a timer: none fits in a bucket below 1 ms.
            if (i < latency_bounds.size() && latency_bounds[i] < 0.001) {
                EXPECT_EQ(later->latency_buckets[i], 0u) << "bucket " << latency_bounds[i];
            }
        }
        EXPECT_EQ(in_buckets, 5u);
        EXPECT_GE(later->latency_sum_seconds, 0.005);
        EXPECT_EQ(find(st.methods, "inc")->latency_count, 1u);

        auto v = co_await ch.async_call<value>("ordo.stats");
        const auto latency = field(field(field(v.get(), "methods"), "later"), "latency");
        EXPECT_EQ(field(latency, "count").as<int>(), 5);
        EXPECT_EQ(field(latency, "buckets").type, msgpack::type::ARRAY);
        co_await srv.async_stop();
    });
}

TEST(Stats, ReregisteringAMethodKeepsItsCounters) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        server srv(ex);
        srv.on("v", [] { return 1; });
        const std::string url = srv.listen("tcp://127.0.0.1:0");
        auto ch = co_await async_connect(url);
        EXPECT_EQ(co_await ch.async_call<int>("v"), 1);
        srv.on("v", [] { return 2; });
        EXPECT_EQ(co_await ch.async_call<int>("v"), 2);
        EXPECT_EQ(find(srv.stats().methods, "v")->requests[0], 2u);
        co_await srv.async_stop();
    });
}

TEST(Stats, IntrospectionOffAlsoHidesOrdoStats) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        server srv(ex);
        srv.handlers().introspection(false);
        srv.on("inc", [](int x) { return x + 1; });
        const std::string url = srv.listen("tcp://127.0.0.1:0");
        auto ch = co_await async_connect(url);
        auto [ec, v] = co_await ch.async_call<value>("ordo.stats", use_tuple);
        EXPECT_EQ(ec, errc::method_not_found);
        co_await srv.async_stop();
    });
}

TEST(Stats, BatchHandlersReportTheirBatches) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        server srv(ex);
        srv.on_batch("sq", {.max_batch_size = 4, .max_wait = 1ms}, [](std::vector<int> xs) {
            for (auto& x : xs) x *= x;
            return xs;
        });
        const std::string url = srv.listen("tcp://127.0.0.1:0");
        auto ch = co_await async_connect(url);
        EXPECT_EQ(co_await ch.async_call<int>("sq", 3), 9);
        const auto st = srv.stats();
        EXPECT_EQ(st.batches.size(), 1u);
        if (st.batches.size() == 1) {
            EXPECT_EQ(st.batches[0].name, "sq");
            EXPECT_EQ(st.batches[0].stats.calls, 1u);
        }
        auto v = co_await ch.async_call<value>("ordo.stats");
        EXPECT_EQ(field(field(field(v.get(), "batches"), "sq"), "calls").as<int>(), 1);
        co_await srv.async_stop();
    });
}

TEST(Events, DroppedNotificationsAreToldToTheServersOwner) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        std::vector<server_event> events;
        server_options o;
        o.on_event = [&](const server_event& e) {
            if (e.what == server_event::kind::dropped) events.push_back(e);
        };
        server srv(ex, o);
        serve_sample_methods(srv);
        const std::string url = srv.listen("tcp://127.0.0.1:0");
        auto ch = co_await async_connect(url);
        ch.notify("nobody", 1);
        ch.notify("note", -5);
        ch.notify("note", 5);
        EXPECT_TRUE(co_await wait_until([&] { return events.size() >= 2; }, 10s));
        if (events.size() >= 2) {
            EXPECT_EQ(events[0].code, errc::method_not_found);
            EXPECT_NE(events[0].reason.find("\"nobody\""), std::string::npos) << events[0].reason;
            EXPECT_FALSE(events[0].peer.empty());
            EXPECT_NE(events[1].reason.find("\"note\""), std::string::npos) << events[1].reason;
            EXPECT_NE(events[1].reason.find("negative"), std::string::npos) << events[1].reason;
            const std::string line = to_string(events[0]);
            EXPECT_NE(line.find("ordo: dropped "), std::string::npos) << line;
            EXPECT_NE(line.find("no such method"), std::string::npos) << line;
        }
        co_await ch.async_call<int>("inc", 1);
        EXPECT_EQ(events.size(), 2u);
        co_await srv.async_stop();
    });
}

TEST(Events, AClientPeerReportsDroppedNotificationsToo) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        server srv(ex);
        // The server calls back a method the client does not serve.
        srv.on("poke", [](peer& p) { channel(p.shared_from_this()).notify("missing", 7); });
        const std::string url = srv.listen("tcp://127.0.0.1:0");
        std::vector<dropped_message> drops;
        peer_options po;
        po.on_dropped = [&](const dropped_message& d) { drops.push_back(d); };
        auto ch = co_await async_connect(url, po);
        co_await ch.async_call<void>("poke");
        EXPECT_TRUE(co_await wait_until([&] { return !drops.empty(); }, 10s));
        if (!drops.empty()) {
            EXPECT_EQ(drops[0].method, "missing");
            EXPECT_EQ(drops[0].code, errc::method_not_found);
            EXPECT_EQ(drops[0].peer, url);
        }
        co_await srv.async_stop();
    });
}

TEST(Stats, AHandlerThatOutlivesItsServerCountsIntoCountersThatStillExist) {
    // The server goes without async_stop while a handler is suspended: the handler is cancelled
    // and finishes later, on the same io_context, after the handler table is gone (ASan would
    // see its counters freed otherwise).
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        auto srv = std::make_unique<server>(ex);
        bool started = false;
        srv->on("wait", [&started]() -> net::awaitable<int> {
            started = true;
            net::steady_timer t(co_await net::this_coro::executor, 60s);
            co_await t.async_wait(use_tuple);
            co_return 1;
        });
        const std::string url = srv->listen("tcp://127.0.0.1:0");
        auto ch = co_await async_connect(url);
        std::optional<std::error_code> outcome;
        net::co_spawn(
            ex,
            [&]() -> net::awaitable<void> {
                auto [ec, r] = co_await ch.async_call<int>("wait", use_tuple);
                outcome = ec;
            },
            net::detached);
        EXPECT_TRUE(co_await wait_until([&] { return started; }, 10s));
        srv.reset();
        EXPECT_TRUE(co_await wait_until([&] { return outcome.has_value(); }, 30s));
        EXPECT_TRUE(outcome && *outcome) << "the call should fail when its server goes";
    });
}

TEST(Events, ACallbackThatThrowsDoesNotStallTheConnection) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        server_options o;
        int told = 0;
        o.on_event = [&](const server_event& e) {
            if (e.what != server_event::kind::dropped) return;
            ++told;
            throw std::runtime_error("a careless callback");
        };
        server srv(ex, o);
        serve_sample_methods(srv);
        srv.on("slow_note", [](int x) -> net::awaitable<void> {
            net::steady_timer t(co_await net::this_coro::executor, 1ms);
            co_await t.async_wait(use_tuple);
            if (x < 0) throw std::invalid_argument("negative");
        });
        const std::string url = srv.listen("tcp://127.0.0.1:0");
        auto ch = co_await async_connect(url);
        ch.notify("nobody", 1);
        ch.notify("note", -1);
        ch.notify("slow_note", -1);  // a serial handler that fails: the queue must go on
        EXPECT_EQ(co_await ch.async_call<int>("inc", 1), 2);
        EXPECT_EQ(told, 3);
        co_await srv.async_stop();
    });
}

}  // namespace
}  // namespace ordo
