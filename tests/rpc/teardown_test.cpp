// An event loop that stops for good with work in flight: calls, handlers, streams and dials
// over ordered channels, pools, routers and resumable sessions, then every handle dropped and
// the io_context destroyed without running again. Nothing may be used after it was freed, and
// every coroutine frame (the library's and the caller's) must be freed: the frames count
// themselves here, and .ci/run also runs this test under ASan + LeakSanitizer.
#include "ordo/ordo.hpp"

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include <asio/bind_executor.hpp>
#include <asio/ip/tcp.hpp>

#include "support/sleep.hpp"

namespace ordo {
namespace {

using namespace std::chrono_literals;
using test::sleep_quietly;

// The frames that hold one, by kind: each count is back to zero once they are destroyed.
enum frame_kind { handler, caller, reader, dial, kinds };

struct frame_count {
    static inline int alive[kinds] = {};
    frame_kind kind;
    explicit frame_count(frame_kind k) : kind(k) { ++alive[kind]; }
    frame_count(const frame_count& o) : kind(o.kind) { ++alive[kind]; }
    ~frame_count() { --alive[kind]; }
    static int total() { return alive[handler] + alive[caller] + alive[reader] + alive[dial]; }
    static std::string counts() {
        return std::to_string(alive[handler]) + " handlers, " + std::to_string(alive[caller]) +
               " callers, " + std::to_string(alive[reader]) + " readers, " +
               std::to_string(alive[dial]) + " dials alive";
    }
};

// Everything the loop holds in flight, made on the loop by build(). Its handles are the
// caller's to drop; what was spawned is owned by the loop.
struct in_flight {
    std::unique_ptr<server> srv;
    std::vector<channel> channels;
    std::optional<stream<int>> items;
    // A listener that accepts and never answers: a resumable session's greeting waits on it.
    std::optional<net::ip::tcp::acceptor> silent;
    std::vector<net::ip::tcp::socket> silent_peers;
    int handlers_started = 0;
    int items_read = 0;
    int calls_ended = 0;
    bool built = false;

    net::awaitable<void> build(int calls_per_channel) {
        auto ex = co_await net::this_coro::executor;
        srv = std::make_unique<server>(ex);
        handler_options concurrent;
        concurrent.concurrent = true;  // each call's handler starts, whatever runs before it
        srv->on(
            "sleep",
            [this](int x) -> net::awaitable<int> {
                frame_count f(handler);
                ++handlers_started;
                co_await sleep_quietly(1h);
                co_return x;
            },
            concurrent);
        srv->on(
            "forever",
            [this](writer<int>& out) -> net::awaitable<void> {
                frame_count f(handler);
                ++handlers_started;
                for (int i = 0;; ++i) {
                    co_await out.write(i);
                    co_await sleep_quietly(1ms);
                }
            },
            concurrent);
        srv->on(
            "one_then_wait",
            [this](writer<int>& out) -> net::awaitable<void> {
                frame_count f(handler);
                ++handlers_started;
                co_await out.write(0);
                co_await sleep_quietly(1h);
            },
            concurrent);
        const auto url = srv->listen("tcp://127.0.0.1:0");
        const auto second = srv->listen("tcp://127.0.0.1:0");  // the router's other replica
        channels.push_back(co_await async_connect(url));
        channels.push_back(co_await async_connect(url + "?mode=pooled&max_connections=2"));
        channels.push_back(co_await async_connect(url + "?resume_ms=5000"));
        channels.push_back(co_await async_connect("route+tcp://" + url.substr(6) + "," +
                                                  second.substr(6) + "?max_concurrent=1"));
        for (std::size_t k = 0; k < channels.size(); ++k) {
            const auto& ch = channels[k];
            for (int i = 0; i < calls_per_channel; ++i) {
                net::co_spawn(
                    ex,
                    [this, ch, i, k]() -> net::awaitable<void> {
                        frame_count f(caller);
                        try {
                            co_await ch.async_call<int>("sleep", int(k) * 100 + i);
                        } catch (const rpc_error&) {
                        }
                        ++calls_ended;
                    },
                    net::detached);
            }
        }
        items.emplace(co_await channels[0].async_stream<int>("forever"));
        for (int i = 0; i < 3; ++i) {
            if (co_await items->next()) ++items_read;
        }
        // A caller waiting for an item that does not come.
        net::co_spawn(
            ex,
            [this, ch = channels[0]]() -> net::awaitable<void> {
                frame_count f(reader);
                try {
                    auto s = co_await ch.async_stream<int>("one_then_wait");
                    while (co_await s.next()) ++items_read;
                } catch (const rpc_error&) {
                }
            },
            net::detached);
        // Dials that do not finish: a resumable session to a listener that never answers,
        // directly and as a router's replica, each with a call waiting for it. (Once the
        // listener has gone, each fails when its resume window has passed.)
        silent.emplace(ex, net::ip::tcp::endpoint(net::ip::make_address("127.0.0.1"), 0));
        const auto mute = "127.0.0.1:" + std::to_string(silent->local_endpoint().port());
        for (const auto& u :
             {"tcp://" + mute + "?resume_ms=2000", "route+tcp://" + mute + "?resume_ms=2000"}) {
            net::co_spawn(
                ex,
                [u]() -> net::awaitable<void> {
                    frame_count f(dial);
                    try {
                        auto ch = co_await async_connect(u);
                        co_await ch.async_call<int>("sleep", 0);
                    } catch (const std::exception&) {
                    }
                },
                net::detached);
        }
        for (int i = 0; i < 2; ++i)
            silent_peers.push_back(co_await silent->async_accept(net::use_awaitable));
        built = true;
    }

