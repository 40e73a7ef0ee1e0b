// The dispatcher alone, fed decoded messages without a connection: serial order with a
// suspended handler, concurrent handlers overlapping, a pipelined serial handler's window,
// ordo.cancel of a running and of a queued request, read pausing at the queue limit, and stop().
#include "rpc/dispatch/dispatcher.hpp"

#include <gtest/gtest.h>

#include <vector>

#include "ordo/rpc/handlers.hpp"
#include "ordo/rpc/peer.hpp"
#include "support/run_test.hpp"
#include "support/sleep.hpp"
#include "support/streams.hpp"

namespace ordo {
namespace {

using namespace std::chrono_literals;
using test::run_test;
using test::wait_until;

struct answer {
    std::uint32_t msgid = 0;
    bool ok = false;
    std::string text;  // the result as text, or the error's message
    errc code{};
};

// Records what the dispatcher sends and asks for.
struct fake_dispatcher_host final : detail::dispatcher_host {
    std::vector<answer> answers;
    std::vector<bool> pauses;
    int started = 0;
    std::shared_ptr<int> token = std::make_shared<int>(0);

    void send_response(const buffer& b) override {
        message m = decode_message(std::string_view(b.data(), b.size()));
        answer a;
        a.msgid = m.msgid;
        a.ok = m.error.is_nil();
        if (a.ok) {
            std::ostringstream t;
            t << m.result;
            a.text = t.str();
        } else {
            auto kv = m.error.as<std::map<std::string, msgpack::object>>();
            a.code = static_cast<errc>(kv.at("code").as<int>());
            a.text = kv.at("message").as<std::string>();
        }
        answers.push_back(a);
    }
    void pause_reading(bool p) override { pauses.push_back(p); }
    void handler_started() override { ++started; }
    std::shared_ptr<void> keep_alive() override { return token; }
    void remote_closing(std::error_code, std::string reason) override {
        closing = std::move(reason);
    }
    void dropped(std::string_view method, errc code, std::string reason) override {
        drops.push_back({std::string(method), code, std::move(reason)});
    }
    std::string closing;
    struct drop {
        std::string method;
        errc code;
        std::string reason;
    };
    std::vector<drop> drops;
};

message request(std::uint32_t id, std::string_view method, int arg) {
    buffer b;
    encode_request(b, id, method, arg);
    return decode_message(std::string_view(b.data(), b.size()));
}
message notification(std::string_view method, std::uint32_t arg) {
    buffer b;
    encode_notification(b, method, arg);
    return decode_message(std::string_view(b.data(), b.size()));
}

// A dispatcher over `h` with a fake host. Handlers that take ordo::peer& get a real peer over
// an in-memory transport that is never started.
struct rig {
    fake_dispatcher_host host;
    peer_counters counters;
    test::transport_pair pair;
    std::shared_ptr<peer> self;
    std::unique_ptr<detail::dispatcher> d;

