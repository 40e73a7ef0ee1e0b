// Resumable sessions (docs/protocol.md, "Resumable sessions"): across dropped connections, every
// request, notification and response arrives exactly once and in order. Connections are cut by a
// userspace proxy (tests/support/cutting_proxy.hpp) on loopback.
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <optional>

#include <gtest/gtest.h>

#include "ordo/rpc/connect.hpp"
#include "ordo/rpc/router.hpp"
#include "ordo/rpc/server.hpp"
#include "rpc/session/session.hpp"
#include "rpc/wire/errors.hpp"
#include "support/cutting_proxy.hpp"
#include "support/peers.hpp"
#include "support/run_test.hpp"
#include "support/streams.hpp"

namespace ordo {
namespace detail {
struct session_test_access {
    static void resume_here(session_registry& reg, std::unique_ptr<transport> t) {
        session::resume_here(reg, session_id{}, "", std::move(t), "", 7, 0);
    }
};
}  // namespace detail
namespace {

using namespace std::chrono_literals;
using test::cut_options;
using test::cutting_proxy;
using test::peer_of;
using test::port_of;
using test::run_test;
using test::wait_until;

// Counts ("add" notifications must arrive as 0, 1, 2...: broken() names the first that did
// not) and answers calls, some of which call back to the caller. Its handlers may run on any
// of the server's loops (one session's on one), the test reads on its own.
struct counting_server {
    explicit counting_server(net::any_io_executor ex, server_options o = {})
        : srv(ex, std::move(o)) {
        srv.on("add", [this](std::uint64_t i) {
            if (i != next_add)
                note("add " + std::to_string(i) + " arrived, expected " +
                     std::to_string(next_add.load()));
            next_add = i + 1;
        });
        srv.on("echo", [this](std::uint64_t i) {
            if (i != next_echo)
                note("echo " + std::to_string(i) + " arrived, expected " +
                     std::to_string(next_echo.load()));
            next_echo = i + 1;
            return i;
        });
        // A call in the other direction, made by the handler: the caller's "twice" answers.
        srv.on("via_caller", [](peer& p, std::uint64_t i) -> net::awaitable<std::uint64_t> {
            channel back(p.shared_from_this());
            co_return co_await back.async_call<std::uint64_t>("twice", i) + 1;
        });
        srv.on("bump", [this] {
            const int n = ++bumps;
            if (on_bump) on_bump();
            return n;
        });
        url = srv.listen("tcp://127.0.0.1:0");
    }
    void note(std::string what) {
        std::lock_guard l(m);
        if (!broken_) broken_ = std::move(what);
    }
    std::optional<std::string> broken() {
        std::lock_guard l(m);
        return broken_;
    }
    server srv;
    std::string url;
    std::atomic<std::uint64_t> next_add{0}, next_echo{0};
    std::atomic<int> bumps{0};
    std::function<void()> on_bump;
    std::mutex m;
    std::optional<std::string> broken_;
};

handlers caller_handlers() {
    handlers h;
    h.on("twice", [](std::uint64_t i) { return 2 * i; });
    return h;
}

// Scale of the long run: ORDO_RESUME_SCALE=0.2 runs a fifth of it (sanitizer builds).
double scale() {
    const char* s = std::getenv("ORDO_RESUME_SCALE");
    return s ? std::atof(s) : 1.0;
}

// Each of these runs on a server with 1, 2 and 4 loops. With several, the caller's new
// connection lands on another loop than its session's (the least loaded: the session's own
// holds it) and moves there at its ordo.hello.
class ResumeOnLoops : public ::testing::TestWithParam<std::size_t> {
  protected:
    server_options options() const {
        server_options o;
        o.threads = GetParam();
        return o;
    }
};

INSTANTIATE_TEST_SUITE_P(Threads, ResumeOnLoops, ::testing::Values(1, 2, 4),
                         [](const auto& info) { return std::to_string(info.param) + "loops"; });

// A resume that claimed its session on one loop finds it ended on the session's loop: the
// caller is told why, its connection closes, and the server lets the connection go once it
// has (nothing is left to keep the loop running).
TEST(Resume, AConnectionWhoseSessionEndedOnItsWayIsToldWhyAndLetGo) {
    net::io_context io;
    detail::session_registry reg(std::chrono::seconds(10), 8);
    std::vector<std::string> got;
    std::optional<close_result> end;
    std::unique_ptr<batched_comm> caller;
    net::co_spawn(
        io,
        [&]() -> net::awaitable<void> {
            auto p = co_await test::connect_pair("tcp");
            caller = std::make_unique<batched_comm>(
                std::move(p.client), comm_options{},
                [&](std::string_view m) { got.emplace_back(m); },
                [&](const close_result& r) { end = r; });
            caller->start();
            detail::session_test_access::resume_here(reg, std::move(p.server));
        },
        [](std::exception_ptr e) {
            if (e) std::rethrow_exception(e);
        });
    // Ends by itself once the caller's connection has closed and the server's is let go.
    io.run_for(std::chrono::seconds(60));
    EXPECT_TRUE(io.stopped()) << "the loop still had work after 60 s";
    ASSERT_TRUE(end.has_value());
    EXPECT_EQ(end->code, make_error_code(errc::peer_lost)) << end->reason;
    ASSERT_EQ(got.size(), 1u);
    EXPECT_NE(got[0].find("no session 000000"), std::string::npos) << got[0];
}

// The same, with the loop destroyed before the server's farewell is written: what holds the
// connection goes with the io_context (LeakSanitizer checks this under CI's ASan build).
TEST(Resume, AFarewellToAConnectionGoesWithItsIoContext) {
    std::unique_ptr<transport> kept;
    {
        net::io_context io;
        detail::session_registry reg(std::chrono::seconds(10), 8);
        bool handed = false;
        net::co_spawn(
            io,
            [&]() -> net::awaitable<void> {
                auto p = co_await test::connect_pair("tcp");
                kept = std::move(p.client);
                detail::session_test_access::resume_here(reg, std::move(p.server));
                handed = true;
            },
            [](std::exception_ptr e) {
                if (e) std::rethrow_exception(e);
            });
        for (int i = 0; i < 10000 && !handed; ++i) io.run_one_for(std::chrono::milliseconds(10));
        ASSERT_TRUE(handed);
        kept.reset();
    }
}

TEST(Resume, SessionIsResumableAndCallsWork) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        counting_server s(ex);
        auto c = co_await async_connect(s.url + "?resume_ms=5000");
        EXPECT_EQ(co_await c.async_call<std::uint64_t>("echo", 0), 0u);
        EXPECT_TRUE(peer_of(c)->is_resumable());
        co_await s.srv.async_stop();
    });
}

