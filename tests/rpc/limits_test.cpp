// The resource limits that are not framing limits (those are in tests/comm/framing_test.cpp):
// each one holds, and what happens at it is what docs/protocol.md says.
#include "ordo/ordo.hpp"

#include <gtest/gtest.h>

#include <algorithm>

#include "support/run_test.hpp"
#include "support/sleep.hpp"

namespace ordo {
namespace {

using namespace std::chrono_literals;
using test::run_test;
using test::wait_until;
using test::sleep_for;

TEST(Limits, MaxQueuedMessagesStopsReadingWhileASerialHandlerIsBusy) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        server_options so;
        so.peer.max_queued_messages = 100;
        server srv(ex, so);
        std::shared_ptr<peer> server_side;
        std::vector<int> seen;
        srv.on("block", [&](peer& p, int ms) -> net::awaitable<int> {
            server_side = p.shared_from_this();
            co_await sleep_for(std::chrono::milliseconds(ms));
            co_return ms;
        });
        srv.on("note", [&](int i, std::string) { seen.push_back(i); });
        auto ch = co_await async_connect(srv.listen("tcp://127.0.0.1:0"));
        bool blocked_done = false;
        ch.async_call<int>("block", 500, [&](std::error_code, int) { blocked_done = true; });
        constexpr int n = 2000;  // of about 1 KiB each: 64 fit in one 64 KiB read
        const std::string pad(1000, 'x');
        for (int i = 0; i < n; ++i) ch.notify("note", i, pad);
        std::size_t most = 0;
        EXPECT_TRUE(co_await wait_until([&] {
            if (server_side) most = std::max(most, server_side->counters().queued_messages);
            return blocked_done && seen.size() == std::size_t(n);
        }));
        // The limit, plus what the read that reached it carried.
        EXPECT_GE(most, 100u);
        EXPECT_LE(most, 100u + 66u);
        for (int i = 0; i < int(seen.size()); ++i) ORDO_CO_ASSERT_EQ(seen[i], i);
        co_await srv.async_stop();
    });
}

// Late responses to calls that timed out are dropped quietly while their msgids are remembered
// (max_abandoned_ids of them); a response to a msgid forgotten is a protocol error. The server
// is raw bytes here, answering msgids 0 and 1 after both calls gave up.
void late_responses(std::size_t remembered, bool connection_survives) {
    run_test([=]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        auto l = listen(ex, "tcp://127.0.0.1:0");
        peer_options o;
        o.max_abandoned_ids = remembered;
        auto ch = co_await async_connect(l->local_address(), o);
        auto raw = co_await l->async_accept();
        int timed_out = 0;
        for (int i = 0; i < 2; ++i)
            ch.async_call<int>("inc", i, timeout(20ms), [&](std::error_code ec, int) {
                if (ec == errc::timed_out) ++timed_out;
            });
        EXPECT_TRUE(co_await wait_until([&] { return timed_out == 2; }));
        buffer b;
        encode_response(b, 0, 1);
        encode_response(b, 1, 2);
        std::error_code ec;
        co_await raw->async_write(net::buffer(b.data(), b.size()), ec);
        auto& p = static_cast<peer&>(*ch.impl());
        if (connection_survives) {
            // A third call, answered after the late ones: the connection took them quietly.
            std::optional<int> third;
            ch.async_call<int>("inc", 2, [&](std::error_code e, int v) { third = e ? -1 : v; });
            buffer b2;
            encode_response(b2, 2, 3);
            co_await raw->async_write(net::buffer(b2.data(), b2.size()), ec);
            EXPECT_TRUE(co_await wait_until([&] { return third.has_value(); }));
            EXPECT_EQ(third.value_or(0), 3);
            EXPECT_TRUE(p.is_open());
        } else {
            auto [code, reason] = co_await p.async_wait_closed();
            EXPECT_EQ(code, errc::protocol_error);
            EXPECT_NE(reason.find("msgid 0"), std::string::npos) << reason;
        }
    });
}

TEST(Limits, LateResponsesToRememberedTimedOutCallsAreDroppedQuietly) {
    late_responses(8, true);
}

TEST(Limits, ALateResponseToAForgottenMsgidClosesTheConnectionWithAProtocolError) {
    late_responses(1, false);
}

// A server that records its events.
struct event_log {
    std::vector<server_event> events;
    std::function<void(const server_event&)> recorder() {
        return [this](const server_event& e) { events.push_back(e); };
    }
    std::size_t count(server_event::kind k) const {
        return std::size_t(std::count_if(events.begin(), events.end(),
                                         [k](const server_event& e) { return e.what == k; }));
    }
};

