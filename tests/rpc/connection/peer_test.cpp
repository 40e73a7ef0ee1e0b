#include "ordo/ordo.hpp"

#include <atomic>
#include <future>
#include <map>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "support/run_test.hpp"
#include "support/sleep.hpp"

// A result type with no default constructor: msgpack's as<T> adaptor builds it.
struct no_default {
    explicit no_default(int x) : v(x) {}
    int v;
};
namespace msgpack {
MSGPACK_API_VERSION_NAMESPACE(MSGPACK_DEFAULT_API_NS) {
    namespace adaptor {
    template <>
    struct as<no_default> {
        no_default operator()(const msgpack::object& o) const { return no_default(o.as<int>()); }
    };
    }  // namespace adaptor
}
}  // namespace msgpack

namespace ordo {
namespace {

using namespace std::chrono_literals;
using test::run_test;
using test::sleep_for;
using test::wait_until;

struct counter : interface {
    method<int(int)> inc{"inc"};
    method<void(int)> note{"note"};
    method<int(int)> sleep_ms{"sleep_ms"};
};

// Requests (rec) and notifications (note) from one peer, 100,000 of them interleaved, are seen
// by the server in send order.
void check_order(handler_options opts, bool suspending) {
    run_test(
        [&]() -> net::awaitable<void> {
            auto ex = co_await net::this_coro::executor;
            server srv(ex);
            std::vector<int> started, finished;
            int running = 0, max_running = 0;
            auto enter = [&](int i) {
                started.push_back(i);
                max_running = std::max(max_running, ++running);
            };
            auto leave = [&](int i) {
                --running;
                finished.push_back(i);
            };
            // The "note" handler calls h by reference: h lives as long as the server.
            auto h = [&](int i) -> net::awaitable<int> {
                enter(i);
                co_await net::post(co_await net::this_coro::executor, net::use_awaitable);
                leave(i);
                co_return i;
            };
            if (suspending) {
                srv.on("rec", h, opts);
                srv.on(
                    "note", [&](int i) -> net::awaitable<void> { co_await h(i); }, opts);
            } else {
                srv.on("rec", [&](int i) {
                    enter(i);
                    leave(i);
                    return i;
                });
                srv.on("note", [&](int i) {
                    enter(i);
                    leave(i);
                });
            }
            auto ch = co_await async_connect(srv.listen("tcp://127.0.0.1:0"));
            constexpr int n = 100'000;
            int answered = 0, wrong = 0;
            for (int i = 0; i < n; ++i) {
                if (i % 3 == 0) {
                    ch.notify("note", i);
                } else {
                    ch.async_call<int>("rec", i, [&, i](std::error_code ec, int v) {
                        ++answered;
                        if (ec || v != i) ++wrong;
                    });
                }
            }
            EXPECT_TRUE(
                co_await wait_until([&] { return finished.size() == std::size_t(n); }, 120s));
            EXPECT_TRUE(co_await wait_until([&] { return answered == n - (n + 2) / 3; }, 60s));
            EXPECT_EQ(wrong, 0);
            ORDO_CO_ASSERT_EQ(started.size(), std::size_t(n));
            for (int i = 0; i < n; ++i) ORDO_CO_ASSERT_EQ(started[i], i);
            if (!opts.concurrent) {
                for (int i = 0; i < n; ++i) ORDO_CO_ASSERT_EQ(finished[i], i);
                EXPECT_EQ(max_running, 1);
            } else if (suspending) {
                EXPECT_GT(max_running, 1) << "concurrent handlers never overlapped";
            }
            co_await srv.async_stop();
        },
        300s);
}

TEST(Ordering, MixedRequestsAndNotificationsReachSerialHandlersInSendOrder) {
    check_order({}, false);
}
TEST(Ordering, SerialHandlersThatSuspendStillTakeEffectInSendOrder) {
    check_order({}, true);
}
TEST(Ordering, ConcurrentHandlersStartInSendOrder) {
    check_order({.concurrent = true}, true);
}

// A server with the counter handlers on tcp, and a connected channel.
struct fixture {
    explicit fixture(net::any_io_executor ex) : srv(ex) {
        srv.on(counter{}.inc, [](int x) { return x + 1; });
        srv.on(counter{}.sleep_ms, [this](int ms) -> net::awaitable<int> {
            try {
                co_await sleep_for(std::chrono::milliseconds(ms));
            } catch (const std::system_error& e) {
                if (e.code() == net::error::operation_aborted) ++handler_saw_cancel;
                throw;
            }
            co_return ms;
        });
        srv.on("fail", [](std::string why) -> int { throw std::runtime_error(why); });
        url = srv.listen("tcp://127.0.0.1:0");
    }
    server srv;
    std::string url;
    int handler_saw_cancel = 0;
};

TEST(Calls, TypedStubCallsLookLikeLocalCalls) {
    run_test([]() -> net::awaitable<void> {
        fixture f(co_await net::this_coro::executor);
        auto c = stub<counter>(co_await async_connect(f.url));
        EXPECT_EQ(co_await c.inc(1), 2);
        EXPECT_EQ(co_await c.inc(41, timeout(5s)), 42);
        co_await f.srv.async_stop();
    });
}

TEST(Calls, TheSameCallWorksThroughEveryCompletionToken) {
    run_test([]() -> net::awaitable<void> {
        fixture f(co_await net::this_coro::executor);
        auto ch = co_await async_connect(f.url);
        auto c = stub<counter>(ch);
        EXPECT_EQ(co_await c.inc(1, net::use_awaitable), 2);
        EXPECT_EQ(co_await c.inc(2, net::experimental::deferred)(net::use_awaitable), 3);
        auto [ec, v] = co_await c.inc(3, net::experimental::as_tuple(net::use_awaitable));
        EXPECT_FALSE(ec);
        EXPECT_EQ(v, 4);
        std::error_code rec;
        EXPECT_EQ(co_await c.inc(4, net::redirect_error(net::use_awaitable, rec)), 5);
        EXPECT_FALSE(rec);
        int from_callback = 0;
        c.inc(5, [&](std::error_code e, int r) { from_callback = e ? -1 : r; });
        EXPECT_TRUE(co_await wait_until([&] { return from_callback != 0; }));
        EXPECT_EQ(from_callback, 6);
        // The untyped form yields the raw value.
        value raw = co_await ch.async_call("inc", 6);
        EXPECT_EQ(raw.get().as<int>(), 7);
        co_await f.srv.async_stop();
    });
}

TEST(Calls, UseFutureFromAnotherThreadCompletes) {
    net::io_context io;
    auto guard = net::make_work_guard(io);
    std::thread t([&] { io.run(); });
    {
        fixture f(io.get_executor());
        auto ch = net::co_spawn(io, async_connect(f.url), net::use_future).get();
        auto c = stub<counter>(ch);
        EXPECT_EQ(c.inc(10, net::use_future).get(), 11);
        auto failing = ch.async_call<int>("nope", 1, net::use_future);
        EXPECT_THROW(failing.get(), std::system_error);
        net::co_spawn(io, f.srv.async_stop(), net::use_future).get();
        ch = channel();
        c = stub<counter>(channel());
        net::post(io, net::use_future).get();  // drop the last references on the io thread
    }
    guard.reset();
    io.stop();
    t.join();
}

TEST(Errors, UnknownMethodBadArgumentsAndThrowingHandlersAnswerErrorsAndTheConnectionStaysUp) {
    run_test([]() -> net::awaitable<void> {
        fixture f(co_await net::this_coro::executor);
        auto ch = co_await async_connect(f.url);
        // (Words as separate strings: GCC 12 cannot keep an initializer list in a coroutine frame.)
        auto expect = [&](errc code, auto call, std::string w1, std::string w2,
                          std::string w3) -> net::awaitable<void> {
            try {
                co_await call();
                ADD_FAILURE() << "no error";
            } catch (const rpc_error& e) {
                EXPECT_EQ(e.code(), code) << e.what();
                for (const std::string* w : {&w1, &w2, &w3})
                    EXPECT_NE(std::string(e.what()).find(*w), std::string::npos) << e.what();
                EXPECT_EQ(e.peer(), f.url);
            }
        };
        co_await expect(
            errc::method_not_found, [&] { return ch.async_call<int>("dec", 1); }, "dec", f.url,
            "no method");
        co_await expect(
            errc::bad_arguments, [&] { return ch.async_call<int>("inc", "one"); }, "inc", "(int)",
            "argument 1");
        co_await expect(
            errc::bad_arguments, [&] { return ch.async_call<int>("inc", 1, 2); }, "inc", "(int)",
            "got 2 arguments");
        co_await expect(
            errc::remote_error, [&] { return ch.async_call<int>("fail", "account 42 is frozen"); },
            "account 42 is frozen", "fail", "remote error");
        co_await expect(
            errc::bad_result, [&] { return ch.async_call<std::string>("inc", 1); }, "inc",
            "bad result", "convert");
        auto [ec, v] =
            co_await ch.async_call<int>("dec", 1, net::experimental::as_tuple(net::use_awaitable));
        EXPECT_EQ(ec, errc::method_not_found);
        EXPECT_EQ(co_await ch.async_call<int>("inc", 1), 2);  // still connected
        co_await f.srv.async_stop();
    });
}

TEST(Errors, AResultThatDoesNotConvertNamesTheExpectedTypeAndTheTypeReceived) {
    run_test([]() -> net::awaitable<void> {
        fixture f(co_await net::this_coro::executor);
        f.srv.on("word", [] { return std::string("abc"); });
        auto ch = co_await async_connect(f.url);
        try {
            co_await ch.async_call<int>("word");
            ADD_FAILURE() << "converted";
        } catch (const rpc_error& e) {
            EXPECT_EQ(e.code(), errc::bad_result) << e.what();
            EXPECT_NE(std::string(e.what()).find("expected int, got str \"abc\""),
                      std::string::npos)
                << e.what();
        }
        try {
            co_await ch.async_call<std::string>("inc", 1);
            ADD_FAILURE() << "converted";
        } catch (const rpc_error& e) {
            EXPECT_NE(std::string(e.what()).find("expected std::string, got positive int 2"),
                      std::string::npos)
                << e.what();
        }
        co_await f.srv.async_stop();
    });
}

TEST(Deadlines, ExpiryFailsWithTimedOutRemovesThePendingEntryAndCancelsTheHandler) {
    run_test([]() -> net::awaitable<void> {
        fixture f(co_await net::this_coro::executor);
        auto ch = co_await async_connect(f.url);
        auto c = stub<counter>(ch);
        try {
            co_await c.sleep_ms(30'000, timeout(50ms));
            ADD_FAILURE() << "no timeout";
        } catch (const rpc_error& e) {
            EXPECT_EQ(e.code(), errc::timed_out);
            EXPECT_NE(std::string(e.what()).find("sleep_ms"), std::string::npos);
        }
        auto& p = static_cast<peer&>(*ch.impl());
        EXPECT_EQ(p.counters().pending_calls, 0u);
        EXPECT_TRUE(co_await wait_until([&] { return f.handler_saw_cancel == 1; }));
        // The late "cancelled" answer is dropped quietly; the connection goes on.
        EXPECT_EQ(co_await c.inc(1), 2);
        EXPECT_TRUE(p.is_open());
        co_await f.srv.async_stop();
    });
}

TEST(Deadlines, AsioCancellationFailsWithCancelledAndTheHandlerObservesIt) {
    run_test([]() -> net::awaitable<void> {
        using namespace net::experimental::awaitable_operators;
        fixture f(co_await net::this_coro::executor);
        auto ch = co_await async_connect(f.url);
        auto c = stub<counter>(ch);
        net::steady_timer t(co_await net::this_coro::executor, 50ms);
        auto r = co_await (c.sleep_ms(30'000, net::experimental::as_tuple(net::use_awaitable)) ||
                           t.async_wait(net::use_awaitable));
        ORDO_CO_ASSERT_EQ(r.index(), 1u);  // the timer won
        auto& p = static_cast<peer&>(*ch.impl());
        EXPECT_EQ(p.counters().pending_calls, 0u);
        EXPECT_TRUE(co_await wait_until([&] { return f.handler_saw_cancel == 1; }));
        EXPECT_EQ(co_await c.inc(1), 2);
        co_await f.srv.async_stop();
    });
}

TEST(Deadlines, ThePeerDefaultTimeoutAppliesToCallsThatSetNone) {
    run_test([]() -> net::awaitable<void> {
        fixture f(co_await net::this_coro::executor);
        peer_options o;
        o.default_timeout = 50ms;
        auto c = stub<counter>(co_await async_connect(f.url, o));
        auto [ec, v] = co_await c.sleep_ms(30'000, net::experimental::as_tuple(net::use_awaitable));
        EXPECT_EQ(ec, errc::timed_out);
        EXPECT_EQ(co_await c.sleep_ms(1, timeout(30s)), 1);  // a per-call timeout overrides it
        co_await f.srv.async_stop();
    });
}

int plain_function(int a, std::string b) {
    return a + static_cast<int>(b.size());
}

TEST(Handlers, PlainFunctionsAndPeerTakingHandlersAreRegisteredAlike) {
    run_test([]() -> net::awaitable<void> {
        server srv(co_await net::this_coro::executor);
        srv.on("plain", plain_function);
        srv.on("whoami", [](peer& p) { return p.remote_address().substr(0, 6); });
        auto ch = co_await async_connect(srv.listen("tcp://127.0.0.1:0"));
        EXPECT_EQ(co_await ch.async_call<int>("plain", 1, "abc"), 4);
        EXPECT_EQ(co_await ch.async_call<std::string>("whoami"), "tcp://");
        co_await srv.async_stop();
    });
}

TEST(Handlers, NotificationsThenACallAreSeenInThatOrder) {
    run_test([]() -> net::awaitable<void> {
        server srv(co_await net::this_coro::executor);
        long total = 0;
        srv.on("add", [&](int x) { return total += x; });
        srv.on("total", [&] { return total; });
        auto ch = co_await async_connect(srv.listen("tcp://127.0.0.1:0"));
        for (int i = 1; i <= 100; ++i) ch.notify("add", i);
        EXPECT_EQ(co_await ch.async_call<long>("total"), 5050);
        co_await srv.async_stop();
    });
}

// close() sends what was queued before it even when the caller drops its last handle at once:
// 20 connections each send 100 notifications, close, and are dropped in the same breath. Over a
// resumable session the close's ordo.bye must get out too, or the server would keep the session
// for its 60 s window: the server's peers are all gone well before that.
void check_close_then_drop(const char* query) {
    run_test(
        [query]() -> net::awaitable<void> {
            server srv(co_await net::this_coro::executor);
            long total = 0;
            int seen = 0;
            srv.on("add", [&](int x) {
                total += x;
                ++seen;
            });
            const auto url = srv.listen("tcp://127.0.0.1:0") + query;
            for (int round = 0; round < 20; ++round) {
                auto ch = co_await async_connect(url);
                for (int i = 1; i <= 100; ++i) ch.notify("add", i);
                ch.impl()->close();
            }  // each channel's last handle went at the end of its round, its notifications queued
            EXPECT_TRUE(co_await wait_until([&] { return seen == 2000; }, 60s)) << seen;
            EXPECT_EQ(total, 20 * 5050);
            EXPECT_TRUE(co_await wait_until([&] { return srv.peer_count() == 0; }, 30s))
                << srv.peer_count() << " sessions left on the server";
            co_await srv.async_stop();
        },
        150s);
}
TEST(Peers, AChannelClosedAndDroppedAtOnceStillSendsWhatItQueued) {
    check_close_then_drop("");
}
TEST(Peers, AResumableChannelClosedAndDroppedAtOnceSendsItsQueueAndItsGoodbye) {
    check_close_then_drop("?resume_ms=60000");
}

TEST(Peers, BothSidesCallEachOtherOverOneConnection) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        server srv(ex);
        // The server's handler calls back into the client that called it.
        srv.on("twice_via_client", [](peer& p, int x) -> net::awaitable<int> {
            int y = co_await channel(p.shared_from_this()).async_call<int>("client_double", x);
            co_return y + 1;
        });
        srv.on(counter{}.inc, [](int x) { return x + 1; });
        handlers mine;
        mine.on("client_double", [](int x) { return 2 * x; });
        const peer_options defaults;
        auto ch = co_await async_connect(srv.listen("tcp://127.0.0.1:0"), defaults, &mine);
        int ok = 0;
        for (int i = 0; i < 100; ++i) {
            ch.async_call<int>("twice_via_client", i, [&, i](std::error_code ec, int v) {
                if (!ec && v == 2 * i + 1) ++ok;
            });
            ch.async_call<int>("inc", i, [&, i](std::error_code ec, int v) {
                if (!ec && v == i + 1) ++ok;
            });
        }
        EXPECT_TRUE(co_await wait_until([&] { return ok == 200; }));
        co_await srv.async_stop();
    });
}

TEST(Msgids, WrapAroundKeepsMatchingResponses) {
    run_test([]() -> net::awaitable<void> {
        fixture f(co_await net::this_coro::executor);
        peer_options o;
        o.first_msgid = 0xffffffffu - 20;
        auto ch = co_await async_connect(f.url, o);
        int ok = 0;
        for (int i = 0; i < 64; ++i)
            ch.async_call<int>("inc", i, [&, i](std::error_code ec, int v) {
                if (!ec && v == i + 1) ++ok;
            });
        EXPECT_TRUE(co_await wait_until([&] { return ok == 64; }));
        co_await f.srv.async_stop();
    });
}

TEST(Msgids, AResponseToAnUnknownIdIsAProtocolError) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        auto l = listen(ex, "tcp://127.0.0.1:0");
        auto ch = co_await async_connect(l->local_address());
        auto raw = co_await l->async_accept();
        std::error_code ec;
        std::optional<std::error_code> call_ec;
        ch.async_call<int>("inc", 1, [&](std::error_code e, int) { call_ec = e; });
        buffer b;
        encode_response(b, 999, 1);
        co_await raw->async_write(net::buffer(b.data(), b.size()), ec);
        EXPECT_TRUE(co_await wait_until([&] { return call_ec.has_value(); }));
        ORDO_CO_ASSERT_TRUE(call_ec.has_value());
        EXPECT_EQ(*call_ec, errc::protocol_error);
        auto& p = static_cast<peer&>(*ch.impl());
        auto [code, reason] = co_await p.async_wait_closed();
        EXPECT_EQ(code, errc::protocol_error);
        EXPECT_NE(reason.find("msgid 999"), std::string::npos) << reason;
        // Later calls fail at once with the same error.
        auto [ec2, v] =
            co_await ch.async_call<int>("inc", 1, net::experimental::as_tuple(net::use_awaitable));
        EXPECT_EQ(ec2, errc::protocol_error);
    });
}

