#include "ordo/comm/batched_comm.hpp"

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <msgpack.hpp>

#include "comm/framing.hpp"
#include "ordo/error.hpp"
#include "ordo/rpc/detail/stream_core.hpp"
#include "support/run_test.hpp"
#include "support/streams.hpp"

namespace ordo {
namespace {

using namespace std::chrono_literals;
using test::connect_pair;
using test::run_test;
using test::seq_msg;
using test::seq_of;
using test::wait_until;

// A client whose writes are recorded, sending to a server that counts the messages it receives;
// both started. The listener, the two connections and the records live as long as this (which
// cannot move: the callbacks hold `this`).
struct recorded_pair {
    recorded_pair(test::transport_pair p, comm_options client_options)
        : l(std::move(p.l)),
          server(std::move(p.server), {}, [this](std::string_view) { ++received; }),
          client(std::move(p.client), with_recorder(std::move(client_options)),
                 [](std::string_view) {}) {
        server.start();
        client.start();
    }

    std::unique_ptr<listener> l;
    std::uint32_t received = 0;
    std::vector<write_event> writes;
    batched_comm server;
    batched_comm client;

  private:
    comm_options with_recorder(comm_options o) {
        o.on_write = [this](const write_event& w) { writes.push_back(w); };
        return o;
    }
};

// A client with `client_options`, sending to a server that records the sequence number of each
// message it receives (test::seq_msg); both started. Cannot move: the callback holds `this`.
struct seq_pair {
    seq_pair(test::transport_pair p, comm_options client_options)
        : l(std::move(p.l)),
          server(std::move(p.server), {}, [this](std::string_view m) { got.push_back(seq_of(m)); }),
          client(std::move(p.client), std::move(client_options), [](std::string_view) {}) {
        server.start();
        client.start();
    }

    std::unique_ptr<listener> l;
    std::vector<std::uint32_t> got;
    batched_comm server;
    batched_comm client;
};

TEST(BatchedComm, ConsecutiveWritesStartAtLeastOneIntervalApartUnderBursts) {
    run_test([]() -> net::awaitable<void> {
        comm_options opts;
        opts.interval = 50ms;
        recorded_pair r(co_await connect_pair("tcp"), opts);
        auto& received = r.received;
        auto& writes = r.writes;
        auto& client = r.client;
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
        comm_options opts;
        opts.interval = 1000ms;
        recorded_pair r(co_await connect_pair("tcp"), opts);
        auto& received = r.received;
        auto& writes = r.writes;
        auto& client = r.client;
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
        comm_options opts;
        opts.interval = 60000ms;  // never reached within the test
        opts.max_batch_bytes = 4096;
        recorded_pair r(co_await connect_pair("tcp"), opts);
        auto& received = r.received;
        auto& writes = r.writes;
        auto& client = r.client;
        client.send(seq_msg(0));  // first write: at once
        EXPECT_TRUE(co_await wait_until([&] { return writes.size() == 1; }));
        for (std::uint32_t i = 1; i <= 5; ++i) client.send(seq_msg(i, 1000));  // > 4096 bytes
        EXPECT_TRUE(co_await wait_until([&] { return received == 6; }));
        EXPECT_EQ(writes.size(), 2u);
        client.abort();
    });
}

TEST(BatchedComm, DrainWaitsForTheHighWaterMarkAndFailsWhenTheConnectionEnds) {
    run_test([]() -> net::awaitable<void> {
        auto p = co_await connect_pair("tcp");
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
        auto p = co_await connect_pair("tcp");
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

// An idle connection holds a small read buffer; one that grew for a 1 MiB message gives the
// memory back once traffic is small again.
TEST(BatchedComm, TheReadBufferStartsSmallAndShrinksBackAfterALargeMessage) {
    run_test([]() -> net::awaitable<void> {
        recorded_pair r(co_await connect_pair("tcp"), {});
        r.client.send(seq_msg(0));
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return r.received == 1; }));
        EXPECT_LE(r.server.counters().read_buffer_bytes, 4096u);
        r.client.send(seq_msg(1, 1 << 20));
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return r.received == 2; }));
        // Small messages one at a time: each read comes back mostly empty.
        for (std::uint32_t i = 2; i < 20; ++i) {
            r.client.send(seq_msg(i));
            ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return r.received == i + 1; }));
        }
        EXPECT_LE(r.server.counters().read_buffer_bytes, 4096u);
    });
}

