// ordo-deadline-bench: a router under overload with mixed deadlines, earliest deadline first
// against FIFO (router_options::queue): the share of calls that finish within their deadline.
//
//   ordo-deadline-bench [--queue edf|fifo] [--seconds 5] [--rate 2000] [--tight-ms 20]
//                       [--relaxed-ms 1000] [--tight-share 0.5] [--work-ms 2] [--replicas 3]
//                       [--on-ms 0 --off-ms 0] [--json]
//
// --replicas in-process ordo servers (one event loop, their own thread) each serve "work"
// (sleeps --work-ms, one call at a time: a serial handler); the router (max_concurrent 1, so
// every waiting call waits in its queue) sends them calls from an open loop at --rate calls/s
// for --seconds: a --tight-share of them with a --tight-ms deadline, the rest with --relaxed-ms.
// Capacity is replicas / work-ms (1,500 calls/s by default): the default rate overloads it by a
// third. A call counts as finished within its deadline when it returned its result (a call past
// its deadline fails timed_out, in the queue or on a replica). Every call is accounted for;
// the run fails if one is not finished within relaxed-ms + 10 s after the last was made.
// With --on-ms and --off-ms the load comes in bursts: calls at --rate for on-ms, then none for
// off-ms (the average is rate x on / (on + off)).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <ordo/ordo.hpp>

#include "replica_loop.hpp"

namespace net = ordo::net;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {

struct settings {
    std::string queue = "edf";
    double seconds = 5;
    double rate = 2000;
    long tight_ms = 20, relaxed_ms = 1000, work_ms = 2;
    double tight_share = 0.5;
    int replicas = 3;
    long on_ms = 0, off_ms = 0;  // bursts: calls only during on_ms of every on_ms + off_ms
    bool json = false;
};

struct tally {
    long made[2] = {0, 0}, ok[2] = {0, 0}, timed_out[2] = {0, 0}, other[2] = {0, 0};
    long late_ok = 0;  // returned a result, but its completion ran 5 ms or more past its deadline
    long finished() const { return ok[0] + ok[1] + timed_out[0] + timed_out[1] + other[0] + other[1]; }
};

net::awaitable<void> drive(const settings& st, ordo::channel ch, tally& t) {
    auto ex = co_await net::this_coro::executor;
    net::steady_timer tick(ex);
    const auto start = clock_type::now();
    const auto end = start + std::chrono::duration_cast<clock_type::duration>(
                                 std::chrono::duration<double>(st.seconds));
    long made = 0;
    double tight_credit = 0;
    // Seconds of "on" time elapsed: with bursts, the rate applies only while on.
    auto on_time = [&](double elapsed) {
        if (st.on_ms <= 0 || st.off_ms <= 0) return elapsed;
        const double period = double(st.on_ms + st.off_ms) / 1000, on = double(st.on_ms) / 1000;
        const double whole = std::floor(elapsed / period);
        return whole * on + std::min(on, elapsed - whole * period);
    };
    while (clock_type::now() < end) {
        const double elapsed = std::chrono::duration<double>(clock_type::now() - start).count();
        const long due = static_cast<long>(on_time(elapsed) * st.rate);
        for (; made < due; ++made) {
            // Tight and relaxed calls interleaved evenly (tight_share of them tight).
            tight_credit += st.tight_share;
            const int cls = tight_credit >= 1 ? 0 : 1;
            if (cls == 0) tight_credit -= 1;
            const auto deadline = std::chrono::milliseconds(cls == 0 ? st.tight_ms : st.relaxed_ms);
            ordo::call_options o;
            o.timeout = deadline;
            ++t.made[cls];
            const auto sent = clock_type::now();
            ch.async_call<int>("work", static_cast<int>(st.work_ms), o,
                               [&t, cls, sent, deadline](std::error_code ec, int) {
                                   if (!ec) {
                                       ++t.ok[cls];
                                       if (clock_type::now() - sent > deadline + 5ms) ++t.late_ok;
                                   } else if (ec == ordo::errc::timed_out) {
                                       ++t.timed_out[cls];
                                   } else {
                                       ++t.other[cls];
                                   }
                               });
        }
        tick.expires_after(1ms);
        co_await tick.async_wait(net::use_awaitable);
    }
    const auto until = clock_type::now() + std::chrono::milliseconds(st.relaxed_ms) + 10s;
    while (t.finished() < made && clock_type::now() < until) {
        tick.expires_after(5ms);
        co_await tick.async_wait(net::use_awaitable);
    }
}

}  // namespace