// What a router books its replicas' calls by (peer::observe_calls): every end of a call,
// answered, failed, timed out or refused at once, before its caller hears; the detail it
// amends is what the caller hears; a call it takes is not completed by the peer.
TEST(Peers, ACallObserverHearsEveryCallEndBeforeItsCallerAndMayTakeTheCall) {
    run_test([]() -> net::awaitable<void> {
        fixture f(co_await net::this_coro::executor);
        auto ch = co_await async_connect(f.url);
        auto& p = static_cast<peer&>(*ch.impl());
        struct seen {
            std::string method;
            std::error_code ec;
            bool now;
            int callers_heard;  // how many callers had heard when it was told
        };
        struct watch final : detail::call_observer {
            std::vector<seen>* log;
            const int* heard;
            std::unique_ptr<detail::pending_call>* taken;
            void ended(std::unique_ptr<detail::pending_call>& call, std::error_code ec,
                       call_outcome& out, bool now) override {
                log->push_back({call->method, ec, now, *heard});
                if (ec == errc::timed_out)
                    *taken = std::move(call);
                else if (ec)
                    out.detail = "observed: " + out.detail;
            }
        };
        std::vector<seen> log;
        int heard = 0;
        std::unique_ptr<detail::pending_call> taken;
        auto w = std::make_unique<watch>();
        w->log = &log;
        w->heard = &heard;
        w->taken = &taken;
        p.observe_calls(std::move(w));
        std::vector<std::pair<std::error_code, std::string>> results;
        auto on = [&](const char* what) {
            return [&, what](std::error_code ec, int) {
                ++heard;
                results.emplace_back(ec, what);
            };
        };
        ch.async_call<int>("inc", 1, on("inc"));
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return heard == 1; }));
        try {
            co_await ch.async_call<int>("fail", std::string("boom"));
            ADD_FAILURE() << "no error";
        } catch (const rpc_error& e) {
            EXPECT_NE(std::string(e.what()).find("observed: "), std::string::npos) << e.what();
            ++heard;
        }
        // Taken at its deadline: its caller hears nothing from the peer, and the call is whole.
        ch.async_call<int>("sleep_ms", 30'000, timeout(50ms), on("sleep_ms"));
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return taken != nullptr; }));
        co_await sleep_for(50ms);
        EXPECT_EQ(heard, 2);
        EXPECT_EQ(taken->method, "sleep_ms");
        taken->complete(make_error_code(errc::cancelled), call_outcome{});
        taken.reset();
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return heard == 3; }));
        EXPECT_EQ(results.back().first, errc::cancelled);
        // Refused at once on a closed connection: told too, not inline.
        p.abort();
        ch.async_call<int>("inc", 2, on("inc"));
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return heard == 4; }));
        ORDO_CO_ASSERT_EQ(log.size(), 4u);
        EXPECT_EQ(log[0].method, "inc");
        EXPECT_FALSE(log[0].ec);
        EXPECT_TRUE(log[0].now);
        EXPECT_EQ(log[1].method, "fail");
        EXPECT_EQ(log[1].ec, errc::remote_error);
        EXPECT_EQ(log[2].ec, errc::timed_out);
        EXPECT_FALSE(log[2].now);
        EXPECT_EQ(log[3].ec, errc::closed);
        EXPECT_FALSE(log[3].now);
        for (std::size_t i = 0; i < log.size(); ++i) EXPECT_EQ(log[i].callers_heard, int(i)) << i;
        co_await f.srv.async_stop();
    });
}

