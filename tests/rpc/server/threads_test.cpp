// Servers over several event loops (server_options::threads), handlers that run elsewhere
// (handler_options::run_on, batch_options::run_on, ordo::worker_pool), and clients called from
// many threads. Also run under ThreadSanitizer by .ci/run.
#include "ordo/ordo.hpp"

#include <atomic>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <stop_token>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "support/cutting_proxy.hpp"
#include "support/run_test.hpp"
#include "support/running_loop.hpp"
#include "support/silent_listener.hpp"
#include "support/streams.hpp"

namespace ordo {
namespace {

using namespace std::chrono_literals;
using test::running_loop;
using test::wait_until;

// The ids of the threads a handler ran on, gathered from several threads.
struct thread_set {
    std::mutex m;
    std::set<std::thread::id> ids;
    void note() {
        std::lock_guard l(m);
        ids.insert(std::this_thread::get_id());
    }
    std::size_t size() {
        std::lock_guard l(m);
        return ids.size();
    }
    bool has(std::thread::id id) {
        std::lock_guard l(m);
        return ids.count(id) > 0;
    }
};

// A server with `threads` loops; its home loop runs on its own thread. Handlers are registered
// by `setup` before it listens.
struct threaded_server {
    running_loop home;
    std::unique_ptr<server> srv;
    std::string url;
    threaded_server(std::size_t threads, std::function<void(server&)> setup, server_options o = {},
                    std::string listen = "tcp://127.0.0.1:0") {
        o.threads = threads;
        net::dispatch(home.io, net::use_future).get();
        net::post(home.io, [&] {
            srv = std::make_unique<server>(home.io.get_executor(), o);
            setup(*srv);
            url = srv->listen(listen);
        });
        net::post(home.io, net::use_future).get();
    }
    ~threaded_server() {
        if (srv) stop();
    }
    // With `pool`, as handler_options::run_on asks: the server stops, then the pool's bodies end
    // (their answers and their coroutines' last steps posted to this loop), then the server and
    // its loop go. A body's coroutine still posting to a destroyed loop is a use after free.
    void stop(worker_pool* pool = nullptr) {
        home.run([this]() -> net::awaitable<void> { co_await srv->async_stop(); });
        if (pool) pool->join();
        net::post(home.io, [this] { srv.reset(); });
        net::post(home.io, net::use_future).get();
    }
    template <class R>
    R on_home(std::function<R()> f) {
        std::promise<R> p;
        net::post(home.io, [&] { p.set_value(f()); });
        return p.get_future().get();
    }
};

// The last handles of a pool and a router dropped on another thread than their loop's, while
// they dial (a listener whose accept queue is full): each closes on its own loop, at once, and
// its waiting call fails with closed. Run under ThreadSanitizer by .ci/run: a close on the
// dropping thread would race with the loop, which runs the dials and their waits.
TEST(Loops, APoolAndARouterDroppedOnAnotherThreadCloseOnTheirLoop) {
    running_loop home;
    std::optional<test::silent_listener> silent;
    ASSERT_TRUE(home.run([&]() -> net::awaitable<bool> {
        silent.emplace(co_await net::this_coro::executor);
        co_return co_await silent->fill();
    }));
    std::promise<std::error_code> pool_heard, router_heard;
    std::shared_ptr<pool> p;
    std::shared_ptr<router> r;
    home.run([&]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        pool_options po;
        po.connect_timeout = 120s;
        p = make_pool(ex, silent->url(), po);
        channel(p).async_call<int>("inc", 1,
                                   [&](std::error_code ec, int) { pool_heard.set_value(ec); });
        router_options ro;
        ro.connect_timeout = 120s;
        ro.wait_for_replica = 120s;
        r = make_router(ex, ro);
        r->add_replica(silent->url());
        channel(r).async_call<int>("inc", 1,
                                   [&](std::error_code ec, int) { router_heard.set_value(ec); });
        co_return;
    });
    ASSERT_EQ(
        home.run([&]() -> net::awaitable<std::size_t> { co_return p->counters().connecting; }), 1u);
    p.reset();  // on this thread
    r.reset();
    auto pool_done = pool_heard.get_future();
    auto router_done = router_heard.get_future();
    ASSERT_EQ(pool_done.wait_for(60s), std::future_status::ready) << "the pool kept its call";
    ASSERT_EQ(router_done.wait_for(60s), std::future_status::ready) << "the router kept its call";
    EXPECT_EQ(pool_done.get(), errc::closed);
    EXPECT_EQ(router_done.get(), errc::closed);
    home.run([&]() -> net::awaitable<void> {
        silent.reset();
        co_return;
    });
}

TEST(Loops, ConnectionsAreSpreadOverTheLoopsAndEachStaysOnOne) {
    thread_set ran_on;
    // Per connection (its first argument), the threads its handler ran on.
    std::mutex m;
    std::map<int, std::set<std::thread::id>> per_connection;
    threaded_server s(2, [&](server& srv) {
        srv.on("where", [&](int conn, int i) {
            ran_on.note();
            std::lock_guard l(m);
            per_connection[conn].insert(std::this_thread::get_id());
            return i;
        });
    });
    running_loop clients;
    clients.run([&]() -> net::awaitable<void> {
        std::vector<channel> chans;
        for (int c = 0; c < 8; ++c) chans.push_back(co_await async_connect(s.url));
        // Each connection's calls are ordered: pipelined, their answers come back in order.
        for (int round = 0; round < 50; ++round)
            for (int c = 0; c < 8; ++c)
                EXPECT_EQ(co_await chans[c].async_call<int>("where", c, round), round);
        EXPECT_EQ(s.on_home<std::size_t>([&] { return s.srv->peer_count(); }), 8u);
    });
    EXPECT_EQ(ran_on.size(), 2u);  // both loops served connections
    EXPECT_EQ(per_connection.size(), 8u);
    for (const auto& [conn, ids] : per_connection)
        EXPECT_EQ(ids.size(), 1u) << "connection " << conn;
}

// TLS handshakes run on the loop each connection is placed on; a failed one is reported once.
TEST(Loops, TlsConnectionsAreSpreadOverTheLoopsToo) {
    const auto& files = test::shared_tls_files();
    thread_set ran_on;
    std::atomic<int> refused{0};
    server_options o;
    o.peer.transport.on_refused = [&](const std::string&) { ++refused; };
    threaded_server s(
        2,
        [&](server& srv) {
            srv.on("inc", [&](int x) {
                ran_on.note();
                return x + 1;
            });
        },
        o, "tls://127.0.0.1:0?cert=" + files.server_cert + "&key=" + files.server_key);
    running_loop clients;
    clients.run([&]() -> net::awaitable<void> {
        std::vector<channel> chans;
        const std::string url = s.url + "?ca=" + files.ca;
        for (int c = 0; c < 6; ++c) chans.push_back(co_await async_connect(url));
        for (auto& ch : chans) EXPECT_EQ(co_await ch.async_call<int>("inc", 1), 2);
        const std::string untrusted = s.url + "?ca=" + files.other_ca;
        auto ex = co_await net::this_coro::executor;
        auto [ec, bad] = co_await net::co_spawn(ex, async_connect(untrusted),
                                                net::experimental::as_tuple(net::use_awaitable));
        EXPECT_TRUE(ec);
        EXPECT_TRUE(co_await wait_until([&] { return refused.load() == 1; }));
    });
    EXPECT_EQ(ran_on.size(), 2u);
}

TEST(Loops, StatsAndOrdoStatsCountEveryLoopsConnections) {
    threaded_server s(2, [](server& srv) { srv.on("inc", [](int x) { return x + 1; }); });
    running_loop clients;
    clients.run([&]() -> net::awaitable<void> {
        std::vector<channel> chans;
        for (int c = 0; c < 6; ++c) chans.push_back(co_await async_connect(s.url));
        for (auto& ch : chans) EXPECT_EQ(co_await ch.async_call<int>("inc", 1), 2);
        // ordo.stats from connections on both loops at once: each gathers every loop.
        std::vector<value> answers;
        for (auto& ch : chans) answers.push_back(co_await ch.async_call<value>("ordo.stats"));
        for (auto& v : answers) {
            const auto& root = v.get();
            std::uint64_t connections = 0, received = 0;
            for (std::uint32_t i = 0; i < root.via.map.size; ++i) {
                const auto& kv = root.via.map.ptr[i];
                if (kv.key.as<std::string>() != "server") continue;
                for (std::uint32_t j = 0; j < kv.val.via.map.size; ++j) {
                    const auto& f = kv.val.via.map.ptr[j];
                    if (f.key.as<std::string>() == "connections")
                        connections = f.val.as<std::uint64_t>();
                    if (f.key.as<std::string>() == "bytes_received")
                        received = f.val.as<std::uint64_t>();
                }
            }
            EXPECT_EQ(connections, 6u);
            EXPECT_GT(received, 6u * 8);  // every connection's call, from both loops
        }
        const auto st = s.on_home<server_stats>([&] { return s.srv->stats(); });
        EXPECT_EQ(st.connections, 6u);
        EXPECT_GE(st.methods.size(), 1u);
        EXPECT_GT(st.bytes_received, 6u * 8 * 2);
    });
}

TEST(Loops, StopWhileHandlersRunOnEveryLoopEnds) {
    std::atomic<int> started{0};
    threaded_server s(3, [&](server& srv) {
        srv.on("sleep", [&](int ms) -> net::awaitable<int> {
            ++started;
            net::steady_timer t(co_await net::this_coro::executor, std::chrono::milliseconds(ms));
            co_await t.async_wait(use_tuple);
            co_return ms;
        });
    });
    running_loop clients;
    std::vector<std::future<std::error_code>> calls;
    std::vector<channel> chans = clients.run([&]() -> net::awaitable<std::vector<channel>> {
        std::vector<channel> v;
        for (int c = 0; c < 6; ++c) v.push_back(co_await async_connect(s.url));
        co_return v;
    });
    for (auto& ch : chans)
        calls.push_back(net::co_spawn(
            clients.io,
            [ch]() -> net::awaitable<std::error_code> {
                auto [ec, v] = co_await ch.async_call<int>(
                    "sleep", 30'000, net::experimental::as_tuple(net::use_awaitable));
                co_return ec;
            },
            net::use_future));
    EXPECT_TRUE(clients.run([&]() -> net::awaitable<bool> {
        co_return co_await wait_until([&] { return started.load() == 6; });
    }));
    const auto t0 = std::chrono::steady_clock::now();
    s.stop();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 20s);
    for (auto& c : calls) {
        ASSERT_EQ(c.wait_for(30s), std::future_status::ready);
        EXPECT_TRUE(c.get());  // the call failed: the server closed its connection
    }
    clients.run([&]() -> net::awaitable<void> {
        chans.clear();
        co_return;
    });
}

// A caller that asks for a session gets one on a server with several loops. Each time its
// connection is cut, it comes back on the least loaded loop, which is not its session's (that
// one still holds the detached session): the connection moves to the session's loop, whose
// handlers go on in order, on that one loop, with nothing lost or run twice.
TEST(Loops, ASessionResumesOnItsOwnLoopWhereverItsCallerComesBack) {
    for (const std::string scheme : {"tcp", "tls"}) {
        SCOPED_TRACE(scheme);
        thread_set ran_on;
        std::atomic<std::uint64_t> next{0};
        std::atomic<int> disorder{0};
        const std::string listen = test::listen_url(scheme);
        threaded_server s(
            2,
            [&](server& srv) {
                srv.on("next", [&](std::uint64_t i) {
                    ran_on.note();
                    if (next.exchange(i + 1) != i) ++disorder;
                    return i;
                });
            },
            {}, listen);
        test::cutting_proxy proxy("127.0.0.1", static_cast<std::uint16_t>(std::stoi(
                                                   s.url.substr(s.url.rfind(':') + 1))));
        const std::string via =
            scheme + "://127.0.0.1:" + std::to_string(proxy.port()) +
            (scheme == "tls" ? test::shared_tls_files().client_params() + "&" : std::string("?")) +
            "resume_ms=10000";
        running_loop clients;
        clients.run([&]() -> net::awaitable<void> {
            auto ch = co_await async_connect(via);
            auto p = std::dynamic_pointer_cast<peer>(ch.impl());
            std::uint64_t i = 0;
            for (int round = 0; round < 8; ++round) {
                std::size_t done = 0, wrong = 0;
                for (int k = 0; k < 200; ++k, ++i)
                    ch.async_call<std::uint64_t>("next", i,
                                                 [&, i](std::error_code e, std::uint64_t r) {
                                                     if (e || r != i) ++wrong;
                                                     ++done;
                                                 });
                proxy.cut_all();
                EXPECT_TRUE(co_await wait_until([&] { return done == 200; }));
                EXPECT_EQ(wrong, 0u);
            }
            EXPECT_EQ(co_await ch.async_call<std::uint64_t>("next", i), i);
            EXPECT_TRUE(p->is_resumable());
            EXPECT_GE(p->counters().resumes, 4u);
            EXPECT_TRUE(p->is_open());
        });
        EXPECT_EQ(disorder.load(), 0);
        EXPECT_EQ(ran_on.size(), 1u);  // the session's loop, every time
        EXPECT_GE(s.srv->connections_accepted(), 5u);
        EXPECT_GE(s.on_home<std::uint64_t>([&] { return s.srv->stats().sessions_moved; }), 4u);
    }
}

TEST(RunOn, AStrandSerializesAHandlerAcrossLoops) {
    worker_pool pool(2);
    const auto strand = pool.make_strand();
    long total = 0;  // no lock: every call runs on the strand
    std::atomic<int> inside{0}, overlaps{0};
    handler_options ho;
    ho.run_on = strand;
    ho.concurrent = true;
    threaded_server s(2, [&](server& srv) {
        srv.on(
            "add",
            [&](int x) {
                if (++inside > 1) ++overlaps;
                total += x;
                std::this_thread::sleep_for(100us);
                --inside;
                return total;
            },
            ho);
        srv.on(
            "total", [&] { return total; }, ho);
    });
    running_loop clients;
    clients.run([&]() -> net::awaitable<void> {
        std::vector<channel> chans;
        for (int c = 0; c < 4; ++c) chans.push_back(co_await async_connect(s.url));
        std::vector<std::future<void>> done;
        auto ex = co_await net::this_coro::executor;
        for (auto& ch : chans)
            done.push_back(net::co_spawn(
                ex,
                [ch]() -> net::awaitable<void> {
                    for (int i = 0; i < 100; ++i) {
                        auto [ec, v] = co_await ch.async_call<long>(
                            "add", 1, net::experimental::as_tuple(net::use_awaitable));
                        EXPECT_FALSE(ec) << ec.message();
                        if (ec) co_return;
                    }
                },
                net::use_future));
        EXPECT_TRUE(co_await wait_until([&] {
            for (auto& d : done)
                if (d.wait_for(0s) != std::future_status::ready) return false;
            return true;
        }));
        EXPECT_EQ(co_await chans[0].async_call<long>("total"), 400);
    });
    EXPECT_EQ(overlaps.load(), 0);
    s.stop(&pool);
}

// A body on a worker pool leaves the loop free: a trivial call on another connection of the
// same (single) loop is answered while the long one runs. The long handler waits for that
// answer, so without the offload this test would fail (the wait gives up after 20 s).
TEST(RunOn, AnOffloadedHandlerLeavesTheLoopFreeAndKeepsItsConnectionSerial) {
    worker_pool pool(2);
    std::promise<void> trivial_answered;
    auto answered = trivial_answered.get_future().share();
    std::atomic<bool> long_saw_answer{false};
    thread_set long_ran_on;
    handler_options off;
    off.run_on = pool.get_executor();
    threaded_server s(1, [&](server& srv) {
        srv.on(
            "long",
            [&](int x) {
                long_ran_on.note();
                long_saw_answer = answered.wait_for(20s) == std::future_status::ready;
                return x;
            },
            off);
        srv.on("trivial", [](int x) { return x; });
    });
    running_loop clients;
    clients.run([&]() -> net::awaitable<void> {
        auto a = co_await async_connect(s.url);
        auto b = co_await async_connect(s.url);
        // On `a`: the long call, then a trivial one that must wait for it (serial).
        auto ex = co_await net::this_coro::executor;
        std::vector<int> order;
        auto first = net::co_spawn(
            ex,
            [&]() -> net::awaitable<void> {
                EXPECT_EQ(co_await a.async_call<int>("long", 1), 1);
                order.push_back(1);
            },
            net::use_future);
        auto second = net::co_spawn(
            ex,
            [&]() -> net::awaitable<void> {
                EXPECT_EQ(co_await a.async_call<int>("trivial", 2), 2);
                order.push_back(2);
            },
            net::use_future);
        // On `b`: answered while the long call runs.
        EXPECT_EQ(co_await b.async_call<int>("trivial", 3, timeout(15s)), 3);
        trivial_answered.set_value();
        EXPECT_TRUE(co_await wait_until([&] { return order.size() == 2; }));
        EXPECT_EQ(order, (std::vector<int>{1, 2}));
        first.get();
        second.get();
    });
    EXPECT_TRUE(long_saw_answer.load());
    EXPECT_FALSE(long_ran_on.has(s.home.t.get_id()));
    s.stop(&pool);
}

// "block" on a worker pool: counts its calls and holds each until `release` is set (20 s at
// most), so that a test can act while offloaded bodies run.
struct blocking_handler {
    explicit blocking_handler(worker_pool& pool) { off.run_on = pool.get_executor(); }
    void serve(server& srv) {
        srv.on(
            "block",
            [this](int x) {
                ++started;
                released.wait_for(20s);
                ++finished;
                return x;
            },
            off);
    }
    std::promise<void> release;
    std::shared_future<void> released = release.get_future().share();
    std::atomic<int> started{0}, finished{0};
    handler_options off;
};

TEST(RunOn, APeerThatDiesWhileItsOffloadedHandlerRunsLeavesTheServerHealthy) {
    worker_pool pool(1);
    blocking_handler b(pool);
    threaded_server s(2, [&](server& srv) {
        b.serve(srv);
        srv.on("inc", [](int x) { return x + 1; });
    });
    running_loop clients;
    clients.run([&]() -> net::awaitable<void> {
        {
            auto ch = co_await async_connect(s.url);
            ch.impl()->notify_raw("block", std::string_view("\x91\x01", 2));
            EXPECT_TRUE(co_await wait_until([&] { return b.started.load() == 1; }));
            auto p = std::dynamic_pointer_cast<peer>(ch.impl());
            ORDO_CO_ASSERT_TRUE(p != nullptr);
            p->abort();
        }
        EXPECT_TRUE(co_await wait_until(
            [&] { return s.on_home<std::size_t>([&] { return s.srv->peer_count(); }) == 0; }));
        b.release.set_value();
        EXPECT_TRUE(co_await wait_until([&] { return b.finished.load() == 1; }));
        auto ch = co_await async_connect(s.url);
        EXPECT_EQ(co_await ch.async_call<int>("inc", 1), 2);
    });
    s.stop(&pool);
}

// The server goes while offloaded bodies still run: their answers are posted back to loops
// that must still exist then (ASan would see the use after free), so it waits for them.
TEST(RunOn, AServerDestroyedWhileOffloadedBodiesRunWaitsForThem) {
    worker_pool pool(2);
    blocking_handler b(pool);
    auto s = std::make_unique<threaded_server>(2, [&](server& srv) { b.serve(srv); });
    running_loop clients;
    std::vector<channel> chans = clients.run([&]() -> net::awaitable<std::vector<channel>> {
        std::vector<channel> v;
        for (int c = 0; c < 2; ++c) v.push_back(co_await async_connect(s->url));
        for (auto& ch : v) ch.impl()->notify_raw("block", std::string_view("\x91\x01", 2));
        EXPECT_TRUE(co_await wait_until([&] { return b.started.load() == 2; }));
        co_return v;
    });
    std::thread releaser([&] {
        std::this_thread::sleep_for(300ms);
        b.release.set_value();
    });
    s->stop();  // async_stop, then the server is destroyed: it waits for the body of the
                // connection on its own loop (the other is on the application's, loop 0)
    EXPECT_GE(b.finished.load(), 1);
    releaser.join();
    pool.join();  // before the application's loop goes, as handler_options::run_on asks
    EXPECT_EQ(b.finished.load(), 2);
    s.reset();
    clients.run([&]() -> net::awaitable<void> {
        chans.clear();
        co_return;
    });
}

// The requests of `method` a server answered with `code` (0: succeeded).
std::uint64_t answered(threaded_server& s, const std::string& method, int code) {
    const auto st = s.on_home<server_stats>([&] { return s.srv->stats(); });
    for (const auto& m : st.methods)
        if (m.name == method) return m.requests[static_cast<std::size_t>(code)];
    return 0;
}

// Calls `method` (7) with a 200 ms deadline from a client: the caller gets timed_out; then the
// body ends (`ended`) and the server answers that call cancelled.
void call_past_its_deadline(threaded_server& s, const std::string& method,
                            const std::atomic<bool>& ended) {
    running_loop clients;
    clients.run([&]() -> net::awaitable<void> {
        auto ch = co_await async_connect(s.url);
        std::error_code code;
        try {
            co_await ch.async_call<int>(method, 7, timeout(200ms));
        } catch (const rpc_error& e) {
            code = e.code();
        }
        EXPECT_EQ(code, errc::timed_out);
        EXPECT_TRUE(co_await wait_until([&] { return ended.load(); }, 15s));
        EXPECT_TRUE(co_await wait_until(
            [&] { return answered(s, method, int(errc::cancelled)) == 1; }, 15s));
    });
}

// A body on a worker that computes and polls its stop token (it ignores the cancellation
// otherwise: it returns its value). The caller's deadline reaches it, and what it returns is
// not sent: the server answers cancelled.
TEST(RunOn, ADeadlineReachesAnOffloadedBodyThatPollsItsStopToken) {
    worker_pool pool(2);
    std::atomic<bool> saw_stop{false}, ended{false};
    thread_set ran_on;
    handler_options off;
    off.run_on = pool.get_executor();
    threaded_server s(1, [&](server& srv) {
        srv.on(
            "spin",
            [&](std::stop_token st, int x) {
                ran_on.note();
                const auto limit = std::chrono::steady_clock::now() + 20s;
                while (!st.stop_requested() && std::chrono::steady_clock::now() < limit) {
                }
                saw_stop = st.stop_requested();
                ended = true;
                return x;
            },
            off);
    });
    call_past_its_deadline(s, "spin", ended);
    EXPECT_TRUE(saw_stop.load());
    EXPECT_EQ(answered(s, "spin", 0), 0u);
    EXPECT_FALSE(ran_on.has(s.home.t.get_id()));
    s.stop(&pool);
}

// A coroutine body on a worker gets Asio cancellation where it awaits.
TEST(RunOn, AnOffloadedCoroutineIsCancelledWhereItAwaits) {
    worker_pool pool(2);
    std::atomic<bool> aborted{false}, ended{false};
    handler_options off;
    off.run_on = pool.get_executor();
    threaded_server s(1, [&](server& srv) {
        srv.on(
            "sleep",
            [&](int x) -> net::awaitable<int> {
                net::steady_timer t(co_await net::this_coro::executor, 20s);
                auto [ec] = co_await t.async_wait(use_tuple);
                aborted = ec == net::error::operation_aborted;
                ended = true;
                co_return x;
            },
            off);
    });
    call_past_its_deadline(s, "sleep", ended);
    EXPECT_TRUE(aborted.load());
    EXPECT_EQ(answered(s, "sleep", 0), 0u);
    s.stop(&pool);
}

// The connection ending (its peer aborts) reaches a body on a worker too.
TEST(RunOn, APeerThatDiesStopsItsOffloadedBody) {
    worker_pool pool(1);
    std::atomic<bool> started{false}, saw_stop{false}, ended{false};
    handler_options off;
    off.run_on = pool.get_executor();
    threaded_server s(2, [&](server& srv) {
        srv.on(
            "spin",
            [&](std::stop_token st, int) {
                started = true;
                const auto limit = std::chrono::steady_clock::now() + 20s;
                while (!st.stop_requested() && std::chrono::steady_clock::now() < limit) {
                }
                saw_stop = st.stop_requested();
                ended = true;
            },
            off);
    });
    running_loop clients;
    clients.run([&]() -> net::awaitable<void> {
        auto ch = co_await async_connect(s.url);
        ch.impl()->notify_raw("spin", std::string_view("\x91\x01", 2));
        EXPECT_TRUE(co_await wait_until([&] { return started.load(); }));
        std::dynamic_pointer_cast<peer>(ch.impl())->abort();
        EXPECT_TRUE(co_await wait_until([&] { return ended.load(); }, 15s));
    });
    EXPECT_TRUE(saw_stop.load());
    s.stop(&pool);
}

// A streaming handler on a worker: items in order, no further ahead of the reader than its
// credit, and a cancel reaches a write that waits for credit (on the connection's loop).
TEST(RunOn, AnOffloadedStreamKeepsItsCreditAndOrderAndIsCancelled) {
    worker_pool pool(2);
    thread_set ran_on;
    std::atomic<std::uint64_t> written{0};
    std::atomic<bool> cancelled{false}, ended{false};
    handler_options off;
    off.run_on = pool.get_executor();
    threaded_server s(1, [&](server& srv) {
        srv.on(
            "count_to",
            [&](writer<int>& out, int n) -> net::awaitable<void> {
                ran_on.note();
                try {
                    for (int i = 0; i < n; ++i) {
                        co_await out.write(i);
                        written = out.written();
                    }
                } catch (const std::system_error& e) {
                    cancelled = e.code() == errc::cancelled;
                    throw;
                }
                ended = true;
            },
            off);
    });
    running_loop clients;
    clients.run([&]() -> net::awaitable<void> {
        auto ch = co_await async_connect(s.url);
        call_options o;
        o.window = 4;
        auto st = co_await ch.async_stream<int>("count_to", 1000, o);
        EXPECT_TRUE(co_await wait_until([&] { return written.load() == 4; }));
        net::steady_timer pause(co_await net::this_coro::executor, 500ms);
        co_await pause.async_wait(use_tuple);  // a reader that stops: the body must wait
        EXPECT_EQ(written.load(), 4u);
        EXPECT_LE(st.received(), 4u);
        std::vector<int> got;
        while (auto v = co_await st.next()) got.push_back(*v);
        ORDO_CO_ASSERT_EQ(got.size(), 1000u);
        for (int i = 0; i < 1000; ++i) ORDO_CO_ASSERT_EQ(got[i], i);
        EXPECT_TRUE(ended.load());

        // Cancelled while its write waits for credit.
        ended = false;
        written = 0;
        o.window = 2;
        auto endless = co_await ch.async_stream<int>("count_to", 1'000'000, o);
        // Nothing read: the body writes its window, then its third write waits on the loop.
        EXPECT_TRUE(co_await wait_until([&] { return written.load() == 2; }));
        pause.expires_after(300ms);
        co_await pause.async_wait(use_tuple);
        EXPECT_EQ(written.load(), 2u);
        endless.cancel();
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return cancelled.load(); }, 15s));
        EXPECT_FALSE(ended.load());
        // The connection serves on.
        auto again = co_await ch.async_stream<int>("count_to", 3, o);
        std::vector<int> three;
        while (auto v = co_await again.next()) three.push_back(*v);
        EXPECT_EQ(three, (std::vector<int>{0, 1, 2}));
    });
    EXPECT_FALSE(ran_on.has(s.home.t.get_id()));
    s.stop(&pool);
}

