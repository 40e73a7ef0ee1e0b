// ordo-overload-bench: one server at twice its capacity, with its concurrency limit adaptive,
// fixed or none (server_options::concurrency): goodput (calls answered within their deadline)
// and the latency of the calls it serves.
//
//   ordo-overload-bench [--limit adaptive|none|N] [--seconds 10] [--warmup 3] [--rate 4000]
//                       [--workers 4] [--work-ms 2] [--deadline-ms 100] [--json]
//
// The server (its own loop and thread) serves "work" on a worker_pool of --workers threads:
// each call blocks its worker for --work-ms (a sleep, as a query or a disk read would), and
// does not look at its stop token, as most handlers do not. Capacity is workers / work-ms
// (2,000 calls/s by default). A client on another thread makes calls from an open loop at
// --rate calls/s over one connection, each with a --deadline-ms deadline (it travels with the
// call: the server does not start one that has passed). Figures count the calls made after
// --warmup seconds: goodput is those answered with a result within their deadline, per second;
// latency percentiles are of those. Every call is accounted for; the run fails if one has not
// finished 10 s after the last was made.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <ordo/ordo.hpp>

namespace net = ordo::net;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {

struct settings {
    std::string limit = "adaptive";
    double seconds = 10, warmup = 3, rate = 4000;
    int workers = 4;
    long work_ms = 2, deadline_ms = 100;
    bool json = false;
};

struct tally {
    long made = 0, finished = 0;
    // Of the calls made after the warm-up:
    long counted = 0, good = 0, late = 0, overloaded = 0, timed_out = 0, other = 0;
    std::vector<double> latency_ms;  // of the good ones
};

net::awaitable<void> drive(const settings& st, ordo::channel ch, tally& t) {
    auto ex = co_await net::this_coro::executor;
    net::steady_timer tick(ex);
    const auto start = clock_type::now();
    const auto seconds = [](double s) {
        return std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(s));
    };
    const auto counted_from = start + seconds(st.warmup);
    const auto end = counted_from + seconds(st.seconds);
    const auto deadline = std::chrono::milliseconds(st.deadline_ms);
    while (clock_type::now() < end) {
        const double elapsed = std::chrono::duration<double>(clock_type::now() - start).count();
        const long due = static_cast<long>(elapsed * st.rate);
        for (; t.made < due; ++t.made) {
            ordo::call_options o;
            o.timeout = deadline;
            const auto sent = clock_type::now();
            const bool counted = sent >= counted_from;
            t.counted += counted;
            ch.async_call<long>(
                "work", st.work_ms, o, [&t, sent, deadline, counted](std::error_code ec, long) {
                    ++t.finished;
                    if (!counted) return;
                    const auto took = clock_type::now() - sent;
                    if (!ec && took <= deadline) {
                        ++t.good;
                        t.latency_ms.push_back(
                            std::chrono::duration<double, std::milli>(took).count());
                    } else if (!ec) {
                        ++t.late;
                    } else if (ec == ordo::errc::overloaded) {
                        ++t.overloaded;
                    } else if (ec == ordo::errc::timed_out) {
                        ++t.timed_out;
                    } else {
                        ++t.other;
                    }
                });
        }
        tick.expires_after(1ms);
        co_await tick.async_wait(net::use_awaitable);
    }
    const auto until = clock_type::now() + 10s;
    while (t.finished < t.made && clock_type::now() < until) {
        tick.expires_after(5ms);
        co_await tick.async_wait(net::use_awaitable);
    }
}

double percentile(std::vector<double>& v, double p) {
    if (v.empty()) return 0;
    const auto k = static_cast<std::size_t>(p * static_cast<double>(v.size() - 1));
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
    return v[k];
}

}  // namespace