TEST(Resume, WithoutResumeMsTheSessionIsPlain) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        counting_server s(ex);
        auto c = co_await async_connect(s.url);
        EXPECT_EQ(co_await c.async_call<std::uint64_t>("echo", 0), 0u);
        EXPECT_FALSE(peer_of(c)->is_resumable());
        co_await s.srv.async_stop();
    });
}

TEST(Resume, AServerThatDoesNotResumeServesAPlainSession) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        server_options so;
        so.resume_window = 0ms;  // answers ordo.hello as a reserved name, like a foreign peer
        counting_server s(ex, so);
        auto c = co_await async_connect(s.url + "?resume_ms=5000");
        c.notify("add", std::uint64_t{0});
        EXPECT_EQ(co_await c.async_call<std::uint64_t>("echo", 0), 0u);
        EXPECT_FALSE(peer_of(c)->is_resumable());
        EXPECT_EQ(s.next_add.load(), 1u);
        co_await s.srv.async_stop();
    });
}

// Cuts at chosen moments: calls pending over a cut complete, notifications arrive once, in order.
TEST_P(ResumeOnLoops, CallsAndNotificationsSurviveCuts) {
    run_test([this]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        counting_server s(ex, options());
        cutting_proxy proxy("127.0.0.1", port_of(s.url));
        auto hs = caller_handlers();
        peer_options po;  // named: see docs/calls-and-channels.md, "GCC 12 note"
        auto c = co_await async_connect(proxy.url() + "?resume_ms=10000", po, &hs);
        std::uint64_t adds = 0, echoes = 0;
        for (int round = 0; round < 20; ++round) {
            for (int i = 0; i < 100; ++i) c.notify("add", adds++);
            std::size_t done = 0;
            for (int i = 0; i < 50; ++i, ++echoes)
                c.async_call<std::uint64_t>("echo", echoes,
                                            [&, want = echoes](std::error_code e, std::uint64_t r) {
                                                EXPECT_FALSE(e) << e.message();
                                                EXPECT_EQ(r, want);
                                                ++done;
                                            });
            proxy.cut_all();
            EXPECT_EQ(co_await c.async_call<std::uint64_t>("via_caller", 20), 41u);
            ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return done == 50; }));
        }
        EXPECT_EQ(co_await c.async_call<std::uint64_t>("echo", echoes), echoes);
        EXPECT_EQ(s.next_add.load(), adds);
        EXPECT_FALSE(s.broken()) << *s.broken();
        EXPECT_GE(proxy.cuts(), 10u);  // a cut_all() while the caller reconnects cuts nothing
        EXPECT_GE(peer_of(c)->counters().resumes, 1u);
        // With several loops the caller came back on another loop (the least loaded: not its
        // session's, unless the last connection there had not finished closing yet).
        if (GetParam() > 1) {
            EXPECT_GE(s.srv.stats().sessions_moved, 1u);
        }
        co_await s.srv.async_stop();
    });
}

