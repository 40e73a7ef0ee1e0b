// ordo-overload-bench: one server at twice its capacity, with its concurrency limit adaptive,
// fixed or none (server_options::concurrency): goodput (calls answered within their deadline)
// and the latency of the calls it serves.
//
//   ordo-overload-bench [--limit adaptive|none|N] [--seconds 10] [--warmup 3] [--rate 4000]
//                       [--workers 4] [--work-ms 2] [--deadline-ms 100] [--json]
//                       [--tenants [--light-rate 200] [--queue 8] [--weights 3:1]]
//
// --tenants measures the limit shared among callers (server_options::shares, a queue of
// --queue calls per caller) in one run of three parts, each on a fresh server: tenant B alone at
// --light-rate; tenant A at --rate beside B at --light-rate; then both at --rate, A weighing 3
// and B 1 (--weights). Each tenant has a connection and a token of its own. It prints each part
// and: B's goodput and p99 beside A against alone, the total goodput, and the shares of the
// saturated part against the weights.
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
    bool tenants = false;
    double light_rate = 200;
    std::size_t queue = 8;
    std::string weights = "3:1";
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

// One client of the server: its token (empty: none), its rate, and what it got.
struct tenant {
    std::string token;
    double rate;
    tally t{};
};

const char* const tenant_tokens[] = {"tenant-a-token-0123456789", "tenant-b-token-0123456789"};

// Serves `work` with `so`, drives each tenant over a connection of its own (all on one client
// thread), and stops. False (with why on stderr) if a call never finished or one failed.
bool run(const settings& st, ordo::server_options so, std::vector<tenant>& tenants,
         ordo::server_stats& ss) {
    ordo::worker_pool pool(static_cast<std::size_t>(st.workers));
    net::io_context server_io;
    ordo::server srv(server_io.get_executor(), std::move(so));
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
    std::exception_ptr failed;
    for (auto& tn : tenants)
        net::co_spawn(
            io,
            [&]() -> net::awaitable<void> {
                ordo::peer_options po;
                po.credentials.token = tn.token;
                auto ch = co_await ordo::async_connect(url, po);
                settings mine = st;
                mine.rate = tn.rate;
                co_await drive(mine, ch, tn.t);
                ch.impl()->close();
            },
            [&](std::exception_ptr e) {
                if (e) failed = e;
            });
    io.run();
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
        return false;
    }
    for (auto& tn : tenants)
        if (tn.t.finished != tn.t.made) {
            std::fprintf(stderr, "ordo-overload-bench: %ld of %ld calls never finished\n",
                         tn.t.made - tn.t.finished, tn.t.made);
            return false;
        }
    return true;
}

struct part {
    double goodput = 0, p50 = 0, p99 = 0;
    long refused = 0;
};

part figures(const settings& st, tally& t) {
    return {static_cast<double>(t.good) / st.seconds, percentile(t.latency_ms, 0.50),
            percentile(t.latency_ms, 0.99), t.overloaded};
}