int main(int argc, char** argv) {
    settings st;
    CLI::App app{"A server at twice its capacity: adaptive, fixed or no concurrency limit",
                 "ordo-overload-bench"};
    app.add_option("--limit", st.limit, "server_options::concurrency: adaptive, none or a number")
        ->capture_default_str();
    app.add_option("--seconds", st.seconds, "how long calls are counted")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    app.add_option("--warmup", st.warmup, "calls made before are not counted")
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber);
    app.add_option("--rate", st.rate, "calls per second offered")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    app.add_option("--workers", st.workers, "the server's worker threads")
        ->capture_default_str()
        ->check(CLI::Range(1, 256));
    app.add_option("--work-ms", st.work_ms, "each call's time on a worker")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    app.add_option("--deadline-ms", st.deadline_ms, "each call's deadline")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    app.add_flag("--json", st.json, "print one JSON line");
    CLI11_PARSE(app, argc, argv);

    ordo::server_options so;
    if (st.limit == "adaptive") {
        so.concurrency = ordo::adaptive;
    } else if (st.limit != "none") {
        try {
            so.concurrency = static_cast<std::size_t>(std::stoul(st.limit));
        } catch (const std::exception&) {
            std::fprintf(stderr, "ordo-overload-bench: --limit is adaptive, none or a number\n");
            return 2;
        }
    }
    ordo::worker_pool pool(static_cast<std::size_t>(st.workers));
    net::io_context server_io;
    ordo::server srv(server_io.get_executor(), so);
    ordo::handler_options ho;
    ho.concurrent = true;
    ho.run_on = pool.get_executor();
    srv.on(
        "work",
        [](long ms) {
            std::this_thread::sleep_for(std::chrono::milliseconds(ms));
            return ms;
        },
        ho);
    const std::string url = srv.listen("tcp://127.0.0.1:0");
    auto guard = net::make_work_guard(server_io);
    std::thread server_thread([&] { server_io.run(); });

    net::io_context io;
    tally t;
    std::exception_ptr failed;
    net::co_spawn(
        io,
        [&]() -> net::awaitable<void> {
            auto ch = co_await ordo::async_connect(url);
            co_await drive(st, ch, t);
            ch.impl()->close();
        },
        [&](std::exception_ptr e) { failed = e; });
    io.run();
    ordo::server_stats ss;
    std::promise<void> stopped;
    net::co_spawn(
        server_io,
        [&]() -> net::awaitable<void> {
            ss = srv.stats();
            co_await srv.async_stop();
        },
        [&](std::exception_ptr) { stopped.set_value(); });
    stopped.get_future().wait();
    pool.join();
    guard.reset();
    server_thread.join();
    if (failed) {
        try {
            std::rethrow_exception(failed);
        } catch (const std::exception& e) {
            std::fprintf(stderr, "ordo-overload-bench: %s\n", e.what());
        }
        return 1;
    }
    if (t.finished != t.made) {
        std::fprintf(stderr, "ordo-overload-bench: %ld of %ld calls never finished\n",
                     t.made - t.finished, t.made);
        return 1;
    }
    const double capacity = st.workers * 1000.0 / static_cast<double>(st.work_ms);
    const double goodput = static_cast<double>(t.good) / st.seconds;
    const double p50 = percentile(t.latency_ms, 0.50), p99 = percentile(t.latency_ms, 0.99);
    if (st.json) {
        std::printf(
            "{\"limit\":\"%s\",\"rate\":%.0f,\"capacity\":%.0f,\"counted\":%ld,"
            "\"good\":%ld,\"goodput\":%.1f,\"p50_ms\":%.3f,\"p99_ms\":%.3f,\"late\":%ld,"
            "\"overloaded\":%ld,\"timed_out\":%ld,\"other\":%ld,\"final_limit\":%zu,"
            "\"no_load_us\":%llu}\n",
            st.limit.c_str(), st.rate, capacity, t.counted, t.good, goodput, p50, p99, t.late,
            t.overloaded, t.timed_out, t.other, ss.concurrency.limit,
            static_cast<unsigned long long>(ss.concurrency.no_load_us));
    } else {
        std::printf(
            "limit %s: %ld calls at %.0f/s (capacity %.0f/s): goodput %.0f/s (%.1f%%), "
            "p50 %.2f ms, p99 %.2f ms; %ld late, %ld refused overloaded, %ld timed out, "
            "%ld other; limit at the end %zu, no-load latency %.2f ms\n",
            st.limit.c_str(), t.counted, st.rate, capacity, goodput,
            t.counted ? 100.0 * static_cast<double>(t.good) / static_cast<double>(t.counted) : 0.0,
            p50, p99, t.late, t.overloaded, t.timed_out, t.other, ss.concurrency.limit,
            static_cast<double>(ss.concurrency.no_load_us) / 1000);
    }
    return t.other == 0 ? 0 : 1;
}
