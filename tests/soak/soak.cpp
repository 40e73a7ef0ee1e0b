// ordo-soak: clients and servers under faults for a while, checking that nothing hangs, leaks or
// vanishes. Not part of the default test run; .ci/run runs it for 60 s.
//
//   ordo-soak [--seconds N] [--clients C]
//
// It starts two server processes (itself with --serve) and C client processes (itself with
// --client). Server 0 lives throughout: the chaos loop stops it (SIGSTOP for 1.5 s) and makes it
// drop every connection (SIGUSR1); its RSS and open descriptors are sampled. Server 1 is also
// killed (SIGKILL) and restarted on the same port. Each client loops: an ordered channel and a
// pooled one to a server, pipelined inc calls (results checked), 64 KiB echoes, notifications,
// then, on the ordered channel, how many of its notifications the server saw. Every call has a
// 2 s deadline.
//
// Checks: every call ends (none pending 5 s after it started: "hung"); on a connection that
// stayed up, the server saw every notification taken ("lost" otherwise); on one that broke,
// notifications not written were reported (on_undelivered); server 0's RSS and descriptors are
// flat (end within 16 MiB and 16 descriptors of the values after warm-up). Prints one summary
// line and exits 1 if a check failed.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <asio/signal_set.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "inc_handlers.hpp"
#include "support/processes.hpp"

