// Lanes (channel::lane, docs/protocol.md "Lanes"): order within a lane and none between lanes,
// lanes dispatched apart, large messages in pieces that small ones pass, a foreign peer that
// sees plain msgpack-rpc, resumable sessions cut in the middle of pieces, and the limits on
// pieces.
#include <atomic>
#include <map>
#include <mutex>

#include <gtest/gtest.h>
#include <asio/ip/tcp.hpp>
#include <asio/write.hpp>

#include "ordo/rpc/connect.hpp"
#include "ordo/rpc/server.hpp"
#include "rpc/connection/lanes.hpp"
#include "support/cutting_proxy.hpp"
#include "support/peers.hpp"
#include "support/run_test.hpp"
#include "support/sleep.hpp"

namespace ordo {
namespace {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;
using test::port_of;
using test::run_test;
using test::wait_until;

std::shared_ptr<peer> base_peer_of(const channel& c) {
    return std::dynamic_pointer_cast<peer>(c.impl()->lane_base(c.impl()));
}

// Records what arrives, per tag, in arrival order (handlers may run on the server's loops).
struct recorder {
    std::mutex m;
    std::map<std::string, std::vector<std::uint64_t>> seen;
    void add(const std::string& tag, std::uint64_t i) {
        std::lock_guard l(m);
        seen[tag].push_back(i);
    }
    std::size_t count(const std::string& tag) {
        std::lock_guard l(m);
        return seen[tag].size();
    }
    // The first position where `tag`'s numbers are not 0, 1, 2..., or -1.
    long out_of_order(const std::string& tag) {
        std::lock_guard l(m);
        const auto& v = seen[tag];
        for (std::size_t i = 0; i < v.size(); ++i)
            if (v[i] != i) return static_cast<long>(i);
        return -1;
    }
};

// "hold": a serial handler that waits until "release" is called (30 s at most), and answers 1
// if it was; `holding` turns true when it starts.
void serve_hold(server& srv, bool& holding, bool& released) {
    srv.on("hold", [&]() -> net::awaitable<int> {
        holding = true;
        net::steady_timer t(co_await net::this_coro::executor);
        const auto until = clock_type::now() + 30s;
        while (!released && clock_type::now() < until) {
            t.expires_after(1ms);
            co_await t.async_wait(use_tuple);
        }
        co_return released ? 1 : 0;
    });
    srv.on("release", [&] { released = true; });
}

void serve_echo_and_inc(server& srv) {
    srv.on("echo", [](const std::string& s) { return s; });
    srv.on("inc", [](int x) { return x + 1; });
}

// One large echo call of `size` bytes on lane "bulk" of a channel to `url` (served by
// serve_echo_and_inc), and small calls on the default lane one after another while it runs: it
// must come back whole. Returns how many small calls completed meanwhile.
net::awaitable<int> small_calls_beside_a_large_one(const std::string& url, std::size_t size) {
    auto ch = co_await async_connect(url);
    // The first call on a lane asks whether the server reads lanes; asked here, so that the
    // large call goes in pieces from its first byte.
    EXPECT_EQ(co_await ch.lane("bulk").async_call<int>("inc", 0), 1);
    std::string blob(size, '\0');
    for (std::size_t i = 0; i < blob.size(); ++i) blob[i] = static_cast<char>(i * 131 % 251);
    bool big_done = false;
    bool big_ok = false;
    ch.lane("bulk").async_call<std::string>("echo", blob, [&](std::error_code ec, std::string r) {
        big_done = true;
        big_ok = !ec && r == blob;
    });
    int passed = 0;
    const auto until = clock_type::now() + 60s;
    while (!big_done && clock_type::now() < until) {
        EXPECT_EQ(co_await ch.async_call<int>("inc", passed), passed + 1);
        if (!big_done) ++passed;
    }
    EXPECT_TRUE(co_await wait_until([&] { return big_done; }, 60s));
    EXPECT_TRUE(big_ok);
    co_return passed;
}

// Messages on three lanes, some large enough to go in pieces, all interleaved by the sender:
// each lane's arrive in the order sent.
TEST(Lanes, OrderHoldsWithinEachLane) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        recorder rec;
        server srv(ex);
        srv.on("rec", [&](std::string tag, std::uint64_t i) { rec.add(tag, i); });
        srv.on("rec_big", [&](std::string tag, std::uint64_t i, const std::string& blob) {
            if (blob.size() != 300'000) rec.add("broken", blob.size());
            rec.add(tag, i);
        });
        srv.on("inc", [](int x) { return x + 1; });
        const auto url = srv.listen("tcp://127.0.0.1:0");
        auto ch = co_await async_connect(url);
        auto a = ch.lane("a");
        auto b = ch.lane("b");
        EXPECT_EQ(a.lane_id(), ch.lane("a").lane_id());
        EXPECT_NE(a.lane_id(), 0);
        EXPECT_EQ(ch.lane_id(), 0);
        EXPECT_EQ(a.lane("").lane_id(), 0);
        const std::string blob(300'000, 'x');
        constexpr std::uint64_t n = 600;
        for (std::uint64_t i = 0; i < n; ++i) {
            if (i % 50 == 7)
                a.notify("rec_big", std::string("a"), i, blob);
            else
                a.notify("rec", std::string("a"), i);
            b.notify("rec", std::string("b"), i);
            if (i % 100 == 3)
                co_await b.async_call<void>("rec_big", std::string("b_calls"), i, blob);
            else
                ch.notify("rec", std::string("default"), i);
            if (i % 100 == 3) ch.notify("rec", std::string("default"), i);
            if (i % 64 == 0) co_await base_peer_of(ch)->async_drain();
        }
        const bool all = co_await wait_until(
            [&] { return rec.count("a") == n && rec.count("b") == n && rec.count("default") == n; },
            40s);
        EXPECT_TRUE(all) << rec.count("a") << " " << rec.count("b") << " "
                         << rec.count("default");
        if (!all) co_return;
        EXPECT_EQ(rec.out_of_order("a"), -1);
        EXPECT_EQ(rec.out_of_order("b"), -1);
        EXPECT_EQ(rec.out_of_order("default"), -1);
        EXPECT_EQ(rec.count("broken"), 0u);
        EXPECT_EQ(rec.count("b_calls"), n / 100);
        EXPECT_EQ(co_await a.async_call<int>("inc", 1), 2);
        co_await srv.async_stop();
    });
}

// A serial handler that waits on one lane holds that lane only: the default lane's calls and
// another lane's are served meanwhile (on one lane they would wait behind it).
TEST(Lanes, ALaneWhoseHandlerWaitsDoesNotHoldAnotherLane) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        bool holding = false, released = false;
        server srv(ex);
        serve_hold(srv, holding, released);
        srv.on("inc", [](int x) { return x + 1; });
        const auto url = srv.listen("tcp://127.0.0.1:0");
        auto ch = co_await async_connect(url);
        bool held_done = false;
        int held_result = -1;
        ch.lane("slow").async_call<int>("hold", [&](std::error_code ec, int r) {
            held_done = true;
            held_result = ec ? -2 : r;
        });
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return holding; }, 20s));
        // Behind "hold" on its own lane these would wait for it: they must not.
        EXPECT_EQ(co_await ch.async_call<int>("inc", 1, timeout(10s)), 2);
        EXPECT_EQ(co_await ch.lane("other").async_call<int>("inc", 2, timeout(10s)), 3);
        EXPECT_FALSE(held_done);
        co_await ch.lane("other").async_call<void>("release", timeout(10s));
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return held_done; }, 20s));
        EXPECT_EQ(held_result, 1);
        co_await srv.async_stop();
    });
}

