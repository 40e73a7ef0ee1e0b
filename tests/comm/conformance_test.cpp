// One conformance suite for every transport (docs/calls-and-channels.md, "Transports"): the same
// tests, unchanged, over tcp, unix, inproc, tls, zmq+tcp and zmq+ipc. First the byte stream under
// batched_comm (order, overload, bad input, close and abort), then RPC over it (mixed ordering
// under batching, pipelined calls, a 16 MiB message, a peer that crashes).
#include <future>
#include <thread>

#include <gtest/gtest.h>

#include "comm/framing.hpp"
#include "ordo/error.hpp"
#include "ordo/ordo.hpp"
#include "support/run_test.hpp"
#include "support/running_loop.hpp"
#include "support/streams.hpp"

namespace ordo {
namespace {

using namespace std::chrono_literals;
using test::connect_pair;
using test::run_test;
using test::seq_msg;
using test::seq_of;
using test::wait_until;

class Conformance : public ::testing::TestWithParam<std::string> {};

TEST_P(Conformance, AMillionSmallMessagesArriveCompleteAndInOrderWithCoalescedWrites) {
    const std::string scheme = GetParam();
    const int interval_ms = 0;
    constexpr std::uint32_t count = 1'000'000;
    run_test(
        [&, scheme = scheme, interval_ms = interval_ms]() -> net::awaitable<void> {
            auto p = co_await connect_pair(scheme);
            std::uint32_t expected = 0;
            bool in_order = true;
            batched_comm server(std::move(p.server), {}, [&](std::string_view m) {
                if (seq_of(m) != expected) in_order = false;
                ++expected;
            });
            comm_options opts;
            opts.interval = std::chrono::milliseconds(interval_ms);
            opts.high_water_bytes = 64 * 1024;
            batched_comm client(std::move(p.client), opts, [](std::string_view) {});
            server.start();
            client.start();
            for (std::uint32_t i = 0; i < count; ++i) {
                client.send(seq_msg(i));
                if (client.counters().buffered_bytes > opts.high_water_bytes)
                    co_await client.async_drain();
            }
            EXPECT_TRUE(co_await wait_until([&] { return expected == count || !in_order; }, 240s));
            EXPECT_TRUE(in_order);
            EXPECT_EQ(expected, count);
            const auto& c = client.counters();
            EXPECT_EQ(c.messages_sent, count);
            EXPECT_EQ(server.counters().messages_received, count);
            EXPECT_EQ(c.bytes_sent, std::uint64_t(count) * 5);
            EXPECT_GT(c.messages_per_write(), 100.0) << "writes: " << c.writes;
            EXPECT_LE(c.peak_buffered_bytes, opts.high_water_bytes + 5);
            auto r = co_await client.async_close();
            EXPECT_EQ(r.code, errc::closed) << r.reason;
            EXPECT_TRUE(r.undelivered.empty());
            co_await server.async_wait_closed();
        },
        300s);
}

TEST_P(Conformance, ProducerOutrunningAPeerThatNeverReadsGetsOverloadedAndExactUndelivered) {
    run_test([scheme = GetParam()]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        auto p = co_await connect_pair(scheme);
        comm_options opts;
        opts.max_buffer_bytes = 1 << 20;
        batched_comm client(std::move(p.client), opts, [](std::string_view) {});
        client.start();
        // p.server is never read until the end: kernel buffers fill, then ours.
        std::uint32_t taken = 0;
        bool refused = false;
        for (std::uint32_t i = 0; i < 200'000 && !refused; ++i) {
            try {
                client.send(seq_msg(i, 1000));
                ++taken;
            } catch (const std::system_error& e) {
                EXPECT_EQ(e.code(), errc::overloaded);
                EXPECT_NE(std::string(e.what()).find("max_buffer_bytes"), std::string::npos);
                refused = true;
            }
            if (i % 64 == 0) co_await net::post(ex, net::use_awaitable);  // let the writer run
        }
        ORDO_CO_ASSERT_TRUE(refused);
        EXPECT_LE(client.counters().peak_buffered_bytes, opts.max_buffer_bytes);
        client.abort();
        auto r = co_await client.async_wait_closed();
        EXPECT_EQ(r.code, errc::closed);
        // Counted once the aborted write has reported how much of it reached the kernel.
        const auto sent = client.counters().messages_sent;

        // Read what reached the peer: whole messages 0..k-1, maybe the head of message k.
        detail::framer f;
        std::vector<std::uint32_t> got;
        for (;;) {
            auto area = f.prepare(65536);
            std::error_code ec;
            auto n = co_await p.server->async_read_some(net::buffer(area.data(), area.size()), ec);
            if (ec) break;
            f.commit(n);
            while (auto m = f.next()) got.push_back(seq_of(*m));
        }
        ORDO_CO_ASSERT_EQ(got.size() + r.undelivered.size(), taken);
        EXPECT_EQ(got.size(), sent);
        for (std::uint32_t i = 0; i < got.size(); ++i) ORDO_CO_ASSERT_EQ(got[i], i);
        for (std::size_t i = 0; i < r.undelivered.size(); ++i)
            ORDO_CO_ASSERT_EQ(seq_of(r.undelivered[i]), got.size() + i);
        EXPECT_GT(r.undelivered.size(), 0u);
    });
}

TEST_P(Conformance, GarbageBytesCloseThatConnectionWithAProtocolErrorAndANewConnectionWorks) {
    run_test([scheme = GetParam()]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        auto l = listen(ex, test::listen_url(scheme));
        auto raw = co_await async_connect_transport(test::connect_url(l->local_address()));
        auto accepted = co_await l->async_accept();
        const std::string remote = accepted->remote_address();
        std::optional<close_result> closed;
        batched_comm victim(
            std::move(accepted), {}, [](std::string_view) {},
            [&](const close_result& r) { closed = r; });
        victim.start();
        std::error_code ec;
        co_await raw->async_write(net::buffer(std::string("\x93\x01\x02\xc1garbage")), ec);
        EXPECT_FALSE(ec);
        EXPECT_TRUE(co_await wait_until([&] { return closed.has_value(); }));
        ORDO_CO_ASSERT_TRUE(closed);
        EXPECT_EQ(closed->code, errc::protocol_error);
        EXPECT_NE(closed->reason.find("0xc1"), std::string::npos) << closed->reason;
        EXPECT_NE(closed->reason.find(remote), std::string::npos) << closed->reason;
        char byte;
        co_await raw->async_read_some(net::buffer(&byte, 1), ec);
        EXPECT_TRUE(ec) << "the server side should have closed the connection";

        auto fresh = co_await async_connect_transport(test::connect_url(l->local_address()));
        std::vector<std::uint32_t> got;
        batched_comm server(co_await l->async_accept(), {},
                            [&](std::string_view m) { got.push_back(seq_of(m)); });
        batched_comm client(std::move(fresh), {}, [](std::string_view) {});
        server.start();
        client.start();
        client.send(seq_msg(7));
        EXPECT_TRUE(co_await wait_until([&] { return got.size() == 1; }));
        EXPECT_EQ(got, std::vector<std::uint32_t>{7});
        client.abort();
    });
}

