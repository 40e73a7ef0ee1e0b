// offload-latency: what handler_options::run_on costs a connection's other calls and how fast
// cancellation reaches an offloaded body (bench/README.md, "Offloaded bodies").
//
//   ordo-offload-latency [--runs N] [--deadline-ms N] [--items N] [--slow-ms N] [--on-loop]
//
// One process, tcp loopback; the server on a loop of its own with a worker_pool of 2 threads,
// the client on another thread.
// - stop: --runs calls of a run_on handler that computes in a loop and polls its std::stop_token,
//   each with a deadline of --deadline-ms; per call, the time from the caller's deadline to the
//   moment the body saw stop requested (p50, p99, max).
// - beside: a streaming handler on run_on (concurrent) that computes --slow-ms per item for
//   --items items, and meanwhile trivial calls, one after another, on the same connection: their
//   round trips (p50, p99, max). --on-loop runs the streaming body on the connection's loop
//   instead, for comparison.
// Every reply is checked; a wrong one, a call that does not fail as it should or a body that
// never sees stop fails the run (exit status 1), as does a usage error (--help lists the flags).
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <stop_token>
#include <string>
#include <vector>

#include "cli.hpp"
#include "ordo/ordo.hpp"
#include "support/running_loop.hpp"

namespace {

using clock_type = std::chrono::steady_clock;
using ordo::net::awaitable;

[[noreturn]] void fail(const std::string& why) {
    std::fprintf(stderr, "error: %s\n", why.c_str());
    std::exit(1);
}

struct config {
    long runs = 200;
    long deadline_ms = 20;
    long items = 40;
    long slow_ms = 50;
    bool on_loop = false;
};

double percentile(std::vector<double> v, double p) {
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size())))];
}

double ms_between(clock_type::time_point a, clock_type::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
}

// Busy for `d` (a computation), or until `stop` is requested.
void compute(std::chrono::milliseconds d, const std::stop_token& stop = {}) {
    const auto until = clock_type::now() + d;
    while (clock_type::now() < until && !stop.stop_requested()) {
    }
}

// The server on a loop of its own; `setup` registers its handlers before it listens.
struct server_on_thread {
    ordo::test::running_loop loop;
    std::unique_ptr<ordo::server> srv;
    std::string url;
    explicit server_on_thread(const std::function<void(ordo::server&)>& setup) {
        ordo::net::post(loop.io, [&] {
            srv = std::make_unique<ordo::server>(loop.io.get_executor());
            setup(*srv);
            url = srv->listen("tcp://127.0.0.1:0");
        });
        ordo::net::post(loop.io, ordo::net::use_future).get();
    }
    ~server_on_thread() {
        loop.run([this]() -> awaitable<void> { co_await srv->async_stop(); });
        ordo::net::post(loop.io, [this] { srv.reset(); });
        ordo::net::post(loop.io, ordo::net::use_future).get();
    }
};

template <class F>
void run_client(ordo::test::running_loop& client, F f) {
    std::string error;
    client.run([&]() -> awaitable<void> {
        try {
            co_await f();
        } catch (const std::exception& e) {
            error = e.what();
        }
    });
    if (!error.empty()) fail(error);
}

// The time from each call's deadline to its body seeing stop requested.
std::vector<double> measure_stop(const config& cfg) {
    ordo::worker_pool workers(2);
    std::atomic<clock_type::rep> saw_stop_at{0};
    std::atomic<long> bodies_ended{0};
    std::vector<double> ms;
    {
        server_on_thread s([&](ordo::server& srv) {
            ordo::handler_options off;
            off.run_on = workers.get_executor();
            srv.on(
                "spin",
                [&](std::stop_token stop, int x) {
                    compute(std::chrono::seconds(10), stop);
                    if (stop.stop_requested())
                        saw_stop_at = clock_type::now().time_since_epoch().count();
                    ++bodies_ended;
                    return x;
                },
                off);
        });
        ordo::test::running_loop client;
        run_client(client, [&]() -> awaitable<void> {
            auto ch = co_await ordo::async_connect(s.url);
            for (long r = 0; r < cfg.runs; ++r) {
                saw_stop_at = 0;
                const auto start = clock_type::now();
                const auto deadline = start + std::chrono::milliseconds(cfg.deadline_ms);
                try {
                    co_await ch.async_call<int>(
                        "spin", static_cast<int>(r),
                        ordo::timeout(std::chrono::milliseconds(cfg.deadline_ms)));
                    fail("a call of spin completed: it should have timed out");
                } catch (const ordo::rpc_error& e) {
                    if (e.code() != ordo::errc::timed_out) fail(e.what());
                }
                // The body ends at stop, or after 10 s if stop never came.
                ordo::net::steady_timer t(co_await ordo::net::this_coro::executor);
                while (bodies_ended.load() < r + 1) {
                    t.expires_after(std::chrono::microseconds(200));
                    co_await t.async_wait(ordo::use_tuple);
                }
                const auto seen = saw_stop_at.load();
                if (seen == 0) fail("an offloaded body never saw its stop token requested");
                ms.push_back(
                    ms_between(deadline, clock_type::time_point(clock_type::duration(seen))));
            }
        });
    }
    workers.join();
    return ms;
}