// A call with a deadline (its context in a small head) made after a large notification of the
// default lane waits behind that notification's pieces, as any message of the lane does.
TEST(Lanes, ACallWithAContextKeepsItsPlaceBehindItsLanesPieces) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        std::vector<std::string> order;
        server srv(ex);
        srv.on("upload", [&](const std::string& blob) {
            order.push_back("upload " + std::to_string(blob.size()));
        });
        srv.on("commit", [&] {
            order.push_back("commit");
            return 1;
        });
        const auto url = srv.listen("tcp://127.0.0.1:0");
        auto ch = co_await async_connect(url);
        EXPECT_EQ(co_await ch.lane("x").async_call<int>("commit"), 1);  // lanes agreed
        order.clear();
        for (int i = 0; i < 3; ++i) {
            ch.notify("upload", std::string(1 << 20, 'u'));
            EXPECT_EQ(co_await ch.async_call<int>("commit", timeout(20s)), 1);
        }
        const std::vector<std::string> want{"upload 1048576", "commit", "upload 1048576", "commit",
                                            "upload 1048576", "commit"};
        EXPECT_EQ(order, want);
        co_await srv.async_stop();
    });
}

// The URL parameter lane= gives a channel its lane; a router sends each call on its lane on
// the replica's connection, so a router's call that waits on one lane does not hold another.
TEST(Lanes, TheUrlParameterAndRoutersCarryTheLane) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        bool holding = false, released = false;
        server srv(ex);
        serve_hold(srv, holding, released);
        srv.on("inc", [](int x) { return x + 1; });
        const auto url = srv.listen("tcp://127.0.0.1:0");
        auto by_url = co_await async_connect(url + "?lane=slow");
        EXPECT_EQ(by_url.lane_id(), detail::lane_id("slow"));
        EXPECT_EQ(by_url.lane("").lane_id(), 0);
        EXPECT_EQ(co_await by_url.async_call<int>("inc", 1), 2);

        auto routed = co_await async_connect("route+" + url);
        int held = 0;
        routed.lane("slow").async_call<int>("hold", [&](std::error_code ec, int r) {
            held = ec ? -1 : r;
        });
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return holding; }, 20s));
        EXPECT_EQ(co_await routed.async_call<int>("inc", 5, timeout(10s)), 6);
        EXPECT_EQ(co_await routed.lane("other").async_call<int>("inc", 6, timeout(10s)), 7);
        EXPECT_EQ(held, 0);
        co_await routed.lane("other").async_call<void>("release", timeout(10s));
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return held != 0; }, 20s));
        EXPECT_EQ(held, 1);
        co_await srv.async_stop();
    });
}

