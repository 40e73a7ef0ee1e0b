// ordo-inc-client --connect URL [--mode ordered|pooled] [--calls N] [--inflight K] [--adds A]
//                 [--timeout-ms T] [--liveness-timeout-ms L] [--ca F] [--cert F --key F]
// URL is any scheme: tcp://, unix://, tls://, zmq+tcp://, zmq+ipc:// (inproc:// names exist only
// inside one process). --ca is the CA file that tls:// servers are checked against (default: the
// system's), --cert/--key a client certificate for servers that ask for one.
// Calls inc(i) for i in 0..N-1 with up to K calls in flight and checks every result. Prints
// "ok N calls in S s (R calls/s)" and exits 0, or "error: <message>" on stderr and exits 1.
// --adds A (ordered mode): also A add(1) notifications spread evenly among the calls, and a check
// that total() grew by exactly A from before the first to after the last (no other client may
// add meanwhile): the ok line ends "; total grew by A", else "error: total grew by X, expected A".
// --help lists the flags; a usage error (an unknown flag, a value that is not a number) prints
// CLI11's message naming the flag and exits 1.
#include <chrono>
#include <cstdio>
#include <iostream>

#include "cli.hpp"
#include "counter.hpp"
#include "run_main.hpp"

namespace net = ordo::net;

namespace {

struct config {
    std::string url = "tcp://127.0.0.1:7000";
    std::string mode = "ordered";
    long calls = 1000;
    long inflight = 1;
    long adds = 0;
    long timeout_ms = 0;
    long liveness_timeout_ms = -1;  // -1: the library's default
    std::string ca, cert, key;
};

// Sends the add(1) notifications due before call `i`: the j-th before call j * calls / adds.
void send_adds(counter& c, const config& cfg, long i, long& adds_sent) {
    while (adds_sent < cfg.adds && adds_sent * cfg.calls / cfg.adds <= i) {
        c.add.notify(1);
        ++adds_sent;
    }
}

net::awaitable<void> worker(counter c, const config& cfg, long& next, long& done, long& adds_sent) {
    while (next < cfg.calls) {
        const int i = static_cast<int>(next++);
        send_adds(c, cfg, i, adds_sent);
        const int v = co_await c.inc(i, ordo::timeout(std::chrono::milliseconds(cfg.timeout_ms)));
        if (v != i + 1)
            throw std::runtime_error("inc(" + std::to_string(i) + ") returned " +
                                     std::to_string(v));
        ++done;
    }
}

net::awaitable<void> run(const config& cfg) {
    if (cfg.mode != "ordered" && cfg.mode != "pooled")
        throw std::runtime_error("unknown --mode " + cfg.mode + " (ordered or pooled)");
    // Pooled and routed notifications have no order with the calls that read the total.
    if (cfg.adds > 0 && (cfg.mode != "ordered" || cfg.url.rfind("route+", 0) == 0))
        throw std::runtime_error("--adds needs one ordered connection (--mode ordered, no route+)");
    std::string url = cfg.url;
    auto add = [&](const std::string& param) {
        url += (url.find('?') == std::string::npos ? "?" : "&") + param;
    };
    if (cfg.mode == "pooled")
        add("mode=pooled&max_connections=" + std::to_string(std::max(1L, cfg.inflight)));
    if (cfg.liveness_timeout_ms >= 0)
        add("liveness_timeout_ms=" + std::to_string(cfg.liveness_timeout_ms));
    if (!cfg.ca.empty()) add("ca=" + cfg.ca);
    if (!cfg.cert.empty()) add("cert=" + cfg.cert);
    if (!cfg.key.empty()) add("key=" + cfg.key);
    ordo::channel ch = co_await ordo::async_connect(url);
    auto c = ordo::stub<counter>(ch);
    const auto deadline = ordo::timeout(std::chrono::milliseconds(cfg.timeout_ms));
    long total_before = 0;
    if (cfg.adds > 0) total_before = co_await c.total(deadline);
    long next = 0, done = 0, adds_sent = 0;
    const auto start = std::chrono::steady_clock::now();
    using namespace net::experimental::awaitable_operators;
    // K workers, each with one call outstanding; the first failure cancels the others.
    auto ex = co_await net::this_coro::executor;
    std::exception_ptr first_error;
    long running = 0;
    net::steady_timer all_done(ex, std::chrono::steady_clock::time_point::max());
    for (long k = 0; k < std::max(1L, cfg.inflight); ++k) {
        ++running;
        net::co_spawn(ex, worker(c, cfg, next, done, adds_sent), [&](std::exception_ptr e) {
            if (e && !first_error) {
                first_error = e;
                next = cfg.calls;  // the other workers stop after their current call
            }
            if (--running == 0) all_done.cancel();
        });
    }
    while (running > 0) co_await all_done.async_wait(ordo::use_tuple);
    if (first_error) std::rethrow_exception(first_error);
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::string grew;
    if (cfg.adds > 0) {
        send_adds(c, cfg, cfg.calls, adds_sent);  // --calls 0: all of them now
        // On an ordered connection the call comes after every notification sent before it.
        const long growth = co_await c.total(deadline) - total_before;
        if (growth != cfg.adds)
            throw std::runtime_error("total grew by " + std::to_string(growth) + ", expected " +
                                     std::to_string(cfg.adds));
        grew = "; total grew by " + std::to_string(growth);
    }
    std::printf("ok %ld calls in %.3f s (%.0f calls/s)%s\n", done, s, done / s, grew.c_str());
}

}  // namespace

int main(int argc, char** argv) {
    config cfg;
    CLI::App app{"Calls inc(i) for i in 0..N-1, K at a time, and checks every result.",
                 "ordo-inc-client"};
    ordo_cli::use_defaults(app);
    app.add_option("--connect", cfg.url, "the server's URL, any scheme (route+..., ?params too)")
        ->type_name("URL");
    app.add_option("--mode", cfg.mode, "ordered (one connection) or pooled")->type_name("MODE");
    app.add_option("--calls", cfg.calls, "calls to make")->check(ordo_cli::at_least(0));
    app.add_option("--inflight", cfg.inflight, "calls in flight at once (pooled: connections)")
        ->check(ordo_cli::at_least(0));
    app.add_option("--adds", cfg.adds,
                   "add(1) notifications among the calls, and a check that total() grew by "
                   "exactly that (ordered mode)")
        ->check(ordo_cli::at_least(0));
    app.add_option("--timeout-ms", cfg.timeout_ms, "deadline of each call (0: none)")
        ->check(ordo_cli::at_least(0));
    app.add_option("--liveness-timeout-ms", cfg.liveness_timeout_ms,
                   "a server silent for this long while calls are pending is lost (default: the "
                   "library's)")
        ->check(ordo_cli::at_least(0))
        ->default_str("");
    app.add_option("--ca", cfg.ca, "CA that tls:// servers are checked against (default: system)")
        ->type_name("F");
    app.add_option("--cert", cfg.cert, "client certificate, for servers that ask for one")
        ->type_name("F");
    app.add_option("--key", cfg.key, "the client certificate's key")->type_name("F");
    if (const auto status = ordo_cli::parse(app, argc, argv, 1)) return *status;
    return run_main("error: ", run(cfg));
}