int main(int argc, char** argv) {
    settings st;
    CLI::App app{"A router under overload with mixed deadlines: EDF against FIFO",
                 "ordo-deadline-bench"};
    app.add_option("--queue", st.queue, "the router's queue order")
        ->check(CLI::IsMember({"edf", "fifo"}))
        ->capture_default_str();
    app.add_option("--seconds", st.seconds, "how long calls are made")->capture_default_str()
        ->check(CLI::PositiveNumber);
    app.add_option("--rate", st.rate, "calls per second offered")->capture_default_str()
        ->check(CLI::PositiveNumber);
    app.add_option("--tight-ms", st.tight_ms, "deadline of tight calls")->capture_default_str()
        ->check(CLI::PositiveNumber);
    app.add_option("--relaxed-ms", st.relaxed_ms, "deadline of relaxed calls")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    app.add_option("--tight-share", st.tight_share, "fraction of calls that are tight")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 1.0));
    app.add_option("--work-ms", st.work_ms, "each call's time on a replica")->capture_default_str()
        ->check(CLI::PositiveNumber);
    app.add_option("--replicas", st.replicas, "in-process replicas")->capture_default_str()
        ->check(CLI::Range(1, 64));
    app.add_option("--on-ms", st.on_ms, "bursts: calls are made for this long (at --rate)...")
        ->check(CLI::NonNegativeNumber);
    app.add_option("--off-ms", st.off_ms, "...then none for this long (0: steady)")
        ->check(CLI::NonNegativeNumber);
    app.add_flag("--json", st.json, "print one JSON line");
    CLI11_PARSE(app, argc, argv);

    ordo_bench::replica_loop replicas;
    std::vector<std::string> urls;
    for (int i = 0; i < st.replicas; ++i) {
        auto& s = replicas.add();
        s.on("work", [](int ms) -> net::awaitable<int> {
            net::steady_timer t(co_await net::this_coro::executor, std::chrono::milliseconds(ms));
            co_await t.async_wait(net::use_awaitable);
            co_return ms;
        });
        urls.push_back(s.listen("tcp://127.0.0.1:0"));
    }
    replicas.start();

    net::io_context io;
    tally t;
    ordo::router_counters rc;
    std::exception_ptr failed;
    net::co_spawn(
        io,
        [&]() -> net::awaitable<void> {
            ordo::router_options o;
            o.max_concurrent = 1;
            o.queue = st.queue == "fifo" ? ordo::queue_order::fifo
                                         : ordo::queue_order::earliest_deadline;
            auto rt = ordo::make_router(co_await net::this_coro::executor, o);
            for (auto& u : urls) co_await rt->async_add_replica(u);
            co_await drive(st, ordo::channel(rt), t);
            rc = rt->counters();
            rt->close();
        },
        [&](std::exception_ptr e) { failed = e; });
    io.run();
    replicas.stop();
    if (failed) return ordo_bench::report_failure("ordo-deadline-bench", failed);
    const long made = t.made[0] + t.made[1];
    if (t.finished() != made) {
        std::fprintf(stderr, "ordo-deadline-bench: %ld of %ld calls never finished\n",
                     made - t.finished(), made);
        return 1;
    }
    const double share = made ? double(t.ok[0] + t.ok[1]) / double(made) : 0;
    const double capacity = st.replicas * 1000.0 / double(st.work_ms);
    if (st.json) {
        std::printf("{\"queue\":\"%s\",\"rate\":%.0f,\"capacity\":%.0f,\"made\":%ld,\"ok\":%ld,"
                    "\"share\":%.4f,\"tight_ok\":%ld,\"tight\":%ld,\"relaxed_ok\":%ld,"
                    "\"relaxed\":%ld,\"expired_in_queue\":%llu,\"late_ok\":%ld,\"other\":%ld}\n",
                    st.queue.c_str(), st.rate, capacity, made, t.ok[0] + t.ok[1], share, t.ok[0],
                    t.made[0], t.ok[1], t.made[1],
                    static_cast<unsigned long long>(rc.expired_in_queue), t.late_ok,
                    t.other[0] + t.other[1]);
    } else {
        std::printf("queue %s: %ld calls at %.0f/s%s (capacity %.0f/s): %.1f%% within deadline "
                    "(tight %ld/%ld, relaxed %ld/%ld); %llu expired in the queue, %ld timed out "
                    "on a replica, %ld other errors\n",
                    st.queue.c_str(), made, st.rate,
                    st.on_ms > 0 && st.off_ms > 0
                        ? (" in bursts of " + std::to_string(st.on_ms) + " ms every " +
                           std::to_string(st.on_ms + st.off_ms) + " ms").c_str()
                        : "",
                    capacity, 100 * share, t.ok[0], t.made[0],
                    t.ok[1], t.made[1], static_cast<unsigned long long>(rc.expired_in_queue),
                    t.timed_out[0] + t.timed_out[1] - static_cast<long>(rc.expired_in_queue),
                    t.other[0] + t.other[1]);
    }
    // late_ok is a figure, not a failure: a response read before its deadline's timer ran
    // completes its call however late the machine runs the completion (docs/protocol.md,
    // "Calls"), and on a busy machine that can be milliseconds after the deadline.
    return 0;
}
