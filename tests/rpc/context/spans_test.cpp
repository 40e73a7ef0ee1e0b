// Spans (ordo/rpc/spans.hpp): a traced call and the call its handler makes recorded with their
// parent links and read back over the wire (ordo.traces); sampling by trace within the ring's
// bounds, with every error and the slowest kept; a router's waits and retries as spans.
// The recorder is per process: each test sets it up, and uses trace ids of its own.
#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>

#include <gtest/gtest.h>

#include "ordo/ordo.hpp"
#include "support/cutting_proxy.hpp"
#include "support/run_test.hpp"

namespace ordo {
namespace {

using namespace std::chrono_literals;
using test::run_test;
using test::wait_until;

// The trace id of test trace `n`: 32 hex digits, spread by splitmix64 so that the sampling by
// trace sees ids as random as real ones (and the same ones on every run).
std::string trace_id(std::uint64_t n) {
    std::uint64_t z = n * 0x9e3779b97f4a7c15ull + 0x1234;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    char b[33];
    std::snprintf(b, sizeof b, "%016llx%016llx", static_cast<unsigned long long>(n + 1),
                  static_cast<unsigned long long>(z));
    return b;
}

call_options traced(const std::string& trace) {
    call_options o;
    o.metadata.emplace_back("traceparent", "00-" + trace + "-00f067aa0ba902b7-01");
    return o;
}

std::vector<span> spans_of(const std::string& trace) {
    return recorded_spans(trace);
}

struct servers {
    server b, a;
    std::string b_url, a_url;
    int slow_started = 0;
    explicit servers(net::any_io_executor ex) : b(ex), a(ex) {
        b.on("leaf", [] { return 1; });
        b.on("fail", [] {
            throw std::runtime_error("no");
            return 0;
        });
        b.on("slow", [this](int ms) { return slow(ms); });
        b_url = b.listen("tcp://127.0.0.1:0");
        a_url = a.listen("tcp://127.0.0.1:0");
    }
    net::awaitable<int> slow(int ms) {
        ++slow_started;
        net::steady_timer t(co_await net::this_coro::executor, std::chrono::milliseconds(ms));
        co_await t.async_wait(net::use_awaitable);
        co_return ms;
    }
};

net::awaitable<int> call_leaf(channel to_b) {
    co_return co_await to_b.async_call<int>("leaf");
}

TEST(Spans, ATracedCallAndTheCallItsHandlerMakesAreRecordedWithParentLinksAndReadOverTheWire) {
    record_spans({.sample_rate = 1.0});
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        servers s(ex);
        channel to_b = co_await async_connect(s.b_url);
        s.a.on("relay", [to_b] { return call_leaf(to_b); });
        channel ch = co_await async_connect(s.a_url);
        const std::string t = trace_id(1);
        EXPECT_EQ(co_await ch.async_call<int>("relay", traced(t)), 1);
        // An untraced call leaves nothing.
        EXPECT_EQ(co_await ch.async_call<int>("relay"), 1);
        // Asked over the wire, as `ordo traces` asks (both servers share this process's ring).
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return spans_of(t).size() == 2; }, 10s));
        const auto got = co_await ch.async_call<std::vector<span>>("ordo.traces", t);
        ORDO_CO_ASSERT_EQ(got.size(), 2u);
        const auto relay =
            std::find_if(got.begin(), got.end(), [](auto& x) { return x.name == "relay"; });
        const auto leaf =
            std::find_if(got.begin(), got.end(), [](auto& x) { return x.name == "leaf"; });
        ORDO_CO_ASSERT_TRUE(relay != got.end() && leaf != got.end());
        EXPECT_EQ(relay->trace_id, t);
        EXPECT_EQ(relay->parent_id, "00f067aa0ba902b7");
        EXPECT_EQ(leaf->trace_id, t);
        EXPECT_EQ(leaf->parent_id, relay->span_id);  // a child of the handler that called it
        EXPECT_NE(leaf->span_id, relay->span_id);
        // Span ids are 16 lowercase hex digits, as a traceparent carries them.
        EXPECT_TRUE(valid_traceparent("00-" + t + "-" + leaf->span_id + "-01")) << leaf->span_id;
        EXPECT_TRUE(valid_traceparent("00-" + t + "-" + relay->span_id + "-01")) << relay->span_id;
        for (const auto& x : got) {
            EXPECT_EQ(x.kind, "server");
            EXPECT_EQ(x.status, "ok");
            EXPECT_EQ(x.kept, "sampled");
            EXPECT_FALSE(x.peer.empty());
            EXPECT_GT(x.bytes_in, 0u);
            EXPECT_GT(x.bytes_out, 0u);
            EXPECT_GE(x.handler_start_us, 0);
            EXPECT_GE(x.handler_end_us, x.handler_start_us);
            EXPECT_GE(x.end_us, x.handler_end_us);
        }
        // The relay's handler waited for the leaf: it is the slowest of the two.
        const auto slowest = co_await ch.async_call<std::vector<span>>("ordo.traces", t, 1);
        ORDO_CO_ASSERT_EQ(slowest.size(), 1u);
        EXPECT_EQ(slowest[0].name, "relay");
        // Another trace is not answered for this one.
        EXPECT_TRUE(
            (co_await ch.async_call<std::vector<span>>("ordo.traces", trace_id(2))).empty());
    });
    record_spans({.capacity = 0});
}

