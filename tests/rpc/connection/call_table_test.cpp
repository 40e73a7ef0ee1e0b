// The call table alone, without a connection: msgid allocation and wrap, deadlines racing
// responses, cancellation before and after the response, protocol errors, fail-all.
#include "rpc/connection/call_table.hpp"

#include <gtest/gtest.h>

#include <vector>

#include "ordo/rpc/peer.hpp"
#include "support/run_test.hpp"
#include "support/sleep.hpp"

namespace ordo {
namespace {

using namespace std::chrono_literals;
using test::run_test;
using test::sleep_for;
using test::wait_until;

// Records every send_cancel; the owner is a token the test holds. Fails the calls of `table`
// (when set) as a connection would.
struct fake_call_table_host final : detail::call_table_host {
    std::vector<std::uint32_t> cancels;
    std::shared_ptr<int> token = std::make_shared<int>(0);
    detail::call_table* table = nullptr;
    void send_cancel(std::uint32_t id, std::uint16_t) override { cancels.push_back(id); }
    std::weak_ptr<void> owner() override { return token; }
    void fail_all_calls(std::error_code code, const std::string& why) override {
        if (table) table->fail_all(code, why);
    }
};

// A call that records how it completed.
struct outcome {
    int completions = 0;
    std::error_code ec;
    std::string detail;
    int result = -1;
};
class recorded_call final : public detail::pending_call {
  public:
    explicit recorded_call(outcome& o) : o_(o) {}
    void complete(std::error_code ec, call_outcome out) override {
        ++o_.completions;
        o_.ec = ec;
        o_.detail = out.detail;
        if (!ec) o_.result = out.result.as<int>();
    }

  private:
    outcome& o_;
};

std::unique_ptr<detail::pending_call> call(outcome& o, std::chrono::milliseconds timeout = 0ms) {
    auto c = std::make_unique<recorded_call>(o);
    c->method = "m";
    c->options.timeout = timeout;
    return c;
}

message response(std::uint32_t id, int result) {
    buffer b;
    encode_response(b, id, result);
    return decode_message(std::string_view(b.data(), b.size()));
}

struct table_fixture {
    explicit table_fixture(net::any_io_executor ex, std::uint32_t first = 0)
        : table(ex, {first, 0ms, 4}, host, counters) {
        host.table = &table;
    }
    fake_call_table_host host;
    peer_counters counters;
    detail::call_table table;
};

TEST(CallTable, MsgidsWrapAndSkipIdsStillPendingOrAbandoned) {
    net::io_context io;
    table_fixture f(io.get_executor(), 0xfffffffeu);
    outcome a, b;
    EXPECT_EQ(f.table.next_id(), 0xfffffffeu);
    EXPECT_EQ(f.table.next_id(), 0xffffffffu);
    // Ids 0 and 1 are taken (one pending, one withdrawn with its response still due): the
    // counter wraps past both.
    f.table.add(0, call(a));
    net::cancellation_signal cancel_b;
    auto cb = call(b);
    cb->slot = cancel_b.slot();
    f.table.add(1, std::move(cb));
    cancel_b.emit(net::cancellation_type::terminal);
    io.run();
    EXPECT_EQ(b.completions, 1);
    EXPECT_EQ(b.ec, errc::cancelled);
    EXPECT_EQ(f.host.cancels, std::vector<std::uint32_t>{1});
    EXPECT_EQ(f.table.next_id(), 2u);
    EXPECT_TRUE(f.table.contains(0));
    // Once the late response to 1 arrived, 1 is free again; 0 stays taken until answered.
    auto late = response(1, 7);
    f.table.on_response(late);
    EXPECT_EQ(b.completions, 1);
    auto r0 = response(0, 42);
    f.table.on_response(r0);
    EXPECT_EQ(a.result, 42);
    EXPECT_EQ(f.table.waiting(), 0u);
}

TEST(CallTable, AResponseToAnIdNoCallUsedIsAProtocolError) {
    net::io_context io;
    table_fixture f(io.get_executor());
    auto m = response(9, 1);
    try {
        f.table.on_response(m);
        FAIL() << "no error";
    } catch (const std::system_error& e) {
        EXPECT_EQ(e.code(), errc::protocol_error);
        EXPECT_NE(std::string(e.what()).find("msgid 9"), std::string::npos) << e.what();
    }
}

TEST(CallTable, ADeadlineThatFiresFirstWinsAndTheLateResponseIsDropped) {
    run_test([]() -> net::awaitable<void> {
        table_fixture f(co_await net::this_coro::executor);
        outcome o;
        const auto id = f.table.next_id();
        f.table.add(id, call(o, 20ms));
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return o.completions > 0; }));
        EXPECT_EQ(o.ec, errc::timed_out);
        EXPECT_EQ(o.detail, "no response within 20 ms");
        EXPECT_EQ(f.host.cancels, std::vector<std::uint32_t>{id});
        auto late = response(id, 5);
        f.table.on_response(late);  // dropped quietly: no throw, no second completion
        EXPECT_EQ(o.completions, 1);
        EXPECT_EQ(f.counters.calls_completed, 1u);
    });
}