namespace net = ordo::net;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {

// ---- server: ordo-inc-server's handlers, plus per-connection notification counts ----

int serve(const std::string& url) {
    net::io_context io;
    long total = 0;
    std::map<const ordo::peer*, long> notes;  // per connection
    std::unique_ptr<ordo::server> srv;
    auto start = [&] {
        ordo::server_options o;
        o.peer.liveness_timeout = 1000ms;
        srv = std::make_unique<ordo::server>(io.get_executor(), o);
        serve_counter(*srv, total);
        srv->on("note", [&](ordo::peer& p, int) {
            // A new peer may get the address of one that is gone: forget each when it ends.
            if (notes[&p]++ == 0)
                p.on_closed([&notes, key = &p](const std::error_code&, const std::string&) {
                    notes.erase(key);
                });
        });
        srv->on("note_count", [&](ordo::peer& p) {
            const long n = notes[&p];
            notes.erase(&p);
            return n;
        });
        return srv->listen(url);
    };
    std::printf("listening on %s\n", start().c_str());
    std::fflush(stdout);
    // SIGUSR1: drop every connection (a graceful stop), then listen again on the same address.
    net::signal_set usr1(io, SIGUSR1);
    std::function<void()> arm = [&] {
        usr1.async_wait([&](std::error_code ec, int) {
            if (ec) return;
            net::co_spawn(
                io,
                [&]() -> net::awaitable<void> {
                    co_await srv->async_stop();
                    notes.clear();
                    start();
                    arm();
                },
                net::detached);
        });
    };
    arm();
    net::signal_set term(io, SIGTERM, SIGINT);
    term.async_wait([&](std::error_code, int) { io.stop(); });
    io.run();
    return 0;
}

// ---- client ----

struct tally {
    long calls = 0, ok = 0, wrong = 0, hung = 0;
    std::map<std::string, long> errors;  // by errc name
    long notes = 0, undelivered = 0, lost = 0, checked_connections = 0;
};

net::awaitable<void> sleep_for(std::chrono::milliseconds d) {
    net::steady_timer t(co_await net::this_coro::executor, d);
    co_await t.async_wait(ordo::use_tuple);
}

// One round on one server: an ordered and a pooled channel, mixed work, then the note check.
net::awaitable<void> round(const std::string& url, tally& t, std::mt19937& rng) {
    ordo::peer_options o;
    o.liveness_timeout = 500ms;
    o.default_timeout = 2000ms;
    long undelivered_here = 0;
    o.on_undelivered = [&](const ordo::undelivered_notification&) { ++undelivered_here; };
    ordo::channel ordered, pooled;
    try {
        ordered = co_await ordo::async_connect(url, o);
        pooled = co_await ordo::async_connect(url + "?mode=pooled&max_connections=4", o);
    } catch (const std::system_error& e) {
        ++t.errors[std::string("connect: ") + e.code().message()];
    }
    if (!ordered || !pooled) {  // the server is down or restarting: try again soon
        co_await sleep_for(100ms);
        co_return;
    }
    long notes_taken = 0;
    // Shared with the calls' handlers, which may (if a call hung) run after this round.
    auto pending_ptr = std::make_shared<long>(0);
    long& pending = *pending_ptr;
    static const std::string big(64 * 1024, 'b');
    auto call = [&](const ordo::channel& ch, bool echo) {
        ++pending;
        ++t.calls;
        const int x = static_cast<int>(rng() % 1000);
        auto done = [&t, pending_ptr, x, echo](std::error_code ec, ordo::value v) {
            --*pending_ptr;
            if (ec) {
                ++t.errors[ec.category() == ordo::error_category()
                               ? ordo::to_string(static_cast<ordo::errc>(ec.value()))
                               : ec.message()];
                return;
            }
            const bool right = echo ? v.get().type == msgpack::type::STR &&
                                          v.get().via.str.size == big.size()
                                    : v.get().as<int>() == x + 1;
            ++(right ? t.ok : t.wrong);
        };
        if (echo)
            ch.async_call<ordo::value>("echo", big, done);
        else
            ch.async_call<ordo::value>("inc", x, done);
    };
    for (int i = 0; i < 400; ++i) {
        const int what = static_cast<int>(rng() % 20);
        if (what == 0) {
            call(rng() % 2 ? ordered : pooled, true);
        } else if (what < 5) {
            try {
                ordered.notify("note", i);
                ++notes_taken;
            } catch (const std::system_error& e) {
                ++t.errors[std::string("notify: ") + e.code().message()];
            }
        } else {
            call(rng() % 2 ? ordered : pooled, false);
        }
        if (pending >= 32) {
            for (int w = 0; w < 400 && pending >= 16; ++w) co_await sleep_for(5ms);
        }
    }
    // Every call ends: by its answer or its 2 s deadline, so none may be left after 5 s.
    for (int w = 0; w < 1000 && pending > 0; ++w) co_await sleep_for(5ms);
    t.hung += pending;
    t.notes += notes_taken;
    // The check: on a connection that stayed up, the server saw every notification.
    auto& p = static_cast<ordo::peer&>(*ordered.impl());
    auto [ec, seen] = co_await ordered.async_call<long>(
        "note_count", net::experimental::as_tuple(net::use_awaitable));
    if (!ec && p.is_open()) {
        ++t.checked_connections;
        if (seen != notes_taken) t.lost += notes_taken - seen;
    }
    co_await p.async_close();
    t.undelivered += undelivered_here;
    if (auto* pl = dynamic_cast<ordo::pool*>(pooled.impl().get())) pl->close();
    if (pending > 0) co_await sleep_for(100ms);
}

int client(const std::vector<std::string>& urls, double seconds, unsigned seed) {
    net::io_context io;
    tally t;
    net::co_spawn(
        io,
        [&]() -> net::awaitable<void> {
            std::mt19937 rng(seed);
            const auto end = clock_type::now() + std::chrono::duration<double>(seconds);
            for (std::size_t i = 0; clock_type::now() < end; ++i)
                co_await round(urls[i % urls.size()], t, rng);
        },
        [](std::exception_ptr e) {
            if (!e) return;
            try {
                std::rethrow_exception(e);
            } catch (const std::exception& x) {
                std::fprintf(stderr, "ordo-soak client: %s\n", x.what());
            }
        });
    io.run();
    std::printf("%ld %ld %ld %ld %ld %ld %ld %ld", t.calls, t.ok, t.wrong, t.hung, t.notes,
                t.undelivered, t.lost, t.checked_connections);
    for (const auto& [kind, v] : t.errors) {
        std::string k = kind;  // one word: the parent splits on spaces
        for (auto& c : k)
            if (c == ' ' || c == '=') c = '_';
        std::printf(" %s=%ld", k.c_str(), v);
    }
    std::printf("\n");
    return 0;
}

// ---- parent: processes, chaos, accounting ----

// This program again, in another role; its stdout on a pipe.
std::unique_ptr<ordo::test::child> spawn(std::vector<std::string> args) {
    args.insert(args.begin(), "/proc/self/exe");
    return std::make_unique<ordo::test::child>(std::move(args));
}

long rss_kb(pid_t pid) {
    std::ifstream f("/proc/" + std::to_string(pid) + "/status");
    std::string key;
    long v = 0;
    while (f >> key)
        if (key == "VmRSS:" && f >> v) return v;
    return -1;
}

long fds(pid_t pid) {
    std::error_code ec;
    long n = 0;
    for (auto it = std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec);
         !ec && it != std::filesystem::directory_iterator(); it.increment(ec))
        ++n;
    return n;
}