    // The caller's handles: the stream, the channels, the server.
    void drop_handles() {
        items.reset();
        // The ordered and the resumable channel are closed first: each then keeps its
        // connection until it has ended.
        if (!channels.empty()) {
            channels[0].impl()->close();
            channels[2].impl()->close();
        }
        channels.clear();
        srv.reset();
    }

    // The handles, and the silent listener with its connections.
    void drop() {
        drop_handles();
        silent_peers.clear();
        silent.reset();
    }

    std::string progress() const {
        return "started " + std::to_string(handlers_started) + ", built " + std::to_string(built) +
               ", items " + std::to_string(items_read);
    }
};

constexpr int calls_per_channel = 4;

// Runs `io` until `done` holds; false after the deadline.
template <class F>
bool run_until(net::io_context& io, F done, std::chrono::seconds limit = 60s) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (!done() && std::chrono::steady_clock::now() < deadline)
        io.run_one_for(std::chrono::milliseconds(100));
    return done();
}

// Sets up everything in flight on `io`, and waits until each handler has started.
bool start(net::io_context& io, in_flight& w) {
    net::co_spawn(io, w.build(calls_per_channel), [](std::exception_ptr e) {
        if (e) std::rethrow_exception(e);
    });
    // The ordered and resumable channels' calls, one call per connection of the pool and per
    // replica of the router (the others wait in their queues), and the two streams' handlers.
    const int handlers = 2 * calls_per_channel + 2 + 2 + 2;
    return run_until(
        io, [&] { return w.built && w.handlers_started == handlers && w.items_read == 4; });
}

// Starts everything on a fresh io_context, lets `stop` end the loop's work its way, drops the
// handles and the silent listener, destroys the context, and checks that no frame is left.
void tear_down(const std::function<void(net::io_context&, in_flight&)>& stop) {
    {
        auto io = std::make_unique<net::io_context>();
        in_flight w;
        ASSERT_TRUE(start(*io, w)) << w.progress();
        EXPECT_GT(frame_count::total(), 0);
        stop(*io, w);
        w.drop();
        io.reset();
    }
    EXPECT_EQ(frame_count::total(), 0) << frame_count::counts();
}

TEST(Teardown, HandlesDroppedOutsideTheLoopThenTheContextDestroyed) {
    // The loop is not run again: the handles go, then the context with what it still holds.
    tear_down([](net::io_context&, in_flight&) {});
}

TEST(Teardown, HandlesDroppedOnTheLoopWhichStopsBeforeTheClosesEnd) {
    // Dropped on the loop; the loop runs a few more steps (closes begin, handlers are
    // cancelled), then stops for good halfway.
    tear_down([](net::io_context& io, in_flight& w) {
        net::post(io, [&] { w.drop_handles(); });
        for (int i = 0; i < 20; ++i) io.poll_one();
    });
}

TEST(Teardown, TheLoopIsStoppedThenTheHandlesDroppedAndTheContextDestroyed) {
    tear_down([](net::io_context& io, in_flight& w) {
        io.stop();
        w.drop_handles();
        // Run after stop() does nothing until restart(): what the drop posted waits.
        EXPECT_EQ(io.poll(), 0u);
    });
}

TEST(Teardown, HandlesDroppedAndTheLoopRunToTheEndLeavesNothingBehind) {
    // The orderly case beside the three above: each close runs to its end, and every frame
    // goes with it, without destroying the context.
    auto io = std::make_unique<net::io_context>();
    in_flight w;
    ASSERT_TRUE(start(*io, w)) << w.progress();
    net::post(*io, [&] { w.drop(); });
    // The handlers' frames end as their server goes; the callers' as their calls fail, the
    // resumable channel's once its window (5 s) has passed, and the dials' (2 s) likewise.
    EXPECT_TRUE(run_until(*io, [] { return frame_count::total() == 0; })) << frame_count::counts();
    EXPECT_EQ(w.calls_ended, 4 * calls_per_channel);
    io.reset();
    EXPECT_EQ(frame_count::total(), 0) << frame_count::counts();
}

// A parked handler (a stream's reader) woken on one thread while its io_context is destroyed
// on another: the two meet in each window where one must wait for the other, held there by a
// handler whose move blocks at a gate (run under ThreadSanitizer by .ci/run as well).
struct gate {
    std::mutex m;
    std::condition_variable cv;
    bool armed = false, entered = false, open = false;
    void wait_entered() {
        std::unique_lock l(m);
        ASSERT_TRUE(cv.wait_for(l, 30s, [&] { return entered; })) << "the gate was not reached";
    }
    void release() {
        std::lock_guard l(m);
        open = true;
        cv.notify_all();
    }
};

struct gated_handler {
    gate* g;
    std::atomic<int>* runs;
    std::atomic<int>* alive;
    gated_handler(gate* gt, std::atomic<int>* r, std::atomic<int>* a) : g(gt), runs(r), alive(a) {
        ++*alive;
    }
    // The first move after the gate is armed waits until it opens.
    gated_handler(gated_handler&& o) noexcept : g(o.g), runs(o.runs), alive(o.alive) {
        ++*alive;
        std::unique_lock l(g->m);
        if (!g->armed) return;
        g->armed = false;
        g->entered = true;
        g->cv.notify_all();
        g->cv.wait(l, [&] { return g->open; });
    }
    gated_handler(const gated_handler&) = delete;
    ~gated_handler() { --*alive; }
    void operator()() { ++*runs; }
};

// Whether `done` is still false after a while: the thread it belongs to waits.
bool still_waits(const std::atomic<bool>& done) {
    std::this_thread::sleep_for(200ms);
    return !done;
}

// The waker has taken the handler and is posting it: the context's destruction waits for the
// post, so that it is not made to a context already gone. The handler goes unrun with it.
TEST(ParkedHandler, TheContextsDestructionWaitsForAWakeThatIsPosting) {
    gate g;
    std::atomic<int> runs{0}, alive{0};
    auto io = std::make_unique<net::io_context>();
    auto p = detail::park(net::bind_executor(io->get_executor(), gated_handler(&g, &runs, &alive)));
    g.armed = true;
    std::thread waker([&] { p->wake(); });  // its post moves the handler: held at the gate
    g.wait_entered();
    std::atomic<bool> destroyed{false};
    std::thread destroyer([&] {
        io.reset();
        destroyed = true;
    });
    EXPECT_TRUE(still_waits(destroyed)) << "the context went while its handler was being posted";
    g.release();
    waker.join();
    destroyer.join();
    p.reset();
    EXPECT_EQ(runs, 0);
    EXPECT_EQ(alive, 0);
}

// The context's destruction has taken the handler and is moving it out: the waker, which owns
// the parked object, destroys it only once the destruction no longer touches it.
TEST(ParkedHandler, AParkedObjectDestroyedOnAnotherThreadWaitsForTheContextsDestruction) {
    gate g;
    std::atomic<int> runs{0}, alive{0};
    auto io = std::make_unique<net::io_context>();
    auto p = detail::park(net::bind_executor(io->get_executor(), gated_handler(&g, &runs, &alive)));
    g.armed = true;
    std::thread destroyer([&] { io.reset(); });  // on_shutdown's move: held at the gate
    g.wait_entered();
    std::atomic<bool> freed{false};
    std::thread owner([&] {
        p->wake();  // taken already: does nothing
        p.reset();
        freed = true;
    });
    EXPECT_TRUE(still_waits(freed)) << "the parked object went while its context used it";
    g.release();
    destroyer.join();
    owner.join();
    EXPECT_EQ(runs, 0);
    EXPECT_EQ(alive, 0);
}

}  // namespace
}  // namespace ordo