// The response of a handler that ran is lost with the connection: the handler does not run
// again, and its answer arrives after the resume.
TEST_P(ResumeOnLoops, ACutRightAfterAHandlerRanDoesNotRunItAgain) {
    run_test([this]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        counting_server s(ex, options());
        cutting_proxy proxy("127.0.0.1", port_of(s.url));
        s.on_bump = [&] { proxy.cut_all(); };
        auto c = co_await async_connect(proxy.url() + "?resume_ms=10000");
        for (int i = 1; i <= 5; ++i) EXPECT_EQ(co_await c.async_call<int>("bump"), i);
        EXPECT_EQ(s.bumps.load(), 5);
        EXPECT_GE(proxy.cuts(), 5u);
        co_await s.srv.async_stop();
    });
}

// Random cuts anywhere (inside messages, inside batches, during handshakes): one-way messages
// and calls both ways, nothing lost, nothing twice, order intact, no error surfaced.
TEST_P(ResumeOnLoops, RandomCutsLoseAndDuplicateNothing) {
    run_test(
        [this]() -> net::awaitable<void> {
            auto ex = co_await net::this_coro::executor;
            counting_server s(ex, options());
            cut_options co;
            co.seed = 20261123;
            co.min_bytes = 2'000;
            co.max_bytes = 40'000;
            cutting_proxy proxy("127.0.0.1", port_of(s.url), co);
            auto hs = caller_handlers();
            peer_options po;  // named: see docs/calls-and-channels.md, "GCC 12 note"
            auto c = co_await async_connect(proxy.url() + "?resume_ms=20000", po, &hs);
            auto p = peer_of(c);
            const auto one_way = static_cast<std::uint64_t>(1'000'000 * scale());
            const auto calls = static_cast<std::uint64_t>(100'000 * scale());
            std::uint64_t adds = 0, echoes = 0, backs = 0, done = 0, failed = 0;
            net::steady_timer progress(ex);
            while (adds < one_way || echoes + backs < calls) {
                for (int i = 0; i < 200 && adds < one_way; ++i) c.notify("add", adds++);
                for (int i = 0; i < 20 && echoes + backs < calls; ++i) {
                    auto check = [&](std::uint64_t expect) {
                        return [&, expect](std::error_code e, std::uint64_t r) {
                            if (e || r != expect) ++failed;
                            ++done;
                        };
                    };
                    if (i % 4 == 3) {
                        c.async_call<std::uint64_t>("via_caller", backs, check(2 * backs + 1));
                        ++backs;
                    } else {
                        c.async_call<std::uint64_t>("echo", echoes, check(echoes));
                        ++echoes;
                    }
                }
                // Bounded in flight: wait for calls, and for the buffers to drain.
                while (echoes + backs - done > 2000) {
                    progress.expires_after(1ms);
                    co_await progress.async_wait(use_tuple);
                }
                co_await p->async_drain();
            }
            ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return done == echoes + backs; }, 120s));
            ORDO_CO_ASSERT_TRUE(
                co_await wait_until([&] { return s.next_add.load() == one_way; }, 60s));
            EXPECT_EQ(failed, 0u);
            EXPECT_FALSE(s.broken()) << *s.broken();
            EXPECT_TRUE(p->is_open());
            std::printf("random cuts: %zu cuts, %zu connections, %llu resumes, %llu resent\n",
                        proxy.cuts(), proxy.connections(),
                        static_cast<unsigned long long>(p->counters().resumes),
                        static_cast<unsigned long long>(p->counters().messages_resent));
            EXPECT_GE(proxy.cuts(), static_cast<std::size_t>(200 * scale()));
            if (GetParam() > 1) {
                EXPECT_GE(s.srv.stats().sessions_moved, 100 * scale());
            }
            co_await s.srv.async_stop();
        },
        300s);
}

// Connections that carry only a few dozen bytes each: cuts fall inside ordo.hello, inside its
// answer and inside the messages sent again after a resume.
TEST_P(ResumeOnLoops, CutsDuringHandshakesAndResends) {
    run_test([this]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        counting_server s(ex, options());
        cut_options co;
        co.seed = 7;
        co.min_bytes = 10;
        co.max_bytes = 160;
        cutting_proxy proxy("127.0.0.1", port_of(s.url), co);
        auto c = co_await async_connect(proxy.url() + "?resume_ms=30000");
        std::uint64_t done = 0, failed = 0;
        for (std::uint64_t i = 0; i < 30; ++i) {
            c.notify("add", i);
            c.async_call<std::uint64_t>("echo", i, [&, i](std::error_code e, std::uint64_t r) {
                if (e || r != i) ++failed;
                ++done;
            });
        }
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return done == 30; }, 60s));
        EXPECT_EQ(failed, 0u);
        EXPECT_EQ(s.next_add.load(), 30u);
        EXPECT_FALSE(s.broken()) << *s.broken();
        EXPECT_GE(proxy.cuts(), 10u);
        co_await s.srv.async_stop();
    });
}

