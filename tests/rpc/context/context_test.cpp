// Call context (docs/protocol.md, "Call context"): metadata from a caller to its handler over a
// peer, a pool and a router; plain msgpack-rpc peers that never see it; deadlines that travel
// with the call, so that a call arriving or waiting past its deadline is never run; and calls
// made inside a handler that take what is left of its deadline, across co_awaits.
#include <algorithm>
#include <future>
#include <map>
#include <optional>
#include <sstream>

#include <gtest/gtest.h>

#include <asio/ip/tcp.hpp>
#include <asio/read.hpp>
#include <asio/write.hpp>

#include "ordo/ordo.hpp"
#include "rpc/context/context.hpp"
#include "support/run_test.hpp"
#include "support/running_loop.hpp"

namespace ordo {
namespace {

using namespace std::chrono_literals;
using test::run_test;
using test::wait_until;
using tcp = net::ip::tcp;

// What a handler saw of its call's context.
struct seen_context {
    bool present = false;
    long long left_ms = -1;  // -1: no deadline
    std::vector<std::pair<std::string, std::string>> metadata;
    MSGPACK_DEFINE(present, left_ms, metadata)
};

seen_context look() {
    seen_context s;
    const call_context* c = current_context();
    if (!c) return s;
    s.present = true;
    if (c->has_deadline()) s.left_ms = c->time_left().count();
    s.metadata = c->metadata.pairs();
    return s;
}

// A server whose handlers answer what they saw: `look` from a plain handler, `look_later` from a
// coroutine after it has waited (the context must follow it across the co_await).
struct context_server {
    server srv;
    std::string url;
    int runs = 0;
    explicit context_server(net::any_io_executor ex) : srv(ex) {
        srv.on("look", [] { return look(); });
        srv.on("look_later", [](int ms) -> net::awaitable<seen_context> {
            net::steady_timer t(co_await net::this_coro::executor, std::chrono::milliseconds(ms));
            co_await t.async_wait(net::use_awaitable);
            co_return look();
        });
        srv.on("count", [this] { return ++runs; });
        srv.on("slow", [](int ms) -> net::awaitable<int> {
            net::steady_timer t(co_await net::this_coro::executor, std::chrono::milliseconds(ms));
            co_await t.async_wait(net::use_awaitable);
            co_return ms;
        });
        url = srv.listen("tcp://127.0.0.1:0");
    }
};

// (Built outside the coroutines: GCC 12 mishandles braced lists of string literals in them.)
metadata some_metadata() {
    return {{"tenant", "acme"}, {"blob-bin", std::string("\x00\x01\xff", 3)}, {"tenant", "second"}};
}
metadata one_pair() {
    return {{"k", "v"}};
}
metadata reserved_pair() {
    return {{"ordo-deadline-ms", "1"}};
}
metadata big_pair() {
    return {{"big", std::string(20000, 'x')}};
}
metadata many_pairs(int n) {
    metadata m;
    for (int i = 0; i < n; ++i) m.emplace_back("k" + std::to_string(i), "v");
    return m;
}
std::vector<std::string> plain_order() {
    return {"ordo.features", "a", "b", "c", "d"};
}

call_options with_meta(metadata m, std::chrono::milliseconds timeout = 0ms) {
    call_options o;
    o.metadata = std::move(m);
    o.timeout = timeout;
    return o;
}

TEST(Context, MetadataReachesPlainAndCoroutineHandlersOverAPeerAPoolAndARouter) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        context_server a(ex);
        const metadata sent = some_metadata();
        const std::vector<std::string> urls{a.url, a.url + "?mode=pooled", "route+" + a.url};
        for (const auto& url : urls) {
            channel ch = co_await async_connect(url);
            const auto now = co_await ch.async_call<seen_context>("look", with_meta(sent));
            EXPECT_TRUE(now.present) << url;
            EXPECT_EQ(now.metadata, sent.pairs())
                << url;  // in order, repeated keys kept, bytes intact
            EXPECT_EQ(now.left_ms, -1) << url;
            const auto later =
                co_await ch.async_call<seen_context>("look_later", 50, with_meta(sent));
            EXPECT_EQ(later.metadata, sent.pairs()) << url;
            // A call without a context: the handler sees none.
            const auto none = co_await ch.async_call<seen_context>("look");
            EXPECT_FALSE(none.present) << url;
        }
    });
}

