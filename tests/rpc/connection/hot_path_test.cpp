// What the speed work changed (CHANGELOG.md, "First round"): completions run inline from the read
// path, the reader lets the writer start between turns of a long read, producers wait on
// async_drain, and run_spinning. Each test checks behaviour a user can see, not speed.
#include "ordo/ordo.hpp"

#include <algorithm>
#include <cstring>
#include <optional>
#include <random>
#include <thread>
#include <unordered_map>

#include <gtest/gtest.h>
#include <asio/bind_executor.hpp>
#include <asio/strand.hpp>

#include "rpc/connection/id_table.hpp"
#include "support/run_test.hpp"

namespace ordo {
namespace {

using namespace std::chrono_literals;
using test::run_test;
using test::wait_until;

// A completion handler now runs inside the read of its response; its exception must still
// leave io_context::run() (as a posted handler's would) and leave the connection up.
TEST(HotPath, AnExceptionFromACompletionHandlerLeavesRunAndTheConnectionStaysUp) {
    net::io_context io;
    server srv(io.get_executor());
    srv.on("inc", [](int x) { return x + 1; });
    channel ch;
    int second = 0;
    net::co_spawn(
        io,
        [&]() -> net::awaitable<void> {
            ch = co_await async_connect(srv.listen("tcp://127.0.0.1:0"));
            ch.async_call<int>("inc", 1, [](std::error_code, int) {
                throw std::runtime_error("thrown by the completion handler");
            });
        },
        net::detached);
    std::string thrown;
    try {
        io.run_for(20s);
    } catch (const std::runtime_error& e) {
        thrown = e.what();
    }
    EXPECT_EQ(thrown, "thrown by the completion handler");
    net::co_spawn(
        io,
        [&]() -> net::awaitable<void> {
            second = co_await ch.async_call<int>("inc", 41);
            co_await srv.async_stop();
        },
        net::detached);
    io.restart();
    io.run_for(20s);
    EXPECT_EQ(second, 42);
}

// A callback with an executor of its own (here a strand) runs there, not inline on the
// connection's loop: one bound by asio::bind_executor, and a handler type that names its
// executor (executor_type, get_executor). A plain callback runs inline, in the read.
using test_strand = net::strand<net::io_context::executor_type>;
struct strand_handler {
    using executor_type = test_strand;
    test_strand ex;
    int* out;
    executor_type get_executor() const noexcept { return ex; }
    void operator()(std::error_code ec, int v) const {
        *out = !ec && v == 2 && ex.running_in_this_thread();
    }
};

// The same, with its executor type-erased: the type alone does not tell it from the default.
struct erased_strand_handler {
    using executor_type = net::any_io_executor;
    test_strand ex;
    int* out;
    executor_type get_executor() const noexcept { return ex; }
    void operator()(std::error_code ec, int v) const {
        *out = !ec && v == 2 && ex.running_in_this_thread();
    }
};

TEST(HotPath, ACallbackWithAnExecutorOfItsOwnRunsThere) {
    net::io_context io;
    server srv(io.get_executor());
    srv.on("inc", [](int x) { return x + 1; });
    test_strand strand = net::make_strand(io.get_executor());
    int bound = -1, typed = -1, erased = -1, plain = -1;
    net::co_spawn(
        io,
        [&]() -> net::awaitable<void> {
            channel ch = co_await async_connect(srv.listen("tcp://127.0.0.1:0"));
            ch.async_call<int>("inc", 1, net::bind_executor(strand, [&](std::error_code ec, int v) {
                                   bound = !ec && v == 2 && strand.running_in_this_thread();
                               }));
            ch.async_call<int>("inc", 1, strand_handler{strand, &typed});
            ch.async_call<int>("inc", 1, erased_strand_handler{strand, &erased});
            ch.async_call<int>("inc", 2, [&](std::error_code ec, int v) {
                plain = !ec && v == 3 && !strand.running_in_this_thread();
            });
            co_await wait_until(
                [&] { return bound >= 0 && typed >= 0 && erased >= 0 && plain >= 0; }, 20s);
            co_await srv.async_stop();
        },
        net::detached);
    io.run_for(30s);
    EXPECT_EQ(bound, 1);
    EXPECT_EQ(typed, 1);
    EXPECT_EQ(erased, 1);
    EXPECT_EQ(plain, 1);
}

// The handler of the last call drops the last reference to its channel while the peer is inside
// its read loop (AddressSanitizer catches a use after free here if the peer does not keep itself
// alive across the handler).
TEST(HotPath, ACompletionHandlerMayDropTheLastReferenceToItsChannel) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        server srv(ex);
        srv.on("inc", [](int x) { return x + 1; });
        std::optional<channel> ch = co_await async_connect(srv.listen("tcp://127.0.0.1:0"));
        std::weak_ptr<channel_impl> weak = ch->impl();
        int results = 0;
        for (int i = 0; i < 10; ++i)
            ch->async_call<int>("inc", i, [&, i](std::error_code ec, int v) {
                EXPECT_FALSE(ec);
                EXPECT_EQ(v, i + 1);
                if (++results == 10) ch.reset();
            });
        EXPECT_TRUE(co_await wait_until([&] { return results == 10 && weak.expired(); }));
        EXPECT_TRUE(co_await wait_until([&] { return srv.peer_count() == 0; }));
        co_await srv.async_stop();
    });
}