// The window passes: what was in flight fails with peer_lost and the application hears of it;
// the channel stays usable, and its next call opens a new session.
TEST_P(ResumeOnLoops, NotResumedWithinTheWindowFailsPendingCallsThenANewSessionOpens) {
    run_test([this]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        counting_server s(ex, options());
        cutting_proxy proxy("127.0.0.1", port_of(s.url));
        std::vector<session_event> events;
        std::vector<std::string> undelivered;
        peer_options po;
        po.on_session = [&](const session_event& e) { events.push_back(e); };
        po.on_undelivered = [&](const undelivered_notification& n) {
            undelivered.push_back(n.method);
        };
        auto c = co_await async_connect(proxy.url() + "?resume_ms=300", po, nullptr);
        EXPECT_EQ(co_await c.async_call<std::uint64_t>("echo", 0), 0u);
        proxy.set_refusing(true);
        const auto cut_at = std::chrono::steady_clock::now();
        proxy.cut_all();
        c.notify("add", std::uint64_t{0});
        auto [e, r] = co_await c.async_call<std::uint64_t>("echo", 1, use_tuple);
        EXPECT_EQ(e, errc::peer_lost);
        ORDO_CO_ASSERT_EQ(events.size(), 2u);
        EXPECT_EQ(events[0].what, session_event::kind::opened);
        EXPECT_EQ(events[1].what, session_event::kind::lost);
        EXPECT_NE(events[1].reason.find("not resumed within 300 ms"), std::string::npos)
            << events[1].reason;
        EXPECT_EQ(undelivered, std::vector<std::string>{"add"});
        // The server gives its side up too, after its own window (the caller asked for 300 ms)
        // and a margin past it (at least a second), so that a caller back just inside its own
        // window finds the session.
        EXPECT_TRUE(co_await wait_until([&] { return s.srv.detached_sessions() == 0; }, 20s));
        EXPECT_GE(std::chrono::steady_clock::now() - cut_at, 1300ms);
        // The network is back: the next call opens a new session, the server counts afresh.
        proxy.set_refusing(false);
        EXPECT_EQ(co_await c.async_call<std::uint64_t>("echo", 0), 0u);
        ORDO_CO_ASSERT_EQ(events.size(), 3u);
        EXPECT_EQ(events[2].what, session_event::kind::opened);
        EXPECT_TRUE(peer_of(c)->is_open());
        co_await s.srv.async_stop();
    });
}

TEST(Resume, AServerThatLostTheSessionSaysSoAtOnce) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        auto first = std::make_unique<counting_server>(ex);
        cutting_proxy proxy("127.0.0.1", port_of(first->url));
        std::vector<session_event> events;
        peer_options po;
        po.on_session = [&](const session_event& e) { events.push_back(e); };
        auto c = co_await async_connect(proxy.url() + "?resume_ms=30000", po, nullptr);
        EXPECT_EQ(co_await c.async_call<std::uint64_t>("echo", 0), 0u);
        // The server "restarts" (no goodbye: the connection is cut first): a new one on the same
        // port knows nothing of the session.
        proxy.set_refusing(true);
        proxy.cut_all();
        ORDO_CO_ASSERT_TRUE(
            co_await wait_until([&] { return first->srv.detached_sessions() == 1; }));
        const std::string url = first->url;
        co_await first->srv.async_stop();
        first.reset();
        server second(ex);
        second.on("echo", [](std::uint64_t i) { return i; });
        second.listen(url);
        proxy.set_refusing(false);
        const auto start = std::chrono::steady_clock::now();
        auto [e, r] = co_await c.async_call<std::uint64_t>("echo", 1, use_tuple);
        EXPECT_EQ(e, errc::session_lost);
        EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);  // not the 30 s window
        ORDO_CO_ASSERT_EQ(events.size(), 2u);
        EXPECT_EQ(events[1].what, session_event::kind::lost);
        EXPECT_EQ(events[1].code, errc::session_lost);
        // Later calls go to a new session with the new server.
        EXPECT_EQ(co_await c.async_call<std::uint64_t>("echo", 2), 2u);
        ORDO_CO_ASSERT_EQ(events.size(), 3u);
        EXPECT_EQ(events[2].what, session_event::kind::opened);
        co_await second.async_stop();
    });
}

TEST(Resume, ACleanCloseByTheServerIsNotWaitedOn) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        counting_server s(ex);
        auto c = co_await async_connect(s.url + "?resume_ms=30000");
        EXPECT_EQ(co_await c.async_call<std::uint64_t>("echo", 0), 0u);
        const auto start = std::chrono::steady_clock::now();
        co_await s.srv.async_stop();
        auto [code, why] = co_await peer_of(c)->async_wait_closed();
        EXPECT_LT(std::chrono::steady_clock::now() - start, 10s) << why;
    });
}