// A writer that waits for work has its batch written by a posted flush, in one non-blocking
// send(2), when the kernel takes it whole (tcp, unix). tls cannot write that way: its batches
// go through the writer. Either way, one turn's messages leave in one write.
TEST(BatchedComm, AnIdleWritersBatchIsWrittenAtOnceWhereTheTransportCan) {
    for (const std::string scheme : {"tcp", "unix", "tls"}) {
        run_test([&]() -> net::awaitable<void> {
            recorded_pair r(co_await connect_pair(scheme), {});
            r.client.send(seq_msg(0));  // the writer may not wait yet: it has just started
            ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return r.received == 1; }));
            const comm_counters before = r.client.counters();
            for (std::uint32_t turn = 0; turn < 20; ++turn) {
                for (std::uint32_t i = 1; i <= 3; ++i) r.client.send(seq_msg(3 * turn + i));
                ORDO_CO_ASSERT_TRUE(
                    co_await wait_until([&] { return r.received == 3 * turn + 4; }));
            }
            const comm_counters& c = r.client.counters();
            EXPECT_EQ(c.messages_sent - before.messages_sent, 60u) << scheme;
            EXPECT_EQ(c.writes - before.writes, 20u) << scheme;
            EXPECT_EQ(c.direct_writes - before.direct_writes, scheme == "tls" ? 0u : 20u) << scheme;
            EXPECT_EQ(r.writes.size(), 21u) << scheme;
            r.client.abort();
        });
    }
}

// A batch larger than the kernel takes at once: the flush writes a part, and the writer writes
// the rest once the peer reads again. Nothing is lost or reordered, and it counts as one write.
TEST(BatchedComm, ABatchTheKernelTakesInPartIsFinishedByTheWriterInOrder) {
    run_test([]() -> net::awaitable<void> {
        comm_options o;
        o.max_buffer_bytes = 64 << 20;
        o.max_batch_bytes = 64 << 20;  // the turn's 32 MiB are one batch
        seq_pair r(co_await connect_pair("tcp"), o);
        r.client.send(seq_msg(0));
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return r.got.size() == 1; }));
        r.server.pause_reading(true);
        const comm_counters before = r.client.counters();
        // 32 MiB in one turn: more than loopback's socket buffers hold.
        for (std::uint32_t i = 1; i <= 512; ++i) r.client.send(seq_msg(i, 64 * 1024));
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] {
            return r.client.counters().write_since != std::chrono::steady_clock::time_point{};
        }));
        EXPECT_EQ(r.client.counters().messages_sent, before.messages_sent);
        r.server.pause_reading(false);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return r.got.size() == 513; }, 60s));
        for (std::uint32_t i = 0; i <= 512; ++i) ORDO_CO_ASSERT_EQ(r.got[i], i);
        const comm_counters& c = r.client.counters();
        EXPECT_EQ(c.messages_sent - before.messages_sent, 512u);
        EXPECT_EQ(c.writes - before.writes, 1u);
        EXPECT_EQ(c.direct_writes, before.direct_writes);
        EXPECT_EQ(c.buffered_bytes, 0u);
        r.client.abort();
    });
}