TEST(Spans, SamplingKeepsWholeTracesAFractionOfThemEveryErrorAndTheSlowestWithinBounds) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        servers s(ex);
        channel ch = co_await async_connect(s.b_url);
        // Rate 0: only errors (in the ring) and the slowest (apart) are kept.
        record_spans({.sample_rate = 0.0, .capacity = 8, .slowest = 2});
        for (int i = 0; i < 40; ++i) co_await ch.async_call<int>("leaf", traced(trace_id(100 + i)));
        co_await ch.async_call<int>("slow", 300, traced(trace_id(200)));
        for (int i = 0; i < 3; ++i) {
            auto [ec, v] =
                co_await ch.async_call<int>("fail", traced(trace_id(300 + i)), use_tuple);
            EXPECT_EQ(ec, errc::remote_error);
        }
        for (int i = 0; i < 20; ++i) co_await ch.async_call<int>("leaf");  // untraced
        auto all = recorded_spans();
        EXPECT_LE(all.size(), 8u + 2u);
        int errors = 0, slow = 0;
        for (const auto& x : all) {
            if (x.kept == "error") {
                ++errors;
                EXPECT_EQ(x.status, "remote error");
            } else {
                EXPECT_EQ(x.kept, "slowest");
                ++slow;
            }
        }
        EXPECT_EQ(errors, 3);
        EXPECT_LE(slow, 2);
        const auto top = recorded_spans({}, 1);
        ORDO_CO_ASSERT_EQ(top.size(), 1u);
        EXPECT_EQ(top[0].trace_id, trace_id(200));  // the 300 ms call
        EXPECT_GE(top[0].end_us, 250'000);

        // Rate 1, capacity 8: the ring holds the last 8.
        record_spans({.capacity = 0});
        record_spans({.sample_rate = 1.0, .capacity = 8, .slowest = 0});
        for (int i = 0; i < 30; ++i) co_await ch.async_call<int>("leaf", traced(trace_id(400 + i)));
        all = recorded_spans();
        ORDO_CO_ASSERT_EQ(all.size(), 8u);
        for (int i = 0; i < 8; ++i) EXPECT_EQ(all[i].trace_id, trace_id(422 + i));

        // Rate 0.25 over 400 traces of two calls each: a fraction near a quarter, each trace
        // kept whole or not at all (the choice is the trace id's, the same in every process).
        record_spans({.capacity = 0});
        record_spans({.sample_rate = 0.25, .capacity = 100000, .slowest = 0});
        for (int i = 0; i < 400; ++i)
            for (int k = 0; k < 2; ++k)
                co_await ch.async_call<int>("leaf", traced(trace_id(1000 + i)));
        all = recorded_spans();
        std::map<std::string, int> per_trace;
        for (const auto& x : all) ++per_trace[x.trace_id];
        for (const auto& [t, n] : per_trace) EXPECT_EQ(n, 2) << t;
        EXPECT_GE(per_trace.size(), 60u);
        EXPECT_LE(per_trace.size(), 140u);
        record_spans({.capacity = 0});
        EXPECT_TRUE(recorded_spans().empty());
    });
}