TEST(CallTable, AResponseThatArrivesFirstWinsAndTheDeadlineNeverFires) {
    run_test([]() -> net::awaitable<void> {
        table_fixture f(co_await net::this_coro::executor);
        outcome o;
        const auto id = f.table.next_id();
        f.table.add(id, call(o, 30ms));
        auto m = response(id, 5);
        f.table.on_response(m);
        EXPECT_EQ(o.completions, 1);
        EXPECT_EQ(o.result, 5);
        co_await sleep_for(100ms);  // well past the deadline: it must not fire now
        EXPECT_EQ(o.completions, 1);
        EXPECT_FALSE(o.ec);
        EXPECT_TRUE(f.host.cancels.empty());
    });
}

TEST(CallTable, CancellingAfterTheResponseDoesNothing) {
    run_test([]() -> net::awaitable<void> {
        table_fixture f(co_await net::this_coro::executor);
        outcome o;
        net::cancellation_signal sig;
        auto c = call(o);
        c->slot = sig.slot();
        const auto id = f.table.next_id();
        f.table.add(id, std::move(c));
        auto m = response(id, 3);
        f.table.on_response(m);
        sig.emit(net::cancellation_type::terminal);  // the handler was removed with the entry
        co_await sleep_for(20ms);
        EXPECT_EQ(o.completions, 1);
        EXPECT_EQ(o.result, 3);
        EXPECT_TRUE(f.host.cancels.empty());
    });
}

TEST(CallTable, FailAllFailsEveryCallOnceAndForgetsAbandonedIds) {
    run_test([]() -> net::awaitable<void> {
        table_fixture f(co_await net::this_coro::executor);
        outcome a, b, c;
        f.table.add(f.table.next_id(), call(a, 10s));
        f.table.add(f.table.next_id(), call(b));
        const auto cid = f.table.next_id();
        f.table.add(cid, call(c, 10ms));
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return c.completions > 0; }));
        EXPECT_EQ(f.table.abandoned(), 1u);
        f.table.fail_all(errc::peer_lost, "gone");
        EXPECT_EQ(a.completions, 1);
        EXPECT_EQ(a.ec, errc::peer_lost);
        EXPECT_EQ(a.detail, "gone");
        EXPECT_EQ(b.completions, 1);
        EXPECT_EQ(c.completions, 1);
        EXPECT_EQ(f.table.waiting(), 0u);
        EXPECT_EQ(f.table.abandoned(), 0u);
        EXPECT_EQ(f.counters.pending_calls, 0u);
        co_await sleep_for(50ms);  // a's 10 s deadline was disarmed with it
        EXPECT_EQ(a.completions, 1);
    });
}

TEST(CallTable, CallsWaitingWhenTheirContextIsDestroyedFailClosedThroughTheHost) {
    // The io_context goes first (as when a program ends with calls out): the table's calls are
    // failed by its connection, not left holding their callers' handlers for ever.
    auto io = std::make_unique<net::io_context>();
    table_fixture f(io->get_executor());
    outcome a, b;
    f.table.add(f.table.next_id(), call(a));
    f.table.add(f.table.next_id(), call(b, 60'000ms));
    EXPECT_EQ(f.table.waiting(), 2u);
    io.reset();
    EXPECT_EQ(f.table.waiting(), 0u);
    for (const outcome* o : {&a, &b}) {
        EXPECT_EQ(o->completions, 1);
        EXPECT_EQ(o->ec, errc::closed);
        EXPECT_NE(o->detail.find("io_context"), std::string::npos) << o->detail;
    }
}

TEST(CallTable, AbandonedIdsAreRememberedUpToTheirLimit) {
    run_test([]() -> net::awaitable<void> {
        table_fixture f(co_await net::this_coro::executor);  // max_abandoned_ids 4
        std::vector<outcome> os(6);
        std::vector<std::uint32_t> ids;
        for (auto& o : os) {
            ids.push_back(f.table.next_id());
            f.table.add(ids.back(), call(o, 5ms));
        }
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return os.back().completions > 0; }));
        EXPECT_EQ(f.table.abandoned(), 4u);
        // The two oldest were forgotten: a response to them is now a protocol error.
        auto m = response(ids[0], 1);
        EXPECT_THROW(f.table.on_response(m), std::system_error);
        auto n = response(ids[5], 1);
        EXPECT_NO_THROW(f.table.on_response(n));
    });
}

TEST(CallTable, ADeadOwnerSilencesDeadlinesAndCancellations) {
    net::io_context io;
    outcome o;
    {
        table_fixture f(io.get_executor());
        f.table.add(f.table.next_id(), call(o, 1ms));
        f.host.token.reset();  // the connection is gone; its timers may still fire
        io.run_for(50ms);
        EXPECT_EQ(o.completions, 0);
        EXPECT_TRUE(f.host.cancels.empty());
    }
}

}  // namespace
}  // namespace ordo