    static net::awaitable<std::unique_ptr<rig>> make(const handlers& h, std::size_t max_queued,
                                                     std::size_t max_queued_bytes = 1 << 30) {
        auto r = std::make_unique<rig>();
        r->pair = co_await test::connect_pair("inproc");
        r->self = make_peer(std::move(r->pair.client));
        r->d = std::make_unique<detail::dispatcher>(*r->self, co_await net::this_coro::executor, &h,
                                                    max_queued, max_queued_bytes, nullptr, r->host,
                                                    r->counters);
        co_return r;
    }
    void feed(message m, std::size_t bytes = 16) { d->on_message(m, bytes); }
};

// A handler_gate handlers wait at until the test opens it; open, it lets everyone through.
struct handler_gate {
    explicit handler_gate(net::any_io_executor ex)
        : t(ex, std::chrono::steady_clock::time_point::max()) {}
    net::awaitable<void> wait() {
        if (!opened) co_await t.async_wait(use_tuple);
    }
    void open() {
        opened = true;
        t.cancel();
    }
    net::steady_timer t;
    bool opened = false;
};

// A handler that records its argument, waits at `g` and returns its argument.
auto gated(handler_gate& g, std::vector<int>& ran) {
    return [&g, &ran](int x) -> net::awaitable<int> {
        ran.push_back(x);
        co_await g.wait();
        co_return x;
    };
}

TEST(Dispatcher, ASerialHandlerHoldsTheNextMessageUntilItEnds) {
    run_test([]() -> net::awaitable<void> {
        handler_gate g(co_await net::this_coro::executor);
        std::vector<int> ran;
        handlers h;
        h.on("slow", gated(g, ran));
        h.on("fast", [&](int x) {
            ran.push_back(x);
            return x;
        });
        auto r = co_await rig::make(h, 100);
        r->feed(request(1, "slow", 1));
        r->feed(request(2, "fast", 2));
        r->feed(notification("fast", 3));
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return !ran.empty(); }));
        co_await test::sleep_for(20ms);  // time for "fast" to run if it wrongly could
        EXPECT_EQ(ran, std::vector<int>{1});
        EXPECT_EQ(r->d->queued(), 2u);
        EXPECT_TRUE(r->host.answers.empty());
        g.open();
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return r->host.answers.size() == 2; }));
        EXPECT_EQ(ran, (std::vector<int>{1, 2, 3}));
        EXPECT_EQ(r->host.answers[0].msgid, 1u);
        EXPECT_EQ(r->host.answers[1].msgid, 2u);
        EXPECT_EQ(r->host.answers[1].text, "2");
        EXPECT_EQ(r->counters.requests_served, 2u);
        EXPECT_EQ(r->counters.notifications_served, 1u);
    });
}

TEST(Dispatcher, ConcurrentHandlersOverlapAndStartInOrder) {
    run_test([]() -> net::awaitable<void> {
        handler_gate g(co_await net::this_coro::executor);
        std::vector<int> started;
        int inside = 0, most = 0;
        handlers h;
        h.on(
            "c",
            [&](int x) -> net::awaitable<int> {
                started.push_back(x);
                most = std::max(most, ++inside);
                co_await g.wait();
                --inside;
                co_return x;
            },
            handler_options{.concurrent = true});
        auto r = co_await rig::make(h, 100);
        for (int i = 1; i <= 3; ++i) r->feed(request(i, "c", i));
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return started.size() == 3; }));
        EXPECT_EQ(started, (std::vector<int>{1, 2, 3}));
        EXPECT_EQ(most, 3);
        EXPECT_EQ(r->d->running(), 3u);
        g.open();
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return r->host.answers.size() == 3; }));
        EXPECT_EQ(r->d->running(), 0u);
    });
}

// handler_entry::pipeline (the Python binding's serial methods, whose loop keeps each
// connection's order): up to `pipeline` messages are handed over without waiting for the one
// before; the next waits in the queue, as behind any serial handler, until one of them ends.
TEST(Dispatcher, APipelinedSerialHandlerTakesUpToItsWindowThenQueues) {
    run_test([]() -> net::awaitable<void> {
        handler_gate g(co_await net::this_coro::executor);
        std::vector<int> ran;
        handlers h;
        detail::handler_entry e;
        e.pipeline = 3;
        e.async = [&](peer&, msgpack::object params, buffer& out) -> net::awaitable<void> {
            const int x = params.via.array.ptr[0].as<int>();
            ran.push_back(x);
            co_await g.wait();
            msgpack::pack(out, x);
        };
        h.on_entry("p", std::move(e));
        auto r = co_await rig::make(h, 100);
        for (int i = 1; i <= 5; ++i) r->feed(request(i, "p", i));
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return ran.size() == 3; }));
        co_await test::sleep_for(20ms);  // time for a fourth to start if it wrongly could
        EXPECT_EQ(ran, (std::vector<int>{1, 2, 3}));
        EXPECT_EQ(r->d->running(), 3u);
        EXPECT_EQ(r->d->queued(), 2u);
        g.open();
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return r->host.answers.size() == 5; }));
        EXPECT_EQ(ran, (std::vector<int>{1, 2, 3, 4, 5}));
        for (std::size_t i = 0; i < 5; ++i) {
            EXPECT_EQ(r->host.answers[i].msgid, i + 1);
            EXPECT_EQ(r->host.answers[i].text, std::to_string(i + 1));
        }
        EXPECT_EQ(r->d->running(), 0u);
    });
}