TEST(Context, AHandlerOnRunOnSeesItsContextOnItsOwnThread) {
    test::running_loop pool;
    run_test([&]() -> net::awaitable<void> {
        server srv(co_await net::this_coro::executor);
        handler_options elsewhere;
        elsewhere.run_on = pool.io.get_executor();
        srv.on(
            "away", [](std::stop_token) { return look(); }, elsewhere);
        srv.on(
            "away_later",
            [](std::stop_token) -> net::awaitable<seen_context> {
                net::steady_timer t(co_await net::this_coro::executor, 20ms);
                co_await t.async_wait(net::use_awaitable);
                co_return look();
            },
            elsewhere);
        channel ch = co_await async_connect(srv.listen("tcp://127.0.0.1:0"));
        const metadata sent = one_pair();
        for (const char* m : {"away", "away_later"}) {
            const auto s = co_await ch.async_call<seen_context>(m, with_meta(sent, 4000ms));
            EXPECT_EQ(s.metadata, sent.pairs()) << m;
            EXPECT_GT(s.left_ms, 0) << m;
        }
    });
}

TEST(Context, TheDeadlineTravelsWithTheCall) {
    run_test([]() -> net::awaitable<void> {
        context_server a(co_await net::this_coro::executor);
        channel ch = co_await async_connect(a.url);
        const auto s = co_await ch.async_call<seen_context>("look", timeout(5000ms));
        EXPECT_TRUE(s.present);
        EXPECT_GT(s.left_ms, 0);
        EXPECT_LE(s.left_ms, 5000);
        // A channel's default timeout is a deadline too.
        channel d = co_await async_connect(a.url + "?timeout_ms=3000");
        const auto t = co_await d.async_call<seen_context>("look");
        EXPECT_GT(t.left_ms, 0);
        EXPECT_LE(t.left_ms, 3000);
    });
}

TEST(Context, ReservedOrOversizedMetadataFailsTheCallAloneNamingIt) {
    run_test([]() -> net::awaitable<void> {
        context_server a(co_await net::this_coro::executor);
        channel ch = co_await async_connect(a.url);
        try {
            co_await ch.async_call<seen_context>("look", with_meta(reserved_pair()));
            ADD_FAILURE() << "a reserved key was sent";
        } catch (const rpc_error& e) {
            EXPECT_EQ(e.code(), errc::bad_arguments);
            EXPECT_NE(std::string(e.what()).find("reserved"), std::string::npos) << e.what();
        }
        try {
            co_await ch.async_call<seen_context>("look", with_meta(big_pair()));
            ADD_FAILURE() << "oversized metadata was sent";
        } catch (const rpc_error& e) {
            EXPECT_EQ(e.code(), errc::bad_arguments);
            EXPECT_NE(std::string(e.what()).find("max_metadata_bytes"), std::string::npos)
                << e.what();
        }
        // 64 pairs are allowed, but with a deadline they are 65 entries on the wire: refused
        // here, alone, rather than closing the connection there.
        try {
            co_await ch.async_call<seen_context>("look", with_meta(many_pairs(64), 5000ms));
            ADD_FAILURE() << "64 pairs and a deadline were sent";
        } catch (const rpc_error& e) {
            EXPECT_EQ(e.code(), errc::bad_arguments);
            EXPECT_NE(std::string(e.what()).find("max_metadata_entries"), std::string::npos)
                << e.what();
        }
        EXPECT_EQ((co_await ch.async_call<seen_context>("look", with_meta(many_pairs(64))))
                      .metadata.size(),
                  64u);
        // The connection is unharmed.
        EXPECT_TRUE((co_await ch.async_call<seen_context>("look", with_meta(one_pair()))).present);
    });
}

// A plain msgpack-rpc server, as neovim is: it answers an unknown method with an error string,
// and every other request with the number of elements it had. It records what it read.
struct foreign_server {
    tcp::acceptor acc;
    std::vector<std::size_t> request_sizes;  // of requests other than ordo.features
    std::vector<std::string> methods;        // requests and notifications, in arrival order
    explicit foreign_server(net::any_io_executor ex)
        : acc(ex, tcp::endpoint(net::ip::make_address("127.0.0.1"), 0)) {}
    std::string url() const {
        return "tcp://127.0.0.1:" + std::to_string(acc.local_endpoint().port());
    }