// A turn that queues more than max_batch_bytes does not wait for its end: each full batch is
// written from within send(), so the other side reads while the sender goes on queueing.
// Order and counts hold as for batches written at the end of a turn.
TEST(BatchedComm, AFullBatchIsWrittenWithinTheTurnThatFilledIt) {
    run_test([]() -> net::awaitable<void> {
        comm_options o;
        o.max_batch_bytes = 4096;
        seq_pair r(co_await connect_pair("tcp"), o);
        const comm_counters before = r.client.counters();
        // 200 messages of 100 bytes, 20 KB, in one turn: no co_await until all are queued.
        for (std::uint32_t i = 0; i < 200; ++i) r.client.send(seq_msg(i, 100));
        const comm_counters& c = r.client.counters();
        EXPECT_GE(c.writes - before.writes, 4u) << "full batches waited for the turn's end";
        EXPECT_EQ(c.direct_writes - before.direct_writes, c.writes - before.writes);
        EXPECT_GE(c.messages_sent - before.messages_sent, 160u);
        EXPECT_LT(c.buffered_bytes, 4096u);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return r.got.size() == 200; }));
        for (std::uint32_t i = 0; i < 200; ++i) ORDO_CO_ASSERT_EQ(r.got[i], i);
        EXPECT_EQ(r.client.counters().messages_sent - before.messages_sent, 200u);
        EXPECT_EQ(r.client.counters().buffered_bytes, 0u);
        r.client.abort();
    });
}