// Round trips of trivial calls made while a slow streaming handler runs on the connection.
std::vector<double> measure_beside(const config& cfg) {
    ordo::worker_pool workers(2);
    std::vector<double> ms;
    {
        server_on_thread s([&](ordo::server& srv) {
            ordo::handler_options o;
            o.concurrent = true;
            if (!cfg.on_loop) o.run_on = workers.get_executor();
            srv.on(
                "slow_items",
                [&](ordo::writer<int>& out, int n) -> awaitable<void> {
                    for (int i = 0; i < n; ++i) {
                        compute(std::chrono::milliseconds(cfg.slow_ms));
                        co_await out.write(i);
                    }
                },
                o);
            srv.on("inc", [](int x) { return x + 1; });
        });
        ordo::test::running_loop client;
        run_client(client, [&]() -> awaitable<void> {
            auto ch = co_await ordo::async_connect(s.url);
            auto items = co_await ch.async_stream<int>("slow_items", static_cast<int>(cfg.items));
            bool done = false;
            int next = 0;
            std::string stream_error;
            ordo::net::co_spawn(
                co_await ordo::net::this_coro::executor,
                [&]() -> awaitable<void> {
                    try {
                        while (auto v = co_await items.next())
                            if (*v != next++) stream_error = "an item out of order";
                    } catch (const std::exception& e) {
                        stream_error = e.what();
                    }
                    done = true;
                },
                ordo::net::detached);
            for (int i = 0; !done; ++i) {
                const auto t0 = clock_type::now();
                if (co_await ch.async_call<int>("inc", i) != i + 1) fail("wrong reply to inc");
                ms.push_back(ms_between(t0, clock_type::now()));
            }
            if (!stream_error.empty()) fail(stream_error);
            if (next != cfg.items) fail("the stream ended early");
        });
    }
    workers.join();
    return ms;
}

void print(const char* what, const std::vector<double>& ms) {
    std::printf("%s over %zu: p50 %.3f ms, p99 %.3f ms, max %.3f ms\n", what, ms.size(),
                percentile(ms, 0.5), percentile(ms, 0.99), *std::max_element(ms.begin(), ms.end()));
}

}  // namespace

int main(int argc, char** argv) {
    config cfg;
    CLI::App app{"Cancellation of offloaded bodies, and a slow offloaded stream beside calls.",
                 "ordo-offload-latency"};
    ordo_cli::use_defaults(app);
    app.add_option("--runs", cfg.runs, "calls whose deadline passes")->check(ordo_cli::at_least(1));
    app.add_option("--deadline-ms", cfg.deadline_ms, "their deadline")
        ->check(ordo_cli::at_least(1));
    app.add_option("--items", cfg.items, "items of the slow stream")->check(ordo_cli::at_least(1));
    app.add_option("--slow-ms", cfg.slow_ms, "computation per item")->check(ordo_cli::at_least(1));
    app.add_flag("--on-loop", cfg.on_loop, "the slow stream on the connection's loop instead");
    if (const auto status = ordo_cli::parse(app, argc, argv, 1)) return *status;
    print("stop latency after the deadline (run_on body polling its stop token), calls",
          measure_stop(cfg));
    print(cfg.on_loop ? "trivial calls beside a slow stream on the loop, calls"
                      : "trivial calls beside a slow stream on run_on, calls",
          measure_beside(cfg));
    return 0;
}