TEST(Dispatcher, CancelOfARunningRequestCancelsItsHandler) {
    run_test([]() -> net::awaitable<void> {
        bool saw_cancel = false;
        handlers h;
        h.on("slow", [&](int) -> net::awaitable<int> {
            try {
                co_await test::sleep_for(30s);
            } catch (const std::system_error&) {
                saw_cancel = true;
                throw;
            }
            co_return 0;
        });
        auto r = co_await rig::make(h, 100);
        r->feed(request(5, "slow", 0));
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return r->d->running() == 1; }));
        r->feed(notification("ordo.cancel", 5));
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return r->host.answers.size() == 1; }));
        EXPECT_TRUE(saw_cancel);
        EXPECT_EQ(r->host.answers[0].msgid, 5u);
        EXPECT_EQ(r->host.answers[0].code, errc::cancelled);
        EXPECT_EQ(r->host.answers[0].text, "handler cancelled");
        EXPECT_EQ(r->counters.handlers_cancelled, 1u);
    });
}

TEST(Dispatcher, CancelOfAQueuedRequestAnswersItWithoutRunningIt) {
    run_test([]() -> net::awaitable<void> {
        handler_gate g(co_await net::this_coro::executor);
        std::vector<int> ran;
        handlers h;
        h.on("slow", gated(g, ran));
        auto r = co_await rig::make(h, 100);
        r->feed(request(1, "slow", 1));
        r->feed(request(2, "slow", 2));
        r->feed(request(3, "slow", 3));
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return ran.size() == 1; }));
        r->feed(notification("ordo.cancel", 2));
        ORDO_CO_ASSERT_EQ(r->host.answers.size(), 1u);  // answered at once
        EXPECT_EQ(r->host.answers[0].msgid, 2u);
        EXPECT_EQ(r->host.answers[0].code, errc::cancelled);
        EXPECT_EQ(r->host.answers[0].text, "cancelled by the caller before it started");
        g.open();
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return r->host.answers.size() == 3; }));
        EXPECT_EQ(ran, (std::vector<int>{1, 3}));
        EXPECT_EQ(r->counters.handlers_cancelled, 0u);
    });
}

TEST(Dispatcher, AFullQueuePausesReadingUntilItHalves) {
    run_test([]() -> net::awaitable<void> {
        handler_gate g(co_await net::this_coro::executor);
        handlers h;
        h.on("slow", [&](int x) -> net::awaitable<int> {
            if (x == 0) co_await g.wait();
            co_return x;
        });
        auto r = co_await rig::make(h, 4);
        r->feed(request(100, "slow", 0));
        for (int i = 1; i <= 3; ++i) r->feed(request(i, "slow", i));
        EXPECT_TRUE(r->host.pauses.empty());
        r->feed(request(4, "slow", 4));  // the fourth queued message: the limit
        EXPECT_EQ(r->host.pauses, std::vector<bool>{true});
        EXPECT_EQ(r->counters.queued_messages, 4u);
        g.open();
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return r->host.answers.size() == 5; }));
        EXPECT_EQ(r->host.pauses, (std::vector<bool>{true, false}));
        for (std::size_t i = 1; i < 5; ++i) EXPECT_EQ(r->host.answers[i].msgid, i);
    });
}

