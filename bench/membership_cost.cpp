// ordo-membership-cost: what a membership change costs a router that has many replicas (issue
// 33's "CPU per membership change at 1,000 replicas"), and what a call costs it there.
//
//   ordo-membership-cost [--replicas N] [--changes K] [--calls C]
//
// One ordo::server listens on N inproc:// names (a simulation of N replicas: every connection
// is real, all in this process). A router follows a source that this program drives by hand:
// it lists all N, then K times adds one, removes one and re-weights one. For each kind it
// prints the CPU time the router took to apply the new set (process CPU time around the
// source's update, which runs the router's whole reaction: diffing the set, the hash ring
// rebuilt, replicas connecting or draining); then C calls (64 in flight, unkeyed and keyed)
// through the router, and their rate.
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "ordo/ordo.hpp"

namespace net = ordo::net;
using namespace std::chrono_literals;

namespace {

double cpu_us() {
    timespec t{};
    ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) * 1e6 + static_cast<double>(t.tv_nsec) / 1e3;
}

struct hand_source final : ordo::replica_source {
    std::function<void(std::vector<ordo::member>)> update;
    void start(std::function<void(std::vector<ordo::member>)> u,
               std::function<void(const std::string&)>) override {
        update = std::move(u);
    }
    void refresh_now() override {}
    void stop() override {}
    std::string describe() const override { return "hand"; }
    ordo::source_counters counters() const override { return {}; }
};

net::awaitable<void> wait_ready(ordo::router& r, std::size_t n) {
    net::steady_timer t(co_await net::this_coro::executor);
    for (int i = 0; i < 60'000; ++i) {
        std::size_t ready = 0;
        for (auto& rc : r.replicas()) ready += rc.state == ordo::replica_state::ready;
        if (ready == n) co_return;
        t.expires_after(1ms);
        co_await t.async_wait(net::use_awaitable);
    }
    throw std::runtime_error("replicas did not all become ready");
}

}  // namespace

int main(int argc, char** argv) {
    std::size_t replicas = 1000, changes = 20, calls = 200'000;
    CLI::App app{"CPU per membership change of a router with many replicas", "ordo-membership-cost"};
    app.add_option("--replicas", replicas, "replicas (inproc:// names on one server)");
    app.add_option("--changes", changes, "changes of each kind (add, remove, re-weight)");
    app.add_option("--calls", calls, "calls through the router afterwards");
    CLI11_PARSE(app, argc, argv);

    net::io_context io;
    ordo::server srv(io.get_executor());
    srv.on("inc", [](int x) { return x + 1; });
    std::vector<ordo::member> set;
    for (std::size_t i = 0; i < replicas + changes; ++i) {
        const std::string url = "inproc://membership-cost-" + std::to_string(i);
        srv.listen(url);
        if (i < replicas) set.push_back({url, 1, ""});
    }
    int status = 0;
    net::co_spawn(io, [&]() -> net::awaitable<void> {
        auto r = ordo::make_router(io.get_executor());
        auto owned = std::make_unique<hand_source>();
        hand_source& src = *owned;
        r->follow(std::move(owned));
        double t0 = cpu_us();
        src.update(set);
        const double first = cpu_us() - t0;
        co_await wait_ready(*r, replicas);
        std::printf("replicas %zu: first set applied in %.0f us of CPU (%.1f us a replica)\n",
                    replicas, first, first / static_cast<double>(replicas));
        double add = 0, remove = 0, reweight = 0;
        for (std::size_t k = 0; k < changes; ++k) {
            set.push_back({"inproc://membership-cost-" + std::to_string(replicas + k), 1, ""});
            t0 = cpu_us();
            src.update(set);
            add += cpu_us() - t0;
            co_await wait_ready(*r, replicas + 1);
            set.erase(set.begin());
            t0 = cpu_us();
            src.update(set);
            remove += cpu_us() - t0;
            set[k % set.size()].weight = set[k % set.size()].weight == 1 ? 2 : 1;
            t0 = cpu_us();
            src.update(set);
            reweight += cpu_us() - t0;
            co_await wait_ready(*r, replicas);
        }
        const double n = static_cast<double>(changes);
        std::printf("per change at %zu replicas, CPU: add %.0f us, remove %.0f us, re-weight %.0f us\n",
                    replicas, add / n, remove / n, reweight / n);
        // Calls through it: 64 in flight, every other one keyed.
        ordo::channel ch(r);
        std::size_t started = 0, done = 0, failed = 0;
        const auto w0 = std::chrono::steady_clock::now();
        t0 = cpu_us();
        std::function<void()> one = [&] {
            const std::size_t i = started++;
            auto cb = [&](std::error_code ec, int) {
                ++done;
                failed += ec ? 1 : 0;
                if (started < calls) one();
            };
            if (i % 2)
                ch.async_call<int>("inc", 1, ordo::key("k" + std::to_string(i % 1024)), cb);
            else
                ch.async_call<int>("inc", 1, cb);
        };
        for (int i = 0; i < 64 && started < calls; ++i) one();
        net::steady_timer t(io);
        while (done < calls) {
            t.expires_after(1ms);
            co_await t.async_wait(net::use_awaitable);
        }
        const double secs =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
        std::printf("calls through %zu replicas: %.0f calls/s, %.1f us of CPU a call, %zu failed\n",
                    replicas, static_cast<double>(calls) / secs,
                    (cpu_us() - t0) / static_cast<double>(calls), failed);
        if (failed) status = 1;
        r->close();
        co_await srv.async_stop();
    }, [&](std::exception_ptr e) {
        if (!e) return;
        try {
            std::rethrow_exception(e);
        } catch (const std::exception& x) {
            std::fprintf(stderr, "ordo-membership-cost: %s\n", x.what());
            status = 1;
        }
    });
    io.run();
    return status;
}