// 1024 requests arrive in one read (about 20 KB). With messages_per_turn = 128 the server's
// replies leave in several writes while it works through the read; with 0 they leave together
// at its end.
// Either way they arrive complete and in order.
std::size_t server_writes_for_one_read(std::size_t messages_per_turn) {
    std::size_t writes = 0;
    run_test([&]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        server_options so;
        so.peer.comm.messages_per_turn = messages_per_turn;
        so.peer.comm.on_write = [&](const write_event&) { ++writes; };
        server srv(ex, so);
        srv.on("inc", [](int x) { return x + 1; });
        auto ch = co_await async_connect(srv.listen("tcp://127.0.0.1:0"));
        co_await ch.async_call<int>("inc", 0);
        EXPECT_TRUE(co_await wait_until([&] { return writes == 1; }));
        writes = 0;
        std::vector<int> got;
        for (int i = 0; i < 1024; ++i)  // queued together: one write from this side
            ch.async_call<int>("inc", i, [&, i](std::error_code ec, int v) {
                EXPECT_FALSE(ec);
                EXPECT_EQ(v, i + 1);
                got.push_back(i);
            });
        EXPECT_TRUE(co_await wait_until([&] { return got.size() == 1024; }));
        for (int i = 0; i < 1024; ++i) ORDO_CO_ASSERT_EQ(got[std::size_t(i)], i);
        co_await srv.async_stop();
    });
    return writes;
}

TEST(HotPath, RepliesLeaveWhileALongReadIsStillBeingProcessed) {
    EXPECT_GE(server_writes_for_one_read(128), 4u);
}

TEST(HotPath, WithoutTurnsRepliesToOneReadLeaveInOneWrite) {
    // Two, should TCP split the requests across two reads.
    EXPECT_LE(server_writes_for_one_read(0), 2u);
}

// Memory stays bounded when the remote side stops reading: notify() refuses with overloaded
// before the buffer passes max_buffer_bytes, async_drain() waits while nothing moves and
// completes once the remote side reads again; then notify() takes messages again.
TEST(HotPath, ASenderFacingAPeerThatStopsReadingIsRefusedNotGrown) {
    run_test([]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        auto l = listen(ex, "tcp://127.0.0.1:0");
        peer_options o;
        o.comm.max_buffer_bytes = 1 << 20;
        o.comm.high_water_bytes = 256 << 10;
        o.liveness_timeout = 0ms;
        auto ch = co_await async_connect(l->local_address(), o);
        auto stalled = co_await l->async_accept();  // accepted, never read (yet)
        auto p = std::dynamic_pointer_cast<peer>(ch.impl());
        const std::string kib(1024, 'x');
        // Fill until refused; the kernel's socket buffers may still take more for a while, so
        // repeat until the buffer stays above the high-water mark.
        long taken = 0;
        bool stuck = false;
        net::steady_timer pause(ex);
        for (int round = 0; round < 50 && !stuck; ++round) {
            bool refused = false;
            for (long i = 0; i < 20'000 && !refused; ++i) {  // 20 MiB: past every buffer
                try {
                    ch.notify("note", kib);
                    ++taken;
                } catch (const std::system_error& e) {
                    EXPECT_EQ(e.code(), errc::overloaded) << e.what();
                    refused = true;
                }
                if (i % 64 == 0) co_await net::post(ex, net::use_awaitable);  // the writer runs
            }
            ORDO_CO_ASSERT_TRUE(refused);
            EXPECT_LE(p->comm().peak_buffered_bytes, o.comm.max_buffer_bytes);
            pause.expires_after(100ms);
            co_await pause.async_wait(use_tuple);
            stuck = p->comm().buffered_bytes > o.comm.high_water_bytes;
        }
        ORDO_CO_ASSERT_TRUE(stuck);

        // Nothing moves: async_drain() is still waiting after 200 ms.
        bool drained = false;
        net::co_spawn(
            ex,
            [&]() -> net::awaitable<void> {
                co_await p->async_drain();
                drained = true;
            },
            net::detached);
        net::steady_timer t(ex, 200ms);
        co_await t.async_wait(use_tuple);
        EXPECT_FALSE(drained);

        // The remote side reads again: the buffer drains and notify() takes messages again.
        std::size_t read = 0;
        bool reader_done = false;
        net::co_spawn(
            ex,
            [&]() -> net::awaitable<void> {
                std::vector<char> buf(1 << 16);
                for (;;) {
                    std::error_code ec;
                    read += co_await stalled->async_read_some(net::buffer(buf), ec);
                    if (ec) break;
                }
                reader_done = true;
            },
            net::detached);
        EXPECT_TRUE(co_await wait_until([&] { return drained; }));
        EXPECT_LE(p->comm().buffered_bytes, o.comm.high_water_bytes);
        EXPECT_GT(read, 0u);
        EXPECT_GT(taken, 1000);  // at least max_buffer_bytes was taken before the refusal
        ch.notify("note", kib);
        p->abort();
        EXPECT_TRUE(co_await wait_until([&] { return reader_done; }));
    });
}