    net::awaitable<void> serve_one() {
        tcp::socket s = co_await acc.async_accept(net::use_awaitable);
        msgpack::unpacker in;
        for (;;) {
            in.reserve_buffer(4096);
            auto [ec, n] = co_await s.async_read_some(net::buffer(in.buffer(), 4096), use_tuple);
            if (ec) co_return;
            in.buffer_consumed(n);
            msgpack::object_handle oh;
            while (in.next(oh)) {
                const auto& a = oh.get().via.array;
                msgpack::sbuffer out;
                msgpack::packer<msgpack::sbuffer> p(out);
                if (a.ptr[0].via.u64 == 2) {
                    methods.push_back(a.ptr[1].as<std::string>());
                    continue;
                }
                const auto id = a.ptr[1].via.u64;
                const auto method = a.ptr[2].as<std::string>();
                methods.push_back(method);
                p.pack_array(4);
                p.pack(1);
                p.pack(id);
                if (method == "ordo.features") {
                    p.pack("Invalid method: " + method);
                    p.pack_nil();
                } else {
                    request_sizes.push_back(a.size);
                    p.pack_nil();
                    p.pack(a.size);
                }
                co_await net::async_write(s, net::buffer(out.data(), out.size()), use_tuple);
            }
        }
    }
};

TEST(Context, APlainMsgpackRpcPeerGetsPlainRequestsInOrderAndTheCallsWork) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        foreign_server f(ex);
        net::co_spawn(ex, f.serve_one(), net::detached);
        channel ch = co_await async_connect(f.url());
        // A call with metadata asks first, and waits for the answer; what is sent meanwhile
        // (a notification, a plain call) waits behind it, in order.
        std::size_t r1 = 0, r2 = 0;
        ch.async_call<std::size_t>("a", with_meta(one_pair(), 5000ms),
                                   [&](std::error_code ec, std::size_t r) {
                                       EXPECT_FALSE(ec) << ec.message();
                                       r1 = r;
                                   });
        ch.notify("b");
        r2 = co_await ch.async_call<std::size_t>("c");
        EXPECT_TRUE(co_await wait_until([&] { return r1 != 0; }));
        EXPECT_EQ(r1, 4u);
        EXPECT_EQ(r2, 4u);
        // Later calls with a context go plain at once.
        EXPECT_EQ(co_await ch.async_call<std::size_t>("d", with_meta(one_pair(), 5000ms)), 4u);
        for (auto n : f.request_sizes) EXPECT_EQ(n, 4u);
        const std::vector<std::string> order = plain_order();
        EXPECT_EQ(f.methods, order);
    });
}

TEST(Context, WhatWaitsForTheAnswerFailsOrIsToldUndeliveredWhenTheConnectionEndsFirst) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        tcp::acceptor acc(ex, tcp::endpoint(net::ip::make_address("127.0.0.1"), 0));
        const std::string url = "tcp://127.0.0.1:" + std::to_string(acc.local_endpoint().port());
        std::vector<std::string> undelivered;
        peer_options o;
        o.on_undelivered = [&](const undelivered_notification& u) {
            undelivered.push_back(u.method);
        };
        channel ch = co_await async_connect(url, o);
        tcp::socket s = co_await acc.async_accept(net::use_awaitable);
        std::optional<std::error_code> failed;
        ch.async_call<int>("a", with_meta(one_pair()),
                           [&](std::error_code ec, int) { failed = ec; });
        ch.notify("b");  // held behind "a"
        // This server reads ordo.features and never answers it: it closes instead.
        char buf[256];
        co_await s.async_read_some(net::buffer(buf), use_tuple);
        s.close();
        EXPECT_TRUE(co_await wait_until([&] { return failed.has_value(); }));
        EXPECT_EQ(failed.value_or(std::error_code{}), errc::peer_lost);
        EXPECT_TRUE(co_await wait_until([&] { return !undelivered.empty(); }));
        ORDO_CO_ASSERT_EQ(undelivered.size(), 1u);
        EXPECT_EQ(undelivered[0], "b");
    });
}