// A 64 MiB echo on a lane goes in pieces both ways: small calls on the default lane, made
// after it, complete while it is on the wire (in one piece they would wait for all of it).
TEST(Lanes, SmallCallsPassALargeCallInPieces) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        server srv(ex);
        serve_echo_and_inc(srv);
        const int passed =
            co_await small_calls_beside_a_large_one(srv.listen("tcp://127.0.0.1:0"), 64 << 20);
        EXPECT_GE(passed, 5) << "small calls waited behind the large one";
        co_await srv.async_stop();
    });
}

// A named lane's pieces in flight are what a small message of another lane waits behind: a
// lane alone on the connection may have lane_window_bytes on their way, but while this side
// sends other messages (plain ones, or another lane's pieces) it keeps to the shared window
// (peer_options::lane_window), and takes the whole window again once they have stopped for
// shared_lane_hold.
TEST(LaneWriter, ALaneKeepsToTheSharedWindowWhileOtherMessagesGo) {
    using detail::lane_window_bytes;
    std::uint64_t plain = 0;
    std::vector<std::string> heads;  // each piece's head, which names its lane
    detail::lane_writer w(
        64 << 10,
        [&](std::string_view head, std::string_view) { heads.emplace_back(head); },
        [] { return std::size_t{0}; }, [&] { return plain; }, 256 << 10);
    const auto t0 = clock_type::now();
    const auto piece = (64 << 10) + detail::piece_overhead_bytes;
    w.push("bulk", std::string(32 << 20, 'x'), {});
    w.pump(t0);
    EXPECT_EQ(w.window("bulk", t0), lane_window_bytes);
    EXPECT_GE(w.in_flight("bulk"), lane_window_bytes);
    EXPECT_LT(w.in_flight("bulk"), lane_window_bytes + piece);

    // A plain message went: the next pieces wait until less than the shared window is out.
    w.credit("bulk", w.in_flight("bulk"));
    plain = 1;
    w.pump(t0 + 1ms);
    EXPECT_EQ(w.window("bulk", t0 + 1ms), std::uint64_t{256} << 10);
    EXPECT_GE(w.in_flight("bulk"), std::uint64_t{256} << 10);
    EXPECT_LT(w.in_flight("bulk"), (std::uint64_t{256} << 10) + piece);
    w.credit("bulk", (64 << 10) + detail::piece_overhead_bytes);
    const auto before = w.in_flight("bulk");
    w.pump(t0 + 2ms);
    EXPECT_EQ(w.in_flight("bulk"), before + piece) << "one piece more, into the room credit made";

    // None since, for longer than the hold: the whole window again.
    const auto later = t0 + 1ms + detail::shared_lane_hold + 1ms;
    EXPECT_EQ(w.window("bulk", later), lane_window_bytes);
    w.pump(later);
    EXPECT_GE(w.in_flight("bulk"), lane_window_bytes);

    // Another lane's piece counts as another message.
    w.credit("bulk", w.in_flight("bulk"));
    w.push("ctl1", "small", {});
    w.pump(later + 1ms);
    EXPECT_EQ(w.window("bulk", later + 1ms), std::uint64_t{256} << 10);
    EXPECT_EQ(w.window("ctl1", later + 1ms), std::uint64_t{256} << 10);
    EXPECT_TRUE(std::any_of(heads.begin(), heads.end(),
                            [](const std::string& h) { return h.find("ctl1") != h.npos; }));
    EXPECT_LT(w.in_flight("bulk"), (std::uint64_t{256} << 10) + piece);

    // The window is kept within the credit step (which the receiver waits for) and the most.
    detail::lane_writer tiny(16 << 10, [](std::string_view, std::string_view) {},
                             [] { return std::size_t{0}; }, [] { return std::uint64_t{1}; }, 1);
    tiny.pump(t0);
    EXPECT_EQ(tiny.window("bulk", t0), detail::lane_credit_step);
    detail::lane_writer huge(64 << 10, [](std::string_view, std::string_view) {},
                             [] { return std::size_t{0}; }, [] { return std::uint64_t{1}; },
                             std::uint64_t{1} << 30);
    huge.pump(t0);
    EXPECT_EQ(huge.window("bulk", t0), lane_window_bytes);
}