// A connection handed over in the middle of a read (batched_comm::hand_over, as a resumed
// session does on a server with several loops): what was queued is written first, the bytes
// read past the current message go along, and the transport moves to another loop, where a new
// batched_comm goes on with both directions intact. inproc and zmq+ cannot move.
TEST_P(Conformance, AConnectionHandedOverToAnotherLoopLosesNoByteEitherWay) {
    const std::string scheme = GetParam();
    const bool movable = scheme == "tcp" || scheme == "unix" || scheme == "tls";
    test::running_loop other;
    run_test([&]() -> net::awaitable<void> {
        auto p = co_await connect_pair(scheme);
        std::vector<std::uint32_t> before, after, back;
        std::unique_ptr<transport> handed;
        std::string rest;
        bool done = false;
        std::unique_ptr<batched_comm> first;
        first = std::make_unique<batched_comm>(std::move(p.server), comm_options{},
                                                    [&](std::string_view m) {
                                                        before.push_back(seq_of(m));
                                                        if (seq_of(m) != 2) return;
                                                        first->send(seq_msg(100));
                                                        first->hand_over(
                                                            [&](std::unique_ptr<transport> t,
                                                                std::string r) {
                                                                handed = std::move(t);
                                                                rest = std::move(r);
                                                                done = true;
                                                            });
                                                    });
        batched_comm client(std::move(p.client), {},
                            [&](std::string_view m) { back.push_back(seq_of(m)); });
        first->start();
        client.start();
        // One write: the hand-over comes in the middle of what one read took.
        std::string burst;
        for (std::uint32_t i = 0; i < 6; ++i) burst += seq_msg(i);
        client.send(burst);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return done; }));
        first.reset();
        ORDO_CO_ASSERT_TRUE(handed);
        EXPECT_EQ(before, (std::vector<std::uint32_t>{0, 1, 2}));
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return back.size() == 1; }));
        EXPECT_EQ(back, std::vector<std::uint32_t>{100});  // queued before: written before
        auto moved = handed->rehome(other.io.get_executor());
        if (!movable) {
            EXPECT_FALSE(moved);
            client.abort();
            co_return;
        }
        ORDO_CO_ASSERT_TRUE(moved);
        EXPECT_TRUE(moved->get_executor() == net::any_io_executor(other.io.get_executor()));
        std::shared_ptr<batched_comm> second;
        std::atomic<int> got{0};
        net::post(other.io, [&, t = std::move(moved), rest]() mutable {
            second = std::make_shared<batched_comm>(std::move(t), comm_options{},
                                                    [&](std::string_view m) {
                                                        after.push_back(seq_of(m));
                                                        second->send(seq_msg(200 + seq_of(m)));
                                                        ++got;
                                                    });
            second->preload(rest);
            second->start();
        });
        for (std::uint32_t i = 6; i < 9; ++i) client.send(seq_msg(i));
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return got.load() == 6 && back.size() == 7; }));
        EXPECT_EQ(after, (std::vector<std::uint32_t>{3, 4, 5, 6, 7, 8}));
        EXPECT_EQ(back, (std::vector<std::uint32_t>{100, 203, 204, 205, 206, 207, 208}));
        client.abort();
        std::promise<void> gone;
        net::post(other.io, [&] {
            second.reset();
            gone.set_value();
        });
        gone.get_future().wait();
    });
}

