// resume-check: a resumable session to an ordo-inc-server (any --threads) through a proxy that
// resets the connection at random byte offsets; every message is accounted for (bench/README.md,
// "Resumable sessions on every loop").
//
//   ordo-resume-check --connect URL [--one-way N] [--calls N] [--notes N] [--inflight K]
//                     [--resume-ms N] [--seed S]
//
// Between this client and URL (tcp://) runs a userspace proxy (tests/support/cutting_proxy.hpp)
// that cuts each connection after 20-400 KB forwarded. Over one channel with resume_ms:
// 1. --one-way add(1) notifications, in chunks of 10,000, each chunk followed by a total() call
//    that must return exactly the number sent so far (a notification lost, repeated, or overtaken
//    by the call after it changes the figure);
// 2. --calls pipelined inc(i) calls (--inflight in flight), each answer checked (i + 1), with
//    --notes add(1) notifications spread among them and total() checked after every 1,000 calls.
// The server's total must start at 0 (a fresh ordo-inc-server, this client alone). Prints one
// line with the counts, the cuts and resumes, and exits 0; a wrong or failed answer prints
// "error: ..." and exits 1.
#include <cstdio>
#include <string>

#include "cli.hpp"
#include "counter.hpp"
#include "ordo/ordo.hpp"
#include "support/cutting_proxy.hpp"

namespace {

namespace net = ordo::net;
using clock_type = std::chrono::steady_clock;

struct config {
    std::string url;
    long one_way = 3'000'000;
    long calls = 300'000;
    long notes = 100'000;
    long inflight = 256;
    long resume_ms = 10'000;
    long seed = 1;
};

[[noreturn]] void fail(const std::string& why) {
    std::fprintf(stderr, "error: %s\n", why.c_str());
    std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
    config cfg;
    CLI::App app{"A resumable session through a cutting proxy, every message checked.",
                 "ordo-resume-check"};
    ordo_cli::use_defaults(app);
    app.add_option("--connect", cfg.url, "the server (tcp://host:port)")->required();
    app.add_option("--one-way", cfg.one_way, "add(1) notifications of phase 1")
        ->check(ordo_cli::at_least(0));
    app.add_option("--calls", cfg.calls, "pipelined inc calls of phase 2")
        ->check(ordo_cli::at_least(0));
    app.add_option("--notes", cfg.notes, "add(1) notifications among the calls")
        ->check(ordo_cli::at_least(0));
    app.add_option("--inflight", cfg.inflight, "calls in flight")->check(ordo_cli::at_least(1));
    app.add_option("--resume-ms", cfg.resume_ms, "the session's window")
        ->check(ordo_cli::at_least(1));
    app.add_option("--seed", cfg.seed, "the proxy's cut points");
    if (const auto status = ordo_cli::parse(app, argc, argv, 1)) return *status;
    const auto a = ordo::parse_address(cfg.url);
    if (a.scheme != "tcp") fail("--connect takes a tcp:// URL");

    ordo::test::cut_options co;
    co.seed = static_cast<std::uint64_t>(cfg.seed);
    co.min_bytes = 20'000;
    co.max_bytes = 400'000;
    ordo::test::cutting_proxy proxy(a.host, a.port, co);

    long expected_total = 0, failed = 0, resumes = 0, resent = 0;
    double seconds = 0;
    auto body = [&]() -> net::awaitable<void> {
        ordo::peer_options po;
        auto ch = co_await ordo::async_connect(
            proxy.url() + "?resume_ms=" + std::to_string(cfg.resume_ms), po);
        auto p = std::dynamic_pointer_cast<ordo::peer>(ch.impl());
        auto c = ordo::stub<counter>(ch);
        const auto t0 = clock_type::now();
        if (co_await c.total() != 0) fail("the server's total is not 0: use a fresh server");
        auto check_total = [&]() -> net::awaitable<void> {
            const long t = co_await c.total();
            if (t != expected_total)
                fail("total() is " + std::to_string(t) + " after " + std::to_string(expected_total) +
                     " add(1) notifications");
        };
        // Phase 1: one-way.
        for (long sent = 0; sent < cfg.one_way;) {
            const long chunk = std::min<long>(10'000, cfg.one_way - sent);
            for (long i = 0; i < chunk; ++i) c.add.notify(1);
            sent += chunk;
            expected_total += chunk;
            co_await p->async_drain();
            co_await check_total();
        }
        // Phase 2: pipelined calls with notifications among them.
        long issued = 0, done = 0, notes_sent = 0;
        net::steady_timer wait(co_await net::this_coro::executor);
        while (issued < cfg.calls) {
            while (issued < cfg.calls && issued - done < cfg.inflight) {
                const long i = issued++;
                ch.async_call<int>("inc", static_cast<int>(i % 1'000'000'000),
                                   [&, i](std::error_code e, int r) {
                                       if (e || r != static_cast<int>(i % 1'000'000'000) + 1)
                                           ++failed;
                                       ++done;
                                   });
                while (cfg.calls > 0 && notes_sent < cfg.notes &&
                       notes_sent * cfg.calls / std::max(cfg.notes, 1L) <= i) {
                    c.add.notify(1);
                    ++notes_sent;
                    ++expected_total;
                }
                if (issued % 1'000 == 0) {
                    co_await p->async_drain();
                    co_await check_total();
                }
            }
            wait.expires_after(std::chrono::microseconds(200));
            co_await wait.async_wait(ordo::use_tuple);
        }
        while (notes_sent < cfg.notes) {
            c.add.notify(1);
            ++notes_sent;
            ++expected_total;
        }
        while (done < issued) {
            wait.expires_after(std::chrono::milliseconds(1));
            co_await wait.async_wait(ordo::use_tuple);
        }
        co_await check_total();
        seconds = std::chrono::duration<double>(clock_type::now() - t0).count();
        resumes = static_cast<long>(p->counters().resumes);
        resent = static_cast<long>(p->counters().messages_resent);
        if (!p->is_resumable()) fail("the session is not resumable");
        p->close();
    };
    try {
        ordo::run(body());
    } catch (const std::exception& x) {
        fail(x.what());
    }
    if (failed > 0) fail(std::to_string(failed) + " calls failed or were answered wrongly");
    std::printf(
        "ok: %ld one-way add(1), %ld pipelined inc calls and %ld add(1) among them, every answer "
        "and total() right, in %.1f s; %zu cuts, %ld resumes, %ld messages resent\n",
        cfg.one_way, cfg.calls, cfg.notes, seconds, proxy.cuts(), resumes, resent);
    return 0;
}