// The smallest window (lane_window=1 is kept at the credit step) with small pieces: the
// receiver's credit, in steps of lane_credit_step, still comes, and a large call beside small
// calls completes.
TEST(Lanes, TheSmallestWindowStillMovesALargeCall) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        server srv(ex);
        serve_echo_and_inc(srv);
        const auto url = srv.listen("tcp://127.0.0.1:0");
        (void)co_await small_calls_beside_a_large_one(url + "?lane_window=1&piece_bytes=16384",
                                                      8 << 20);
        co_await srv.async_stop();
    });
}

// A stream's credit goes past its lane's window: the stream's serial handler holds the calls
// queued behind it on the lane (800 KiB, over the shared window, which is then not credited),
// and waits for the credit that the caller's reading sends on the same lane, while
// default-lane calls keep the lane to the shared window.
TEST(Lanes, AStreamsCreditPassesItsLanesWindow) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        server srv(ex);
        srv.on("items", [](writer<int>& out, int n) -> net::awaitable<void> {
            for (int i = 0; i < n; ++i) co_await out.write(i);
        });
        srv.on("store", [](const std::string& s) { return s.size(); });
        srv.on("inc", [](int x) { return x + 1; });
        const auto url = srv.listen("tcp://127.0.0.1:0");
        auto ch = co_await async_connect(url);
        auto bulk = ch.lane("bulk");
        EXPECT_EQ(co_await bulk.async_call<int>("inc", 0), 1);
        EXPECT_EQ(co_await ch.async_call<int>("inc", 0), 1);
        call_options o;
        o.window = 2;  // the handler needs credit after two items
        auto s = co_await bulk.async_stream<int>("items", 40, o);
        int stored = 0;
        for (int k = 0; k < 8; ++k)
            bulk.async_call<std::size_t>("store", std::string(100 << 10, 'x'),
                                         [&](std::error_code ec, std::size_t n) {
                                             if (!ec && n == 100u << 10) ++stored;
                                         });
        int got = 0;
        bool ended = false;
        net::co_spawn(
            ex,
            [&]() -> net::awaitable<void> {
                while (auto v = co_await s.next()) {
                    if (*v != got) break;
                    ++got;
                }
                ended = true;
            },
            net::detached);
        int small = 0;
        const auto until = clock_type::now() + 60s;
        while (!(ended && stored == 8) && clock_type::now() < until) {
            EXPECT_EQ(co_await ch.async_call<int>("inc", small), small + 1);
            ++small;
            co_await test::sleep_for(1ms);
        }
        EXPECT_EQ(got, 40) << "the stream's credit waited behind its lane's window";
        EXPECT_EQ(stored, 8);
        co_await srv.async_stop();
    });
}