// A batch on a worker that all its callers left (their deadlines passed) is cancelled: its
// stop token is requested.
TEST(RunOn, ABatchAllOfWhoseCallersLeftIsCancelled) {
    worker_pool pool(2);
    std::atomic<bool> started{false}, saw_stop{false}, ended{false};
    threaded_server s(1, [&](server& srv) {
        batch_options bo;
        bo.max_batch_size = 2;
        bo.max_wait = 1s;
        bo.run_on = pool.get_executor();
        srv.on_batch("spin", bo, [&](std::vector<int> xs, std::stop_token st) {
            started = true;
            const auto limit = std::chrono::steady_clock::now() + 20s;
            while (!st.stop_requested() && std::chrono::steady_clock::now() < limit) {
            }
            saw_stop = st.stop_requested();
            ended = true;
            return xs;
        });
    });
    running_loop clients;
    clients.run([&]() -> net::awaitable<void> {
        auto ch = co_await async_connect(s.url);
        auto ex = co_await net::this_coro::executor;
        std::atomic<int> timed_out{0};
        for (int i = 0; i < 2; ++i)
            net::co_spawn(
                ex,
                [&, ch, i]() -> net::awaitable<void> {
                    try {
                        co_await ch.async_call<int>("spin", i, timeout(300ms));
                    } catch (const rpc_error& e) {
                        if (e.code() == errc::timed_out) ++timed_out;
                    }
                },
                net::detached);
        EXPECT_TRUE(co_await wait_until([&] { return timed_out.load() == 2; }, 15s));
        EXPECT_TRUE(started.load());
        EXPECT_TRUE(co_await wait_until([&] { return ended.load(); }, 15s));
    });
    EXPECT_TRUE(saw_stop.load());
    s.stop(&pool);
}