TEST(Context, WhatWaitsForTheAnswerIsBoundedByMaxBufferBytes) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        tcp::acceptor acc(ex, tcp::endpoint(net::ip::make_address("127.0.0.1"), 0));
        peer_options o;
        o.comm.max_buffer_bytes = 64 << 10;
        channel ch = co_await async_connect(
            "tcp://127.0.0.1:" + std::to_string(acc.local_endpoint().port()), o);
        tcp::socket s = co_await acc.async_accept(net::use_awaitable);  // never answers
        ch.async_call<int>("a", with_meta(one_pair()), [](std::error_code, int) {});
        const std::string big(40 << 10, 'x');
        ch.notify("b", big);  // held: 40 KiB of 64
        try {
            ch.notify("c", big);  // 80 KiB: refused, and said so
            ADD_FAILURE() << "held past max_buffer_bytes";
        } catch (const std::system_error& e) {
            EXPECT_EQ(e.code(), errc::overloaded);
            EXPECT_NE(std::string(e.what()).find("max_buffer_bytes"), std::string::npos)
                << e.what();
        }
        s.close();
    });
}

// Writes `requests` (msgpack-rpc messages) to an ordo server over a raw socket, and reads
// answers until `answers` have come; returns them by msgid as [error code or 0, result].
net::awaitable<std::map<std::uint64_t, std::pair<int, std::string>>> raw_exchange(
    std::string url, std::string requests, std::size_t answers) {
    auto ex = co_await net::this_coro::executor;
    tcp::socket s(ex);
    const auto port = static_cast<std::uint16_t>(std::stoi(url.substr(url.rfind(':') + 1)));
    co_await s.async_connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port),
                             net::use_awaitable);
    co_await net::async_write(s, net::buffer(requests), net::use_awaitable);
    std::map<std::uint64_t, std::pair<int, std::string>> got;
    msgpack::unpacker in;
    while (got.size() < answers) {
        in.reserve_buffer(4096);
        const std::size_t n =
            co_await s.async_read_some(net::buffer(in.buffer(), 4096), net::use_awaitable);
        in.buffer_consumed(n);
        msgpack::object_handle oh;
        while (in.next(oh)) {
            const auto& a = oh.get().via.array;
            const auto id = a.ptr[1].via.u64;
            if (a.ptr[2].is_nil()) {
                std::ostringstream text;
                text << a.ptr[3];
                got[id] = {0, text.str()};
            } else {
                const auto err = a.ptr[2].as<std::map<std::string, msgpack::object>>();
                got[id] = {err.at("code").as<int>(), err.at("message").as<std::string>()};
            }
        }
    }
    co_return got;
}

std::string request(std::uint32_t id, const std::string& method, std::vector<int> params,
                    std::optional<std::uint64_t> deadline_ms) {
    msgpack::sbuffer b;
    msgpack::packer<msgpack::sbuffer> p(b);
    p.pack_array(deadline_ms ? 5 : 4);
    p.pack(0);
    p.pack(id);
    p.pack(method);
    p.pack(params);
    if (deadline_ms) {
        p.pack_map(1);
        p.pack(std::string("ordo-deadline-ms"));
        p.pack(*deadline_ms);
    }
    return std::string(b.data(), b.size());
}

TEST(Context, ACallThatArrivesExpiredOrExpiresInTheQueueIsNeverRun) {
    run_test([]() -> net::awaitable<void> {
        context_server a(co_await net::this_coro::executor);
        // No ordo.cancel follows (this caller never withdraws): only the deadline stops them.
        // 1: arrives with no time left. 2: a serial handler that takes 400 ms. 3: 100 ms left,
        // queued behind 2, so its deadline passes while it waits. 4: time enough, runs.
        const std::string bytes = request(1, "count", {}, 0) + request(2, "slow", {400}, {}) +
                                  request(3, "count", {}, 100) + request(4, "count", {}, 60000);
        auto got = co_await raw_exchange(a.url, bytes, 4);
        EXPECT_EQ(got[1].first, static_cast<int>(errc::timed_out)) << got[1].second;
        EXPECT_NE(got[1].second.find("\"count\""), std::string::npos) << got[1].second;
        EXPECT_EQ(got[2].first, 0);
        EXPECT_EQ(got[3].first, static_cast<int>(errc::timed_out)) << got[3].second;
        EXPECT_EQ(got[4].first, 0);
        EXPECT_EQ(got[4].second, "1");  // the first and only run of count
        EXPECT_EQ(a.runs, 1);
    });
}