// A sender that queues without ever yielding to its executor, to a peer that reads: once the
// kernel's buffer is full the writer cannot run, so send() itself writes what the kernel takes
// again, once per max_batch_bytes queued. (The batch the kernel took in part used to wait for
// the sender's next yield, however much it queued meanwhile.) Nothing is lost or reordered.
TEST(BatchedComm, ASenderThatNeverYieldsGoesOnWritingAsThePeerReads) {
    // The peer: a plain socket with a small receive buffer, read by a thread of its own.
    const int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(lfd, 0);
    const int rcvbuf = 64 * 1024;
    ::setsockopt(lfd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    ASSERT_EQ(::listen(lfd, 1), 0);
    socklen_t len = sizeof a;
    ASSERT_EQ(::getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len), 0);
    std::string received;
    std::atomic<std::size_t> received_bytes{0};  // received.size(), for the sender to watch
    std::atomic<bool> go{false};  // the peer reads only once the kernel's buffers are full
    std::thread peer([&] {
        pollfd pf{lfd, POLLIN, 0};
        if (::poll(&pf, 1, 30'000) != 1) return;
        const int fd = ::accept(lfd, nullptr, nullptr);
        if (fd < 0) return;
        for (int i = 0; i < 30'000 && !go; ++i) std::this_thread::sleep_for(1ms);
        const timeval limit{30, 0};
        ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
        // Only the bytes here, so that the peer reads as fast as the kernel hands them over
        // (under a sanitizer too): they are parsed once the connection has ended.
        std::vector<char> chunk(65536);
        for (;;) {
            const ssize_t n = ::recv(fd, chunk.data(), chunk.size(), 0);
            if (n <= 0) break;
            received.append(chunk.data(), std::size_t(n));
            received_bytes = received.size();
        }
        ::close(fd);
    });
    std::uint32_t sent = 0;
    run_test([&]() -> net::awaitable<void> {
        auto t = co_await async_connect_transport("tcp://127.0.0.1:" +
                                                  std::to_string(ntohs(a.sin_port)));
        comm_options o;
        o.max_batch_bytes = 4096;
        batched_comm client(std::move(t), o, [](std::string_view) {});
        client.start();
        // No co_await from here on: only send() can write. First 8 MB, about twice what the
        // kernel's buffers hold while the peer does not read: the batch goes in part.
        while (sent < 8192) client.send(seq_msg(sent++, 1000));
        EXPECT_LT(client.counters().messages_sent, 8192u);
        go = true;
        // Then, as the peer reads, the rest of those and 4 MB more: 12 MB reach it only if
        // send() goes on writing. The sender slows down while far ahead of the peer (which
        // may get little of the CPU), so that its queue stays well within max_buffer_bytes.
        // (A time bound only stops a run that would never get there: on a busy machine each
        // short sleep may last a millisecond or more.)
        const auto until = std::chrono::steady_clock::now() + 120s;
        while (received_bytes < 12'000'000 && std::chrono::steady_clock::now() < until &&
               client.counters().buffered_bytes < (64u << 20)) {
            client.send(seq_msg(sent++, 1000));
            std::this_thread::sleep_for(client.counters().buffered_bytes > (8u << 20) ? 1ms : 20us);
        }
        EXPECT_GE(received_bytes, 12'000'000u)
            << "the peer got only what the kernel held: the sender's queue waited for it to "
               "yield ("
            << sent << " queued)";
        // Then slowly, a message a millisecond, still without yielding: once per 4 KiB queued,
        // send() writes what the kernel takes, so the peer catches up with all but the last
        // few messages. (A write that took the batch and the queue whole used to leave the
        // next sends to wait for a yield; so did a batch begun from a large queue, until as
        // much again was queued.)
        const std::size_t tail_from = sent;
        std::size_t behind = 0;
        for (int i = 0; i < 5000; ++i) {
            client.send(seq_msg(sent++, 1000));
            std::this_thread::sleep_for(1ms);
            const std::size_t queued = std::size_t(sent) * seq_msg(0, 1000).size();
            behind = queued - std::min<std::size_t>(received_bytes, queued);
            if (sent - tail_from >= 200 && behind <= 6000) break;
        }
        EXPECT_LE(behind, 6000u) << "the peer is " << behind << " bytes behind after "
                                 << sent - tail_from << " slow sends";
        co_await client.async_close();  // writes the rest, then ends
    }, 240s);
    peer.join();
    ::close(lfd);
    detail::framer f;
    std::uint32_t got = 0;
    bool in_order = true;
    for (std::size_t at = 0; at < received.size();) {
        const std::size_t n = std::min<std::size_t>(65536, received.size() - at);
        f.feed(std::string_view(received).substr(at, n));
        at += n;
        while (auto m = f.next()) in_order = seq_of(*m) == got++ && in_order;
    }
    EXPECT_EQ(got, sent);
    EXPECT_TRUE(in_order);
}

// Replies that handlers send while the reader passes on a read's messages leave together when
// the read is done, written at once by the reader (tcp): in order, one write per read.
TEST(BatchedComm, RepliesSentByHandlersLeaveTogetherWhenTheirReadIsDone) {
    run_test([]() -> net::awaitable<void> {
        auto p = co_await connect_pair("tcp");
        std::vector<std::uint32_t> got;
        std::unique_ptr<batched_comm> server;
        server = std::make_unique<batched_comm>(
            std::move(p.server), comm_options{},
            [&](std::string_view m) { server->send(seq_msg(seq_of(m) + 1000)); });
        batched_comm client(std::move(p.client), {},
                            [&](std::string_view m) { got.push_back(seq_of(m)); });
        server->start();
        client.start();
        for (std::uint32_t turn = 0; turn < 10; ++turn) {
            for (std::uint32_t i = 0; i < 3; ++i) client.send(seq_msg(3 * turn + i));
            ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return got.size() == 3 * turn + 3; }));
        }
        for (std::uint32_t i = 0; i < 30; ++i) ORDO_CO_ASSERT_EQ(got[i], i + 1000);
        const comm_counters& c = server->counters();
        EXPECT_EQ(c.messages_sent, 30u);
        EXPECT_EQ(c.writes, c.direct_writes);
        // One write per read: three replies each, unless TCP split a turn's requests.
        EXPECT_GE(c.writes, 10u);
        EXPECT_LE(c.writes, 20u);
        client.abort();
    });
}