TEST(Spans, ARoutersWaitForRoomAndItsRetryOnAnotherReplicaAreSpansOfTheTrace) {
    record_spans({.sample_rate = 1.0});
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        servers s(ex);
        const auto port =
            static_cast<std::uint16_t>(std::stoi(s.b_url.substr(s.b_url.rfind(':') + 1)));
        // One replica, one call at a time: the second call waits for the first.
        channel r = co_await async_connect("route+" + s.b_url + "?max_concurrent=1");
        const std::string t1 = trace_id(5000), t2 = trace_id(5001);
        int done = 0;
        r.async_call<int>("slow", 200, traced(t1), [&](std::error_code, int) { ++done; });
        r.async_call<int>("leaf", traced(t2), [&](std::error_code, int) { ++done; });
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return done == 2; }, 20s));
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return spans_of(t2).size() == 2; }, 10s));
        auto got = spans_of(t2);
        const auto wait =
            std::find_if(got.begin(), got.end(), [](auto& x) { return x.kind == "router"; });
        ORDO_CO_ASSERT_TRUE(wait != got.end());
        EXPECT_EQ(wait->name, "wait");
        EXPECT_EQ(wait->method, "leaf");
        EXPECT_EQ(wait->peer, s.b_url);
        EXPECT_EQ(wait->parent_id, "00f067aa0ba902b7");  // a sibling of the replica's span
        EXPECT_GE(wait->end_us, 100'000);

        // An idempotent call whose replica's connection is cut goes again, to the other one.
        test::cutting_proxy proxy("127.0.0.1", port);
        router_options ro{.max_concurrent = 4, .policy = route_policy::round_robin};
        ro.idempotent_methods = {"slow"};
        auto rt = make_router(ex, ro);
        const std::string via = "tcp://127.0.0.1:" + std::to_string(proxy.port());
        co_await rt->async_add_replica(via);
        const std::string t3 = trace_id(5002);
        bool answered = false;
        const int started = s.slow_started;
        channel(rt).async_call<int>("slow", 300, traced(t3), [&](std::error_code ec, int) {
            EXPECT_FALSE(ec) << ec.message();
            answered = true;
        });
        co_await rt->async_add_replica(s.b_url);
        // Cut once the call runs on the replica behind the proxy.
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return s.slow_started > started; }, 10s));
        proxy.cut_all();
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return answered; }, 20s));
        EXPECT_EQ(rt->counters().retried, 1u);
        got = spans_of(t3);
        const auto retry =
            std::find_if(got.begin(), got.end(), [](auto& x) { return x.name == "retry"; });
        ORDO_CO_ASSERT_TRUE(retry != got.end());
        EXPECT_EQ(retry->kind, "router");
        EXPECT_EQ(retry->peer, via);
        EXPECT_EQ(retry->status, "peer lost");
        EXPECT_EQ(retry->kept, "sampled");
        EXPECT_NE(retry->note.find(via), std::string::npos) << retry->note;
        rt->close();

        // A call that waits in vain (no replica within wait_for_replica): its wait, failed.
        router_options lone;
        lone.wait_for_replica = 100ms;
        auto empty = make_router(ex, lone);
        const std::string t4 = trace_id(5003);
        auto [ec, v] = co_await channel(empty).async_call<int>("leaf", traced(t4), use_tuple);
        EXPECT_EQ(ec, errc::peer_lost);
        got = spans_of(t4);
        ORDO_CO_ASSERT_EQ(got.size(), 1u);
        EXPECT_EQ(got[0].kind, "router");
        EXPECT_EQ(got[0].name, "wait");
        EXPECT_EQ(got[0].status, "peer lost");
        EXPECT_EQ(got[0].kept, "sampled");
        EXPECT_GE(got[0].end_us, 50'000);
        EXPECT_NE(got[0].note.find("wait_for_replica"), std::string::npos) << got[0].note;
        empty->close();
    });
    record_spans({.capacity = 0});
}