int run(double seconds, int clients) {
    std::vector<std::unique_ptr<ordo::test::child>> servers(2);
    std::vector<std::string> urls(2);
    auto start_server = [&](int i, const std::string& listen) {
        servers[i] = spawn({"--serve", listen});
        const std::string line = servers[i]->read_line(10s);
        if (line.rfind("listening on ", 0) != 0)
            throw std::runtime_error("server " + std::to_string(i) + " said: " + line);
        urls[i] = line.substr(13);
    };
    start_server(0, "tcp://127.0.0.1:0");
    start_server(1, "tcp://127.0.0.1:0");
    std::vector<std::unique_ptr<ordo::test::child>> cs;
    for (int i = 0; i < clients; ++i)
        cs.push_back(spawn({"--client", urls[0], urls[1], std::to_string(seconds),
                            std::to_string(1000 + i)}));
    std::mt19937 rng(42);
    const auto t0 = clock_type::now();
    const auto end = t0 + std::chrono::duration<double>(seconds);
    long rss_start = -1, fds_start = -1, rss_end = 0, fds_end = 0;
    std::map<std::string, long> chaos;
    std::string curve;  // server 0's RSS and descriptors over time
    auto last_sample = t0 - 1h;
    while (clock_type::now() < end) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1000 + rng() % 2000));
        if (clock_type::now() - last_sample >= 30s || curve.empty()) {
            last_sample = clock_type::now();
            char b[80];
            std::snprintf(b, sizeof b, " %.0fs:%.1fMiB/%ldfd",
                          std::chrono::duration<double>(last_sample - t0).count(),
                          rss_kb(servers[0]->pid()) / 1024.0, fds(servers[0]->pid()));
            curve += b;
        }
        const auto warm_up = std::min<clock_type::duration>(
            5s, std::chrono::duration_cast<clock_type::duration>((end - t0) / 4));
        if (rss_start < 0 && clock_type::now() - t0 > warm_up) {
            rss_start = rss_kb(servers[0]->pid());
            fds_start = fds(servers[0]->pid());
        }
        switch (rng() % 4) {
            case 0:  // server 1 crashes and comes back on its port
                servers[1].reset();  // SIGKILL, reaped
                start_server(1, urls[1]);
                ++chaos["kill"];
                break;
            case 1: {  // a server hangs for 1.5 s
                auto& s = *servers[rng() % 2];
                s.signal(SIGSTOP);
                std::this_thread::sleep_for(1500ms);
                s.signal(SIGCONT);
                ++chaos["stop"];
                break;
            }
            default:  // a server drops every connection
                servers[rng() % 2]->signal(SIGUSR1);
                ++chaos["drop"];
        }
    }
    tally all;
    bool clients_ok = true;
    for (auto& c : cs) {
        const std::string line = c->read_line(30s);
        if (c->wait_exit(10s) != 0 || line.empty()) {
            clients_ok = false;
            continue;
        }
        std::istringstream in(line);
        long v[8];
        for (auto& x : v) in >> x;
        all.calls += v[0], all.ok += v[1], all.wrong += v[2], all.hung += v[3];
        all.notes += v[4], all.undelivered += v[5], all.lost += v[6];
        all.checked_connections += v[7];
        std::string kv;
        while (in >> kv) {
            const auto eq = kv.rfind('=');
            all.errors[kv.substr(0, eq)] += std::stol(kv.substr(eq + 1));
        }
    }
    rss_end = rss_kb(servers[0]->pid());
    fds_end = fds(servers[0]->pid());
    servers.clear();
    const bool flat = rss_start > 0 && rss_end - rss_start < 16 * 1024 && fds_end - fds_start < 16;
    const bool ok = clients_ok && all.hung == 0 && all.lost == 0 && all.wrong == 0 && flat &&
                    all.ok > 0 && all.checked_connections > 0;
    std::string errs, ch;
    for (auto& [k, v] : all.errors) errs += (errs.empty() ? "" : ", ") + k + " " + std::to_string(v);
    for (auto& [k, v] : chaos) ch += (ch.empty() ? "" : ", ") + k + " " + std::to_string(v);
    std::printf(
        "soak: %.0f s, %d clients; calls %ld (ok %ld, wrong %ld, hung %ld; errors: %s); "
        "notifications %ld (undelivered reported %ld, lost %ld, over %ld checked connections); "
        "chaos: %s; server 0 RSS %.1f -> %.1f MiB, fds %ld -> %ld: %s\n",
        seconds, clients, all.calls, all.ok, all.wrong, all.hung, errs.empty() ? "none" : errs.c_str(),
        all.notes, all.undelivered, all.lost, all.checked_connections, ch.c_str(),
        rss_start / 1024.0, rss_end / 1024.0, fds_start, fds_end,
        ok ? "ok" : (clients_ok ? "FAILED" : "FAILED (a client died)"));
    std::printf("soak: server 0 over time:%s\n", curve.c_str());
    return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
    std::vector<std::string> a(argv + 1, argv + argc);
    try {
        if (a.size() == 2 && a[0] == "--serve") return serve(a[1]);
        if (a.size() == 5 && a[0] == "--client")
            return client({a[1], a[2]}, std::stod(a[3]), static_cast<unsigned>(std::stoul(a[4])));
        double seconds = 60;
        int clients = 3;
        for (std::size_t i = 0; i + 1 < a.size(); i += 2) {
            if (a[i] == "--seconds")
                seconds = std::stod(a[i + 1]);
            else if (a[i] == "--clients")
                clients = std::stoi(a[i + 1]);
            else
                throw std::runtime_error("unknown flag " + a[i]);
        }
        return run(seconds, clients);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "ordo-soak: %s\n", e.what());
        return 2;
    }
}
