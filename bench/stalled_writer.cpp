// stalled-writer: does a reader that stops hold its writer's memory at the window and one item
// (bench/README.md, "Streams")? A server in a child process and a client in this one, on
// loopback; the RSS of both (VmRSS) is sampled every 50 ms while the client tries to write
// --items items of --size bytes:
// - upload: a client stream whose handler never reads (until it is cancelled);
// - two-way: an echo whose caller never reads the echoes: the handler is held by its writer's
//   credit and stops reading, and then the caller's writes stop too.
// Once the writer has been still for --still-ms, it prints the items written, each process's
// growth over its RSS before the stream, and the stream's window (8192 items, 1 MiB) beside it.
// Exits 1 when either process grew by more than --limit-mib (a window that does not hold).
//
//   ordo-stalled-writer [--mode upload|two-way] [--items N] [--size BYTES] [--still-ms N]
//                       [--limit-mib N] [--json]
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

#include "cli.hpp"
#include "ordo/ordo.hpp"

namespace {

namespace net = ordo::net;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

[[noreturn]] void fail(const std::string& why) {
    std::fprintf(stderr, "error: %s\n", why.c_str());
    std::exit(1);
}

struct config {
    std::string mode = "upload";
    long items = 16384;
    long size = 64 * 1024;
    long still_ms = 1000;
    long limit_mib = 16;
    bool json = false;
};

// VmRSS of `pid`, in bytes (0 when it cannot be read).
std::uint64_t rss(pid_t pid) {
    std::ifstream f("/proc/" + std::to_string(pid) + "/status");
    std::string line;
    while (std::getline(f, line))
        if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
    return 0;
}

// The server: `hold` reads nothing until it is cancelled; `echo` writes back what it reads.
// Writes its address to `out`, serves until its stdin ends.
[[noreturn]] void serve(int out) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    net::io_context io;
    ordo::server srv(io.get_executor());
    srv.on("hold", [](ordo::reader<std::string_view>&) -> net::awaitable<int> {
        net::steady_timer t(co_await net::this_coro::executor, 1h);
        co_await t.async_wait(net::use_awaitable);
        co_return 0;
    });
    srv.on("echo",
           [](ordo::reader<std::string_view>& in,
              ordo::writer<std::string_view>& w) -> net::awaitable<void> {
               while (auto v = co_await in.next()) co_await w.write(*v);
           });
    const std::string url = srv.listen("tcp://127.0.0.1:0") + "\n";
    if (::write(out, url.data(), url.size()) != static_cast<ssize_t>(url.size())) std::_Exit(1);
    ::close(out);
    std::thread stdin_watch([&io] {
        char c;
        while (::read(0, &c, 1) > 0) {
        }
        io.stop();
    });
    io.run();
    stdin_watch.join();
    std::_Exit(0);
}

struct held : ordo::interface {
    ordo::method<ordo::upload<std::string_view, int>()> hold{"hold"};
    ordo::method<ordo::two_way<std::string_view, std::string>()> echo{"echo"};
};

struct outcome {
    std::uint64_t written = 0;
    std::uint64_t client_base = 0, client_peak = 0, server_base = 0, server_peak = 0;
};

outcome run(const config& cfg, pid_t server, const std::string& url) {
    net::io_context io;
    outcome o;
    std::atomic<std::uint64_t> written{0};
    std::atomic<bool> writing_done{false};
    auto body = [&]() -> net::awaitable<void> {
        ordo::channel ch = co_await ordo::async_connect(url);
        const std::string item(static_cast<std::size_t>(cfg.size), 'x');
        co_await ch.async_call<void>("ordo.ping");  // warm: the connection is up
        o.client_base = rss(::getpid());
        o.server_base = rss(server);
        auto ex = co_await net::this_coro::executor;
        // The writer, on its own: it blocks once the window is used up.
        auto write_all = [&](auto& w) -> net::awaitable<void> {
            for (long i = 0; i < cfg.items; ++i) {
                if (!co_await w.write(std::string_view(item))) break;
                written = static_cast<std::uint64_t>(i + 1);
            }
            writing_done = true;
        };
        auto sample = [&] {
            o.client_peak = std::max(o.client_peak, rss(::getpid()));
            o.server_peak = std::max(o.server_peak, rss(server));
        };
        auto watch = [&]() -> net::awaitable<void> {
            net::steady_timer t(ex);
            std::uint64_t last = ~0ull;
            auto still_since = clock_type::now();
            const auto give_up = clock_type::now() + 60s;
            while (clock_type::now() < give_up && !writing_done) {
                t.expires_after(50ms);
                co_await t.async_wait(net::use_awaitable);
                sample();
                if (written != last) {
                    last = written;
                    still_since = clock_type::now();
                } else if (clock_type::now() - still_since >= std::chrono::milliseconds(cfg.still_ms)) {
                    break;
                }
            }
            sample();
        };
        if (cfg.mode == "upload") {
            auto up = co_await ordo::stub<held>(ch).hold();
            net::co_spawn(ex, write_all(up), net::detached);
            co_await watch();
            up.cancel();
        } else {
            auto s = co_await ordo::stub<held>(ch).echo();
            net::co_spawn(ex, write_all(s), net::detached);
            co_await watch();
            s.cancel();
        }
        o.written = written;
        ch.impl()->close();
    };
    net::co_spawn(io, body(), [](std::exception_ptr e) {
        if (e) std::rethrow_exception(e);
    });
    io.run();
    return o;
}

}  // namespace