// valid_traceparent as the W3C text reads, one character at a time: the reference for the
// one that checks 16 bytes at a time.
bool reference_traceparent(std::string_view v) {
    if (v.size() != 55 || v.substr(0, 3) != "00-" || v[35] != '-' || v[52] != '-') return false;
    const auto hex = [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); };
    bool trace_zero = true, parent_zero = true;
    for (std::size_t i = 3; i < 55; ++i) {
        if (i == 35 || i == 52) continue;
        if (!hex(v[i])) return false;
        if (i < 35) trace_zero = trace_zero && v[i] == '0';
        if (i > 35 && i < 52) parent_zero = parent_zero && v[i] == '0';
    }
    return !trace_zero && !parent_zero;
}

TEST(Spans, ValidTraceparentAgreesWithTheTextOfTheStandardOnEveryOneByteChange) {
    const std::string good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    EXPECT_TRUE(valid_traceparent(good));
    // Every byte value at every position (signed bytes included: 0x80 and up).
    for (std::size_t i = 0; i < good.size(); ++i)
        for (int b = 0; b < 256; ++b) {
            std::string v = good;
            v[i] = static_cast<char>(b);
            ASSERT_EQ(valid_traceparent(v), reference_traceparent(v)) << i << " " << b;
        }
    // All-zero ids, and ids zero but for one digit (in each 16-byte half of the trace id).
    const std::string zeros_trace = "00-00000000000000000000000000000000-00f067aa0ba902b7-01";
    const std::string zeros_parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01";
    EXPECT_FALSE(valid_traceparent(zeros_trace));
    EXPECT_FALSE(valid_traceparent(zeros_parent));
    for (std::size_t i : {3u, 18u, 19u, 34u}) {
        std::string v = zeros_trace;
        v[i] = '1';
        EXPECT_TRUE(valid_traceparent(v)) << i;
    }
    EXPECT_FALSE(valid_traceparent(good.substr(0, 54)));
    EXPECT_FALSE(valid_traceparent(good + "0"));
}

// What the nested call's handler saw: its trace id and whether it had a deadline.
struct nested_seen {
    std::string trace;
    bool deadline = false;
    MSGPACK_DEFINE(trace, deadline)
};

net::awaitable<nested_seen> relay_lazily(std::string url,
                                         std::shared_ptr<std::optional<channel>> ch) {
    if (!*ch) *ch = co_await async_connect(url);
    co_return co_await (*ch)->async_call<nested_seen>("see");
}

TEST(Spans, AConnectionMadeInsideATracedHandlerDoesNotCarryThatCallsContextIntoLaterCalls) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        servers s(ex);
        s.b.on("see", [] {
            const call_context* c = current_context();
            return nested_seen{c ? std::string(c->trace_id()) : std::string(),
                               c && c->has_deadline()};
        });
        auto lazy = std::make_shared<std::optional<channel>>();
        const std::string b_url = s.b_url;
        s.a.on("relay", [b_url, lazy] { return relay_lazily(b_url, lazy); });
        channel ch = co_await async_connect(s.a_url);
        call_options first = traced(trace_id(7000));
        first.timeout = 5s;
        const auto one = co_await ch.async_call<nested_seen>("relay", first);
        EXPECT_EQ(one.trace, trace_id(7000));
        EXPECT_TRUE(one.deadline);
        // The channel the first call opened serves the second, which has no context.
        const auto two = co_await ch.async_call<nested_seen>("relay");
        EXPECT_EQ(two.trace, "");
        EXPECT_FALSE(two.deadline);
    });
}

}  // namespace
}  // namespace ordo
