#include "ordo/batched_comm.hpp"

#include <unistd.h>

#include <atomic>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "comm/framing.hpp"
#include "ordo/error.hpp"
#include "support/run_test.hpp"

namespace ordo {
namespace {

using namespace std::chrono_literals;
using test::run_test;
using test::wait_until;

std::string unique_url(const std::string& scheme) {
    static std::atomic<int> n{0};
    if (scheme == "unix")
        return "unix:///tmp/ordo-test-" + std::to_string(::getpid()) + "-" + std::to_string(n++) +
               ".sock";
    return "tcp://127.0.0.1:0";
}

struct transport_pair {
    std::unique_ptr<listener> l;
    std::unique_ptr<transport> client, server;
};

net::awaitable<transport_pair> connect_pair(const std::string& url) {
    transport_pair p;
    p.l = listen(co_await net::this_coro::executor, url);
    p.client = co_await async_connect_transport(p.l->local_address());
    p.server = co_await p.l->async_accept();
    co_return p;
}

// Message i: a msgpack uint32 (0xce + 4 bytes, big-endian), optionally followed in an array by
// a bin payload of `pad` bytes.
std::string seq_msg(std::uint32_t i, std::size_t pad = 0) {
    std::string s;
    if (pad > 0) s += "\x92";
    s += '\xce';
    for (int shift = 24; shift >= 0; shift -= 8) s += char((i >> shift) & 0xff);
    if (pad > 0) {
        s += '\xc6';
        for (int shift = 24; shift >= 0; shift -= 8) s += char((pad >> shift) & 0xff);
        s += std::string(pad, 'p');
    }
    return s;
}

std::uint32_t seq_of(std::string_view m) {
    if (!m.empty() && m[0] == '\x92') m.remove_prefix(1);
    if (m.size() < 5 || m[0] != '\xce') throw std::runtime_error("not a sequence message");
    std::uint32_t v = 0;
    for (int i = 1; i <= 4; ++i) v = (v << 8) | static_cast<unsigned char>(m[i]);
    return v;
}

class OrderedStream : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(OrderedStream, AMillionSmallMessagesArriveCompleteAndInOrderWithCoalescedWrites) {
    const auto [scheme, interval_ms] = GetParam();
    constexpr std::uint32_t count = 1'000'000;
    run_test(
        [&, scheme = scheme, interval_ms = interval_ms]() -> net::awaitable<void> {
            auto p = co_await connect_pair(unique_url(scheme));
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

INSTANTIATE_TEST_SUITE_P(TcpAndUnix, OrderedStream,
                         ::testing::Combine(::testing::Values("tcp", "unix"),
                                            ::testing::Values(0, 5)),
                         [](const auto& info) {
                             return std::get<0>(info.param) + "_interval_" +
                                    std::to_string(std::get<1>(info.param)) + "ms";
                         });

TEST(BatchedComm, ConsecutiveWritesStartAtLeastOneIntervalApartUnderBursts) {
    run_test([]() -> net::awaitable<void> {
        auto p = co_await connect_pair("tcp://127.0.0.1:0");
        std::uint32_t received = 0;
        batched_comm server(std::move(p.server), {}, [&](std::string_view) { ++received; });
        std::vector<write_event> writes;
        comm_options opts;
        opts.interval = 50ms;
        opts.on_write = [&](const write_event& w) { writes.push_back(w); };
        batched_comm client(std::move(p.client), opts, [](std::string_view) {});
        server.start();
        client.start();
        // 30 bursts of 20 messages, 10 ms apart: about 300 ms of traffic.
        net::steady_timer gap(co_await net::this_coro::executor);
        std::uint32_t sent = 0;
        for (int burst = 0; burst < 30; ++burst) {
            for (int i = 0; i < 20; ++i) client.send(seq_msg(sent++));
            gap.expires_after(10ms);
            co_await gap.async_wait(use_tuple);
        }
        EXPECT_TRUE(co_await wait_until([&] { return received == sent; }));
        ORDO_CO_ASSERT_GE(writes.size(), 2u);
        EXPECT_LT(writes.size(), 30u) << "bursts were not coalesced";
        std::size_t messages = 0;
        for (std::size_t i = 0; i < writes.size(); ++i) {
            messages += writes[i].messages;
            if (i > 0) {
                EXPECT_GE(writes[i].start - writes[i - 1].start, 50ms)
                    << "write " << i << " started too early";
            }
        }
        EXPECT_EQ(messages, sent);
        client.abort();
    });
}

TEST(BatchedComm, FirstMessageAfterAnIdleSpellIsWrittenAtOnce) {
    run_test([]() -> net::awaitable<void> {
        auto p = co_await connect_pair("tcp://127.0.0.1:0");
        std::uint32_t received = 0;
        batched_comm server(std::move(p.server), {}, [&](std::string_view) { ++received; });
        std::vector<write_event> writes;
        comm_options opts;
        opts.interval = 1000ms;
        opts.on_write = [&](const write_event& w) { writes.push_back(w); };
        batched_comm client(std::move(p.client), opts, [](std::string_view) {});
        server.start();
        client.start();
        net::steady_timer idle(co_await net::this_coro::executor);
        using clock = std::chrono::steady_clock;

        const auto t0 = clock::now();  // first message ever: nothing to wait for
        client.send(seq_msg(0));
        EXPECT_TRUE(co_await wait_until([&] { return writes.size() == 1; }));
        client.send(seq_msg(1));  // right after a write: waits for the rest of the interval
        EXPECT_TRUE(co_await wait_until([&] { return writes.size() == 2; }));
        idle.expires_after(1200ms);  // an idle spell longer than the interval
        co_await idle.async_wait(use_tuple);
        const auto t2 = clock::now();
        client.send(seq_msg(2));
        EXPECT_TRUE(co_await wait_until([&] { return writes.size() == 3 && received == 3; }));
        ORDO_CO_ASSERT_EQ(writes.size(), 3u);
        EXPECT_LT(writes[0].start - t0, 500ms);
        EXPECT_GE(writes[1].start - writes[0].start, 1000ms);
        EXPECT_LT(writes[2].start - t2, 500ms);
        client.abort();
    });
}

TEST(BatchedComm, MaxBatchBytesTriggersAWriteBeforeTheIntervalEnds) {
    run_test([]() -> net::awaitable<void> {
        auto p = co_await connect_pair("tcp://127.0.0.1:0");
        std::uint32_t received = 0;
        batched_comm server(std::move(p.server), {}, [&](std::string_view) { ++received; });
        std::vector<write_event> writes;
        comm_options opts;
        opts.interval = 60000ms;  // never reached within the test
        opts.max_batch_bytes = 4096;
        opts.on_write = [&](const write_event& w) { writes.push_back(w); };
        batched_comm client(std::move(p.client), opts, [](std::string_view) {});
        server.start();
        client.start();
        client.send(seq_msg(0));  // first write: at once
        EXPECT_TRUE(co_await wait_until([&] { return writes.size() == 1; }));
        for (std::uint32_t i = 1; i <= 5; ++i) client.send(seq_msg(i, 1000));  // > 4096 bytes
        EXPECT_TRUE(co_await wait_until([&] { return received == 6; }));
        EXPECT_EQ(writes.size(), 2u);
        client.abort();
    });
}

class Overload : public ::testing::TestWithParam<std::string> {};

TEST_P(Overload, ProducerOutrunningAPeerThatNeverReadsGetsOverloadedAndExactUndelivered) {
    run_test([scheme = GetParam()]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        auto p = co_await connect_pair(unique_url(scheme));
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

INSTANTIATE_TEST_SUITE_P(TcpAndUnix, Overload, ::testing::Values("tcp", "unix"));

TEST(BatchedComm, GarbageBytesCloseThatConnectionWithAProtocolErrorAndANewConnectionWorks) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        auto l = listen(ex, "tcp://127.0.0.1:0");
        auto raw = co_await async_connect_transport(l->local_address());
        std::optional<close_result> closed;
        batched_comm victim(
            co_await l->async_accept(), {}, [](std::string_view) {},
            [&](const close_result& r) { closed = r; });
        victim.start();
        std::error_code ec;
        co_await raw->async_write(net::buffer(std::string("\x93\x01\x02\xc1garbage")), ec);
        EXPECT_FALSE(ec);
        EXPECT_TRUE(co_await wait_until([&] { return closed.has_value(); }));
        ORDO_CO_ASSERT_TRUE(closed);
        EXPECT_EQ(closed->code, errc::protocol_error);
        EXPECT_NE(closed->reason.find("0xc1"), std::string::npos) << closed->reason;
        EXPECT_NE(closed->reason.find("127.0.0.1"), std::string::npos) << closed->reason;
        char byte;
        co_await raw->async_read_some(net::buffer(&byte, 1), ec);
        EXPECT_TRUE(ec) << "the server side should have closed the connection";

        auto fresh = co_await async_connect_transport(l->local_address());
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

TEST(BatchedComm, CloseDeliversEverythingQueuedBeforeIt) {
    run_test([]() -> net::awaitable<void> {
        auto p = co_await connect_pair("tcp://127.0.0.1:0");
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

TEST(BatchedComm, AbortHandsBackWhatWasNotWrittenInOrder) {
    run_test([]() -> net::awaitable<void> {
        auto p = co_await connect_pair("tcp://127.0.0.1:0");
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

TEST(BatchedComm, DrainWaitsForTheHighWaterMarkAndFailsWhenTheConnectionEnds) {
    run_test([]() -> net::awaitable<void> {
        auto p = co_await connect_pair("tcp://127.0.0.1:0");
        comm_options opts;
        opts.high_water_bytes = 10'000;
        batched_comm client(std::move(p.client), opts, [](std::string_view) {});
        client.start();
        for (std::uint32_t i = 0; i < 100; ++i) client.send(seq_msg(i, 1000));
        EXPECT_GT(client.counters().buffered_bytes, opts.high_water_bytes);
        co_await client.async_drain();  // the kernel takes 100 KB: the writer gets below the mark
        EXPECT_LE(client.counters().buffered_bytes, opts.high_water_bytes);

        // The peer goes away while the buffer is above the mark: drain throws the reason.
        p.server->close();
        bool threw = false;
        for (std::uint32_t i = 0; i < 100'000 && !threw; ++i) {
            try {
                client.send(seq_msg(i, 1000));
                if (client.counters().buffered_bytes > opts.high_water_bytes)
                    co_await client.async_drain();
            } catch (const std::system_error& e) {
                threw = true;
                EXPECT_EQ(e.code(), errc::peer_lost) << e.what();
            }
        }
        EXPECT_TRUE(threw);
    });
}

TEST(BatchedComm, AThrowingMessageHandlerAbortsTheConnectionWithItsMessage) {
    run_test([]() -> net::awaitable<void> {
        auto p = co_await connect_pair("tcp://127.0.0.1:0");
        batched_comm server(std::move(p.server), {},
                            [](std::string_view) { throw std::runtime_error("handler bug"); });
        batched_comm client(std::move(p.client), {}, [](std::string_view) {});
        server.start();
        client.start();
        client.send(seq_msg(1));
        auto r = co_await server.async_wait_closed();
        EXPECT_NE(r.reason.find("handler bug"), std::string::npos) << r.reason;
        auto c = co_await client.async_wait_closed();
        EXPECT_EQ(c.code, errc::peer_lost);
    });
}

}  // namespace
}  // namespace ordo
