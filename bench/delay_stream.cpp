// delay-stream: a stream over a long path (bench/README.md, "Streams over a long path"). A
// relay in userspace (tc netem is not in this kernel) delays every byte by --delay-ms each way;
// through it go, one after the other:
// - raw TCP: --mib MiB written in 1 MiB writes to a sink that reads them and answers one byte;
// - ordo, fixed window: a stream of --item-kib items (1 MiB) of the same total, with the default
//   window of 1 MiB (call_options::window_bytes);
// - ordo, grown window: the same with call_options::max_window_bytes --max-window-mib (64);
// - the same two the other way: a client stream (upload), whose credit the server grows when
//   the caller runs out of it while the handler has read everything.
// Each prints its MB/s (from the first byte written to the last received), and the ordo rows
// their ratio to raw TCP.
//
//   ordo-delay-stream [--delay-ms N] [--mib N] [--item-kib N] [--max-window-mib N] [--json]
//
// One process, loopback: the relay, the sink and the ordo server on threads of their own, the
// client on another. Every item is checked (its size and its sequence number); a short or
// misordered stream fails the run (exit status 1).
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <string>

#include <asio/ip/tcp.hpp>
#include <asio/read.hpp>
#include <asio/write.hpp>

#include "cli.hpp"
#include "ordo/ordo.hpp"
#include "support/delay_relay.hpp"
#include "support/running_loop.hpp"

namespace {

namespace net = ordo::net;
using net::awaitable;
using net::ip::tcp;
using clock_type = std::chrono::steady_clock;

[[noreturn]] void fail(const std::string& why) {
    std::fprintf(stderr, "error: %s\n", why.c_str());
    std::exit(1);
}

struct config {
    long delay_ms = 10;
    long mib = 256;
    long item_kib = 1024;
    long max_window_mib = 64;
    bool json = false;
};

using ordo::test::delay_relay;

double mb_per_s(std::uint64_t bytes, clock_type::duration d) {
    return static_cast<double>(bytes) / 1e6 / std::chrono::duration<double>(d).count();
}

// Raw TCP through the relay: `total` bytes to a sink that answers one byte once it has them.
double raw_tcp(const config& cfg, std::uint64_t total) {
    ordo::test::running_loop sink_loop;
    tcp::acceptor sink(sink_loop.io, {net::ip::address_v4::loopback(), 0});
    net::co_spawn(
        sink_loop.io,
        [&]() -> awaitable<void> {
            auto s = co_await sink.async_accept(net::use_awaitable);
            std::string b(1 << 20, '\0');
            std::uint64_t got = 0;
            while (got < total) got += co_await s.async_read_some(net::buffer(b), net::use_awaitable);
            co_await net::async_write(s, net::buffer("k", 1), net::use_awaitable);
        },
        net::detached);
    delay_relay relay(sink.local_endpoint().port(), std::chrono::milliseconds(cfg.delay_ms));
    ordo::test::running_loop client;
    return client.run([&]() -> awaitable<double> {
        tcp::socket s(client.io);
        co_await s.async_connect({net::ip::address_v4::loopback(), relay.port()}, net::use_awaitable);
        const std::string b(1 << 20, 'x');
        const auto start = clock_type::now();
        for (std::uint64_t sent = 0; sent < total; sent += b.size())
            co_await net::async_write(s, net::buffer(b), net::use_awaitable);
        char k = 0;
        co_await net::async_read(s, net::buffer(&k, 1), net::use_awaitable);
        co_return mb_per_s(total, clock_type::now() - start);
    });
}

struct sink : ordo::interface {
    ordo::method<ordo::upload<std::string_view, std::uint64_t>(std::uint64_t)> put{"put"};
};

// ordo through the relay: a stream of `items` items of `size` bytes, with `max_window` (0: the
// window stays at its default); `upload`: the client writes them (a client stream).
double ordo_stream(const config& cfg, std::uint64_t items, std::size_t size,
                   std::uint64_t max_window, std::uint64_t& window_after, bool upload = false) {
    ordo::test::running_loop server_loop;
    std::unique_ptr<ordo::server> srv;
    std::string url;
    net::post(server_loop.io, [&] {
        srv = std::make_unique<ordo::server>(server_loop.io.get_executor());
        srv->on("blob",
                [](ordo::writer<std::string_view>& out, std::uint64_t n,
                   std::uint64_t bytes) -> awaitable<void> {
                    std::string item(bytes, 'y');
                    for (std::uint64_t i = 0; i < n; ++i) {
                        std::memcpy(item.data(), &i, sizeof i);
                        co_await out.write(item);
                    }
                });
        srv->on(sink{}.put,
                [](ordo::reader<std::string_view>& in, std::uint64_t size) -> awaitable<std::uint64_t> {
                    std::uint64_t i = 0;
                    while (auto v = co_await in.next()) {
                        std::uint64_t seq = 0;
                        if (v->size() != size) fail("an item of " + std::to_string(v->size()));
                        std::memcpy(&seq, v->data(), sizeof seq);
                        if (seq != i) fail("item " + std::to_string(i) + " out of order");
                        ++i;
                    }
                    co_return i;
                });
        url = srv->listen("tcp://127.0.0.1:0");
    });
    net::post(server_loop.io, net::use_future).get();
    double rate = 0;
    {
        delay_relay relay(static_cast<std::uint16_t>(std::stoi(url.substr(url.rfind(':') + 1))),
                          std::chrono::milliseconds(cfg.delay_ms));
        ordo::test::running_loop client;
        rate = client.run([&]() -> awaitable<double> {
            auto ch = co_await ordo::async_connect("tcp://127.0.0.1:" +
                                                   std::to_string(relay.port()));
            ordo::call_options o;
            o.max_window_bytes = max_window;
            const auto start = clock_type::now();
            if (upload) {
                auto up = co_await ordo::stub<sink>(ch).put(std::uint64_t{size}, o);
                std::string item(size, 'u');
                for (std::uint64_t i = 0; i < items; ++i) {
                    std::memcpy(item.data(), &i, sizeof i);
                    if (!co_await up.write(std::string_view(item)))
                        fail("the upload ended after " + std::to_string(i) + " items");
                }
                if (const auto n = co_await up.finish(); n != items)
                    fail("the server read " + std::to_string(n) + " items");
                window_after = 0;
                co_return mb_per_s(items * size, clock_type::now() - start);
            }
            auto s = co_await ch.async_stream<std::string>("blob", items, std::uint64_t{size}, o);
            std::uint64_t i = 0;
            while (auto v = co_await s.next()) {
                std::uint64_t seq = 0;
                if (v->size() != size) fail("an item of " + std::to_string(v->size()) + " bytes");
                std::memcpy(&seq, v->data(), sizeof seq);
                if (seq != i) fail("item " + std::to_string(i) + " out of order");
                ++i;
            }
            if (i != items) fail("the stream ended after " + std::to_string(i) + " items");
            const double r = mb_per_s(items * size, clock_type::now() - start);
            window_after = s.window_bytes();
            co_return r;
        });
    }
    server_loop.run([&]() -> awaitable<void> { co_await srv->async_stop(); });
    net::post(server_loop.io, [&] { srv.reset(); });
    net::post(server_loop.io, net::use_future).get();
    return rate;
}

}  // namespace

