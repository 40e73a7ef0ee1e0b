// ordo-hedge-bench: one slow replica among three, with and without hedged calls
// (router_options::hedge): the calls' p50/p99 and how many more calls the replicas served.
//
//   ordo-hedge-bench [--hedge none|p95|MS] [--calls 20000] [--in-flight 1] [--stall-ms 50]
//                    [--stall-share 0.05] [--warmup 2000] [--json]
//
// Three in-process ordo servers (one event loop, their own thread) serve "work" (a coroutine
// that answers at once); the first of them stalls --stall-ms on a --stall-share of its calls,
// drawn at random (as a replica with a garbage collector, a noisy neighbour or a slow disk
// would). A router (least loaded, "work" idempotent) sends --calls calls, --in-flight at a
// time, after --warmup calls that are not measured (they teach the router the p95). Extra calls
// are the calls the replicas ran beyond the calls made: the hedges that went out.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <future>
#include <memory>
#include <random>
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
    std::string hedge = "none";
    long calls = 20'000, warmup = 2'000;
    int in_flight = 1;
    long stall_ms = 50;
    double stall_share = 0.05;
    bool json = false;
};

// Keeps `in_flight` calls going until `total` have been made; records each one's latency.
net::awaitable<void> drive(ordo::channel ch, long total, int in_flight,
                           std::vector<double>& latencies_ms, long& failed) {
    long made = 0, done = 0;
    auto ex = co_await net::this_coro::executor;
    net::steady_timer idle(ex, clock_type::time_point::max());
    std::function<void()> one = [&] {
        if (made == total) return;
        ++made;
        const auto t0 = clock_type::now();
        ch.async_call<int>("work", 0, [&, t0](std::error_code ec, int) {
            latencies_ms.push_back(
                std::chrono::duration<double, std::milli>(clock_type::now() - t0).count());
            if (ec) ++failed;
            if (++done == total) idle.cancel();
            one();
        });
    };
    for (int i = 0; i < in_flight; ++i) one();
    auto [ec] = co_await idle.async_wait(ordo::use_tuple);
    (void)ec;
}

double percentile(std::vector<double> v, double q) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, static_cast<std::size_t>(q * static_cast<double>(v.size())))];
}

}  // namespace

int main(int argc, char** argv) {
    settings st;
    CLI::App app{"One slow replica of three, with and without hedged calls", "ordo-hedge-bench"};
    app.add_option("--hedge", st.hedge, "none, p95, or a delay in ms")->capture_default_str();
    app.add_option("--calls", st.calls, "calls measured")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    app.add_option("--warmup", st.warmup, "calls made first, not measured")
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber);
    app.add_option("--in-flight", st.in_flight, "calls at a time")
        ->capture_default_str()
        ->check(CLI::Range(1, 1024));
    app.add_option("--stall-ms", st.stall_ms, "the slow replica's stall")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    app.add_option("--stall-share", st.stall_share, "the share of its calls that stall")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 1.0));
    app.add_flag("--json", st.json, "print one JSON line");
    CLI11_PARSE(app, argc, argv);
    ordo::hedge_policy policy;
    if (st.hedge == "p95") {
        policy.p95 = true;
    } else if (st.hedge != "none") {
        try {
            policy.after = std::chrono::milliseconds(std::stol(st.hedge));
        } catch (const std::exception&) {
            std::fprintf(stderr, "ordo-hedge-bench: --hedge takes none, p95 or a number\n");
            return 2;
        }
    }

    ordo_bench::replica_loop replicas;
    std::vector<std::string> urls;
    std::atomic<long> ran{0};
    std::minstd_rand rng(42);  // the replicas' thread only
    for (int i = 0; i < 3; ++i) {
        auto& s = replicas.add();
        const bool slow = i == 0;
        ordo::handler_options concurrent;
        concurrent.concurrent = true;
        s.on(
            "work",
            [&, slow](int v) -> net::awaitable<int> {
                ran.fetch_add(1, std::memory_order_relaxed);
                if (slow && std::uniform_real_distribution<double>(0, 1)(rng) < st.stall_share) {
                    net::steady_timer t(co_await net::this_coro::executor,
                                        std::chrono::milliseconds(st.stall_ms));
                    co_await t.async_wait(ordo::use_tuple);  // a hedge's loser is cancelled
                }
                co_return v;
            },
            concurrent);
        urls.push_back(s.listen("tcp://127.0.0.1:0"));
    }
    replicas.start();

    net::io_context io;
    std::vector<double> latencies;
    long failed = 0, ran_measured = 0;
    ordo::router_counters rc;
    std::exception_ptr error;
    net::co_spawn(
        io,
        [&]() -> net::awaitable<void> {
            ordo::router_options o;
            o.idempotent_methods = {"work"};
            o.hedge = policy;
            o.aperture = false;  // every replica, the slow one included
            auto rt = ordo::make_router(co_await net::this_coro::executor, o);
            for (auto& u : urls) co_await rt->async_add_replica(u);
            std::vector<double> warm;
            long warm_failed = 0;
            co_await drive(ordo::channel(rt), st.warmup, st.in_flight, warm, warm_failed);
            const auto before = rt->counters();
            const long ran_before = ran.load();
            co_await drive(ordo::channel(rt), st.calls, st.in_flight, latencies, failed);
            // Losers still running on the slow replica end within its stall.
            net::steady_timer settle(co_await net::this_coro::executor,
                                     std::chrono::milliseconds(st.stall_ms * 2));
            co_await settle.async_wait(ordo::use_tuple);
            ran_measured = ran.load() - ran_before;
            rc = rt->counters();
            rc.hedged -= before.hedged;
            rc.hedge_wins -= before.hedge_wins;
            rc.over_budget -= before.over_budget;
            rt->close();
        },
        [&](std::exception_ptr e) { error = e; });
    io.run();
    replicas.stop();
    if (error) return ordo_bench::report_failure("ordo-hedge-bench", error);
    const double p50 = percentile(latencies, 0.50), p99 = percentile(latencies, 0.99);
    const long stalled = std::count_if(latencies.begin(), latencies.end(),
                                       [&](double ms) { return ms >= double(st.stall_ms) / 2; });
    const double extra = 100.0 * double(ran_measured - st.calls) / double(st.calls);
    if (st.json) {
        std::printf(
            "{\"hedge\":\"%s\",\"calls\":%ld,\"failed\":%ld,\"p50_ms\":%.3f,\"p99_ms\":%.3f,"
            "\"stalled\":%ld,\"extra_percent\":%.2f,\"hedged\":%llu,\"hedge_wins\":%llu,"
            "\"over_budget\":%llu}\n",
            st.hedge.c_str(), st.calls, failed, p50, p99, stalled, extra,
            static_cast<unsigned long long>(rc.hedged),
            static_cast<unsigned long long>(rc.hedge_wins),
            static_cast<unsigned long long>(rc.over_budget));
    } else {
        std::printf(
            "hedge %s: %ld calls, %ld failed: p50 %.3f ms, p99 %.3f ms, %ld took half the "
            "stall or more; extra calls %.2f%% (%llu hedges, %llu won, %llu over budget)\n",
            st.hedge.c_str(), st.calls, failed, p50, p99, stalled, extra,
            static_cast<unsigned long long>(rc.hedged),
            static_cast<unsigned long long>(rc.hedge_wins),
            static_cast<unsigned long long>(rc.over_budget));
    }
    return failed == 0 ? 0 : 1;
}