TEST(Context, ACallMadeInsideAHandlerTakesWhatIsLeftOfItsDeadlineAcrossCoAwaits) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        context_server b(ex);
        server a(ex);
        channel to_b = co_await async_connect(b.url);
        // Waits `ms`, then asks b what deadline its own call (made without a timeout) had.
        a.on("relay", [&to_b](int ms) -> net::awaitable<seen_context> {
            net::steady_timer t(co_await net::this_coro::executor, std::chrono::milliseconds(ms));
            co_await t.async_wait(net::use_awaitable);
            co_return co_await to_b.async_call<seen_context>("look");
        });
        // The same through a router to b.
        channel routed = co_await async_connect("route+" + b.url);
        a.on("relay_routed", [&routed]() -> net::awaitable<seen_context> {
            co_return co_await routed.async_call<seen_context>("look");
        });
        const std::string a_url = a.listen("tcp://127.0.0.1:0");
        channel ch = co_await async_connect(a_url);
        const auto s = co_await ch.async_call<seen_context>("relay", 200, timeout(3000ms));
        EXPECT_TRUE(s.present);
        EXPECT_GT(s.left_ms, 0);
        EXPECT_LE(s.left_ms, 2800);  // 3000 less the 200 ms the handler waited first
        const auto r = co_await ch.async_call<seen_context>("relay_routed", timeout(3000ms));
        EXPECT_GT(r.left_ms, 0);
        EXPECT_LE(r.left_ms, 3000);
        // A channel's own default timeout, when shorter, still bounds the nested call.
        channel short_b = co_await async_connect(b.url + "?timeout_ms=300");
        a.on("relay_short", [&short_b]() -> net::awaitable<seen_context> {
            co_return co_await short_b.async_call<seen_context>("look");
        });
        const auto bounded = co_await ch.async_call<seen_context>("relay_short", timeout(3000ms));
        EXPECT_GT(bounded.left_ms, 0);
        EXPECT_LE(bounded.left_ms, 300);
        // Without a deadline, the nested call has none.
        const auto none = co_await ch.async_call<seen_context>("relay", 0);
        EXPECT_FALSE(none.present);
        // A handler whose deadline has passed cannot start calls: they fail at once, saying
        // why. (Called over a raw socket: an ordo caller would cancel the handler at its
        // deadline, before it gets that far.)
        a.on("late", [&to_b]() -> net::awaitable<std::string> {
            net::steady_timer t(co_await net::this_coro::executor, 300ms);
            co_await t.async_wait(net::use_awaitable);
            try {
                co_await to_b.async_call<int>("count");
            } catch (const rpc_error& e) {
                co_return std::string(e.what());
            }
            co_return std::string("sent");
        });
        auto got = co_await raw_exchange(a_url, request(7, "late", {}, 100), 1);
        EXPECT_EQ(got[7].first, 0);
        EXPECT_NE(got[7].second.find("had passed"), std::string::npos) << got[7].second;
        EXPECT_EQ(b.runs, 0);
    });
}

// What a handler saw of its trace.
struct seen_trace {
    std::string trace_id, parent_id, span_id;
    int flags = 0;
    MSGPACK_DEFINE(trace_id, parent_id, span_id, flags)
};

seen_trace look_trace() {
    seen_trace t;
    if (const call_context* c = current_context()) {
        t.trace_id = c->trace_id();
        t.parent_id = c->parent_id();
        t.span_id = c->span_id();
        t.flags = c->trace_flags;
    }
    return t;
}