// A call's cancel whose request is wholly sent goes on the default lane, past the lane's
// queue, even while the lane's window holds what is queued behind the call (800 KiB of calls
// behind a serial handler, never credited): the server finds the call on its lane and cancels
// its handler, and the calls behind it then run.
TEST(Lanes, ACancelReachesItsHandlerOnANamedLane) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        server srv(ex);
        bool started = false, saw_cancel = false;
        srv.on("slow", [&](int) -> net::awaitable<int> {
            started = true;
            try {
                co_await test::sleep_for(60s);
            } catch (const std::system_error&) {
                saw_cancel = true;
                throw;
            }
            co_return 0;
        });
        srv.on("inc", [](int x) { return x + 1; });
        srv.on("store", [](const std::string& s) { return s.size(); });
        auto ch = co_await async_connect(srv.listen("tcp://127.0.0.1:0"));
        auto bulk = ch.lane("bulk");
        EXPECT_EQ(co_await bulk.async_call<int>("inc", 0), 1);
        EXPECT_EQ(co_await ch.async_call<int>("inc", 0), 1);  // the lane shares the connection
        std::error_code got;
        bool done = false;
        net::cancellation_signal cancel;
        bulk.async_call<int>("slow", 0,
                             net::bind_cancellation_slot(cancel.slot(),
                                                         [&](std::error_code ec, int) {
                                                             got = ec;
                                                             done = true;
                                                         }));
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return started; }, 20s));
        int stored = 0;
        for (int k = 0; k < 8; ++k)
            bulk.async_call<std::size_t>("store", std::string(100 << 10, 'x'),
                                         [&](std::error_code ec, std::size_t n) {
                                             if (!ec && n == 100u << 10) ++stored;
                                         });
        EXPECT_EQ(co_await ch.async_call<int>("inc", 1), 2);
        cancel.emit(net::cancellation_type::terminal);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return done; }, 20s));
        EXPECT_TRUE(co_await wait_until([&] { return saw_cancel; }, 20s))
            << "the cancel did not reach the handler on lane bulk";
        EXPECT_TRUE(co_await wait_until([&] { return stored == 8; }, 20s));
        EXPECT_EQ(base_peer_of(ch)->counters().notifications_undelivered, 0u);
        co_await srv.async_stop();
    });
}

