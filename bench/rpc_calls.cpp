// Call rate and latency over one ordered ordo::peer: a forked server process serves inc(int);
// the client makes --count calls one at a time (seq) and then with --inflight calls outstanding
// (pipelined), checks every result, and prints one JSON line per workload.
//
// With --workload hol, it measures instead the latency of a small call made right after a
// --size byte echo call (ordered: it waits behind it; pooled: it does not).
//
//   rpc_calls [--transport tcp|unix|inproc|tls|zmq+tcp|zmq+ipc] [--mode ordered|pooled] [--workload calls|hol]
//             [--count N] [--inflight K] [--size BYTES] [--method inc|square_batch]
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include <ordo/ordo.hpp>

#include "fork_server.hpp"
#include "run_main.hpp"

namespace net = ordo::net;
using clock_type = std::chrono::steady_clock;

namespace {

struct config {
    std::string transport = "tcp";
    std::string mode = "ordered";
    std::string workload = "calls";
    long count = 100'000;
    long inflight = 256;
    long size = 64 << 20;
    std::string method = "inc";  // or square_batch (a batch handler: 64 per batch, 1 ms)
};

int serve(const config& cfg, int ready_fd) {
    net::io_context io;
    ordo::server srv(io.get_executor());
    srv.on("inc", [](int x) { return x + 1; });
    srv.on("echo", [](msgpack::object v) { return v; });
    auto batches = srv.on_batch("square_batch",
                                {.max_batch_size = 64, .max_wait = std::chrono::milliseconds(1)},
                                [](std::vector<int> xs) {
                                    for (auto& x : xs) x *= x;
                                    return xs;
                                });
    const std::string bound = srv.listen(ordo::test::listen_url(cfg.transport)) + "\n";
    if (::write(ready_fd, bound.data(), bound.size()) < 0) return 1;
    ::close(ready_fd);
    // The client's connection ending is the signal to stop.
    net::co_spawn(
        io,
        [&]() -> net::awaitable<void> {
            net::steady_timer t(io);
            bool seen = false;
            for (;;) {
                t.expires_after(std::chrono::milliseconds(20));
                co_await t.async_wait(ordo::use_tuple);
                if (srv.peer_count() > 0) seen = true;
                if (seen && srv.peer_count() == 0) break;
            }
            co_await srv.async_stop();
        },
        net::detached);
    io.run();
    if (cfg.method == "square_batch") {
        std::fprintf(stderr, "server: %llu batches for %llu calls; sizes:",
                     static_cast<unsigned long long>(batches.stats().batches),
                     static_cast<unsigned long long>(batches.stats().calls));
        for (auto [size, n] : batches.stats().size_histogram)
            std::fprintf(stderr, " %zu:%llu", size, static_cast<unsigned long long>(n));
        std::fprintf(stderr, "\n");
    }
    return 0;
}

// The argument of call i, and what it must return (squares stay within int).
int arg(const config& cfg, long i) {
    return static_cast<int>(cfg.method == "square_batch" ? i % 1000 : i);
}
int expected(const config& cfg, long i) {
    const int a = arg(cfg, i);
    return cfg.method == "square_batch" ? a * a : a + 1;
}

double percentile(std::vector<double>& v, double p) {
    if (v.empty()) return 0;
    std::size_t k = std::min(v.size() - 1, static_cast<std::size_t>(p * v.size()));
    std::nth_element(v.begin(), v.begin() + k, v.end());
    return v[k];
}

void report(const config& cfg, const char* workload, long inflight, double seconds,
            std::vector<double>& lat) {
    std::printf(
        "{\"workload\":\"%s\",\"method\":\"%s\",\"transport\":\"%s\",\"mode\":\"%s\","
        "\"count\":%ld,\"inflight\":%ld,\"seconds\":%.4f,\"rate\":%.0f,\"p50_us\":%.1f,"
        "\"p90_us\":%.1f,\"p99_us\":%.1f}\n",
        workload, cfg.method.c_str(), cfg.transport.c_str(), cfg.mode.c_str(), cfg.count, inflight,
        seconds, cfg.count / seconds, percentile(lat, 0.5), percentile(lat, 0.9),
        percentile(lat, 0.99));
}

net::awaitable<void> hol(const config& cfg, ordo::channel ch) {
    const std::string big(static_cast<std::size_t>(cfg.size), 'x');
    std::vector<double> small_lat, big_lat;
    bool bad = false;
    for (long round = 0; round < cfg.count && !bad; ++round) {
        int done = 0;
        const auto t0 = clock_type::now();
        ch.async_call<std::string>("echo", big, [&](std::error_code ec, std::string r) {
            if (ec || r.size() != big.size()) bad = true;
            big_lat.push_back(
                std::chrono::duration<double, std::micro>(clock_type::now() - t0).count());
            ++done;
        });
        const auto t1 = clock_type::now();
        ch.async_call<int>("inc", 1, [&](std::error_code ec, int v) {
            if (ec || v != 2) bad = true;
            small_lat.push_back(
                std::chrono::duration<double, std::micro>(clock_type::now() - t1).count());
            ++done;
        });
        net::steady_timer t(co_await net::this_coro::executor);
        while (done < 2) {
            t.expires_after(std::chrono::microseconds(100));
            co_await t.async_wait(ordo::use_tuple);
        }
    }
    std::printf(
        "{\"workload\":\"hol\",\"transport\":\"%s\",\"mode\":\"%s\",\"count\":%ld,"
        "\"size\":%ld,\"small_p50_us\":%.0f,\"small_max_us\":%.0f,\"big_p50_us\":%.0f}\n",
        cfg.transport.c_str(), cfg.mode.c_str(), cfg.count, cfg.size, percentile(small_lat, 0.5),
        percentile(small_lat, 1.0), percentile(big_lat, 0.5));
    if (bad) throw std::runtime_error("a call failed or returned a wrong result");
}

net::awaitable<void> client(const config& cfg, std::string url) {
    if (cfg.mode == "pooled")
        url += "?mode=pooled&max_connections=" + std::to_string(std::max(2L, cfg.inflight));
    ordo::channel ch = co_await ordo::async_connect(url);
    co_await ch.async_call<int>("inc", 0);  // connected and warm before the clock starts
    if (cfg.workload == "hol") co_return co_await hol(cfg, ch);
    std::vector<double> lat;
    lat.reserve(cfg.count);

    auto start = clock_type::now();
    for (long i = 0; i < cfg.count; ++i) {
        auto t0 = clock_type::now();
        int v = co_await ch.async_call<int>(cfg.method, arg(cfg, i));
        lat.push_back(std::chrono::duration<double, std::micro>(clock_type::now() - t0).count());
        if (v != expected(cfg, i)) throw std::runtime_error("wrong result");
    }
    report(cfg, "seq", 1, std::chrono::duration<double>(clock_type::now() - start).count(), lat);

    lat.clear();
    long next = 0, done = 0, wrong = 0;
    net::steady_timer finished(co_await net::this_coro::executor, clock_type::time_point::max());
    std::function<void()> issue = [&] {
        const long i = next++;
        const auto t0 = clock_type::now();
        ch.async_call<int>(cfg.method, arg(cfg, i), [&, i, t0](std::error_code ec, int v) {
            lat.push_back(
                std::chrono::duration<double, std::micro>(clock_type::now() - t0).count());
            if (ec || v != expected(cfg, i)) ++wrong;
            if (++done == cfg.count)
                finished.cancel();
            else if (next < cfg.count)
                issue();
        });
    };
    start = clock_type::now();
    for (long k = 0; k < std::min(cfg.inflight, cfg.count); ++k) issue();
    while (done < cfg.count) co_await finished.async_wait(ordo::use_tuple);
    report(cfg, "pipelined", cfg.inflight,
           std::chrono::duration<double>(clock_type::now() - start).count(), lat);
    if (wrong) throw std::runtime_error("wrong results");
}

}  // namespace

int main(int argc, char** argv) {
    config cfg;
    for (int i = 1; i + 1 < argc; i += 2) {
        std::string k = argv[i], v = argv[i + 1];
        if (k == "--transport")
            cfg.transport = v;
        else if (k == "--mode")
            cfg.mode = v;
        else if (k == "--workload")
            cfg.workload = v;
        else if (k == "--size")
            cfg.size = std::stol(v);
        else if (k == "--method")
            cfg.method = v;
        else if (k == "--count")
            cfg.count = std::stol(v);
        else if (k == "--inflight")
            cfg.inflight = std::stol(v);
        else {
            std::cerr << "unknown flag " << k << "\n";
            return 2;
        }
    }
    bench_server srv = start_server(cfg.transport, [&](int fd) { return serve(cfg, fd); });
    const int status = run_main("rpc_calls: ", client(cfg, srv.url));
    srv.wait();
    return status;
}