metadata traced() {
    return {{"traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
            {"tracestate", "vendor=1"}};
}

TEST(Context, ACallMadeInsideATracedHandlerIsAChildOfItsSpan) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        server b(ex);
        b.on("trace", [] { return look_trace(); });
        b.on("state", [] {
            const call_context* c = current_context();
            const std::string* s = c ? c->find("tracestate") : nullptr;
            return s ? *s : std::string();
        });
        channel to_b = co_await async_connect(b.listen("tcp://127.0.0.1:0"));
        server a(ex);
        // Its own span, then b's view of the call it made after a co_await.
        a.on("relay", [&to_b]() -> net::awaitable<std::vector<seen_trace>> {
            const seen_trace mine = look_trace();
            net::steady_timer t(co_await net::this_coro::executor, 20ms);
            co_await t.async_wait(net::use_awaitable);
            const seen_trace theirs = co_await to_b.async_call<seen_trace>("trace");
            std::vector<seen_trace> both;
            both.push_back(mine);
            both.push_back(theirs);
            co_return both;
        });
        a.on("relay_state", [&to_b]() -> net::awaitable<std::string> {
            co_return co_await to_b.async_call<std::string>("state");
        });
        channel ch = co_await async_connect(a.listen("tcp://127.0.0.1:0"));
        const auto both =
            co_await ch.async_call<std::vector<seen_trace>>("relay", with_meta(traced()));
        ORDO_CO_ASSERT_EQ(both.size(), 2u);
        const seen_trace& mine = both[0];
        const seen_trace& theirs = both[1];
        EXPECT_EQ(mine.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
        EXPECT_EQ(mine.parent_id, "00f067aa0ba902b7");
        EXPECT_EQ(mine.span_id.size(), 16u);
        EXPECT_NE(mine.span_id, mine.parent_id);
        EXPECT_EQ(mine.flags, 1);
        // The nested call: the same trace, a child of a's span, the flags carried on.
        EXPECT_EQ(theirs.trace_id, mine.trace_id);
        EXPECT_EQ(theirs.parent_id, mine.span_id);
        EXPECT_EQ(theirs.flags, 1);
        EXPECT_NE(theirs.span_id, mine.span_id);
        EXPECT_EQ(co_await ch.async_call<std::string>("relay_state", with_meta(traced())),
                  "vendor=1");
        // An untraced call: nothing is made up.
        const auto plain = co_await ch.async_call<std::vector<seen_trace>>("relay");
        ORDO_CO_ASSERT_EQ(plain.size(), 2u);
        EXPECT_TRUE(plain[0].trace_id.empty());
        EXPECT_TRUE(plain[1].trace_id.empty());
    });
}

// What a plain handler saw of both.
struct seen_all {
    seen_context c;
    seen_trace t;
    MSGPACK_DEFINE(c, t)
};

metadata second_trace() {
    return {{"traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"}};
}

// A trace; pairs with a deadline; another trace; nothing; three pairs.
std::vector<call_options> five_contexts() {
    std::vector<call_options> o;
    o.push_back(with_meta(traced()));
    o.push_back(with_meta(one_pair(), 60000ms));
    o.push_back(with_meta(second_trace()));
    o.push_back(call_options{});
    o.push_back(with_meta(some_metadata()));
    return o;
}

// A plain function's context is reused for the next call on its connection (read_context,
// on the way straight from the read and on the queued one): each call sees its own pairs,
// trace and deadline, and nothing of the call before.
TEST(Context, EachCallSeesOnlyItsOwnContextWhereTheLastOnesIsReused) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        server s(ex);
        s.on("both", [] { return seen_all{look(), look_trace()}; });
        s.on("wait", [](int ms) -> net::awaitable<int> {
            net::steady_timer t(co_await net::this_coro::executor, std::chrono::milliseconds(ms));
            co_await t.async_wait(net::use_awaitable);
            co_return ms;
        });
        channel ch = co_await async_connect(s.listen("tcp://127.0.0.1:0"));
        // Twice: one at a time (each runs from the read), then all sent at once behind a
        // serial handler that waits (each runs from the queue).
        for (int round = 0; round < 2; ++round) {
            const bool queued = round == 1;
            std::vector<call_options> opts = five_contexts();
            std::vector<seen_all> got;
            if (!queued) {
                for (auto& o : opts)
                    got.push_back(co_await ch.async_call<seen_all>("both", std::move(o)));
            } else {
                std::future<int> waited = ch.async_call<int>("wait", 200, net::use_future);
                std::vector<std::future<seen_all>> f;
                for (auto& o : opts)
                    f.push_back(ch.async_call<seen_all>("both", std::move(o), net::use_future));
                co_await wait_until([&] {
                    return std::all_of(f.begin(), f.end(), [](auto& x) {
                        return x.wait_for(0s) == std::future_status::ready;
                    });
                });
                EXPECT_EQ(waited.get(), 200);
                for (auto& x : f) got.push_back(x.get());
            }
            ORDO_CO_ASSERT_EQ(got.size(), 5u);
            const auto& [a, b, c, d, e] = std::tie(got[0], got[1], got[2], got[3], got[4]);
            EXPECT_EQ(a.t.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736") << queued;
            EXPECT_EQ(a.c.metadata, traced().pairs()) << queued;
            EXPECT_EQ(a.c.left_ms, -1) << queued;
            EXPECT_TRUE(b.t.trace_id.empty()) << queued;
            EXPECT_EQ(b.c.metadata, one_pair().pairs()) << queued;
            EXPECT_GT(b.c.left_ms, 0) << queued;
            EXPECT_LE(b.c.left_ms, 60000) << queued;
            EXPECT_EQ(c.t.trace_id, "0af7651916cd43dd8448eb211c80319c") << queued;
            EXPECT_EQ(c.t.parent_id, "b7ad6b7169203331") << queued;
            EXPECT_EQ(c.t.flags, 0) << queued;
            EXPECT_NE(c.t.span_id, a.t.span_id) << queued;
            EXPECT_EQ(c.c.metadata, second_trace().pairs()) << queued;
            EXPECT_EQ(c.c.left_ms, -1) << queued;
            EXPECT_FALSE(d.c.present) << queued;
            EXPECT_TRUE(d.t.trace_id.empty()) << queued;
            EXPECT_TRUE(e.t.trace_id.empty()) << queued;
            EXPECT_EQ(e.c.metadata, some_metadata().pairs()) << queued;
        }
    });
}