TEST(RunOn, BatchesRunOnTheWorkerPoolAndGatherCallsFromEveryLoop) {
    worker_pool pool(2);
    thread_set batch_ran_on, loops_seen;
    std::atomic<std::size_t> largest{0};
    threaded_server s(2, [&](server& srv) {
        batch_options bo;
        bo.max_batch_size = 16;
        bo.max_wait = 20ms;
        bo.run_on = pool.get_executor();
        srv.on_batch("square", bo, [&](std::vector<int> xs) {
            batch_ran_on.note();
            std::size_t seen = largest.load();
            while (xs.size() > seen && !largest.compare_exchange_weak(seen, xs.size())) {
            }
            for (auto& x : xs) x *= x;
            return xs;
        });
        srv.on("where", [&] { loops_seen.note(); });
    });
    running_loop clients;
    clients.run([&]() -> net::awaitable<void> {
        std::vector<channel> chans;
        for (int c = 0; c < 4; ++c) chans.push_back(co_await async_connect(s.url));
        for (auto& ch : chans) co_await ch.async_call<void>("where");
        auto ex = co_await net::this_coro::executor;
        std::vector<std::future<void>> done;
        for (int c = 0; c < 4; ++c)
            done.push_back(net::co_spawn(
                ex,
                [ch = chans[c], c]() -> net::awaitable<void> {
                    for (int i = 0; i < 25; ++i) {
                        const int x = c * 100 + i;
                        EXPECT_EQ(co_await ch.async_call<int>("square", x), x * x);
                    }
                },
                net::use_future));
        EXPECT_TRUE(co_await wait_until([&] {
            for (auto& d : done)
                if (d.wait_for(0s) != std::future_status::ready) return false;
            return true;
        }));
    });
    EXPECT_EQ(loops_seen.size(), 2u);
    EXPECT_GE(batch_ran_on.size(), 1u);
    EXPECT_FALSE(batch_ran_on.has(s.home.t.get_id()));
    EXPECT_GT(largest.load(), 1u);  // calls from several connections shared a batch
    const auto st = s.on_home<server_stats>([&] { return s.srv->stats(); });
    ASSERT_EQ(st.batches.size(), 1u);
    EXPECT_EQ(st.batches[0].stats.calls, 100u);
    s.stop(&pool);
}