// While no connection carries the session, sends are kept up to max_unacked_bytes, then
// refused with overloaded; everything taken arrives after the resume.
TEST_P(ResumeOnLoops, AFullResendBufferPushesBackAndLosesNothing) {
    run_test([this]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        counting_server s(ex, options());
        cutting_proxy proxy("127.0.0.1", port_of(s.url));
        auto c = co_await async_connect(proxy.url() + "?resume_ms=20000&max_unacked_bytes=65536");
        EXPECT_EQ(co_await c.async_call<std::uint64_t>("echo", 0), 0u);
        proxy.set_refusing(true);
        proxy.cut_all();
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return s.srv.detached_sessions() == 1; }));
        std::uint64_t taken = 0;
        bool refused = false;
        for (int i = 0; i < 100'000 && !refused; ++i) {
            try {
                c.notify("add", taken);
                ++taken;
            } catch (const std::system_error& e) {
                EXPECT_EQ(e.code(), errc::overloaded);
                refused = true;
            }
        }
        EXPECT_TRUE(refused);
        EXPECT_GT(taken, 1000u);
        proxy.set_refusing(false);
        co_await peer_of(c)->async_drain();
        EXPECT_EQ(co_await c.async_call<std::uint64_t>("echo", 1), 1u);
        EXPECT_EQ(s.next_add.load(), taken);
        EXPECT_FALSE(s.broken()) << *s.broken();
        co_await s.srv.async_stop();
    });
}

// Between connections, what a session keeps to send on the resume is what counters() calls
// buffered (a sender's backpressure reads it), and async_drain() waits for the resume.
TEST_P(ResumeOnLoops, WhileDetachedTheBufferedBytesAreWhatWaitsForTheResume) {
    run_test([this]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        counting_server s(ex, options());
        cutting_proxy proxy("127.0.0.1", port_of(s.url));
        auto c = co_await async_connect(proxy.url() + "?resume_ms=20000");
        auto p = peer_of(c);
        EXPECT_EQ(co_await c.async_call<std::uint64_t>("echo", 0), 0u);
        proxy.set_refusing(true);
        proxy.cut_all();
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return s.srv.detached_sessions() == 1; }));
        // The caller's side hears of the drop at its next send at the latest.
        std::uint64_t sent = 0;
        for (; sent < 10'000; ++sent) c.notify("add", sent);
        EXPECT_GE(p->comm().buffered_bytes, 10'000u * 4);  // each add is at least 4 bytes
        EXPECT_EQ(p->comm().buffered_bytes, p->counters().unacked_bytes);
        bool drained = false, drain_failed = false;
        net::co_spawn(ex, p->async_drain(), [&](std::exception_ptr e) {
            drained = true;
            drain_failed = bool(e);
        });
        net::steady_timer pause(ex);
        pause.expires_after(100ms);
        co_await pause.async_wait(use_tuple);
        EXPECT_FALSE(drained);  // no connection yet
        proxy.set_refusing(false);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return drained; }, 30s));
        EXPECT_FALSE(drain_failed);
        EXPECT_EQ(co_await c.async_call<std::uint64_t>("echo", 1), 1u);
        EXPECT_EQ(s.next_add.load(), sent);
        EXPECT_FALSE(s.broken()) << *s.broken();
        co_await s.srv.async_stop();
    });
}

// A caller that sends notifications in a loop, checking only its buffered bytes (the documented
// backpressure), with a short window and a cut early in the run: the write that fails detaches
// the session at once, what follows is kept and pushes back, and the session resumes inside its
// window, every message once and in order. (It used to stay attached to the dead connection,
// paying a thrown error per message, until the server's window had passed: issue 50.)
TEST_P(ResumeOnLoops, ASenderLoopingOverNotifySurvivesAnEarlyCutWithAShortWindow) {
    run_test([this]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        counting_server s(ex, options());
        cutting_proxy proxy("127.0.0.1", port_of(s.url));
        std::vector<session_event> events;
        peer_options po;
        po.on_session = [&](const session_event& e) { events.push_back(e); };
        auto c = co_await async_connect(proxy.url() + "?resume_ms=500", po, nullptr);
        auto p = peer_of(c);
        EXPECT_EQ(co_await c.async_call<std::uint64_t>("echo", 0), 0u);
        constexpr std::uint64_t n = 300'000;
        constexpr std::size_t high_water = 256 * 1024;
        // The loop runs from a timer, as a sender's usually does, not from inside the delivery
        // of echo's answer (where the connection holds its writes until the delivery ends).
        net::steady_timer pause(ex);
        pause.expires_after(1ms);
        co_await pause.async_wait(use_tuple);
        std::uint64_t resumed_at = n;  // the first message sent after the resume
        for (std::uint64_t i = 0; i < n; ++i) {
            // The cut, early, from inside the loop: the proxy resets both sides before
            // cut_all() returns, so that the next write the caller makes fails in its send().
            if (i == n / 30) proxy.cut_all();
            if (resumed_at == n && p->counters().resumes > 0) resumed_at = i;
            c.notify("add", i);
            if (p->comm().buffered_bytes > high_water) co_await p->async_drain();
        }
        // Pushed back while detached, the loop gave the event loop its turn, and the session
        // resumed long before the loop's end (not after a turn of 290,000 messages).
        EXPECT_LT(resumed_at, n / 2);
        EXPECT_EQ(co_await c.async_call<std::uint64_t>("echo", 1), 1u);
        EXPECT_EQ(s.next_add.load(), n);
        EXPECT_FALSE(s.broken()) << *s.broken();
        EXPECT_EQ(proxy.cuts(), 1u);
        EXPECT_EQ(p->counters().resumes, 1u);
        for (const auto& e : events) EXPECT_NE(e.what, session_event::kind::lost) << e.reason;
        co_await s.srv.async_stop();
    });
}

