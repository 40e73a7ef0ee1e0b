// Every guarantee with every other: {plain, resume_ms} x {1, 2, 4 loops} x {tcp, tls}, each
// case sending notifications, unary calls, streams, batched calls and streaming batches at once,
// served by ordo-inc-server's handlers (examples/inc_handlers.hpp). Where the session resumes,
// its connections go through a proxy that resets them at random byte offsets
// (tests/support/cutting_proxy.hpp), and with several loops the caller comes back on another
// loop than its session's. Every call completes exactly once, with the right answer; every
// notification arrives once and in order; every stream delivers its items in order, then ends.
// Also run under ThreadSanitizer by .ci/run (ORDO_MATRIX_SCALE=0.2).
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <tuple>

#include <gtest/gtest.h>

#include "counter.hpp"
#include "inc_handlers.hpp"
#include "ordo/ordo.hpp"
#include "support/cutting_proxy.hpp"
#include "support/numbers.hpp"
#include "support/run_test.hpp"
#include "support/streams.hpp"

namespace ordo {
namespace {

using namespace std::chrono_literals;
using test::iota;
using test::run_test;
using test::wait_until;

double scale() {
    const char* s = std::getenv("ORDO_MATRIX_SCALE");
    return s ? std::atof(s) : 1.0;
}

// Notifications "note" must arrive as 0, 1, 2... on whichever loop the session lives.
struct note_checker {
    std::atomic<std::uint64_t> next{0};
    std::mutex m;
    std::optional<std::string> broken;
    void on(std::uint64_t i) {
        if (next.exchange(i + 1) == i) return;
        std::lock_guard l(m);
        if (!broken) broken = "note " + std::to_string(i) + " out of order";
    }
};

net::awaitable<std::vector<int>> read_all(stream<int>& s) {
    std::vector<int> v;
    while (auto x = co_await s.next()) v.push_back(*x);
    co_return v;
}

using matrix_case = std::tuple<std::string, std::size_t, bool>;  // scheme, loops, resume

class Matrix : public ::testing::TestWithParam<matrix_case> {};

TEST_P(Matrix, EveryKindOfCallCompletesOnceAndInOrder) {
    const auto [scheme, loops, resume] = GetParam();
    run_test(
        [&, scheme = scheme, loops = loops, resume = resume]() -> net::awaitable<void> {
            auto ex = co_await net::this_coro::executor;
            server_options so;
            so.threads = loops;
            server srv(ex, so);
            long total = 0;
            serve_counter(srv, total);
            note_checker notes;
            srv.on("note", [&](std::uint64_t i) { notes.on(i); });
            srv.on("echo_u", [](std::uint64_t i) { return i; });
            const std::string bound = srv.listen(test::listen_url(scheme));
            std::optional<test::cutting_proxy> proxy;
            std::string url = test::connect_url(bound);
            if (resume) {
                test::cut_options co;
                co.seed = 20261124 + static_cast<unsigned>(loops);
                co.min_bytes = 3'000;
                co.max_bytes = 30'000;
                proxy.emplace("127.0.0.1",
                              static_cast<std::uint16_t>(std::stoi(bound.substr(bound.rfind(':') + 1))),
                              co);
                url = test::connect_url(scheme + "://127.0.0.1:" + std::to_string(proxy->port()));
                url += (url.find('?') == std::string::npos ? "?" : "&") +
                       std::string("resume_ms=20000");
            }
            auto ch = co_await async_connect(url);
            auto p = std::dynamic_pointer_cast<peer>(ch.impl());
            ORDO_CO_ASSERT_TRUE(p);
            auto c = stub<counter>(ch);
            const int rounds = std::max(2, static_cast<int>(150 * scale()));
            std::uint64_t sent_notes = 0, calls = 0, done = 0, wrong = 0;
            std::string first_wrong;
            auto check = [&](std::uint64_t want) {
                return [&, want](std::error_code e, std::uint64_t r) {
                    if ((e || r != want) && wrong++ == 0)
                        first_wrong = e ? e.message() : "answer " + std::to_string(r);
                    ++done;
                };
            };
            for (int round = 0; round < rounds; ++round) {
                for (int i = 0; i < 100; ++i) ch.notify("note", sent_notes++);
                for (int i = 0; i < 40; ++i, ++calls) ch.async_call<std::uint64_t>("echo_u", calls, check(calls));
                for (int i = 0; i < 8; ++i, ++calls) {
                    const int x = round * 8 + i;
                    ch.async_call<std::uint64_t>("square_batch", x,
                                                 check(static_cast<std::uint64_t>(x * x)));
                }
                auto s = co_await c.count_to(40);
                EXPECT_EQ(co_await read_all(s), iota(40)) << "round " << round;
                auto b = co_await c.count_batch(10);
                EXPECT_EQ(co_await read_all(b), iota(10)) << "round " << round;
                ORDO_CO_ASSERT_TRUE(co_await wait_until([&] { return done == calls; }, 60s));
            }
            EXPECT_EQ(wrong, 0u) << first_wrong;
            EXPECT_EQ(co_await ch.async_call<std::uint64_t>("echo_u", 7), 7u);
            EXPECT_EQ(notes.next.load(), sent_notes);
            {
                std::lock_guard l(notes.m);
                EXPECT_FALSE(notes.broken) << *notes.broken;
            }
            EXPECT_TRUE(p->is_open());
            if (resume) {
                EXPECT_TRUE(p->is_resumable());
                EXPECT_GE(proxy->cuts(), 1u);
                EXPECT_EQ(p->counters().resumes, proxy->cuts());
                if (loops > 1) {
                    EXPECT_GE(srv.stats().sessions_moved, 1u);
                }
                std::printf("%s, %zu loops: %zu cuts, %llu moved to their session's loop\n",
                            scheme.c_str(), loops, proxy->cuts(),
                            static_cast<unsigned long long>(srv.stats().sessions_moved));
            } else {
                EXPECT_FALSE(p->is_resumable());
            }
            co_await srv.async_stop();
        },
        240s);
}

INSTANTIATE_TEST_SUITE_P(
    Combinations, Matrix,
    ::testing::Combine(::testing::Values(std::string("tcp"), std::string("tls")),
                       ::testing::Values(std::size_t{1}, std::size_t{2}, std::size_t{4}),
                       ::testing::Bool()),
    [](const auto& info) {
        return std::get<0>(info.param) + "_" + std::to_string(std::get<1>(info.param)) + "loops_" +
               (std::get<2>(info.param) ? "resume" : "plain");
    });

}  // namespace
}  // namespace ordo