// A body given with its owner (send(head, body, keep)) is written from where it is: bytes
// changed after send() but before they went out arrive changed. Its owner goes once it has been
// written; small messages before and after it keep their order.
TEST(BatchedComm, AHeldBodyIsWrittenFromWhereItIsAndLetGoOnceWritten) {
    run_test([]() -> net::awaitable<void> {
        auto p = co_await connect_pair("tcp");
        std::vector<std::string> got;
        batched_comm server(std::move(p.server), {},
                            [&](std::string_view m) { got.emplace_back(m); });
        comm_options o;
        o.max_buffer_bytes = 64 << 20;
        batched_comm client(std::move(p.client), o, [](std::string_view) {});
        server.start();
        client.start();
        client.send(seq_msg(0));
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return got.size() == 1; }));
        server.pause_reading(true);
        // 32 MiB of bin: more than loopback's socket buffers hold while the server waits.
        std::string body(32 << 20, 'a');
        const char head[] = {char(0xc6), char(0x02), 0, 0, 0};  // bin 32 of 32 MiB
        struct owner final : held_body {
            bool* alive;
            explicit owner(bool* a) : alive(a) { *alive = true; }
            ~owner() override { *alive = false; }
        };
        bool alive = false;
        client.send(seq_msg(1));
        client.send(std::string_view(head, sizeof head), body, std::make_unique<owner>(&alive));
        client.send(seq_msg(2));
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] {
            return client.counters().write_since != std::chrono::steady_clock::time_point{};
        }));
        EXPECT_TRUE(alive) << "let go before it was written";
        body.back() = 'Z';  // not yet written: it goes out as it is now
        server.pause_reading(false);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return got.size() == 4; }, 60s));
        EXPECT_EQ(seq_of(got[1]), 1u);
        ORDO_CO_ASSERT_EQ(got[2].size(), sizeof head + body.size());
        EXPECT_EQ(got[2].substr(0, sizeof head), std::string(head, sizeof head));
        EXPECT_EQ(got[2].back(), 'Z') << "copied when sent, not written from where it was";
        EXPECT_EQ(got[2].find_first_not_of('a', sizeof head), got[2].size() - 1);
        EXPECT_EQ(seq_of(got[3]), 2u);
        EXPECT_FALSE(alive);
        EXPECT_EQ(client.counters().buffered_bytes, 0u);
        client.abort();
    });
}

// Bytes of a message that its handler keeps (keep_delivered) stay where they were read, and
// unchanged: the connection gives that buffer up and reads what follows into another. A small
// part is not kept, nor one asked for outside a delivery.
TEST(BatchedComm, ABigPartOfAMessageIsKeptWhereItWasRead) {
    run_test([]() -> net::awaitable<void> {
        auto p = co_await connect_pair("tcp");
        std::vector<std::pair<std::string_view, std::shared_ptr<const kept_bytes>>> kept;
        int messages = 0, small_kept = 0;
        batched_comm server(std::move(p.server), {}, [&](std::string_view m) {
            ++messages;
            if (m.size() < kept_bytes_min) {
                small_kept += keep_delivered(m) != nullptr;
                return;
            }
            const std::string_view bytes = m.substr(5);  // the bin's
            auto k = keep_delivered(bytes);
            if (!k) return;
            EXPECT_EQ(keep_delivered(bytes), k) << "one holder for one buffer";
            kept.emplace_back(bytes, std::move(k));
        });
        comm_options o;
        o.max_buffer_bytes = 64 << 20;
        batched_comm client(std::move(p.client), o, [](std::string_view) {});
        server.start();
        client.start();
        const char head[] = {char(0xc6), 0, char(0x40), 0, 0};  // bin 32 of 4 MiB
        const std::string letters = "abc";
        for (std::size_t i = 0; i < letters.size(); ++i) {
            client.send(std::string_view(head, sizeof head), std::string(4 << 20, letters[i]));
            client.send(seq_msg(i));
        }
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return messages == 6; }, 60s));
        EXPECT_EQ(small_kept, 0);
        ORDO_CO_ASSERT_EQ(kept.size(), letters.size());
        for (std::size_t i = 0; i < kept.size(); ++i) {
            EXPECT_EQ(kept[i].first.size(), std::size_t{4} << 20);
            EXPECT_EQ(kept[i].first.find_first_not_of(letters[i]), std::string_view::npos)
                << "message " << i << "'s bytes changed after it was kept";
        }
        EXPECT_EQ(keep_delivered(kept[0].first), nullptr) << "kept outside a delivery";
        client.abort();
    });
}