TEST(Peers, ResponsesForAPeerThatWentAwayAreDroppedAndItsResourcesFreed) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        server srv(ex);
        int finished = 0;
        // Ignores cancellation, so it answers after its peer has gone.
        srv.on("stubborn", [&](int ms) -> net::awaitable<int> {
            try {
                co_await sleep_for(std::chrono::milliseconds(ms));
            } catch (const std::system_error&) {
            }
            co_await net::this_coro::reset_cancellation_state();  // Asio would throw again
            net::steady_timer t(co_await net::this_coro::executor, std::chrono::milliseconds(ms));
            co_await t.async_wait(use_tuple);
            ++finished;
            co_return ms;
        });
        auto url = srv.listen("tcp://127.0.0.1:0");
        {
            auto ch = co_await async_connect(url);
            std::optional<std::error_code> got;
            ch.async_call<int>("stubborn", 100, [&](std::error_code e, int) { got = e; });
            EXPECT_TRUE(co_await wait_until([&] { return srv.peer_count() == 1; }));
            static_cast<peer&>(*ch.impl()).abort();
            EXPECT_TRUE(co_await wait_until([&] { return got.has_value(); }));
            EXPECT_EQ(*got, errc::closed);
        }
        EXPECT_TRUE(co_await wait_until([&] { return finished == 1 && srv.peer_count() == 0; }));
        co_await srv.async_stop();
    });
}

