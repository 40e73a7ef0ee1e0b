// One-way message rate over one BatchedComm: a client process sends --count messages of --size
// bytes in a tight loop (waiting only at the high-water mark); a server process (forked) checks
// their count and order and answers with one message when the last has arrived. The clock runs
// from the first send to that answer. Prints one JSON line.
//
//   comm_oneway [--transport tcp|unix|inproc|tls|zmq+tcp|zmq+ipc] [--interval-ms N] [--count N] [--size BYTES]
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>

#include "ordo/batched_comm.hpp"

#include "fork_server.hpp"

namespace net = ordo::net;
using clock_type = std::chrono::steady_clock;

namespace {

struct config {
    std::string transport = "tcp";
    int interval_ms = 0;
    std::uint32_t count = 1'000'000;
    std::size_t size = 16;
};

// Message i: an array [i, bin of padding] sized to `size` bytes in total (at least 11).
std::string make_message(std::uint32_t i, std::size_t size) {
    std::size_t pad = size > 11 ? size - 11 : 0;
    std::string s = "\x92\xce";
    for (int shift = 24; shift >= 0; shift -= 8) s += char((i >> shift) & 0xff);
    s += '\xc6';
    for (int shift = 24; shift >= 0; shift -= 8) s += char((pad >> shift) & 0xff);
    s.append(pad, 'x');
    return s;
}

std::uint32_t seq_of(std::string_view m) {
    std::uint32_t v = 0;
    for (int i = 2; i < 6; ++i) v = (v << 8) | static_cast<unsigned char>(m[i]);
    return v;
}

int serve(const config& cfg, int ready_fd) {
    net::io_context io;
    auto l = ordo::listen(io.get_executor(), ordo::test::listen_url(cfg.transport));
    const std::string bound = l->local_address() + "\n";
    if (::write(ready_fd, bound.data(), bound.size()) < 0) return 1;
    ::close(ready_fd);
    int status = 1;
    net::co_spawn(
        io,
        [&]() -> net::awaitable<void> {
            std::uint32_t expected = 0;
            bool in_order = true;
            std::unique_ptr<ordo::batched_comm> comm;
            comm = std::make_unique<ordo::batched_comm>(
                co_await l->async_accept(), ordo::comm_options{}, [&](std::string_view m) {
                    if (seq_of(m) != expected) in_order = false;
                    if (++expected == cfg.count)
                        comm->send(make_message(in_order ? expected : 0, 0));
                });
            comm->start();
            co_await comm->async_wait_closed();
            l->close();  // tls and zmq listeners keep working in the background until closed
            status = in_order && expected == cfg.count ? 0 : 1;
        },
        net::detached);
    io.run();
    return status;
}

}  // namespace

int main(int argc, char** argv) {
    config cfg;
    for (int i = 1; i + 1 < argc; i += 2) {
        std::string k = argv[i], v = argv[i + 1];
        if (k == "--transport")
            cfg.transport = v;
        else if (k == "--interval-ms")
            cfg.interval_ms = std::stoi(v);
        else if (k == "--count")
            cfg.count = std::stoul(v);
        else if (k == "--size")
            cfg.size = std::stoul(v);
        else {
            std::cerr << "unknown flag " << k << "\n";
            return 2;
        }
    }
    bench_server srv = start_server(cfg.transport, [&](int fd) { return serve(cfg, fd); });
    const std::string url = srv.url;
    net::io_context io;
    int status = 1;
    net::co_spawn(
        io,
        [&]() -> net::awaitable<void> {
            ordo::comm_options opts;
            opts.interval = std::chrono::milliseconds(cfg.interval_ms);
            bool answered = false;
            std::uint32_t confirmed = 0;
            ordo::batched_comm comm(co_await ordo::async_connect_transport(url), opts,
                                    [&](std::string_view m) {
                                        answered = true;
                                        confirmed = seq_of(m);
                                    });
            comm.start();
            std::vector<std::string> messages;
            const auto start = clock_type::now();
            for (std::uint32_t i = 0; i < cfg.count; ++i) {
                comm.send(make_message(i, cfg.size));
                if (comm.counters().buffered_bytes > opts.high_water_bytes)
                    co_await comm.async_drain();
            }
            net::steady_timer t(io);
            const auto give_up = clock_type::now() + std::chrono::seconds(120);
            while (!answered && clock_type::now() < give_up) {
                t.expires_after(std::chrono::microseconds(200));
                co_await t.async_wait(ordo::use_tuple);
            }
            const double seconds = std::chrono::duration<double>(clock_type::now() - start).count();
            const auto& c = comm.counters();
            std::printf(
                "{\"workload\":\"oneway\",\"transport\":\"%s\",\"interval_ms\":%d,\"count\":%u,"
                "\"size\":%zu,\"seconds\":%.4f,\"rate\":%.0f,\"writes\":%llu,\"msgs_per_write\":%."
                "1f,"
                "\"peak_buffer_bytes\":%zu,\"ok\":%s}\n",
                cfg.transport.c_str(), cfg.interval_ms, cfg.count, cfg.size, seconds,
                cfg.count / seconds, static_cast<unsigned long long>(c.writes),
                c.messages_per_write(), c.peak_buffered_bytes,
                answered && confirmed == cfg.count ? "true" : "false");
            co_await comm.async_close();
            status = answered && confirmed == cfg.count ? 0 : 1;
        },
        net::detached);
    io.run();
    const bool server_ok = srv.wait();
    return status != 0 || !server_ok;
}