int run_tenants(const settings& st, ordo::server_options so) {
    unsigned wa = 3, wb = 1;
    if (std::sscanf(st.weights.c_str(), "%u:%u", &wa, &wb) != 2 || wa == 0 || wb == 0) {
        std::fprintf(stderr, "ordo-overload-bench: --weights is A:B, two numbers above 0\n");
        return 2;
    }
    so.authenticate = ordo::authenticate_tokens(
        {{tenant_tokens[0], "tenant-a"}, {tenant_tokens[1], "tenant-b"}});
    so.shares.queue = st.queue;
    ordo::server_stats ss;
    std::vector<tenant> alone{{tenant_tokens[1], st.light_rate}};
    if (!run(st, so, alone, ss)) return 1;
    std::vector<tenant> beside{{tenant_tokens[0], st.rate}, {tenant_tokens[1], st.light_rate}};
    if (!run(st, so, beside, ss)) return 1;
    const std::size_t beside_limit = ss.concurrency.limit;
    const double beside_no_load_ms = static_cast<double>(ss.concurrency.no_load_us) / 1000;
    ordo::server_options weighted = so;
    weighted.shares.weights = {{"tenant-a", wa}, {"tenant-b", wb}};
    std::vector<tenant> both{{tenant_tokens[0], st.rate}, {tenant_tokens[1], st.rate}};
    if (!run(st, weighted, both, ss)) return 1;
    const part b_alone = figures(st, alone[0].t), a = figures(st, beside[0].t),
               b = figures(st, beside[1].t), sa = figures(st, both[0].t),
               sb = figures(st, both[1].t);
    const double share_ratio = sb.goodput > 0 ? sa.goodput / sb.goodput : 0;
    if (st.json) {
        std::printf(
            "{\"limit\":\"%s\",\"queue\":%zu,\"rate\":%.0f,\"light_rate\":%.0f,"
            "\"b_alone\":{\"goodput\":%.1f,\"p50_ms\":%.3f,\"p99_ms\":%.3f},"
            "\"beside\":{\"a_goodput\":%.1f,\"b_goodput\":%.1f,\"b_p50_ms\":%.3f,"
            "\"b_p99_ms\":%.3f,\"a_refused\":%ld,\"b_refused\":%ld,\"final_limit\":%zu,"
            "\"no_load_ms\":%.3f},"
            "\"b_goodput_ratio\":%.4f,\"b_p99_ratio\":%.3f,\"total_goodput\":%.1f,"
            "\"weighted\":{\"weights\":\"%u:%u\",\"a_goodput\":%.1f,\"b_goodput\":%.1f,"
            "\"ratio\":%.3f}}\n",
            st.limit.c_str(), st.queue, st.rate, st.light_rate, b_alone.goodput, b_alone.p50,
            b_alone.p99, a.goodput, b.goodput, b.p50, b.p99, a.refused, b.refused, beside_limit,
            beside_no_load_ms, b_alone.goodput > 0 ? b.goodput / b_alone.goodput : 0,
            b_alone.p99 > 0 ? b.p99 / b_alone.p99 : 0, a.goodput + b.goodput, wa, wb, sa.goodput,
            sb.goodput, share_ratio);
    } else {
        std::printf("limit %s, a queue of %zu per caller, capacity %.0f/s\n", st.limit.c_str(),
                    st.queue, st.workers * 1000.0 / static_cast<double>(st.work_ms));
        std::printf("  B alone at %.0f/s: goodput %.0f/s, p50 %.2f ms, p99 %.2f ms\n",
                    st.light_rate, b_alone.goodput, b_alone.p50, b_alone.p99);
        std::printf(
            "  A at %.0f/s beside B: A goodput %.0f/s (%ld refused); B goodput %.0f/s (%.1f%% of "
            "alone, %ld refused), p50 %.2f ms, p99 %.2f ms (%.2fx alone); total %.0f/s; the "
            "limit ended at %zu, no-load latency %.2f ms\n",
            st.rate, a.goodput, a.refused, b.goodput,
            b_alone.goodput > 0 ? 100 * b.goodput / b_alone.goodput : 0.0, b.refused, b.p50,
            b.p99, b_alone.p99 > 0 ? b.p99 / b_alone.p99 : 0.0, a.goodput + b.goodput,
            beside_limit, beside_no_load_ms);
        std::printf("  both at %.0f/s, weights %u:%u: A %.0f/s, B %.0f/s, A/B %.2f\n", st.rate,
                    wa, wb, sa.goodput, sb.goodput, share_ratio);
    }
    return 0;
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
    app.add_flag("--tenants", st.tenants,
                 "three parts with two token-authenticated tenants sharing the limit: B alone, "
                 "A beside B, both saturating with --weights");
    app.add_option("--light-rate", st.light_rate, "with --tenants: B's calls per second")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    app.add_option("--queue", st.queue, "with --tenants: server_options::shares.queue")
        ->capture_default_str();
    app.add_option("--weights", st.weights, "with --tenants: A's and B's weights, A:B")
        ->capture_default_str();
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
    if (st.tenants) return run_tenants(st, so);
    std::vector<tenant> one{{"", st.rate}};
    ordo::server_stats ss;
    if (!run(st, so, one, ss)) return 1;
    tally& t = one[0].t;
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