TEST(Dispatcher, QueuedBytesOverTheirLimitPauseReadingToo) {
    run_test([]() -> net::awaitable<void> {
        handler_gate g(co_await net::this_coro::executor);
        std::vector<int> ran;
        handlers h;
        h.on("slow", gated(g, ran));
        auto r = co_await rig::make(h, 100, 1000);
        r->feed(request(100, "slow", 0));  // running: what follows queues
        r->feed(request(1, "slow", 1), 400);
        r->feed(request(2, "slow", 2), 400);
        EXPECT_TRUE(r->host.pauses.empty());
        EXPECT_EQ(r->d->queued_bytes(), 800u);
        r->feed(request(3, "slow", 3), 400);  // 1200 bytes: over max_queued_bytes
        EXPECT_EQ(r->host.pauses, std::vector<bool>{true});
        g.open();
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return r->host.answers.size() == 4; }));
        EXPECT_EQ(r->host.pauses, (std::vector<bool>{true, false}));
        EXPECT_EQ(r->d->queued_bytes(), 0u);
    });
}

TEST(Dispatcher, PingIsAnsweredAndUnknownMethodsAreTold) {
    run_test([]() -> net::awaitable<void> {
        handlers h;
        auto r = co_await rig::make(h, 4);
        r->feed(request(1, "ordo.ping", 0));
        r->feed(request(2, "nope", 0));
        r->feed(request(3, "ordo.nope", 0));
        r->feed(notification("nope", 1));
        ORDO_CO_ASSERT_EQ(r->host.answers.size(), 3u);
        EXPECT_TRUE(r->host.answers[0].ok);
        EXPECT_EQ(r->host.answers[1].code, errc::method_not_found);
        EXPECT_EQ(r->host.answers[1].text, "no method \"nope\"");
        EXPECT_EQ(r->host.answers[2].text, "no method \"ordo.nope\" (reserved name)");
        EXPECT_EQ(r->counters.unknown_notifications, 1u);
    });
}

TEST(Dispatcher, StopCancelsRunningHandlersAndDropsTheQueue) {
    run_test([]() -> net::awaitable<void> {
        int cancelled = 0;
        std::vector<int> ran;
        handlers h;
        h.on("slow", [&](int x) -> net::awaitable<int> {
            ran.push_back(x);
            try {
                co_await test::sleep_for(30s);
            } catch (const std::system_error&) {
                ++cancelled;
            }
            co_return x;
        });
        auto r = co_await rig::make(h, 100);
        r->feed(request(1, "slow", 1));
        r->feed(request(2, "slow", 2));
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return ran.size() == 1; }));
        r->d->stop();
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return r->d->running() == 0; }));
        EXPECT_EQ(cancelled, 1);
        EXPECT_EQ(r->d->queued(), 0u);
        EXPECT_EQ(ran, std::vector<int>{1});
        r->feed(request(3, "slow", 3));  // after stop: not dispatched
        EXPECT_EQ(r->d->running(), 0u);
        EXPECT_EQ(ran, std::vector<int>{1});
        EXPECT_EQ(r->counters.handlers_cancelled, 1u);
    });
}

// A lost resumable session: running handlers are cancelled and their answers dropped (their
// callers are gone), the queue is dropped, and what arrives next is dispatched as usual.
TEST(Dispatcher, RestartDropsTheOldSessionsWorkAndGoesOn) {
    run_test([]() -> net::awaitable<void> {
        std::vector<int> ran;
        handlers h;
        h.on("slow", [&](int x) -> net::awaitable<int> {
            ran.push_back(x);
            if (x < 3) co_await test::sleep_for(30s);  // cancelled by the restart
            co_return x;
        });
        auto r = co_await rig::make(h, 100);
        r->feed(request(1, "slow", 1));
        r->feed(request(2, "slow", 2));
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return ran.size() == 1; }));
        r->d->restart();
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return r->d->running() == 0; }));
        EXPECT_TRUE(r->host.answers.empty());  // the cancelled handler's answer was dropped
        EXPECT_EQ(r->d->queued(), 0u);
        r->feed(request(3, "slow", 3));
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return r->host.answers.size() == 1; }));
        EXPECT_EQ(r->host.answers[0].msgid, 3u);
        EXPECT_TRUE(r->host.answers[0].ok);
        EXPECT_EQ(ran, (std::vector<int>{1, 3}));
        EXPECT_EQ(r->counters.handlers_cancelled, 1u);
    });
}

}  // namespace
}  // namespace ordo