// Over mutual TLS the session resumes for the client that opened it (the server checks that the
// new connection's client certificate is the same).
TEST_P(ResumeOnLoops, OverMutualTlsTheSameClientResumes) {
    run_test([this]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        const auto& f = test::shared_tls_files();
        server srv(ex, options());
        srv.on("echo", [](std::uint64_t i) { return i; });
        const std::string url = srv.listen("tls://127.0.0.1:0?cert=" + f.server_cert +
                                           "&key=" + f.server_key + "&ca=" + f.ca);
        cutting_proxy proxy("127.0.0.1", port_of(url));
        const std::string via = "tls://127.0.0.1:" + std::to_string(proxy.port()) + "?ca=" + f.ca +
                                "&cert=" + f.client_cert + "&key=" + f.client_key +
                                "&resume_ms=10000";
        auto c = co_await async_connect(via);
        for (std::uint64_t i = 0; i < 3; ++i) {
            EXPECT_EQ(co_await c.async_call<std::uint64_t>("echo", i), i);
            proxy.cut_all();
        }
        EXPECT_EQ(co_await c.async_call<std::uint64_t>("echo", 3), 3u);
        EXPECT_TRUE(peer_of(c)->is_resumable());
        EXPECT_GE(peer_of(c)->counters().resumes, 1u);
        co_await srv.async_stop();
    });
}

// Router replicas take resume_ms too: a cut replica connection resumes instead of being dropped.
TEST(Resume, RouterReplicasResume) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        counting_server a(ex), b(ex);
        cutting_proxy pa("127.0.0.1", port_of(a.url)), pb("127.0.0.1", port_of(b.url));
        auto c =
            co_await async_connect("route+tcp://127.0.0.1:" + std::to_string(pa.port()) +
                                   ",127.0.0.1:" + std::to_string(pb.port()) + "?resume_ms=10000");
        int done = 0;
        for (int round = 0; round < 10; ++round) {
            for (int i = 0; i < 20; ++i)
                c.async_call<int>("bump", [&](std::error_code e, int) {
                    EXPECT_FALSE(e) << e.message();
                    ++done;
                });
            pa.cut_all();
            pb.cut_all();
            ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return done == 20 * (round + 1); }));
        }
        EXPECT_EQ(a.bumps.load() + b.bumps.load(), 200);  // each call ran once
        auto r = std::dynamic_pointer_cast<router>(c.impl());
        for (const auto& rep : r->replicas()) EXPECT_EQ(rep.errors, 0u) << rep.url;
        co_await a.srv.async_stop();
        co_await b.srv.async_stop();
    });
}

// A resume refused by a server at max_connections (its detached session holds the one slot):
// the refusal is not taken for a goodbye; the caller retries until its window passes, and its
// next call opens a new session once the server has let the old one go.
TEST(Resume, ARefusedResumeIsRetriedNotTakenForAGoodbye) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        server_options so;
        so.max_connections = 1;
        counting_server s(ex, so);
        cutting_proxy proxy("127.0.0.1", port_of(s.url));
        auto c = co_await async_connect(proxy.url() + "?resume_ms=500");
        EXPECT_EQ(co_await c.async_call<std::uint64_t>("echo", 0), 0u);
        proxy.cut_all();
        auto [e, r] = co_await c.async_call<std::uint64_t>("echo", 1, use_tuple);
        // Refused until the caller's window passed (peer_lost), or until the server let the
        // session go first and said so (session_lost): both windows are 500 ms.
        EXPECT_TRUE(e == errc::peer_lost || e == errc::session_lost) << e.message();
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return s.srv.peer_count() == 0; }, 10s));
        EXPECT_EQ(co_await c.async_call<std::uint64_t>("echo", 0), 0u);  // a new session
        EXPECT_TRUE(peer_of(c)->is_open());
        co_await s.srv.async_stop();
    });
}