int main(int argc, char** argv) {
    config cfg;
    CLI::App app{"ordo-stalled-writer: a reader that stops holds its writer at the window"};
    ordo_cli::use_defaults(app);
    app.add_option("--mode", cfg.mode, "upload (the handler does not read) or two-way (the "
                                       "caller does not read the echoes)")
        ->check(CLI::IsMember({"upload", "two-way"}));
    app.add_option("--items", cfg.items, "items the writer tries to write")
        ->check(ordo_cli::at_least(1));
    app.add_option("--size", cfg.size, "bytes of an item")->check(ordo_cli::at_least(1));
    app.add_option("--still-ms", cfg.still_ms, "how long the writer must be still to stop")
        ->check(ordo_cli::at_least(100));
    app.add_option("--limit-mib", cfg.limit_mib, "the most either process may grow")
        ->check(ordo_cli::at_least(1));
    app.add_flag("--json", cfg.json, "one JSON object");
    if (const auto status = ordo_cli::parse(app, argc, argv, 1)) return *status;

    int to_server[2], from_server[2];
    if (::pipe(to_server) != 0 || ::pipe(from_server) != 0) fail("pipe failed");
    const pid_t pid = ::fork();
    if (pid < 0) fail("fork failed");
    if (pid == 0) {
        ::dup2(to_server[0], 0);
        ::close(to_server[0]);
        ::close(to_server[1]);
        ::close(from_server[0]);
        serve(from_server[1]);
    }
    ::close(to_server[0]);
    ::close(from_server[1]);
    std::string url;
    char c;
    while (::read(from_server[0], &c, 1) == 1 && c != '\n') url += c;
    ::close(from_server[0]);
    if (url.empty()) fail("the server did not start");

    const outcome o = run(cfg, pid, url);
    ::close(to_server[1]);  // the server ends
    int status = 0;
    ::waitpid(pid, &status, 0);

    const double mib = 1 << 20;
    const double client = double(o.client_peak - std::min(o.client_peak, o.client_base)) / mib;
    const double server = double(o.server_peak - std::min(o.server_peak, o.server_base)) / mib;
    const double offered = double(cfg.items) * double(cfg.size) / mib;
    if (cfg.json)
        std::printf("{\"mode\":\"%s\",\"size\":%ld,\"offered_mib\":%.1f,\"written\":%llu,"
                    "\"client_growth_mib\":%.2f,\"server_growth_mib\":%.2f}\n",
                    cfg.mode.c_str(), cfg.size, offered,
                    static_cast<unsigned long long>(o.written), client, server);
    else
        std::printf("%s, items of %ld bytes, %.0f MiB offered: %llu written (%.2f MiB) before the "
                    "writer stopped\nRSS growth: client %.2f MiB, server %.2f MiB (window: 8192 "
                    "items or 1 MiB, plus one item)\n",
                    cfg.mode.c_str(), cfg.size, offered, static_cast<unsigned long long>(o.written),
                    double(o.written) * double(cfg.size) / mib, client, server);
    if (o.written >= static_cast<std::uint64_t>(cfg.items))
        fail("the writer wrote every item: nothing held it");
    if (client > double(cfg.limit_mib) || server > double(cfg.limit_mib))
        fail("a process grew by more than --limit-mib " + std::to_string(cfg.limit_mib));
    return 0;
}