TEST(Context, MetadataCopiesShareTheirPairsUntilOneIsChanged) {
    metadata a{{"k", "v"}};
    metadata b = a;  // shares
    metadata c;
    c = b;
    EXPECT_EQ(a.begin(), b.begin());
    EXPECT_EQ(a.begin(), c.begin());
    b.emplace_back("x", "y");  // b gets its own copy first
    EXPECT_NE(a.begin(), b.begin());
    EXPECT_EQ(a.size(), 1u);
    EXPECT_EQ(c.size(), 1u);
    EXPECT_EQ(b.size(), 2u);
    EXPECT_EQ(b.pairs()[0], (metadata::pair{"k", "v"}));
    a = metadata{};  // the last holders free it (the sanitizer builds check)
    c.clear();
    EXPECT_TRUE(a.empty());
    EXPECT_TRUE(c.empty());
    metadata d = std::move(b);
    EXPECT_TRUE(b.empty());  // NOLINT: moved from, on purpose
    EXPECT_EQ(d.size(), 2u);
}

// The send path writes a common request's head in one pass on the stack, and its encoded pairs
// after it: their bytes must be those of the general encoder, for every deadline width, pair
// count and size it takes, and it must decline what it does not take.
TEST(Context, TheOnePassRequestWriterWritesWhatTheGeneralOneWrites) {
    std::string params_bytes;
    {
        msgpack::sbuffer b;
        msgpack::pack(b, std::make_tuple(std::string("payload"), 42));
        params_bytes.assign(b.data(), b.size());
    }
    const std::string_view params(params_bytes);
    int written = 0, declined = 0;
    for (const std::string& method :
         {std::string("e"), std::string("echo"), std::string(31, 'm'), std::string(32, 'm')}) {
        for (const std::size_t pairs : {0u, 1u, 2u, 14u, 15u}) {
            metadata meta;
            for (std::size_t i = 0; i < pairs; ++i)
                meta.emplace_back("key-" + std::to_string(i), std::string(i * 3, 'v'));
            if (pairs == 1)
                meta = metadata{
                    {"traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}};
            if (pairs == 2) meta = metadata{{"t-bin", std::string("\0\xff", 2)}, {"k", "v"}};
            for (const long long ms : {-1ll, 0ll, 5ll, 200ll, 70000ll, 5000000000ll}) {
                const bool timed = ms >= 0;
                if (pairs == 0 && !timed) continue;
                detail::packed_metadata packed;
                const std::string_view encoded =
                    pairs ? packed.pack(method, meta, timed) : std::string_view();
                buffer general;
                detail::write_context_request(general, 0x01020304, method, params, meta,
                                              std::chrono::milliseconds(ms), timed);
                char small[detail::small_context_head];
                const std::size_t n =
                    detail::write_small_context_head(small, 0x01020304, method, params, meta.size(),
                                                     std::chrono::milliseconds(ms), timed);
                if (method.size() >= 32 || pairs >= 15) {
                    EXPECT_EQ(n, 0u) << method.size() << " " << pairs;
                    ++declined;
                    continue;
                }
                ASSERT_NE(n, 0u) << method << " " << pairs << " " << ms;
                EXPECT_EQ(std::string(small, n) + std::string(encoded),
                          std::string_view(general.data(), general.size()))
                    << method << " " << pairs << " " << ms;
                ++written;
            }
        }
    }
    EXPECT_GT(written, 40);
    EXPECT_GT(declined, 10);
    // Params too long for the stack are declined, not cut.
    // (Its fixed part: 7 bytes of head, a method's length, the map's, and the deadline's 26.)
    const std::string big(detail::small_context_head - 35, 'x');
    char room[detail::small_context_head];
    EXPECT_EQ(
        detail::write_small_context_head(room, 1, "m", big, 0, std::chrono::milliseconds(1), true),
        0u);
    // One byte less fits, the widest deadline and all, to the buffer's last byte.
    EXPECT_EQ(detail::write_small_context_head(room, 1, "m", big.substr(1), 0,
                                               std::chrono::milliseconds(5000000000ll), true),
              detail::small_context_head);
}

TEST(Context, AMalformedTraceparentIsNotATrace) {
    EXPECT_TRUE(valid_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"));
    EXPECT_FALSE(valid_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0"));
    EXPECT_FALSE(valid_traceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"));
    EXPECT_FALSE(valid_traceparent("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"));
    EXPECT_FALSE(valid_traceparent("00-00000000000000000000000000000000-00f067aa0ba902b7-01"));
    EXPECT_FALSE(valid_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"));
    EXPECT_FALSE(valid_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7-01"));
    EXPECT_FALSE(valid_traceparent(""));
}

// What the access log recorded, copied out of its views.
struct logged {
    std::string trace_id, method, peer, subject;
    std::error_code status;
    std::chrono::microseconds duration{0};
    std::size_t in = 0, out = 0;
};

TEST(Context, TheAccessLogHasOneRecordPerRequestAnswered) {
    run_test([]() -> net::awaitable<void> {
        std::vector<logged> log;
        server_options o;
        o.access_log = [&log](const access_record& r) {
            log.push_back({std::string(r.trace_id), std::string(r.method), std::string(r.peer),
                           std::string(r.subject), r.status, r.duration, r.bytes_in, r.bytes_out});
        };
        server srv(co_await net::this_coro::executor, o);
        srv.on("inc", [](int x) { return x + 1; });
        srv.on("fail", []() -> int { throw std::runtime_error("no"); });
        srv.on("nap", [](int ms) -> net::awaitable<int> {
            net::steady_timer t(co_await net::this_coro::executor, std::chrono::milliseconds(ms));
            co_await t.async_wait(net::use_awaitable);
            co_return ms;
        });
        const std::string url = srv.listen("tcp://127.0.0.1:0");
        channel ch = co_await async_connect(url);
        EXPECT_EQ(co_await ch.async_call<int>("inc", 1), 2);
        EXPECT_EQ(co_await ch.async_call<int>("nap", 60, with_meta(traced())), 60);
        try {
            co_await ch.async_call<int>("fail");
        } catch (const rpc_error&) {
        }
        try {
            co_await ch.async_call<int>("nope");
        } catch (const rpc_error&) {
        }
        ch.notify("inc", 5);  // a notification is not a call: no record
        // Answered timed_out on arrival, without running.
        const std::vector<int> one(1, 1);
        auto got = co_await raw_exchange(url, request(1, "inc", one, 0), 1);
        EXPECT_EQ(got[1].first, static_cast<int>(errc::timed_out));
        EXPECT_EQ(co_await ch.async_call<int>("inc", 2), 3);
        ORDO_CO_ASSERT_EQ(log.size(), 6u);
        EXPECT_EQ(log[0].method, "inc");
        EXPECT_FALSE(log[0].status);
        EXPECT_TRUE(log[0].trace_id.empty());
        EXPECT_TRUE(log[0].peer.starts_with("tcp://127.0.0.1:")) << log[0].peer;
        EXPECT_TRUE(log[0].subject.empty());
        EXPECT_GT(log[0].in, 0u);
        EXPECT_GT(log[0].out, 0u);
        EXPECT_EQ(log[1].method, "nap");
        EXPECT_EQ(log[1].trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
        EXPECT_GE(log[1].duration, 60ms);
        EXPECT_GT(log[1].in, log[0].in);  // its context came with it
        EXPECT_EQ(log[2].method, "fail");
        EXPECT_EQ(log[2].status, errc::remote_error);
        EXPECT_EQ(log[3].method, "nope");
        EXPECT_EQ(log[3].status, errc::method_not_found);
        EXPECT_EQ(log[4].method, "inc");
        EXPECT_EQ(log[4].status, errc::timed_out);
        EXPECT_EQ(log[5].method, "inc");
        EXPECT_FALSE(log[5].status);
    });
}

}  // namespace
}  // namespace ordo