TEST(HotPath, RunSpinningRunsHandlersAndTimersAndReturnsWhenWorkRunsOut) {
    for (auto spin : {std::chrono::microseconds(0), std::chrono::microseconds(200)}) {
        net::io_context io;
        int ran = 0;
        for (int i = 0; i < 3; ++i) net::post(io, [&] { ++ran; });
        // The clock starts before the timer is armed: its expiry is measured from its
        // construction, so starting it after would let a correct run look a few us short.
        const auto start = std::chrono::steady_clock::now();
        net::steady_timer t(io, 30ms);  // longer than the spin: the loop must sleep, then wake
        t.async_wait([&](std::error_code ec) {
            if (!ec) ++ran;
        });
        EXPECT_EQ(run_spinning(io, spin), 4u);
        EXPECT_EQ(ran, 4);
        EXPECT_GE(std::chrono::steady_clock::now() - start, 30ms);
        EXPECT_TRUE(io.stopped());
    }
}

// ordo::run (compiled once, so that main() need not instantiate co_spawn) runs the coroutine and
// what it started to the end, and rethrows what it threw; coroutine calls (their untyped half
// compiled once too) keep an ordo::value result after the connection's read zone is reused.
TEST(HotPath, RunRunsACoroutineToTheEndAndRethrowsWhatItThrew) {
    bool timer_done = false;
    int got = 0;
    run([&]() -> net::awaitable<void> {
        auto ex = co_await net::this_coro::executor;
        server srv(ex);
        srv.on("inc", [](int x) { return x + 1; });
        auto ch = co_await async_connect(srv.listen("tcp://127.0.0.1:0"));
        value v = co_await ch.async_call("inc", 41);
        for (int i = 0; i < 100; ++i) EXPECT_EQ(co_await ch.async_call<int>("inc", i), i + 1);
        got = v.get().as<int>();
        co_await srv.async_stop();
        // Started here and not awaited: run() returns only once it has finished too.
        auto t = std::make_shared<net::steady_timer>(ex, 30ms);
        t->async_wait([t, &timer_done](std::error_code ec) { timer_done = !ec; });
    }());
    EXPECT_EQ(got, 42);
    EXPECT_TRUE(timer_done);
    try {
        run([]() -> net::awaitable<void> {
            server srv(co_await net::this_coro::executor);
            auto ch = co_await async_connect(srv.listen("tcp://127.0.0.1:0"));
            std::exception_ptr failed;
            try {
                co_await ch.async_call<int>("dec", 1);
            } catch (...) {
                failed = std::current_exception();
            }
            co_await srv.async_stop();  // so that only the error is left to leave run()
            if (failed) std::rethrow_exception(failed);
        }());
        ADD_FAILURE() << "run() returned";
    } catch (const rpc_error& e) {
        EXPECT_EQ(e.code(), errc::method_not_found) << e.what();
        EXPECT_EQ(e.method(), "dec");
    }
}