int main(int argc, char** argv) {
    config cfg;
    CLI::App app{"ordo-delay-stream: a stream over a path with a delay, against raw TCP"};
    ordo_cli::use_defaults(app);
    app.add_option("--delay-ms", cfg.delay_ms, "delay each way")->check(ordo_cli::at_least(0));
    app.add_option("--mib", cfg.mib, "MiB to move")->check(ordo_cli::at_least(1));
    app.add_option("--item-kib", cfg.item_kib, "size of a stream item")->check(ordo_cli::at_least(1));
    app.add_option("--max-window-mib", cfg.max_window_mib, "call_options::max_window_bytes")
        ->check(ordo_cli::at_least(2));
    app.add_flag("--json", cfg.json, "one JSON object");
    if (const auto status = ordo_cli::parse(app, argc, argv, 1)) return *status;
    const std::size_t size = static_cast<std::size_t>(cfg.item_kib) * 1024;
    const std::uint64_t total = std::uint64_t(cfg.mib) << 20;
    const std::uint64_t items = std::max<std::uint64_t>(1, total / size);
    const double raw = raw_tcp(cfg, total);
    std::uint64_t fixed_window = 0, grown_window = 0;
    const double fixed = ordo_stream(cfg, items, size, 0, fixed_window);
    const std::uint64_t max_window = std::uint64_t(cfg.max_window_mib) << 20;
    const double grown = ordo_stream(cfg, items, size, max_window, grown_window);
    std::uint64_t none = 0;
    const double up_fixed = ordo_stream(cfg, items, size, 0, none, true);
    const double up_grown = ordo_stream(cfg, items, size, max_window, none, true);
    if (cfg.json)
        std::printf("{\"delay_ms\":%ld,\"mib\":%ld,\"item_kib\":%ld,\"raw_mb_s\":%.1f,"
                    "\"fixed_mb_s\":%.1f,\"grown_mb_s\":%.1f,\"fixed_ratio\":%.3f,"
                    "\"grown_ratio\":%.3f,\"grown_window_bytes\":%llu,"
                    "\"upload_fixed_mb_s\":%.1f,\"upload_grown_mb_s\":%.1f,"
                    "\"upload_fixed_ratio\":%.3f,\"upload_grown_ratio\":%.3f}\n",
                    cfg.delay_ms, cfg.mib, cfg.item_kib, raw, fixed, grown, fixed / raw,
                    grown / raw, static_cast<unsigned long long>(grown_window), up_fixed,
                    up_grown, up_fixed / raw, up_grown / raw);
    else
        std::printf("delay %ld ms each way, %ld MiB, items of %ld KiB\n"
                    "raw TCP                      %8.1f MB/s\n"
                    "ordo stream, 1 MiB window    %8.1f MB/s  %.2fx\n"
                    "ordo stream, grown window    %8.1f MB/s  %.2fx (window %.1f MiB at the end)\n"
                    "ordo upload, 1 MiB credit    %8.1f MB/s  %.2fx\n"
                    "ordo upload, grown credit    %8.1f MB/s  %.2fx\n",
                    cfg.delay_ms, cfg.mib, cfg.item_kib, raw, fixed, fixed / raw, grown,
                    grown / raw, static_cast<double>(grown_window) / (1 << 20), up_fixed,
                    up_fixed / raw, up_grown, up_grown / raw);
    return 0;
}