// Deadlines keep running while the session waits for a connection.
TEST_P(ResumeOnLoops, DeadlinesKeepRunningBetweenConnections) {
    run_test([this]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        counting_server s(ex, options());
        cutting_proxy proxy("127.0.0.1", port_of(s.url));
        auto c = co_await async_connect(proxy.url() + "?resume_ms=30000");
        EXPECT_EQ(co_await c.async_call<std::uint64_t>("echo", 0), 0u);
        proxy.set_refusing(true);
        proxy.cut_all();
        const auto start = std::chrono::steady_clock::now();
        auto [e, r] = co_await c.async_call<std::uint64_t>("echo", 1, timeout(200ms), use_tuple);
        EXPECT_EQ(e, errc::timed_out);
        EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);  // not the 30 s window
        proxy.set_refusing(false);
        // The session resumes; the withdrawn call's late answer is dropped quietly.
        EXPECT_EQ(co_await c.async_call<std::uint64_t>("echo", 2), 2u);
        EXPECT_GE(peer_of(c)->counters().resumes, 1u);
        co_await s.srv.async_stop();
    });
}

// A server keeps at most max_detached_sessions waiting; beyond, it gives up the one detached
// longest, whose caller hears session_lost when it comes back (and then opens a new session).
TEST_P(ResumeOnLoops, DetachedSessionsAreBoundedOnTheServer) {
    run_test([this]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        server_options so = options();
        so.max_detached_sessions = 1;
        counting_server s(ex, so);
        cutting_proxy first("127.0.0.1", port_of(s.url)), second("127.0.0.1", port_of(s.url));
        std::vector<session_event> events;
        peer_options po;
        po.on_session = [&](const session_event& e) { events.push_back(e); };
        auto a = co_await async_connect(first.url() + "?resume_ms=30000", po, nullptr);
        auto b = co_await async_connect(second.url() + "?resume_ms=30000");
        EXPECT_EQ(co_await a.async_call<std::uint64_t>("echo", 0), 0u);
        EXPECT_EQ(co_await b.async_call<std::uint64_t>("echo", 0), 0u);
        first.set_refusing(true);
        first.cut_all();
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return s.srv.detached_sessions() == 1; }));
        second.set_refusing(true);
        second.cut_all();  // a second one detaches: the first is given up
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return s.srv.peer_count() == 1; }));
        EXPECT_EQ(s.srv.detached_sessions(), 1u);
        first.set_refusing(false);
        second.set_refusing(false);
        auto [e, r] = co_await a.async_call<std::uint64_t>("echo", 1, use_tuple);
        EXPECT_EQ(e, errc::session_lost);
        EXPECT_EQ(co_await a.async_call<std::uint64_t>("echo", 2), 2u);  // a new session
        EXPECT_EQ(co_await b.async_call<std::uint64_t>("echo", 3), 3u);  // resumed
        EXPECT_GE(peer_of(b)->counters().resumes, 1u);
        co_await s.srv.async_stop();
    });
}

// Sends one encoded hello to `url` on a fresh connection; returns the answer's error code and
// text (success: {} and "").
net::awaitable<std::pair<std::error_code, std::string>> hello_answer(std::string url, buffer b) {
    auto t = co_await async_connect_transport(url);
    std::error_code ec;
    co_await t->async_write(net::buffer(b.data(), b.size()), ec);
    decoder d;
    char chunk[4096];
    std::optional<message> m;
    while (!m && !ec) {
        const std::size_t n = co_await t->async_read_some(net::buffer(chunk), ec);
        d.feed(std::string_view(chunk, n));
        m = d.next();
    }
    t->close();
    if (!m || m->kind != message_kind::response)
        co_return std::make_pair(ec, std::string("no answer"));
    std::string text;
    if (m->error.is_nil()) co_return std::make_pair(std::error_code{}, text);
    const std::error_code code = detail::error_from_wire(m->error, text);
    co_return std::make_pair(code, text);
}