// The pending-call table replaced an std::unordered_map: it must agree with one under the
// patterns calls make (ids in sequence across the 2^32 wrap, answered mostly in order, some
// late, some never until the end) and give memory back when calls drain.
TEST(HotPath, TheIdTableAgreesWithAnUnorderedMapAndShrinksWhenCallsDrain) {
    detail::id_table<std::unique_ptr<int>> table;
    std::unordered_map<std::uint32_t, int> model;
    std::mt19937 rng(7);
    std::uint32_t next = 0xffff'ff00u;  // wraps after 256 ids
    std::vector<std::uint32_t> live;
    for (int step = 0; step < 200'000; ++step) {
        const unsigned r = rng() % 100;
        if (r < 52 || live.empty()) {
            const std::uint32_t id = next++;
            ASSERT_FALSE(table.contains(id));
            table.insert(id) = std::make_unique<int>(int(id));
            model[id] = int(id);
            live.push_back(id);
        } else {
            // Mostly the oldest (in-order responses), sometimes any.
            const std::size_t k = r < 90 ? 0 : rng() % live.size();
            const std::uint32_t id = live[k];
            live.erase(live.begin() + std::ptrdiff_t(k));
            auto v = table.take(id);
            ASSERT_TRUE(v && *v) << id;
            EXPECT_EQ(**v, model.at(id));
            model.erase(id);
            EXPECT_FALSE(table.take(id));
        }
        if (step % 997 == 0) {
            ASSERT_EQ(table.size(), model.size());
            for (const auto& [id, v] : model) {
                auto* found = table.find(id);
                ASSERT_TRUE(found && *found) << id;
                EXPECT_EQ(**found, v);
            }
            EXPECT_FALSE(table.contains(next));
        }
    }
    EXPECT_GT(table.capacity(), 1024u) << "the random walk should have grown the table";
    // Drain all but one long-pending call: the table shrinks back.
    while (live.size() > 1) {
        EXPECT_TRUE(table.take(live.back()));
        live.pop_back();
    }
    EXPECT_EQ(table.size(), 1u);
    EXPECT_LE(table.capacity(), 64u);
    EXPECT_TRUE(table.contains(live[0]));
    auto all = table.take_all();
    ASSERT_EQ(all.size(), 1u);
    EXPECT_EQ(all[0].first, live[0]);
    EXPECT_TRUE(table.empty());
}

// Params are packed into a buffer with inline bytes: small and large params, moved and copied,
// must hold exactly what msgpack packs.
TEST(HotPath, ParamsBufferHoldsWhatMsgpackPacksInlineOrOnTheHeap) {
    for (std::size_t n : {0u, 1u, 90u, 111u, 112u, 113u, 5000u}) {
        const std::string s(n, 'x');
        msgpack::sbuffer expected;
        msgpack::pack(expected, std::make_tuple(7, s, true));
        auto b = detail::pack_params(7, s, true);
        ASSERT_EQ(std::string_view(b.data(), b.size()),
                  std::string_view(expected.data(), expected.size()))
            << n;
        detail::params_buffer moved(std::move(b));
        EXPECT_EQ(b.size(), 0u);
        EXPECT_EQ(std::string_view(moved.data(), moved.size()),
                  std::string_view(expected.data(), expected.size()));
        auto copy = moved.copy();
        detail::params_buffer assigned;
        assigned.write("junk", 4);
        assigned = std::move(moved);
        EXPECT_EQ(std::string_view(assigned.data(), assigned.size()),
                  std::string_view(copy.data(), copy.size()));
        assigned.clear();
        EXPECT_EQ(assigned.size(), 0u);
    }
}

// copy_small copies with two fixed-width copies that may overlap: every length up to past the
// largest width, at every alignment, copies exactly its bytes and writes none beyond them.
TEST(HotPath, CopySmallCopiesEachLengthExactlyAndNothingBeyond) {
    std::string from(96, '\0');
    for (std::size_t i = 0; i < from.size(); ++i) from[i] = char('A' + i % 50);
    for (std::size_t off = 0; off < 8; ++off) {
        for (std::size_t n = 0; n <= 80; ++n) {
            std::string to(128, '#');
            detail::copy_small(to.data() + off, from.data() + off, n);
            EXPECT_EQ(to.substr(0, off), std::string(off, '#')) << n;
            EXPECT_EQ(to.substr(off, n), from.substr(off, n)) << n;
            EXPECT_EQ(to.substr(off + n), std::string(128 - off - n, '#')) << n;
        }
    }
}

