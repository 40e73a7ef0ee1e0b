// resume-latency: how long a resumable session takes from a dropped connection to its next
// response (bench/README.md, "Resumable sessions").
//
//   ordo-resume-latency [--cuts N] [--resume-ms N] [--threads N] [--send-cost N]
//
// One process: a server, a client making sequential echo calls with resume_ms, and between them
// a userspace proxy (tests/support/cutting_proxy.hpp) that resets the connection every 20-40 ms.
// For each cut it records the time from the reset to the first response carried by the new
// connection (the session's resume count has grown), and prints p50, p90, p99 and the maximum.
// --threads N: the server serves on N loops (server_options::threads), the client on the first;
// with more than one, each new connection lands on another loop than the session's and moves
// there (the summary line counts those moves). --send-cost N then times N notify() calls while
// connected and N with the connection cut and not yet resumed (kept for the resume), and checks
// that the server counted every one after the resume.
// Every reply is checked; a wrong one, or a call that fails, fails the run (exit status 1), as
// does a usage error (--help lists the flags).
#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <atomic>

#include "cli.hpp"
#include "ordo/ordo.hpp"
#include "support/cutting_proxy.hpp"

namespace {

using clock_type = std::chrono::steady_clock;

[[noreturn]] void fail(const std::string& why) {
    std::fprintf(stderr, "error: %s\n", why.c_str());
    std::exit(1);
}

struct config {
    long cuts = 200;
    long resume_ms = 10'000;
    long threads = 1;
    long send_cost = 0;  // notifications per phase of the send-cost measurement (0: none)
};

double percentile(std::vector<double> v, double p) {
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size())))];
}

}  // namespace

int main(int argc, char** argv) {
    config cfg;
    CLI::App app{"From a dropped connection to the next response (resumable sessions).",
                 "ordo-resume-latency"};
    ordo_cli::use_defaults(app);
    app.add_option("--cuts", cfg.cuts, "connections to cut")->check(ordo_cli::at_least(1));
    app.add_option("--resume-ms", cfg.resume_ms, "the client's resume_ms")
        ->check(ordo_cli::at_least(1));
    app.add_option("--threads", cfg.threads, "the server's event loops")
        ->check(ordo_cli::at_least(1));
    app.add_option("--send-cost", cfg.send_cost,
                   "then time this many notify() calls while connected, and as many with the "
                   "connection cut and not yet resumed (ns per message each)")
        ->check(ordo_cli::at_least(0));
    if (const auto status = ordo_cli::parse(app, argc, argv, 1)) return *status;
    ordo::net::io_context io;
    ordo::server_options so;
    so.threads = static_cast<std::size_t>(cfg.threads);
    ordo::server srv(io.get_executor(), so);
    srv.on("echo", [](std::uint64_t i) { return i; });
    std::atomic<std::uint64_t> notes{0};
    srv.on("note", [&notes](std::uint64_t) { ++notes; });
    const std::string url = srv.listen("tcp://127.0.0.1:0");
    ordo::test::cutting_proxy proxy(
        "127.0.0.1", static_cast<std::uint16_t>(std::stoi(url.substr(url.rfind(':') + 1))));

    std::vector<double> ms;
    double connected_ns = 0, detached_ns = 0;
    std::string error;
    std::uint64_t moved = 0;
    auto body = [&]() -> ordo::net::awaitable<void> {
        auto c = co_await ordo::async_connect(proxy.url() +
                                              "?resume_ms=" + std::to_string(cfg.resume_ms));
        auto p = std::dynamic_pointer_cast<ordo::peer>(c.impl());
        std::minstd_rand rng(7);
        std::uint64_t i = 0;
        for (long cut = 0; cut < cfg.cuts; ++cut) {
            // Calls for 20-40 ms, then a cut, then calls until one is answered over the new
            // connection.
            const auto until = clock_type::now() + std::chrono::milliseconds(20 + rng() % 21);
            while (clock_type::now() < until) {
                if (co_await c.async_call<std::uint64_t>("echo", i) != i) fail("wrong reply");
                ++i;
            }
            const auto resumes = p->counters().resumes;
            const auto at = clock_type::now();
            proxy.cut_all();
            for (int tries = 0;; ++tries) {
                if (co_await c.async_call<std::uint64_t>("echo", i) != i) fail("wrong reply");
                ++i;
                if (p->counters().resumes > resumes) break;
                if (tries > 1'000'000) fail("no resume after a cut");
            }
            ms.push_back(std::chrono::duration<double, std::milli>(clock_type::now() - at).count());
        }
        moved = srv.stats().sessions_moved;
        if (cfg.send_cost > 0) {
            // notify() in chunks of 10,000, timing the loops only: connected (each chunk
            // drained before the next), then cut and refused, so that every message waits for
            // the resume in the resend buffer.
            auto timed = [&](long n, bool drain) -> ordo::net::awaitable<double> {
                double ns = 0;
                for (long sent = 0; sent < n;) {
                    const long chunk = std::min(10'000L, n - sent);
                    const auto t0 = clock_type::now();
                    for (long k = 0; k < chunk; ++k) c.notify("note", i++);
                    ns += std::chrono::duration<double, std::nano>(clock_type::now() - t0).count();
                    sent += chunk;
                    if (drain) co_await p->async_drain();
                }
                co_return ns / static_cast<double>(n);
            };
            (void)co_await timed(cfg.send_cost, true);  // warm
            connected_ns = co_await timed(cfg.send_cost, true);
            proxy.set_refusing(true);
            proxy.cut_all();
            // The first send after the reset meets it; the rest are only kept.
            c.notify("note", i++);
            const auto resumes = p->counters().resumes;
            detached_ns = co_await timed(cfg.send_cost, false);
            proxy.set_refusing(false);
            co_await p->async_drain();
            if (co_await c.async_call<std::uint64_t>("echo", i) != i) fail("wrong reply");
            if (p->counters().resumes != resumes + 1) fail("the session did not resume once");
            if (notes != 3 * static_cast<std::uint64_t>(cfg.send_cost) + 1)
                fail("the server counted " + std::to_string(notes.load()) + " notifications");
        }
        co_await srv.async_stop();
    };
    ordo::net::co_spawn(io, body(), [&](std::exception_ptr e) {
        if (!e) return;
        try {
            std::rethrow_exception(e);
        } catch (const std::exception& x) {
            error = x.what();
        }
    });
    io.run();
    if (!error.empty()) fail(error);
    std::printf(
        "resume latency over %zu cuts (tcp loopback, through a proxy): p50 %.2f ms, p90 %.2f ms, "
        "p99 %.2f ms, max %.2f ms; server on %ld loops, %llu connections moved to their "
        "session's loop\n",
        ms.size(), percentile(ms, 0.5), percentile(ms, 0.9), percentile(ms, 0.99),
        *std::max_element(ms.begin(), ms.end()), cfg.threads,
        static_cast<unsigned long long>(moved));
    if (cfg.send_cost > 0)
        std::printf(
            "notify() over a resumable session, %ld messages each: connected %.0f ns a "
            "message, cut and not yet resumed %.0f ns (%.2fx)\n",
            cfg.send_cost, connected_ns, detached_ns, detached_ns / connected_ns);
    return 0;
}