TEST_P(Conformance, CloseDeliversEverythingQueuedBeforeIt) {
    run_test([scheme = GetParam()]() -> net::awaitable<void> {
        auto p = co_await connect_pair(scheme);
        std::vector<std::uint32_t> got;
        std::optional<close_result> server_closed;
        batched_comm server(
            std::move(p.server), {}, [&](std::string_view m) { got.push_back(seq_of(m)); },
            [&](const close_result& r) { server_closed = r; });
        comm_options opts;
        opts.interval = 20ms;
        batched_comm client(std::move(p.client), opts, [](std::string_view) {});
        server.start();
        client.start();
        for (std::uint32_t i = 0; i < 10'000; ++i) client.send(seq_msg(i, 100));
        auto r = co_await client.async_close();
        EXPECT_EQ(r.code, errc::closed) << r.reason;
        EXPECT_TRUE(r.undelivered.empty());
        EXPECT_THROW(client.send(seq_msg(0)), std::system_error);
        EXPECT_TRUE(co_await wait_until([&] { return server_closed.has_value(); }));
        ORDO_CO_ASSERT_EQ(got.size(), 10'000u);
        for (std::uint32_t i = 0; i < got.size(); ++i) ORDO_CO_ASSERT_EQ(got[i], i);
        EXPECT_EQ(server_closed->code, errc::peer_lost);
        EXPECT_NE(server_closed->reason.find("closed the connection"), std::string::npos);
    });
}

TEST_P(Conformance, AbortHandsBackWhatWasNotWrittenInOrder) {
    run_test([scheme = GetParam()]() -> net::awaitable<void> {
        auto p = co_await connect_pair(scheme);
        std::uint32_t received = 0;
        std::optional<close_result> server_closed;
        batched_comm server(
            std::move(p.server), {}, [&](std::string_view) { ++received; },
            [&](const close_result& r) { server_closed = r; });
        batched_comm client(std::move(p.client), {}, [](std::string_view) {});
        server.start();
        client.start();
        // No suspension between the sends and abort(): the writer has not run.
        for (std::uint32_t i = 0; i < 1000; ++i) client.send(seq_msg(i));
        client.abort();
        try {
            client.send(seq_msg(1000));
            ADD_FAILURE() << "send after abort was taken";
        } catch (const std::system_error& e) {
            EXPECT_EQ(e.code(), errc::closed);
        }
        auto r = co_await client.async_wait_closed();
        EXPECT_EQ(r.code, errc::closed);
        ORDO_CO_ASSERT_EQ(r.undelivered.size(), 1000u);
        for (std::uint32_t i = 0; i < 1000; ++i) ORDO_CO_ASSERT_EQ(seq_of(r.undelivered[i]), i);
        EXPECT_TRUE(co_await wait_until([&] { return server_closed.has_value(); }));
        EXPECT_EQ(received, 0u);
        EXPECT_EQ(server_closed->code, errc::peer_lost);
    });
}


// --- RPC over each transport ------------------------------------------------------------------

// A server on its own thread and io_context, so that a test can "crash" it: stop the thread and
// destroy everything it owned, as the kernel closes a dead process's sockets.
struct remote_server {
    net::io_context io;
    std::unique_ptr<server> srv;
    std::string url;
    std::thread thread;
    std::vector<int> order;  // "mixed" and "note" arguments in arrival order (server thread)

    explicit remote_server(const std::string& scheme) {
        srv = std::make_unique<server>(io.get_executor());
        srv->on("mixed", [this](int i) {
            order.push_back(i);
            return i;
        });
        srv->on("note", [this](int i) { order.push_back(i); });
        srv->on("echo", [](std::string s) { return s; });
        srv->on("inc", [](int x) { return x + 1; });
        srv->on(
            "sleep_ms",
            [](int ms) -> net::awaitable<int> {
                net::steady_timer t(co_await net::this_coro::executor,
                                    std::chrono::milliseconds(ms));
                co_await t.async_wait(net::use_awaitable);
                co_return ms;
            },
            {.concurrent = true});
        url = test::connect_url(srv->listen(test::listen_url(scheme)));
        thread = std::thread([this] {
            auto work = net::make_work_guard(io);
            io.run();
        });
    }

    // Everything the server owned goes at once, without a goodbye.
    void crash() {
        io.stop();
        if (thread.joinable()) thread.join();
        srv.reset();
    }

    std::vector<int> arrivals() {
        std::promise<std::vector<int>> p;
        auto f = p.get_future();
        net::post(io, [&] { p.set_value(order); });
        return f.get();
    }

    ~remote_server() {
        if (thread.joinable()) {
            net::co_spawn(io, srv->async_stop(), net::use_future).wait_for(30s);
            crash();
        }
    }
};

std::string with_param(const std::string& url, const std::string& kv) {
    return url + (url.find('?') == std::string::npos ? "?" : "&") + kv;
}

TEST_P(Conformance, HundredThousandMixedCallsAndNotificationsArriveInSendOrderUnderBatching) {
    remote_server rs(GetParam());
    run_test(
        [&]() -> net::awaitable<void> {
            auto ch = co_await async_connect(with_param(rs.url, "interval_ms=2"));
            constexpr int n = 100'000;
            int answered = 0, wrong = 0;
            for (int i = 0; i < n; ++i) {
                if (i % 4 == 3) {
                    ch.async_call<int>("mixed", i, [&, i](std::error_code ec, int v) {
                        ++answered;
                        if (ec || v != i) ++wrong;
                    });
                } else {
                    ch.notify("note", i);
                }
                if (i % 1024 == 0) co_await net::post(net::use_awaitable);
            }
            EXPECT_TRUE(co_await wait_until([&] { return answered == n / 4; }, 120s));
            EXPECT_EQ(wrong, 0);
            // The last message is a call: once it is answered, everything before it was handled.
            const std::vector<int> order = rs.arrivals();
            ORDO_CO_ASSERT_EQ(order.size(), std::size_t(n));
            for (int i = 0; i < n; ++i) ORDO_CO_ASSERT_EQ(order[i], i);
        },
        180s);
}

TEST_P(Conformance, PipelinedCallsAreAllAnsweredAndMatched) {
    remote_server rs(GetParam());
    run_test([&]() -> net::awaitable<void> {
        auto ch = co_await async_connect(rs.url);
        constexpr int n = 20'000;
        int in_flight = 0, answered = 0, wrong = 0, max_in_flight = 0;
        net::steady_timer room(co_await net::this_coro::executor,
                               std::chrono::steady_clock::time_point::max());
        for (int i = 0; i < n; ++i) {
            while (in_flight >= 256) co_await room.async_wait(use_tuple);
            ++in_flight;
            max_in_flight = std::max(max_in_flight, in_flight);
            ch.async_call<int>("inc", i, [&, i](std::error_code ec, int v) {
                --in_flight;
                ++answered;
                if (ec || v != i + 1) ++wrong;
                room.cancel();
            });
        }
        EXPECT_TRUE(co_await wait_until([&] { return answered == n; }, 120s));
        EXPECT_EQ(wrong, 0);
        EXPECT_EQ(max_in_flight, 256);
    });
}

TEST_P(Conformance, ASixteenMiBMessageMakesTheRoundTripIntact) {
    remote_server rs(GetParam());
    run_test([&]() -> net::awaitable<void> {
        auto ch = co_await async_connect(rs.url);
        std::string big(16 << 20, '\0');
        std::uint32_t x = 12345;
        for (auto& c : big) {
            x = x * 1664525u + 1013904223u;
            c = static_cast<char>(x >> 24);
        }
        auto back = co_await ch.async_call<std::string>("echo", big);
        EXPECT_EQ(back.size(), big.size());
        EXPECT_TRUE(back == big);
        EXPECT_EQ(co_await ch.async_call<int>("inc", 1), 2);  // and the connection goes on
    });
}

TEST_P(Conformance, AServerCrashFailsEveryPendingCallWithPeerLostAndLaterCallsAtOnce) {
    remote_server rs(GetParam());
    run_test([&]() -> net::awaitable<void> {
        auto ch = co_await async_connect(rs.url);
        EXPECT_EQ(co_await ch.async_call<int>("inc", 1), 2);
        int failed = 0, other = 0;
        for (int i = 0; i < 100; ++i)
            ch.async_call<int>("sleep_ms", 60'000, [&](std::error_code ec, int) {
                if (ec == errc::peer_lost)
                    ++failed;
                else
                    ++other;
            });
        EXPECT_EQ(co_await ch.async_call<int>("inc", 2), 3);  // the sleeps have started
        const auto t0 = std::chrono::steady_clock::now();
        rs.crash();
        // Well below the 10 s liveness timeout: the transport itself reports the loss.
        EXPECT_TRUE(co_await wait_until([&] { return failed + other == 100; }, 8s));
        EXPECT_EQ(failed, 100);
        EXPECT_EQ(other, 0);
        try {
            co_await ch.async_call<int>("inc", 1);
            ADD_FAILURE() << "a call after the crash succeeded";
        } catch (const rpc_error& e) {
            EXPECT_EQ(e.code(), errc::peer_lost) << e.what();
        }
        EXPECT_LT(std::chrono::steady_clock::now() - t0, 9s);
    });
}

INSTANTIATE_TEST_SUITE_P(EveryTransport, Conformance, ::testing::ValuesIn(test::all_schemes),
                         [](const auto& info) { return test::scheme_name(info.param); });

}  // namespace
}  // namespace ordo