// The heads built in place are the bytes the general encoder writes, for methods of every
// length around the fixstr limit and the inline bytes (long methods take the general way).
TEST(HotPath, HeadsBuiltInPlaceMatchTheGeneralEncoder) {
    for (std::size_t n = 0; n <= 70; ++n) {
        const std::string method(n, 'm');
        msgpack::sbuffer req, note;
        detail::write_request_head(req, 0x01020304u, method);
        detail::write_notification_head(note, method);
        EXPECT_EQ(std::string_view(detail::request_head(0x01020304u, method)),
                  std::string_view(req.data(), req.size()))
            << n;
        EXPECT_EQ(std::string_view(detail::notification_head(method)),
                  std::string_view(note.data(), note.size()))
            << n;
    }
}

// Pending calls are made and freed once per call; their memory is kept on the thread for the
// next call (detail::recycled_new). Under AddressSanitizer nothing is kept, so that a use after
// free is still reported: there the reuse is not checked, only that blocks are good.
#if defined(__SANITIZE_ADDRESS__)  // GCC's name
constexpr bool recycling = false;
#elif defined(__has_feature)  // clang's
constexpr bool recycling = !__has_feature(address_sanitizer);
#else
constexpr bool recycling = true;
#endif

TEST(HotPath, APendingCallsMemoryIsReusedForTheNextCallOfTheThread) {
    struct call final : detail::pending_call {
        void complete(std::error_code, call_outcome) override {}
        char payload[40] = {};
    };
    void* first = nullptr;
    {
        auto c = std::make_unique<call>();
        c->method = "inc";
        first = c.get();
    }
    auto again = std::make_unique<call>();
    if (recycling) {
        EXPECT_EQ(static_cast<void*>(again.get()), first);
    }
    EXPECT_TRUE(again->method.empty());  // constructed anew: nothing of the old call is seen
    // Another thread has a cache of its own: the block freed here is not handed out there.
    void* there = nullptr;
    std::thread([&] {
        auto c = std::make_unique<call>();
        there = c.get();
    }).join();
    EXPECT_NE(there, static_cast<void*>(again.get()));
}

TEST(HotPath, RecycledBlocksAreDistinctWritableAndBoundedPerSizeClass) {
    // A block is kept by size class (64 bytes wide), not handed back to malloc: one freed at 10
    // bytes serves 60 (malloc would place those in different bins).
    void* small = detail::recycled_new(10);
    detail::recycled_delete(small, 10);
    void* larger = detail::recycled_new(60);
    std::memset(larger, 1, 60);
    if (recycling) {
        EXPECT_EQ(larger, small);
    }
    detail::recycled_delete(larger, 60);
    // More blocks than a size class keeps (128), in sizes across the classes and beyond them.
    for (std::size_t size : {1, 24, 64, 65, 200, 512, 513, 4096}) {
        std::vector<unsigned char*> blocks;
        for (int i = 0; i < 300; ++i) {
            auto* p = static_cast<unsigned char*>(detail::recycled_new(size));
            std::memset(p, i & 0xff, size);
            blocks.push_back(p);
        }
        std::sort(blocks.begin(), blocks.end());
        EXPECT_EQ(std::adjacent_find(blocks.begin(), blocks.end()), blocks.end()) << size;
        // Taking 300 emptied this thread's cache of the class: of the 300 given back in this
        // order, it keeps the first 128 and returns the rest to the heap.
        for (auto* p : blocks) detail::recycled_delete(p, size);
        // Taken again: each still distinct, and each holds what is written to it.
        std::vector<unsigned char*> again;
        for (int i = 0; i < 300; ++i) {
            auto* p = static_cast<unsigned char*>(detail::recycled_new(size));
            std::memset(p, 0x5a, size);
            again.push_back(p);
        }
        if (recycling && size <= 512) {
            // The first 128 taken are exactly the 128 kept: no more (the last ones given back
            // would come first) and no fewer (a block from the heap cannot be one of them).
            std::vector<unsigned char*> first(again.begin(), again.begin() + 128);
            std::vector<unsigned char*> kept(blocks.begin(), blocks.begin() + 128);
            std::sort(first.begin(), first.end());
            EXPECT_EQ(first, kept) << size;
        }
        for (auto* p : again) EXPECT_EQ(p[size - 1], 0x5a);
        std::sort(again.begin(), again.end());
        EXPECT_EQ(std::adjacent_find(again.begin(), again.end()), again.end()) << size;
        std::size_t reused = 0;
        for (auto* p : again) reused += std::binary_search(blocks.begin(), blocks.end(), p);
        if (recycling && size <= 512) {
            EXPECT_GE(reused, 128u) << size;
        }
        for (auto* p : again) detail::recycled_delete(p, size);
    }
}

}  // namespace
}  // namespace ordo