TEST(Threads, CallsFromManyCoroutinesOnTwoThreadsAreAllMatched) {
    net::io_context io(2);
    auto strand = net::make_strand(io);
    auto guard = net::make_work_guard(io);
    std::vector<std::thread> threads;
    for (int i = 0; i < 2; ++i) threads.emplace_back([&] { io.run(); });
    {
        auto srv_strand = net::make_strand(io);
        std::unique_ptr<server> srv;
        std::string url;
        net::post(srv_strand, net::use_future).get();
        net::dispatch(srv_strand, [&] {
            srv = std::make_unique<server>(srv_strand);
            srv->on(counter{}.inc, [](int x) { return x + 1; });
            url = srv->listen("tcp://127.0.0.1:0");
        });
        net::post(srv_strand, net::use_future).get();
        // The peer lives on its own strand; callers run on other strands of the same threads.
        auto ch = net::co_spawn(strand, async_connect(url), net::use_future).get();
        std::atomic<int> ok{0}, bad{0};
        std::vector<std::future<void>> done;
        for (int k = 0; k < 16; ++k) {
            done.push_back(net::co_spawn(
                net::make_strand(io),
                [&, k]() -> net::awaitable<void> {
                    auto c = stub<counter>(ch);
                    for (int i = 0; i < 200; ++i) {
                        int v = k * 1000 + i;
                        if (co_await c.inc(v) == v + 1)
                            ++ok;
                        else
                            ++bad;
                    }
                },
                net::use_future));
        }
        for (auto& d : done) EXPECT_EQ(d.wait_for(60s), std::future_status::ready);
        EXPECT_EQ(ok.load(), 16 * 200);
        EXPECT_EQ(bad.load(), 0);
        net::co_spawn(srv_strand, srv->async_stop(), net::use_future).get();
        net::dispatch(strand, [&] { ch = channel(); });
        net::post(strand, net::use_future).get();
        net::dispatch(srv_strand, [&] { srv.reset(); });
        net::post(srv_strand, net::use_future).get();
    }
    guard.reset();
    for (auto& t : threads) t.join();
}