// A lane whose handler has stopped is held by its credit at the sender: 80 MiB sent behind it
// (more than max_queued_bytes, which would stop the connection's reading) wait on the caller's
// side, while another lane's large calls and the default lane's go on; released, the lane's
// messages all arrive, in order.
TEST(Lanes, AStoppedLaneIsHeldByItsCreditAndTheOthersGoOn) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        bool holding = false, released = false;
        recorder rec;
        server srv(ex);
        serve_hold(srv, holding, released);
        srv.on("sink", [&](std::uint64_t i, const std::string& blob) {
            if (blob.size() != (1 << 20)) rec.add("broken", blob.size());
            rec.add("slow", i);
        });
        srv.on("echo", [](const std::string& s) { return s; });
        const auto url = srv.listen("tcp://127.0.0.1:0");
        auto ch = co_await async_connect(url);
        auto slow = ch.lane("slow");
        slow.notify("hold");
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return holding; }, 20s));
        const std::string mib(1 << 20, 's');
        constexpr std::uint64_t n = 80;
        for (std::uint64_t i = 0; i < n; ++i) slow.notify("sink", i, mib);
        const std::string two(2 << 20, 'o');
        for (int k = 0; k < 8; ++k) {
            EXPECT_EQ(co_await ch.lane("other").async_call<std::string>("echo", two, timeout(20s)),
                      two);
            EXPECT_EQ(co_await ch.async_call<std::string>("echo", std::string("d"), timeout(20s)),
                      "d");
        }
        EXPECT_EQ(rec.count("slow"), 0u);
        co_await ch.lane("other").async_call<void>("release", timeout(20s));
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return rec.count("slow") == n; }, 60s));
        EXPECT_EQ(rec.out_of_order("slow"), -1);
        EXPECT_EQ(rec.count("broken"), 0u);
        co_await srv.async_stop();
    });
}

// A msgpack-rpc server that knows nothing of ordo: answers "echo" with its first argument,
// anything else with an error, and keeps the methods it was sent.
struct foreign_server {
    explicit foreign_server(net::any_io_executor ex)
        : acceptor(ex, {net::ip::make_address("127.0.0.1"), 0}) {
        net::co_spawn(ex, serve(), net::detached);
    }
    std::string url() const {
        return "tcp://127.0.0.1:" + std::to_string(acceptor.local_endpoint().port());
    }
    net::awaitable<void> serve() {
        auto [aec, sock] = co_await acceptor.async_accept(use_tuple);
        if (aec) co_return;
        msgpack::unpacker in;
        for (;;) {
            in.reserve_buffer(65536);
            auto [ec, n] = co_await sock.async_read_some(net::buffer(in.buffer(), 65536), use_tuple);
            if (ec) co_return;
            in.buffer_consumed(n);
            msgpack::object_handle oh;
            while (in.next(oh)) {
                const auto& a = oh.get().via.array;
                const int kind = a.ptr[0].as<int>();
                const std::string method = a.ptr[kind == 0 ? 2 : 1].as<std::string>();
                methods.push_back(method);
                if (kind != 0) continue;
                msgpack::sbuffer b;
                msgpack::packer<msgpack::sbuffer> p(b);
                p.pack_array(4);
                p.pack(1);
                p.pack(a.ptr[1]);
                if (method == "echo") {
                    p.pack_nil();
                    p.pack(a.ptr[3].via.array.ptr[0]);
                } else {
                    p.pack(std::string("no such method"));
                    p.pack_nil();
                }
                co_await net::async_write(sock, net::buffer(b.data(), b.size()), use_tuple);
            }
        }
    }
    net::ip::tcp::acceptor acceptor;
    std::vector<std::string> methods;
};

// Toward a peer that does not read lanes, a lane's messages go whole and in the order sent,
// after one question (ordo.features) it answers with an error: no ordo.piece on its wire.
TEST(Lanes, AForeignPeerGetsPlainMessagesInTheOrderSent) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        foreign_server fs(ex);
        auto ch = co_await async_connect(fs.url());
        const std::string blob(200'000, 'y');
        ch.lane("bulk").notify("note", 1);
        EXPECT_EQ(co_await ch.lane("bulk").async_call<std::string>("echo", blob), blob);
        EXPECT_EQ(co_await ch.async_call<int>("echo", 7), 7);
        EXPECT_EQ(co_await ch.lane("x").async_call<int>("echo", 8), 8);
        const std::vector<std::string> want{"ordo.features", "note", "echo", "echo", "echo"};
        EXPECT_EQ(fs.methods, want);
    });
}