// A stream item ends its message: keep_delivered_item finds its bytes there and keeps them where
// they were read. An item packed with a longer head than msgpack's shortest is not found at the
// place its shortest packing would start, so it is left to be copied.
TEST(BatchedComm, AStreamItemIsKeptWhereItWasReadWhenItsBytesAreFound) {
    run_test([]() -> net::awaitable<void> {
        auto p = co_await connect_pair("tcp");
        std::vector<std::string_view> views;  // empty: not kept
        std::vector<std::shared_ptr<const kept_bytes>> kept;
        batched_comm server(std::move(p.server), {}, [&](std::string_view m) {
            msgpack::zone zone;
            std::size_t off = 0;
            const auto msg = msgpack::unpack(zone, m.data(), m.size(), off,
                                             [](msgpack::type::object_type, std::size_t,
                                                void*) { return true; });
            const msgpack::object& item = msg.via.array.ptr[2].via.array.ptr[1];
            std::shared_ptr<const kept_bytes> k;
            views.push_back(detail::keep_delivered_item(item, k));
            kept.push_back(std::move(k));
        });
        comm_options o;
        o.max_buffer_bytes = 64 << 20;
        batched_comm client(std::move(p.client), o, [](std::string_view) {});
        server.start();
        client.start();
        const std::string head = "\x93\x02\xa9ordo.item\x92\x01";  // [2, "ordo.item", [1, item]]
        const std::string bin(2 << 20, 'x');
        const std::string bin_head = "\xc6" + std::string("\x00\x20\x00\x00", 4);  // 2 MiB
        const std::string shortest = "\x92\x07" + bin_head;       // [7, bin]
        const std::string longer = std::string("\xdc\x00\x02\x07", 4) + bin_head;  // array 16
        client.send(head + shortest, bin);
        client.send(head + longer, bin);
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return views.size() == 2; }, 60s));
        ORDO_CO_ASSERT_EQ(views[0].size(), shortest.size() + bin.size());
        EXPECT_TRUE(kept[0]);
        EXPECT_EQ(std::string(views[0].substr(0, shortest.size())), shortest);
        EXPECT_EQ(views[0].find_first_not_of('x', shortest.size()), std::string_view::npos);
        EXPECT_TRUE(views[1].empty()) << "found where its shortest packing would start";
        EXPECT_FALSE(kept[1]);
        client.abort();
    });
}

// A held body that the connection did not write when it ended comes back whole, head and body,
// among the undelivered messages in order, and its owner goes.
TEST(BatchedComm, AHeldBodyNotWrittenComesBackWholeAndItsOwnerGoes) {
    run_test([]() -> net::awaitable<void> {
        auto p = co_await connect_pair("tcp");
        batched_comm server(std::move(p.server), {}, [](std::string_view) {});
        comm_options o;
        o.max_buffer_bytes = 64 << 20;
        batched_comm client(std::move(p.client), o, [](std::string_view) {});
        server.pause_reading(true);
        server.start();
        client.start();
        const std::string body(32 << 20, 'b');
        const char head[] = {char(0xc6), char(0x02), 0, 0, 0};
        struct owner final : held_body {
            bool* alive;
            explicit owner(bool* a) : alive(a) { *alive = true; }
            ~owner() override { *alive = false; }
        };
        bool alive = false;
        client.send(std::string_view(head, sizeof head), body, std::make_unique<owner>(&alive));
        client.send(seq_msg(7));
        ORDO_CO_ASSERT_TRUE(co_await wait_until([&] {
            return client.counters().write_since != std::chrono::steady_clock::time_point{};
        }));
        client.abort(errc::closed, "test");
        const close_result r = co_await client.async_wait_closed();
        EXPECT_FALSE(alive);
        // The message cut by the abort comes back whole (its peer may have its first bytes),
        // then the one behind it.
        ORDO_CO_ASSERT_EQ(r.undelivered.size(), 2u);
        EXPECT_EQ(r.undelivered[0], std::string(head, sizeof head) + body);
        EXPECT_EQ(seq_of(r.undelivered[1]), 7u);
    });
}

}  // namespace
}  // namespace ordo