// Half-sent messages (slowloris): a client announces a 1 MiB str and then sends a byte now and
// then, never finishing. The server drops it within message_timeout and says why; a fresh
// client is served meanwhile.
TEST(Limits, AMessageThatDoesNotCompleteWithinMessageTimeoutClosesItsConnection) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        event_log log;
        server_options so;
        so.peer.comm.message_timeout = 300ms;
        so.on_event = log.recorder();
        server srv(ex, so);
        srv.on("inc", [](int x) { return x + 1; });
        const std::string url = srv.listen("tcp://127.0.0.1:0");
        auto slow = co_await async_connect_transport(url);
        std::error_code ec;
        const std::string head("\x93\x02\xa1m\x91\xdb\x00\x10\x00\x00", 10);  // str of 1 MiB
        co_await slow->async_write(net::buffer(head), ec);
        ORDO_CO_ASSERT_TRUE(!ec);
        const auto start = std::chrono::steady_clock::now();
        bool closed = false;
        for (int i = 0; i < 400 && !closed; ++i) {  // a byte every 25 ms, for at most 10 s
            co_await sleep_for(25ms);
            co_await slow->async_write(net::buffer("x", 1), ec);
            if (ec) closed = true;
            if (i == 4) {  // meanwhile a fresh client is served
                auto ch = co_await async_connect(url);
                EXPECT_EQ(co_await ch.async_call<int>("inc", 1), 2);
            }
        }
        EXPECT_TRUE(closed);
        EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] {
            return log.count(server_event::kind::closed) >= 1;
        }));
        bool said = false;
        for (const auto& e : log.events)
            if (e.what == server_event::kind::closed && e.code == errc::protocol_error &&
                e.reason.find("message_timeout") != std::string::npos)
                said = true;
        EXPECT_TRUE(said);
        co_await srv.async_stop();
    });
}

// max_connections: the connection beyond it is told why and closed at once; its caller's error
// carries the server's reason; once a connection leaves, a new client is served again.
TEST(Limits, AConnectionBeyondMaxConnectionsIsToldWhyAndClosedAtOnce) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        event_log log;
        server_options so;
        so.max_connections = 2;
        so.on_event = log.recorder();
        server srv(ex, so);
        srv.on("inc", [](int x) { return x + 1; });
        const std::string url = srv.listen("tcp://127.0.0.1:0");
        auto a = co_await async_connect(url);
        auto b = co_await async_connect(url);
        EXPECT_EQ(co_await a.async_call<int>("inc", 1), 2);
        EXPECT_EQ(co_await b.async_call<int>("inc", 2), 3);
        auto c = co_await async_connect(url);
        auto [ec, v] = co_await c.async_call<int>("inc", 3, ordo::timeout(20s), use_tuple);
        EXPECT_EQ(ec, errc::peer_lost);
        try {
            co_await c.async_call<int>("inc", 3);
            ADD_FAILURE() << "the refused connection served a call";
        } catch (const rpc_error& e) {
            EXPECT_NE(std::string(e.what()).find("max_connections"), std::string::npos)
                << e.what();
        }
        EXPECT_EQ(log.count(server_event::kind::refused), 1u);
        EXPECT_EQ(log.count(server_event::kind::opened), 2u);
        EXPECT_EQ(srv.peer_count(), 2u);
        // One leaves: the next client is served.
        co_await std::static_pointer_cast<peer>(a.impl())->async_close();
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return srv.peer_count() == 1; }));
        EXPECT_EQ(log.count(server_event::kind::closed), 1u);
        auto d = co_await async_connect(url);
        EXPECT_EQ(co_await d.async_call<int>("inc", 4), 5);
        co_await srv.async_stop();
    });
}

// idle_timeout: a quiet connection with nothing pending is told why and closed; one whose
// handler runs longer than the timeout is not.
TEST(Limits, IdleConnectionsAreToldWhyAndClosedBusyOnesAreNot) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        server_options so;
        so.idle_timeout = 300ms;
        std::vector<std::string> closed;
        so.on_event = [&](const server_event& e) {
            if (e.what == server_event::kind::closed) closed.push_back(e.reason);
        };
        server srv(ex, so);
        srv.on("inc", [](int x) { return x + 1; });
        srv.on("sleep_ms", [](int ms) -> net::awaitable<int> {
            co_await sleep_for(std::chrono::milliseconds(ms));
            co_return ms;
        });
        const std::string url = srv.listen("tcp://127.0.0.1:0");
        auto idle = co_await async_connect(url);
        auto busy = co_await async_connect(url);
        EXPECT_EQ(co_await idle.async_call<int>("inc", 1), 2);
        const auto start = std::chrono::steady_clock::now();
        EXPECT_EQ(co_await busy.async_call<int>("sleep_ms", 1200), 1200);  // 4x the timeout
        auto p = std::dynamic_pointer_cast<peer>(idle.impl());
        auto [code, why] = co_await p->async_wait_closed();
        EXPECT_NE(why.find("idle_timeout"), std::string::npos) << why;
        EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
        EXPECT_TRUE(std::dynamic_pointer_cast<peer>(busy.impl())->is_open());
        ORDO_CO_ASSERT_GE(closed.size(), 1u);
        EXPECT_NE(closed[0].find("idle_timeout"), std::string::npos) << closed[0];
        co_await srv.async_stop();
    });
}

}  // namespace
}  // namespace ordo