// Opens a session from `from` (a loopback address of its own) with a raw ordo.hello, reads the
// answer, and drops the connection: the server keeps the session detached.
net::awaitable<void> hello_and_drop(std::uint16_t port, const char* from) {
    net::ip::tcp::socket sock(co_await net::this_coro::executor);
    sock.open(net::ip::tcp::v4());
    sock.bind({net::ip::make_address(from), 0});
    co_await sock.async_connect({net::ip::make_address("127.0.0.1"), port}, use_tuple);
    buffer b;
    encode_request(b, 1, "ordo.hello", 1, msgpack::type::nil_t(), 0, 30'000);
    std::error_code ec;
    co_await net::async_write(sock, net::buffer(b.data(), b.size()),
                              net::redirect_error(net::use_awaitable, ec));
    char answer[256];
    (void)co_await sock.async_read_some(net::buffer(answer),
                                        net::redirect_error(net::use_awaitable, ec));
    sock.close();
}

// When more sessions wait than max_detached_sessions, the one given up is the oldest of the
// address with the most waiting: a flood of hello-and-drop connections from one address does
// not push out another caller's parked session (it used to: the oldest overall went).
TEST_P(ResumeOnLoops, AFloodOfDetachedSessionsFromOneAddressDoesNotEvictAnothersSession) {
    run_test([this]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        server_options so = options();
        so.max_detached_sessions = 8;
        counting_server s(ex, so);
        cutting_proxy proxy("127.0.0.1", port_of(s.url));
        std::vector<session_event> events;
        peer_options po;
        po.on_session = [&](const session_event& e) { events.push_back(e); };
        auto a = co_await async_connect(proxy.url() + "?resume_ms=30000", po, nullptr);
        EXPECT_EQ(co_await a.async_call<std::uint64_t>("echo", 0), 0u);
        proxy.set_refusing(true);
        proxy.cut_all();
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return s.srv.detached_sessions() == 1; }));
        for (int i = 0; i < 40; ++i) co_await hello_and_drop(port_of(s.url), "127.0.0.2");
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return s.srv.detached_sessions() == 8; }));
        proxy.set_refusing(false);
        EXPECT_EQ(co_await a.async_call<std::uint64_t>("echo", 1), 1u);
        EXPECT_GE(peer_of(a)->counters().resumes, 1u);
        for (const auto& e : events) EXPECT_NE(e.what, session_event::kind::lost) << e.reason;
        co_await s.srv.async_stop();
    });
}

// A resume naming a session the server never gave out is refused.
TEST_P(ResumeOnLoops, AForgedSessionIdIsRefused) {
    run_test([this]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        counting_server s(ex, options());
        buffer b;
        const std::vector<char> forged(16, '\x42');  // packed as bin, like a session id
        encode_request(b, 7, "ordo.hello", 1, forged, 0, 1000);
        auto [code, text] = co_await hello_answer(s.url, std::move(b));
        EXPECT_EQ(code, errc::session_lost) << text;
        co_await s.srv.async_stop();
    });
}

// Hellos a server cannot honour are answered with an error saying why (and the connection
// goes on as a plain one).
TEST(Resume, HellosThatCannotBeHonouredAreAnsweredWithTheReason) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        counting_server s(ex);
        const msgpack::type::nil_t nil;
        struct bad {
            buffer b;
            std::string says;
        };
        std::vector<bad> cases(4);
        encode_request(cases[0].b, 1, "ordo.hello", 2, nil, 0, 1000);
        cases[0].says = "version 2 is not supported";
        encode_request(cases[1].b, 1, "ordo.hello", 1, nil, 0, 0);
        cases[1].says = "window_ms 0";
        encode_request(cases[2].b, 1, "ordo.hello", 1, nil, 5, 1000);
        cases[2].says = "counts 5 messages received; 0 were sent";
        encode_request(cases[3].b, 1, "ordo.hello", 1, "not an id", 0, 1000);
        cases[3].says = "expects [version, session id or nil, received, window_ms]";
        for (auto& c : cases) {
            auto [code, text] = co_await hello_answer(s.url, std::move(c.b));
            EXPECT_EQ(code, errc::bad_arguments) << text;
            EXPECT_NE(text.find(c.says), std::string::npos) << text;
        }
        // A window beyond a day is granted as a day (no clock overflow).
        buffer huge;
        encode_request(huge, 1, "ordo.hello", 1, nil, 0, std::uint64_t{1} << 63);
        auto [code, text] = co_await hello_answer(s.url, std::move(huge));
        EXPECT_FALSE(code) << text;
        co_await s.srv.async_stop();
    });
}

TEST(Resume, ResumeMsIsRefusedOnPooledChannels) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        counting_server s(ex);
        try {
            co_await async_connect(s.url + "?mode=pooled&resume_ms=1000");
            ADD_FAILURE() << "accepted";
        } catch (const std::system_error& e) {
            EXPECT_EQ(e.code(), errc::bad_address);
            EXPECT_NE(std::string(e.what()).find("not to mode=pooled"), std::string::npos);
        }
        co_await s.srv.async_stop();
    });
}

// Over zmq+ ZeroMQ reconnects underneath and may drop messages unseen: a session there could
// not keep its promise, so asking for one is refused, naming both (not served plain silently).
TEST(Resume, ResumeMsIsRefusedOverZmq) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        server srv(ex);
        srv.on("echo", [](std::uint64_t i) { return i; });
        const std::string url = srv.listen("zmq+tcp://127.0.0.1:0");
        try {
            co_await async_connect(url + "?resume_ms=1000");
            ADD_FAILURE() << "accepted";
        } catch (const std::system_error& e) {
            EXPECT_EQ(e.code(), errc::bad_address);
            const std::string what = e.what();
            EXPECT_NE(what.find("resume_ms is not supported over zmq+"), std::string::npos) << what;
        }
        auto plain = co_await async_connect(url);
        EXPECT_EQ(co_await plain.async_call<std::uint64_t>("echo", 3), 3u);
        co_await srv.async_stop();
    });
}

}  // namespace
}  // namespace ordo