// ordo.methods lists what a server serves, with parameter types; turned off, it is an unknown
// reserved method like any other.
TEST(Introspection, OrdoMethodsListsTheMethodsWithTheirParameterTypes) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        server srv(ex);
        srv.on("inc", [](int x) { return x + 1; });
        srv.on("greet",
               [](const std::string& who, int times) { return who + std::to_string(times); });
        const std::string url = srv.listen("tcp://127.0.0.1:0");
        auto ch = co_await async_connect(url);
        auto listed = co_await ch.async_call<std::map<std::string, std::string>>("ordo.methods");
        EXPECT_EQ(listed, (std::map<std::string, std::string>{{"greet", "(std::string, int)"},
                                                              {"inc", "(int)"}}));
        srv.handlers().introspection(false);
        auto [ec, none] =
            co_await ch.async_call<std::map<std::string, std::string>>("ordo.methods", use_tuple);
        EXPECT_EQ(ec, errc::method_not_found);
        co_await srv.async_stop();
    });
}

// A coroutine call converts its result as msgpack does: a type with no default constructor
// works through its as<T> adaptor.
TEST(Errors, ACoroutineCallYieldsAResultTypeWithNoDefaultConstructor) {
    run_test([]() -> net::awaitable<void> {
        fixture f(co_await net::this_coro::executor);
        auto ch = co_await async_connect(f.url);
        const no_default r = co_await ch.async_call<no_default>("inc", 41);
        EXPECT_EQ(r.v, 42);
        co_await f.srv.async_stop();
    });
}

}  // namespace
}  // namespace ordo