// Clients used from a multi-threaded program: calls started on plain threads and on coroutines
// of another io_context; each completes on its caller's executor.
TEST(Clients, PoolsAndRoutersTakeCallsFromManyThreads) {
    threaded_server s(2, [](server& srv) { srv.on("inc", [](int x) { return x + 1; }); });
    running_loop owner, callers;
    auto owner_strand = net::make_strand(owner.io);
    std::shared_ptr<pool> pl;
    std::shared_ptr<router> rt;
    net::dispatch(owner_strand, [&] {
        pl = make_pool(owner_strand, s.url);
        rt = make_router(owner_strand);
        rt->add_replica(s.url);
        rt->add_replica(s.url);
    });
    net::post(owner_strand, net::use_future).get();
    for (const channel& ch : {channel(pl), channel(rt)}) {
        std::atomic<int> ok{0}, wrong_executor{0};
        std::vector<std::thread> threads;
        for (int t = 0; t < 4; ++t)
            threads.emplace_back([&, t] {
                for (int i = 0; i < 50; ++i) {
                    const int x = t * 1000 + i;
                    if (ch.async_call<int>("inc", x, net::use_future).get() == x + 1) ++ok;
                }
            });
        std::vector<std::future<void>> coros;
        for (int k = 0; k < 4; ++k)
            coros.push_back(net::co_spawn(
                callers.io,
                [&, k]() -> net::awaitable<void> {
                    for (int i = 0; i < 50; ++i) {
                        const int x = 100'000 + k * 1000 + i;
                        if (co_await ch.async_call<int>("inc", x) == x + 1) ++ok;
                        if (!callers.io.get_executor().running_in_this_thread()) ++wrong_executor;
                    }
                },
                net::use_future));
        for (auto& t : threads) t.join();
        for (auto& c : coros) ASSERT_EQ(c.wait_for(60s), std::future_status::ready);
        EXPECT_EQ(ok.load(), 8 * 50);
        EXPECT_EQ(wrong_executor.load(), 0);
    }
    net::dispatch(owner_strand, [&] {
        pl.reset();
        rt.reset();
    });
    net::post(owner_strand, net::use_future).get();
}

}  // namespace
}  // namespace ordo