// A resumable session cut at random byte counts, inside pieces too: every lane's messages
// arrive once each and in order, and every call is answered.
TEST(Lanes, CutsInsidePiecesLoseAndDuplicateNothingOnAnyLane) {
    run_test(
        []() -> net::awaitable<void> {
            auto ex = co_await net::this_coro::executor;
            recorder rec;
            server srv(ex);
            srv.on("rec", [&](std::string tag, std::uint64_t i, const std::string& blob) {
                if (blob.size() % 1000 != 0) rec.add("broken", blob.size());
                rec.add(tag, i);
            });
            srv.on("echo", [](const std::string& s) { return s; });
            const auto url = srv.listen("tcp://127.0.0.1:0");
            test::cut_options co;
            co.seed = 20261129;
            co.min_bytes = 100'000;
            co.max_bytes = 900'000;
            test::cutting_proxy proxy("127.0.0.1", port_of(url), co);
            auto ch = co_await async_connect(proxy.url() + "?resume_ms=20000&piece_bytes=16384");
            auto bulk = ch.lane("bulk");
            constexpr std::uint64_t n = 300;
            std::uint64_t answered = 0, failed = 0;
            for (std::uint64_t i = 0; i < n; ++i) {
                bulk.notify("rec", std::string("bulk"), i, std::string((i % 7) * 40'000, 'b'));
                ch.notify("rec", std::string("default"), i, std::string(1000, 'd'));
                ch.lane("small").notify("rec", std::string("small"), i, std::string());
                if (i % 10 == 0) {
                    std::string want(100'000 + i, 'e');
                    bulk.async_call<std::string>("echo", want,
                                                 [&, want](std::error_code ec, std::string r) {
                                                     if (ec || r != want) ++failed;
                                                     ++answered;
                                                 });
                }
                if (i % 8 == 0) co_await base_peer_of(ch)->async_drain();
            }
            ORDO_CO_ASSERT_TRUE(co_await wait_until(
                [&] {
                    return rec.count("bulk") >= n && rec.count("default") >= n &&
                           rec.count("small") >= n && answered == n / 10;
                },
                120s));
            EXPECT_EQ(rec.count("bulk"), n);
            EXPECT_EQ(rec.count("default"), n);
            EXPECT_EQ(rec.count("small"), n);
            EXPECT_EQ(rec.out_of_order("bulk"), -1);
            EXPECT_EQ(rec.out_of_order("default"), -1);
            EXPECT_EQ(rec.out_of_order("small"), -1);
            EXPECT_EQ(rec.count("broken"), 0u);
            EXPECT_EQ(failed, 0u);
            EXPECT_GE(proxy.cuts(), 10u);
            EXPECT_TRUE(base_peer_of(ch)->is_open());
            co_await srv.async_stop();
        },
        240s);
}

// A client of pieces written by hand.
struct piece_client {
    net::ip::tcp::socket sock;
    explicit piece_client(net::any_io_executor ex) : sock(ex) {}
    net::awaitable<void> connect(const std::string& url) {
        co_await sock.async_connect({net::ip::make_address("127.0.0.1"), port_of(url)},
                                    net::use_awaitable);
    }
    net::awaitable<void> piece(const std::string& lane, std::uint64_t remaining,
                               const std::string& bytes) {
        msgpack::sbuffer b;
        msgpack::packer<msgpack::sbuffer> p(b);
        p.pack_array(3);
        p.pack(2);
        p.pack(std::string("ordo.piece"));
        p.pack_array(3);
        p.pack(lane);
        p.pack(remaining);
        p.pack_bin(static_cast<std::uint32_t>(bytes.size()));
        p.pack_bin_body(bytes.data(), static_cast<std::uint32_t>(bytes.size()));
        co_await net::async_write(sock, net::buffer(b.data(), b.size()), use_tuple);
    }
    // Reads until the server closes the connection (true) or `limit` passes (false).
    net::awaitable<bool> closed_within(std::chrono::milliseconds limit) {
        using namespace net::experimental::awaitable_operators;
        char buf[4096];
        const auto deadline = clock_type::now() + limit;
        while (clock_type::now() < deadline) {
            net::steady_timer t(sock.get_executor(), deadline - clock_type::now());
            auto r = co_await (sock.async_read_some(net::buffer(buf), use_tuple) ||
                               t.async_wait(use_tuple));
            if (r.index() == 1) co_return false;
            if (std::get<0>(std::get<0>(r))) co_return true;
        }
        co_return false;
    }
};

std::string encoded_notification(const std::string& method, int arg) {
    msgpack::sbuffer b;
    msgpack::packer<msgpack::sbuffer> p(b);
    p.pack_array(3);
    p.pack(2);
    p.pack(method);
    p.pack_array(1);
    p.pack(arg);
    return std::string(b.data(), b.size());
}

// Pieces that break a limit or contradict each other close their connection (and only it):
// too large a message, too many lanes, pieces that say other sizes, a piece inside a piece, a
// message never completed within message_timeout. Pieces within the limits are served.
TEST(Lanes, PiecesOverTheLimitsCloseTheirConnection) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        server_options so;
        so.peer.comm.limits.max_message_bytes = 1 << 20;
        so.peer.comm.limits.max_lanes = 4;
        so.peer.comm.message_timeout = 500ms;
        server srv(ex, so);
        int noted = 0;
        srv.on("note", [&](int) { ++noted; });
        srv.on("inc", [](int x) { return x + 1; });
        const auto url = srv.listen("tcp://127.0.0.1:0");
        const std::string note = encoded_notification("note", 1);

        {  // within the limits: a message in three pieces, and one of one piece, are served
            piece_client c(ex);
            co_await c.connect(url);
            co_await c.piece("a", note.size() - 2, note.substr(0, 2));
            co_await c.piece("a", note.size() - 5, note.substr(2, 3));
            co_await c.piece("a", 0, note.substr(5));
            co_await c.piece("b", 0, note);
            ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return noted == 2; }, 10s));
        }
        {  // a message over max_message_bytes
            piece_client c(ex);
            co_await c.connect(url);
            co_await c.piece("a", 2 << 20, note.substr(0, 2));
            EXPECT_TRUE(co_await c.closed_within(10s));
        }
        {  // a size that wraps: remaining near 2^64 must not pass for a small message
            piece_client c(ex);
            co_await c.connect(url);
            co_await c.piece("a", ~std::uint64_t{0}, note.substr(0, 1));
            EXPECT_TRUE(co_await c.closed_within(10s));
        }
        {  // five lanes with a message in the making, over max_lanes (4)
            piece_client c(ex);
            co_await c.connect(url);
            for (int i = 0; i < 5; ++i)
                co_await c.piece("lane" + std::to_string(i), note.size() - 1, note.substr(0, 1));
            EXPECT_TRUE(co_await c.closed_within(10s));
        }
        {  // pieces that say different sizes
            piece_client c(ex);
            co_await c.connect(url);
            co_await c.piece("a", note.size() - 1, note.substr(0, 1));
            co_await c.piece("a", 100, note.substr(1, 1));
            EXPECT_TRUE(co_await c.closed_within(10s));
        }
        {  // a piece inside a piece
            piece_client inner(ex);
            msgpack::sbuffer b;
            msgpack::packer<msgpack::sbuffer> p(b);
            p.pack_array(3);
            p.pack(2);
            p.pack(std::string("ordo.piece"));
            p.pack_array(3);
            p.pack(std::string("a"));
            p.pack(0);
            p.pack_bin(static_cast<std::uint32_t>(note.size()));
            p.pack_bin_body(note.data(), static_cast<std::uint32_t>(note.size()));
            piece_client c(ex);
            co_await c.connect(url);
            co_await c.piece("a", 0, std::string(b.data(), b.size()));
            EXPECT_TRUE(co_await c.closed_within(10s));
        }
        {  // a message begun and never finished: closed after message_timeout
            piece_client c(ex);
            co_await c.connect(url);
            const auto began = clock_type::now();
            co_await c.piece("a", note.size() - 1, note.substr(0, 1));
            EXPECT_TRUE(co_await c.closed_within(20s));
            EXPECT_GE(clock_type::now() - began, 400ms);
        }
        EXPECT_EQ(noted, 2);
        auto ch = co_await async_connect(url);
        EXPECT_EQ(co_await ch.lane("a").async_call<int>("inc", 1), 2);
        co_await srv.async_stop();
    });
}

}  // namespace
}  // namespace ordo
