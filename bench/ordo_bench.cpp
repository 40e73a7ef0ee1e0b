// ordo-bench: one harness for ordo's workloads and for the raw baselines they are measured
// against (bench/README.md).
//
//   ordo-bench [--workload oneway|seq|pipelined|hol|fanin|fanin-raw|cpu|beside-slow|stream|
//                          stream-batch|upload|bidi]
//              [--transport tcp|unix|inproc|zmq|tls|raw-tcp|raw-zmq]
//              [--mode ordered|pooled|naive|lanes] [--interval-ms N] [--count N] [--inflight K]
//              [--big-inflight N]
//              [--size BYTES] [--clients C] [--spin-us N] [--json] [--connect URL]
//              [--resume-ms N] [--work-us U] [--slow-ms S] [--server-threads N] [--offload]
//              [--window N] [--cuts N [--seed S]] [--meta KEY=VALUE]... [--traces N]
//              [--trace-sample RATE] [--concurrency adaptive|N] [--async-echo]
//   ordo-bench --serve URL [--transport T] [--interval-ms N] [--spin-us N] [--threads N]
//              [--offload] [--concurrency adaptive|N] [--async-echo]  (what the client starts)
//
// --concurrency adaptive|N: the server's concurrency limit (server_options::concurrency);
// --async-echo: echo is a coroutine, which such a limit counts (a plain function is not), to
// weigh what a limit costs each call.
//
// --traces N (pipelined): call i also carries traceparent i mod N, of N random traces made up
// front; --trace-sample RATE: the server records spans of that fraction of traces
// (ordo::record_spans), what 1% sampling costs is measured with both.
// --meta KEY=VALUE (pipelined): every echo call carries this metadata (docs/protocol.md, "Call
// context"), e.g. a W3C traceparent, to weigh a context against calls without one.
//
// --cuts N (tcp, --resume-ms): the client reaches the server through a proxy that resets the
// connection N times (bench/bench_cuts.hpp); every message must still arrive once and in order.
//
// The server runs --threads event loops (server_options::threads); the client passes its
// --server-threads (default 1) and --offload to the server it starts. Three workloads are about
// them (bench/README.md, "Several loops and many clients"):
// - cpu: --clients ordered connections from this one process, --inflight calls in flight split
//   evenly over them (at least 1 each; default 256 / 4 = 64), --count calls in all (20000) of
//   "work", which spins --work-us microseconds of CPU on the server's loop and returns its
//   argument. It shows what several loops add when the handlers compute.
// - beside-slow: two ordered connections; one always has a "slow" call in flight (--slow-ms of
//   CPU, 50; with --offload the server runs it on a worker_pool of one thread, through
//   handler_options::run_on, else on the loop), the other makes --count (1000) echo calls one
//   at a time, 1 ms apart, whose latencies are reported. It shows what a slow handler does to
//   its loop's other connections.
// - fanin-raw: fanin with a client that costs far less per call than the server, so that the
//   server is the bottleneck: --clients plain TCP connections (default 4) driven from one
//   thread with poll(), each keeping --inflight (256) echo requests in flight, pre-encoded
//   msgpack-rpc written in batches (msgids repeat every --inflight calls); every response is
//   checked byte for byte (msgid, no error, the payload back) and counted, no latencies are
//   taken. --count (1,000,000) calls in all. Only --transport tcp and --mode ordered (an ordo
//   tcp server, started as usual or at --connect tcp://IPV4:PORT).
// - stream: one streaming call on one ordered connection: the server writes --count items
//   (1,000,000) of --size bytes (16), each stamped with its sequence number, and the client
//   reads them, checking the order; --window is the stream's credit (0: ordo's default). The
//   stream's counterpart of oneway (bench/README.md, "Streams").
// - stream-batch: --clients streaming calls (4) on one ordered connection to a streaming batch
//   handler, --count items in all (1,000,000): each step of the batch gives every caller one
//   item; the client reads the streams at once, checking each one's order.
// - upload: one client stream (docs/protocol.md, "Streams both ways"): the client writes --count
//   items (1,000,000) of --size bytes (16), stamped; the handler reads them, checking the order,
//   and answers their number. The counterpart of stream the other way.
// - bidi: one two-way stream: the client writes --count items as in upload while it reads the
//   handler's echo of each, checking the order; --window is the credit for the echoes.
//
// Unless --connect is given, the client starts its server: `ordo-bench --serve URL` through
// fork/exec of this program (on a thread of this process for inproc://, which cannot cross
// processes). The server writes its bound address on stdout and serves until its stdin ends,
// which the client closes when done (or the kernel, if the client dies). Connections are made and
// warmed before the clock starts; every reply is checked: a wrong or missing one fails the run
// (exit status 1), as does a usage error (--help lists the flags).
//
// Payloads are --size bytes (at least 8) whose first 8 bytes are the message's sequence number.
// ordo sends them as a msgpack str in the params; raw-tcp frames them with a 4-byte length;
// raw-zmq sends them as one-frame messages.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iostream>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <asio/posix/stream_descriptor.hpp>
#include <zmq.hpp>

#include <ordo/ordo.hpp>

#include "bench_cuts.hpp"
#include "bench_options.hpp"
#include "support/streams.hpp"  // listen_url, connect_url, shared_tls_files

namespace net = ordo::net;
using clock_type = std::chrono::steady_clock;

namespace {

// ---------------------------------------------------------------- configuration

[[noreturn]] void fail(const std::string& what) {
    throw std::runtime_error(what);
}

bool is_raw(const config& c) {
    return c.transport.rfind("raw-", 0) == 0;
}

// The scheme ordo's URLs use for a --transport name.
std::string scheme_of(const std::string& transport) {
    return transport == "zmq" ? "zmq+tcp" : transport;
}

// Checks the combination of flags and fills in the workload's defaults.
void complete(config& c) {
    c.inflight = std::max(1L, c.inflight);
    c.clients = std::max(1, c.clients);
    const std::vector<std::string> workloads{"oneway", "seq",         "pipelined", "hol",
                                             "fanin",  "fanin-raw",   "cpu",       "beside-slow",
                                             "stream", "stream-batch", "upload",    "bidi"};
    const std::vector<std::string> transports{"tcp", "unix",    "inproc", "zmq",
                                              "tls", "raw-tcp", "raw-zmq"};
    if (std::find(workloads.begin(), workloads.end(), c.workload) == workloads.end())
        fail("unknown workload " + c.workload);
    if (std::find(transports.begin(), transports.end(), c.transport) == transports.end())
        fail("unknown transport " + c.transport);
    if (c.mode != "ordered" && c.mode != "pooled" && c.mode != "naive" && c.mode != "lanes")
        fail("unknown mode " + c.mode + " (ordered, pooled, naive or lanes)");
    if (c.mode == "lanes" && c.workload != "hol")
        fail("--mode lanes is for hol: an ordered channel whose big calls go on their own lane");
    if (c.size == 0) c.size = c.workload == "hol" ? 1 << 20 : 16;
    if (c.size < 8) fail("--size must be at least 8 (the sequence number)");
    if (c.count == 0)
        c.count = c.workload == "oneway" || c.workload.starts_with("stream") ||
                          c.workload == "upload" || c.workload == "bidi"
                      ? 1'000'000
                  : c.workload == "hol"                                      ? 50
                  : c.workload == "cpu"                                      ? 20'000
                  : c.workload == "beside-slow"                              ? 1000
                  : c.workload == "fanin-raw"                                ? 1'000'000
                                                                             : 100'000;
    if (c.workload == "oneway" && c.mode != "ordered")
        fail("oneway runs on one ordered channel: --mode ordered");
    if (c.mode == "naive" && c.workload != "pipelined" && c.workload != "seq")
        fail("--mode naive (a connection per call) is for seq and pipelined");
    if (is_raw(c) && (c.workload == "hol" || c.mode != "ordered"))
        fail("raw baselines run oneway, seq, pipelined and fanin, in mode ordered");
    if (c.workload == "fanin" && c.transport == "inproc")
        fail("fanin runs client processes: inproc:// cannot reach them");
    if ((c.workload == "cpu" || c.workload == "beside-slow") && (is_raw(c) || c.mode != "ordered"))
        fail("cpu and beside-slow run on ordo's ordered channels: not raw, --mode ordered");
    if ((c.workload.starts_with("stream") || c.workload == "upload" || c.workload == "bidi") &&
        (is_raw(c) || c.mode != "ordered"))
        fail("stream, stream-batch, upload and bidi run on ordo's ordered channels: not raw, "
             "--mode ordered");
    if (c.cuts > 0 && (c.transport != "tcp" || c.mode != "ordered" || c.resume_ms <= 0 ||
                       c.workload.starts_with("fanin")))
        fail("--cuts needs --transport tcp, --mode ordered, --resume-ms and one client");
    if (c.cuts > 0 && c.seed == 0)
        c.seed = static_cast<long>(clock_type::now().time_since_epoch().count() % 1'000'000'007);
    if (c.workload == "fanin-raw" && (c.transport != "tcp" || c.mode != "ordered" || c.resume_ms))
        fail(
            "fanin-raw writes msgpack-rpc from plain sockets to ordo's tcp server: "
            "--transport tcp, --mode ordered, no --resume-ms");
}

// Keeps the thread busy for `d` (reading the clock until it has passed): real CPU, as a handler
// that computes, not a sleep.
void spin_for(std::chrono::microseconds d) {
    const auto until = clock_type::now() + d;
    while (clock_type::now() < until) {
    }
}

// ---------------------------------------------------------------- payloads and numbers

void put_be64(char* p, std::uint64_t v) {
    for (int i = 0; i < 8; ++i) p[i] = static_cast<char>(v >> (56 - 8 * i));
}

void stamp(std::string& p, std::uint64_t seq) {
    put_be64(p.data(), seq);
}

std::uint64_t seq_of(const char* p) {
    std::uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v = (v << 8) | static_cast<unsigned char>(p[i]);
    return v;
}

std::string payload(std::size_t size, std::uint64_t seq) {
    std::string p(size, 'x');
    stamp(p, seq);
    return p;
}

double micros(clock_type::duration d) {
    return std::chrono::duration<double, std::micro>(d).count();
}

double seconds_since(clock_type::time_point t) {
    return std::chrono::duration<double>(clock_type::now() - t).count();
}

double cpu_seconds(const rusage& r) {
    return double(r.ru_utime.tv_sec) + double(r.ru_stime.tv_sec) +
           (double(r.ru_utime.tv_usec) + double(r.ru_stime.tv_usec)) / 1e6;
}

double process_cpu() {
    rusage r{};
    ::getrusage(RUSAGE_SELF, &r);
    return cpu_seconds(r);
}

double thread_cpu() {
    timespec ts{};
    ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + double(ts.tv_nsec) / 1e9;
}

/// What one client run measured.
struct result {
    double seconds = 0;
    long calls = 0;             // messages or calls counted in the rate
    std::vector<float> lat_us;  // per call (empty for oneway)
    double big_mb_s = 0;        // hol: the big calls' payload bytes per second (each way)
    double msgs_per_write = 0;
    std::uint64_t peak_buffer_bytes = 0;
};

double percentile(const std::vector<float>& sorted, double p) {
    if (sorted.empty()) return 0;
    const auto k = std::min(sorted.size() - 1, static_cast<std::size_t>(p * double(sorted.size())));
    return sorted[k];
}

void write_all(int fd, const char* p, std::size_t n) {
    while (n > 0) {
        const ssize_t w = ::write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) fail(std::string("write failed: ") + std::strerror(errno));
        p += w;
        n -= static_cast<std::size_t>(w);
    }
}

bool read_all(int fd, char* p, std::size_t n) {
    while (n > 0) {
        const ssize_t r = ::read(fd, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        p += r;
        n -= static_cast<std::size_t>(r);
    }
    return true;
}

// ---------------------------------------------------------------- ordo server

struct oneway_state {
    std::uint64_t received = 0;
    bool in_order = true;
};

/// Serves echo, the oneway notifications and their verdict, work (cpu) and slow (beside-slow)
/// until `stop_fd` ends, on cfg.threads loops (this thread is loop 0).
int serve_ordo(const config& cfg, const std::string& url, int ready_fd, int stop_fd) {
    net::io_context io(1);
    // A slow call still running on the pool when the server stops posts its answer back to a
    // loop: the pool is joined before the server goes (handler_options::run_on).
    std::optional<ordo::worker_pool> pool;
    if (cfg.offload) pool.emplace(1);
    ordo::server_options so;
    so.peer.comm.interval = std::chrono::milliseconds(cfg.interval_ms);
    so.threads = static_cast<std::size_t>(cfg.threads);
    so.peer.lane_window = static_cast<std::size_t>(cfg.lane_window);
    if (!cfg.auth_tokens.empty())
        so.authenticate = ordo::authenticate_tokens(ordo::read_token_file(cfg.auth_tokens));
    if (cfg.concurrency == "adaptive")
        so.concurrency = ordo::adaptive;
    else if (!cfg.concurrency.empty())
        so.concurrency = static_cast<std::size_t>(std::stoul(cfg.concurrency));
    so.shares.queue = cfg.fair_queue;
    ordo::server srv(io.get_executor(), so);
    if (cfg.trace_sample >= 0) ordo::record_spans({.sample_rate = cfg.trace_sample});
    oneway_state st;  // oneway runs one connection: one loop touches it
    if (cfg.async_echo) {
        ordo::handler_options concurrent;
        concurrent.concurrent = true;
        srv.on(
            "echo", [](msgpack::object v) -> net::awaitable<msgpack::object> { co_return v; },
            concurrent);
    } else {
        srv.on("echo", [](msgpack::object v) { return v; });
    }
    srv.on("work", [](std::uint32_t us, msgpack::object v) {
        spin_for(std::chrono::microseconds(us));
        return v;
    });
    ordo::handler_options slow_on;
    if (pool) slow_on.run_on = pool->get_executor();
    srv.on(
        "slow",
        [](std::uint32_t ms, std::uint64_t seq) {
            spin_for(std::chrono::milliseconds(ms));
            return seq;
        },
        slow_on);
    srv.on("n", [&st](msgpack::object p) {
        if (p.type != msgpack::type::STR || p.via.str.size < 8 ||
            seq_of(p.via.str.ptr) != st.received)
            st.in_order = false;
        ++st.received;
    });
    // stream: n items of `size` bytes, each stamped with its sequence number.
    srv.on("items",
           [](ordo::writer<std::string_view>& out, std::uint64_t n,
              std::uint32_t size) -> net::awaitable<void> {
               std::string p = payload(size, 0);
               for (std::uint64_t i = 0; i < n; ++i) {
                   stamp(p, i);
                   co_await out.write(p);
               }
           });
    // upload: the items' number, once read in order.
    srv.on("upload_items",
           [](ordo::reader<std::string_view>& in) -> net::awaitable<std::uint64_t> {
               std::uint64_t i = 0;
               while (auto v = co_await in.next()) {
                   if (v->size() < 8 || seq_of(v->data()) != i)
                       throw std::runtime_error("upload: item " + std::to_string(i) +
                                                " out of order");
                   ++i;
               }
               co_return i;
           });
    // bidi: each item back as it came.
    srv.on("echo_items",
           [](ordo::reader<std::string_view>& in,
              ordo::writer<std::string_view>& out) -> net::awaitable<void> {
               while (auto v = co_await in.next()) co_await out.write(*v);
           });
    // stream-batch: each caller gets n items; step k gives every open caller item k.
    srv.on_batch_stream(
        "items_batch", {.max_batch_size = 1024, .max_wait = std::chrono::milliseconds(2)},
        [](ordo::batch_writer<std::string>& out,
           std::vector<std::tuple<std::uint64_t, std::uint32_t>> args) -> net::awaitable<void> {
            std::vector<std::string> p;
            for (auto& a : args) p.push_back(payload(std::get<1>(a), 0));
            for (std::uint64_t k = 0; !out.open().empty(); ++k) {
                std::vector<ordo::stream_step<std::string>> step;
                step.reserve(out.open().size());
                for (std::size_t i : out.open()) {
                    if (k < std::get<0>(args[i])) {
                        stamp(p[i], k);
                        step.emplace_back(p[i]);
                    } else {
                        step.emplace_back(ordo::stream_end{});
                    }
                }
                co_await out.step(std::move(step));
            }
        });
    srv.on("done", [&st]() {
        std::vector<std::uint64_t> verdict{st.received, st.in_order ? 1u : 0u};
        st = {};
        return verdict;
    });
    const std::string bound = srv.listen(url) + "\n";
    write_all(ready_fd, bound.data(), bound.size());
    ::close(ready_fd);
    net::posix::stream_descriptor stop(io, stop_fd);
    net::co_spawn(
        io,
        [&]() -> net::awaitable<void> {
            char c;
            co_await stop.async_read_some(net::buffer(&c, 1), ordo::use_tuple);  // EOF: done
            co_await srv.async_stop();
        },
        net::detached);
    ordo::run_spinning(io, std::chrono::microseconds(cfg.spin_us));
    if (pool) pool->join();
    return 0;
}

// ---------------------------------------------------------------- raw TCP baseline

// Frames: a 4-byte big-endian length, then the payload. A connection starts with one byte:
// 'E' (echo every frame back) or 'O' followed by an 8-byte count (one-way: check the frames'
// order and answer one byte, '1' in order or '0' not, once `count` frames have arrived).

void put_frame(std::string& out, const std::string& p) {
    const auto n = static_cast<std::uint32_t>(p.size());
    const char h[4] = {char(n >> 24), char(n >> 16), char(n >> 8), char(n)};
    out.append(h, 4);
    out += p;
}

std::uint32_t frame_len(const char* p) {
    return (std::uint32_t(std::uint8_t(p[0])) << 24) | (std::uint32_t(std::uint8_t(p[1])) << 16) |
           (std::uint32_t(std::uint8_t(p[2])) << 8) | std::uint32_t(std::uint8_t(p[3]));
}

void nodelay(int fd) {
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// Hands every whole frame in in[0, have) to `on_frame(payload, size)`, keeps the partial one at
// the front (growing `in` to fit it) and updates `have`.
template <class F>
void take_frames(std::vector<char>& in, std::size_t& have, F&& on_frame) {
    std::size_t pos = 0;
    while (have - pos >= 4) {
        const std::size_t n = frame_len(in.data() + pos);
        if (have - pos < 4 + n) {
            if (4 + n > in.size()) in.resize(4 + n);
            break;
        }
        on_frame(in.data() + pos + 4, n);
        pos += 4 + n;
    }
    std::memmove(in.data(), in.data() + pos, have - pos);
    have -= pos;
}

// Waits up to spin_us for bytes on `fd` without sleeping (so that the read that follows does
// not pay a wake-up), as ordo::run_spinning does for ordo.
void spin_for_input(int fd, int spin_us) {
    if (spin_us <= 0) return;
    const auto until = clock_type::now() + std::chrono::microseconds(spin_us);
    char c;
    while (::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) < 0 && errno == EAGAIN &&
           clock_type::now() < until) {
    }
}

void raw_tcp_connection(int fd, int spin_us) {
    char kind = 0;
    if (!read_all(fd, &kind, 1)) return (void)::close(fd);
    std::uint64_t expect_count = 0;
    if (kind == 'O') {
        char c[8];
        if (!read_all(fd, c, 8)) return (void)::close(fd);
        expect_count = seq_of(c);
    }
    std::vector<char> in(1 << 20);
    std::size_t have = 0;
    std::string out;
    std::uint64_t received = 0;
    bool in_order = true;
    for (;;) {
        if (have == in.size()) in.resize(in.size() * 2);
        spin_for_input(fd, spin_us);
        const ssize_t r = ::read(fd, in.data() + have, in.size() - have);
        if (r <= 0) break;
        have += static_cast<std::size_t>(r);
        take_frames(in, have, [&](const char* f, std::size_t n) {
            if (kind == 'E') {
                out.append(f - 4, 4 + n);  // the frame as it came, length included
            } else {
                if (n < 8 || seq_of(f) != received) in_order = false;
                if (++received == expect_count) out += in_order ? '1' : '0';
            }
        });
        if (!out.empty()) {
            write_all(fd, out.data(), out.size());
            out.clear();
        }
    }
    ::close(fd);
}

int serve_raw_tcp(int ready_fd, int spin_us) {
    const int l = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (::bind(l, reinterpret_cast<sockaddr*>(&a), len) != 0 || ::listen(l, 128) != 0 ||
        ::getsockname(l, reinterpret_cast<sockaddr*>(&a), &len) != 0)
        fail(std::string("raw-tcp: cannot listen: ") + std::strerror(errno));
    const std::string bound = "raw-tcp://127.0.0.1:" + std::to_string(ntohs(a.sin_port)) + "\n";
    write_all(ready_fd, bound.data(), bound.size());
    ::close(ready_fd);
    std::thread([l, spin_us] {
        for (;;) {
            const int fd = ::accept4(l, nullptr, nullptr, SOCK_CLOEXEC);
            if (fd < 0) return;
            nodelay(fd);
            std::thread(raw_tcp_connection, fd, spin_us).detach();
        }
    }).detach();
    char c;
    while (::read(0, &c, 1) > 0) {
    }
    std::_Exit(0);  // the connection threads are blocked in read(): end them with the process
}

// A blocking TCP connection to SCHEME://IPV4:PORT[?params] (raw-tcp; fanin-raw: tcp).
int tcp_connect(const std::string& url, const std::string& scheme) {
    const auto sep = url.find("://");
    const std::string rest = sep == std::string::npos ? "" : url.substr(sep + 3);
    const std::string host_port = rest.substr(0, rest.find('?'));
    const auto colon = host_port.rfind(':');
    if (url.rfind(scheme + "://", 0) != 0 || colon == std::string::npos)
        fail("not a " + scheme + ":// URL with an IPv4 address: " + url);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(std::stoi(host_port.substr(colon + 1))));
    const std::string host = host_port.substr(0, colon);
    if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) fail("bad IPv4 host " + host);
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
        const std::string why = std::strerror(errno);
        ::close(fd);
        fail("cannot connect to " + url + ": " + why);
    }
    nodelay(fd);
    return fd;
}

// Reads whole frames from `fd` into `in` (keeping a partial one) and hands each to `on_frame`.
template <class F>
bool read_frames(int fd, std::vector<char>& in, std::size_t& have, F&& on_frame) {
    if (have == in.size()) in.resize(in.size() * 2);
    const ssize_t r = ::read(fd, in.data() + have, in.size() - have);
    if (r == 0) fail("raw-tcp: the server closed the connection");
    if (r < 0) return errno == EAGAIN || errno == EINTR;
    have += static_cast<std::size_t>(r);
    take_frames(in, have, on_frame);
    return true;
}

// Blocking ping-pong (inflight 1) or a window of `inflight` requests over a non-blocking socket.
result raw_tcp_calls(const config& cfg, int fd, long count, long inflight) {
    const char e = 'E';
    write_all(fd, &e, 1);
    result res;
    res.lat_us.reserve(static_cast<std::size_t>(count));
    std::string p = payload(static_cast<std::size_t>(cfg.size), 0);
    std::vector<char> in(1 << 16);
    std::size_t have = 0;
    std::string out;
    if (inflight <= 1) {
        const auto start = clock_type::now();
        for (long i = 0; i < count; ++i) {
            stamp(p, static_cast<std::uint64_t>(i));
            out.clear();
            put_frame(out, p);
            const auto t0 = clock_type::now();
            write_all(fd, out.data(), out.size());
            spin_for_input(fd, cfg.spin_us);
            if (!read_all(fd, in.data(), 4)) fail("raw-tcp: connection ended");
            const std::size_t n = frame_len(in.data());
            if (n + 4 > in.size()) in.resize(n + 4);
            if (!read_all(fd, in.data() + 4, n)) fail("raw-tcp: connection ended");
            res.lat_us.push_back(static_cast<float>(micros(clock_type::now() - t0)));
            if (n != p.size() || seq_of(in.data() + 4) != static_cast<std::uint64_t>(i))
                fail("raw-tcp: wrong reply");
        }
        res.seconds = seconds_since(start);
        res.calls = count;
        return res;
    }
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    std::vector<clock_type::time_point> sent_at(static_cast<std::size_t>(count));
    long sent = 0, received = 0, writes = 0;
    std::size_t out_pos = 0;
    const auto start = clock_type::now();
    while (received < count) {
        while (sent < count && sent - received < inflight) {
            stamp(p, static_cast<std::uint64_t>(sent));
            put_frame(out, p);
            sent_at[static_cast<std::size_t>(sent++)] = clock_type::now();
        }
        pollfd pf{fd, static_cast<short>(POLLIN | (out_pos < out.size() ? POLLOUT : 0)), 0};
        if (::poll(&pf, 1, 10'000) <= 0) fail("raw-tcp: no progress for 10 s");
        if ((pf.revents & POLLOUT) && out_pos < out.size()) {
            const ssize_t w = ::write(fd, out.data() + out_pos, out.size() - out_pos);
            if (w > 0) {
                out_pos += static_cast<std::size_t>(w);
                ++writes;
                if (out_pos == out.size()) out.clear(), out_pos = 0;
            }
        }
        if (pf.revents & (POLLIN | POLLHUP | POLLERR)) {
            read_frames(fd, in, have, [&](const char* f, std::size_t n) {
                if (n != p.size() || seq_of(f) != static_cast<std::uint64_t>(received))
                    fail("raw-tcp: wrong reply");
                res.lat_us.push_back(static_cast<float>(
                    micros(clock_type::now() - sent_at[static_cast<std::size_t>(received)])));
                ++received;
            });
        }
    }
    res.seconds = seconds_since(start);
    res.calls = count;
    res.msgs_per_write = writes ? double(count) / double(writes) : 0;
    return res;
}

result raw_tcp_oneway(const config& cfg, int fd) {
    std::string hello(9, 'O');
    put_be64(hello.data() + 1, static_cast<std::uint64_t>(cfg.count));
    write_all(fd, hello.data(), hello.size());
    std::string p = payload(static_cast<std::size_t>(cfg.size), 0);
    std::string out;
    out.reserve(64 * 1024 + p.size() + 4);
    long writes = 0;
    result res;
    const auto start = clock_type::now();
    for (long i = 0; i < cfg.count; ++i) {
        stamp(p, static_cast<std::uint64_t>(i));
        put_frame(out, p);
        if (out.size() >= 64 * 1024 || i + 1 == cfg.count) {
            write_all(fd, out.data(), out.size());
            out.clear();
            ++writes;
        }
    }
    char verdict = 0;
    if (!read_all(fd, &verdict, 1)) fail("raw-tcp: the server ended before its verdict");
    res.seconds = seconds_since(start);
    if (verdict != '1') fail("raw-tcp: the server saw the messages out of order");
    res.calls = cfg.count;
    res.msgs_per_write = double(cfg.count) / double(writes);
    return res;
}

// ---------------------------------------------------------------- fanin-raw: a cheap client

// fanin-raw's client: --clients plain TCP connections to an ordo tcp server, driven from this
// one thread with poll(). Each connection keeps --inflight echo requests in flight, taken from
// a block encoded once: `inflight` requests [0, msgid, "echo", [payload]] with msgids
// 0..inflight-1 (always as uint32, so every request has the same size), written twice in a
// row so that any run of up to `inflight` consecutive requests is one contiguous write. A
// msgid comes back before it is sent again: request k goes out once response k - inflight is
// in. ordo answers echo (a handler that does not suspend) in order, so response k must be
// [1, k % inflight, nil, the request's payload] byte for byte; anything else (an error, another
// message, a closed connection, 10 s without progress) fails the run. No latencies are taken.

/// A connection of fanin-raw's client; counts are of requests since it was opened.
struct raw_rpc_conn {
    int fd = -1;
    long sent = 0;              // requests released (their bytes written or pending)
    long received = 0;          // responses checked
    std::uint64_t written = 0;  // bytes of the request stream written
    std::vector<char> in;       // unparsed bytes of responses
    std::size_t have = 0;
    bool want_out = false;  // the socket took part of a write: wait for POLLOUT
};

/// The requests of one window, encoded once (see above).
struct raw_rpc_block {
    std::string bytes;          // 2 * window requests
    std::size_t request = 0;    // bytes of one request
    std::size_t result_at = 0;  // where a request's str (header and payload) starts in it
    long window = 0;
};

void put_str_header(std::string& out, std::size_t n) {
    if (n < 32) {
        out += char(0xa0 | n);
    } else if (n < 256) {
        out += '\xd9';
        out += char(n);
    } else if (n < 65536) {
        out += '\xda';
        out += char(n >> 8);
        out += char(n);
    } else {
        out += '\xdb';
        for (int s = 24; s >= 0; s -= 8) out += char(n >> s);
    }
}

raw_rpc_block encode_requests(std::size_t size, long window) {
    raw_rpc_block b;
    b.window = window;
    const std::string head("\x94\x00\xce", 3);                 // [0, msgid (uint32) ...
    std::string tail = '\xa4' + std::string("echo") + '\x91';  // ..., "echo", [payload]]
    b.result_at = head.size() + 4 + tail.size();               // the str, which echo returns
    put_str_header(tail, size);
    b.request = head.size() + 4 + tail.size() + size;
    if (double(b.request) * double(window) > double(128 << 20))
        fail("fanin-raw: --inflight x --size is over 128 MiB of requests per window");
    b.bytes.reserve(2 * b.request * static_cast<std::size_t>(window));
    for (int copy = 0; copy < 2; ++copy) {
        for (long id = 0; id < window; ++id) {
            b.bytes += head;
            for (int s = 24; s >= 0; s -= 8) b.bytes += char(std::uint32_t(id) >> s);
            b.bytes += tail;
            b.bytes += payload(size, static_cast<std::uint64_t>(id));
        }
    }
    return b;
}

// The msgpack object at p (up to n bytes) as text, for an error message.
std::string describe_msgpack(const char* p, std::size_t n) {
    try {
        std::size_t off = 0;
        const auto h = msgpack::unpack(p, n, off);
        std::ostringstream s;
        s << h.get();
        std::string t = s.str();
        return t.size() > 300 ? t.substr(0, 300) + "..." : t;
    } catch (const std::exception&) {
        return "undecodable msgpack (" + std::to_string(n) + " bytes)";
    }
}

// Checks the response at p[0, n) against request `k` of `b`; returns its size, or 0 if it is
// not complete yet. A wrong one fails the run.
std::size_t take_response(const raw_rpc_block& b, const char* p, std::size_t n, long k) {
    auto u = [p](std::size_t i) { return std::uint8_t(p[i]); };
    auto wrong = [&](const char* why) {
        fail("fanin-raw: response " + std::to_string(k) + " " + why + ": " +
             describe_msgpack(p, n));
    };
    if (n < 3) return 0;
    if (u(0) != 0x94 || u(1) != 0x01) wrong("is not a response");
    const std::uint8_t t = u(2);
    const std::size_t id_bytes = t < 0x80 ? 0 : t == 0xcc ? 1 : t == 0xcd ? 2 : t == 0xce ? 4 : 9;
    if (id_bytes == 9) wrong("has a msgid that is not a uint32");
    if (n < 3 + id_bytes + 1) return 0;
    std::uint64_t id = t < 0x80 ? t : 0;
    for (std::size_t i = 0; i < id_bytes; ++i) id = (id << 8) | u(3 + i);
    std::size_t at = 3 + id_bytes;
    if (id != static_cast<std::uint64_t>(k % b.window)) wrong("has the wrong msgid");
    if (u(at) != 0xc0) {
        // An error: wait for the whole message, to show it.
        try {
            std::size_t off = 0;
            (void)msgpack::unpack(p, n, off);
        } catch (const msgpack::insufficient_bytes&) {
            return 0;
        } catch (const std::exception&) {
        }
        wrong("is an error");
    }
    ++at;
    // The result must be the request's str, header and payload, byte for byte.
    const char* req = b.bytes.data() + static_cast<std::size_t>(k % b.window) * b.request;
    const std::size_t result_bytes = b.request - b.result_at;
    if (n < at + result_bytes) return 0;
    if (std::memcmp(p + at, req + b.result_at, result_bytes) != 0) wrong("has the wrong result");
    return at + result_bytes;
}

// Releases requests of `c` up to `target` (at most a window ahead of its responses) and writes
// what is pending, as far as the socket takes it. Counts the writes in `writes`.
void raw_rpc_top_up(const raw_rpc_block& b, raw_rpc_conn& c, long target, long& writes) {
    c.sent = std::max(c.sent, std::min(target, c.received + b.window));
    const std::uint64_t end = static_cast<std::uint64_t>(c.sent) * b.request;
    if (c.written == end) {
        c.want_out = false;
        return;
    }
    // Pending bytes are at most one window: contiguous in the doubled block.
    const std::size_t at = c.written % (b.request * static_cast<std::size_t>(b.window));
    const ssize_t w = ::send(c.fd, b.bytes.data() + at, end - c.written, MSG_NOSIGNAL);
    if (w < 0 && errno != EAGAIN && errno != EINTR)
        fail(std::string("fanin-raw: write failed: ") + std::strerror(errno));
    if (w > 0) {
        c.written += static_cast<std::uint64_t>(w);
        ++writes;
    }
    c.want_out = c.written < end;
}

// Reads what `c` has and checks every whole response in it.
void raw_rpc_drain(const raw_rpc_block& b, raw_rpc_conn& c) {
    if (c.have == c.in.size()) c.in.resize(c.in.size() * 2);
    const ssize_t r = ::read(c.fd, c.in.data() + c.have, c.in.size() - c.have);
    if (r == 0) fail("fanin-raw: the server closed a connection");
    if (r < 0) {
        if (errno == EAGAIN || errno == EINTR) return;
        fail(std::string("fanin-raw: read failed: ") + std::strerror(errno));
    }
    c.have += static_cast<std::size_t>(r);
    std::size_t pos = 0;
    while (pos < c.have) {
        if (c.received == c.sent) fail("fanin-raw: a message that answers no request");
        const std::size_t n = take_response(b, c.in.data() + pos, c.have - pos, c.received);
        if (n == 0) break;
        pos += n;
        ++c.received;
    }
    std::memmove(c.in.data(), c.in.data() + pos, c.have - pos);
    c.have -= pos;
}

// Runs every connection until it has `target` responses; fails after 10 s without progress.
void raw_rpc_pump(const raw_rpc_block& b, std::vector<raw_rpc_conn>& conns, long target,
                  long& writes) {
    std::vector<pollfd> pfs(conns.size());
    for (;;) {
        std::size_t busy = 0;
        for (std::size_t i = 0; i < conns.size(); ++i) {
            auto& c = conns[i];
            if (!c.want_out) raw_rpc_top_up(b, c, target, writes);
            if (c.received < target) ++busy;
            pfs[i] = {c.fd, static_cast<short>(POLLIN | (c.want_out ? POLLOUT : 0)), 0};
        }
        if (busy == 0) return;
        if (::poll(pfs.data(), pfs.size(), 10'000) <= 0) fail("fanin-raw: no progress for 10 s");
        for (std::size_t i = 0; i < conns.size(); ++i) {
            if (pfs[i].revents & POLLOUT) raw_rpc_top_up(b, conns[i], target, writes);
            if (pfs[i].revents & (POLLIN | POLLHUP | POLLERR)) raw_rpc_drain(b, conns[i]);
        }
    }
}

// fanin-raw: --clients connections from this thread, --count calls split evenly over them
// (after a window each to warm them), as the comment above says.
result run_fanin_raw(const config& cfg, const std::string& url) {
    const long per = std::max(1L, cfg.count / cfg.clients);
    const raw_rpc_block b = encode_requests(static_cast<std::size_t>(cfg.size), cfg.inflight);
    std::vector<raw_rpc_conn> conns(static_cast<std::size_t>(cfg.clients));
    result res;
    try {
        for (auto& c : conns) {
            c.fd = tcp_connect(url, "tcp");
            ::fcntl(c.fd, F_SETFL, ::fcntl(c.fd, F_GETFL) | O_NONBLOCK);
            c.in.resize(std::max<std::size_t>(1 << 16, 2 * b.request + 64));
        }
        long writes = 0;
        raw_rpc_pump(b, conns, cfg.inflight, writes);  // warm
        writes = 0;
        const auto start = clock_type::now();
        raw_rpc_pump(b, conns, cfg.inflight + per, writes);
        res.seconds = seconds_since(start);
        res.calls = per * cfg.clients;
        res.msgs_per_write = writes ? double(res.calls) / double(writes) : 0;
    } catch (...) {
        for (auto& c : conns)
            if (c.fd >= 0) ::close(c.fd);
        throw;
    }
    for (auto& c : conns) ::close(c.fd);
    return res;
}

// ---------------------------------------------------------------- raw ZeroMQ baseline

// The server binds a ROUTER (echoes every message it gets, so REQ and DEALER clients both work)
// and a PULL (one-way messages, order checked). A request "?" + 8-byte count on the ROUTER asks
// for the one-way verdict; it is answered ("1" in order, "0" not) once that many have arrived.
int serve_raw_zmq(int ready_fd) {
    zmq::context_t ctx(1);
    zmq::socket_t router(ctx, zmq::socket_type::router), pull(ctx, zmq::socket_type::pull);
    router.set(zmq::sockopt::linger, 0);
    pull.set(zmq::sockopt::linger, 0);
    router.bind("tcp://127.0.0.1:*");
    pull.bind("tcp://127.0.0.1:*");
    auto port = [](zmq::socket_t& s) {
        const std::string e = s.get(zmq::sockopt::last_endpoint);
        return e.substr(e.rfind(':') + 1);
    };
    const std::string bound = "raw-zmq://127.0.0.1:" + port(router) + "/" + port(pull) + "\n";
    write_all(ready_fd, bound.data(), bound.size());
    ::close(ready_fd);
    std::uint64_t received = 0, asked = 0;
    bool in_order = true;
    std::vector<zmq::message_t> verdict_to;  // the asking request's envelope
    auto answer = [&] {
        if (verdict_to.empty() || received < asked) return;
        for (auto& f : verdict_to) router.send(std::move(f), zmq::send_flags::sndmore);
        router.send(zmq::buffer(std::string(in_order && received == asked ? "1" : "0")));
        verdict_to.clear();
        received = 0;
        in_order = true;
    };
    std::vector<zmq::message_t> frames;
    for (;;) {
        zmq::pollitem_t items[] = {{router.handle(), 0, ZMQ_POLLIN, 0},
                                   {pull.handle(), 0, ZMQ_POLLIN, 0},
                                   {nullptr, 0, ZMQ_POLLIN, 0}};
        zmq::poll(items, 3, std::chrono::milliseconds(-1));
        if (items[2].revents & (ZMQ_POLLIN | ZMQ_POLLERR)) {  // a pipe's end is POLLHUP: POLLERR
            char c;
            if (::read(0, &c, 1) <= 0) std::_Exit(0);
        }
        if (items[0].revents & ZMQ_POLLIN) {
            for (int burst = 0; burst < 1024; ++burst) {
                frames.clear();
                zmq::message_t m;
                if (!router.recv(m, zmq::recv_flags::dontwait)) break;
                frames.push_back(std::move(m));
                while (frames.back().more()) {
                    zmq::message_t part;
                    (void)router.recv(part, zmq::recv_flags::none);
                    frames.push_back(std::move(part));
                }
                const auto& last = frames.back();
                if (last.size() == 9 && static_cast<const char*>(last.data())[0] == '?') {
                    asked = seq_of(static_cast<const char*>(last.data()) + 1);
                    frames.pop_back();
                    verdict_to = std::move(frames);
                    answer();
                    continue;
                }
                for (std::size_t i = 0; i < frames.size(); ++i)
                    router.send(std::move(frames[i]), i + 1 < frames.size()
                                                          ? zmq::send_flags::sndmore
                                                          : zmq::send_flags::none);
            }
        }
        if (items[1].revents & ZMQ_POLLIN) {
            for (int burst = 0; burst < 4096; ++burst) {
                zmq::message_t m;
                if (!pull.recv(m, zmq::recv_flags::dontwait)) break;
                if (m.size() < 8 || seq_of(static_cast<const char*>(m.data())) != received)
                    in_order = false;
                ++received;
            }
            answer();
        }
    }
}

struct zmq_endpoints {
    std::string router, pull;
};

zmq_endpoints zmq_urls(const std::string& url) {
    // raw-zmq://HOST:ROUTERPORT/PULLPORT
    const auto slash = url.rfind('/'), colon = url.rfind(':');
    if (url.rfind("raw-zmq://", 0) != 0 || slash < colon || colon == std::string::npos)
        fail("not a raw-zmq URL: " + url);
    const std::string host = url.substr(10, colon - 10);
    return {"tcp://" + host + ":" + url.substr(colon + 1, slash - colon - 1),
            "tcp://" + host + ":" + url.substr(slash + 1)};
}

result raw_zmq_calls(const config& cfg, zmq::context_t& ctx, const std::string& url, long count,
                     long inflight) {
    result res;
    res.lat_us.reserve(static_cast<std::size_t>(count));
    std::string p = payload(static_cast<std::size_t>(cfg.size), 0);
    const bool req = inflight <= 1;  // REQ/REP ping-pong, else DEALER/ROUTER with a window
    zmq::socket_t s(ctx, req ? zmq::socket_type::req : zmq::socket_type::dealer);
    s.set(zmq::sockopt::linger, 0);
    s.connect(zmq_urls(url).router);
    auto check = [&](const zmq::message_t& m, long i) {
        if (m.size() != p.size() ||
            seq_of(static_cast<const char*>(m.data())) != static_cast<std::uint64_t>(i))
            fail("raw-zmq: wrong reply");
    };
    // Warm: the connection is made before the clock starts.
    s.send(zmq::buffer(p));
    zmq::message_t m;
    (void)s.recv(m);
    check(m, 0);
    std::vector<clock_type::time_point> sent_at(static_cast<std::size_t>(count));
    long sent = 0, received = 0;
    const auto start = clock_type::now();
    while (received < count) {
        while (sent < count && sent - received < inflight) {
            stamp(p, static_cast<std::uint64_t>(sent));
            sent_at[static_cast<std::size_t>(sent)] = clock_type::now();
            s.send(zmq::buffer(p));
            ++sent;
        }
        if (!s.recv(m)) fail("raw-zmq: receive failed");
        res.lat_us.push_back(static_cast<float>(
            micros(clock_type::now() - sent_at[static_cast<std::size_t>(received)])));
        check(m, received++);
    }
    res.seconds = seconds_since(start);
    res.calls = count;
    return res;
}

result raw_zmq_oneway(const config& cfg, zmq::context_t& ctx, const std::string& url) {
    const auto eps = zmq_urls(url);
    zmq::socket_t push(ctx, zmq::socket_type::push), req(ctx, zmq::socket_type::req);
    push.set(zmq::sockopt::linger, 0);
    req.set(zmq::sockopt::linger, 0);
    push.connect(eps.pull);
    req.connect(eps.router);
    std::string p = payload(static_cast<std::size_t>(cfg.size), 0);
    std::string ask(9, '?');
    put_be64(ask.data() + 1, static_cast<std::uint64_t>(cfg.count));
    // Warm: both connections up before the clock starts.
    req.send(zmq::buffer(std::string("warm-up!")));
    zmq::message_t m;
    (void)req.recv(m);
    result res;
    const auto start = clock_type::now();
    for (long i = 0; i < cfg.count; ++i) {
        stamp(p, static_cast<std::uint64_t>(i));
        push.send(zmq::buffer(p));
    }
    req.send(zmq::buffer(ask));
    (void)req.recv(m);
    res.seconds = seconds_since(start);
    if (m.to_string() != "1") fail("raw-zmq: the server saw the messages out of order");
    res.calls = cfg.count;
    return res;
}

// ---------------------------------------------------------------- ordo client

std::string with_params(std::string url, const std::string& params) {
    if (params.empty()) return url;
    return url + (url.find('?') == std::string::npos ? "?" : "&") + params;
}

std::string client_url(const config& cfg, const std::string& base, long inflight) {
    std::string params = "interval_ms=" + std::to_string(cfg.interval_ms);
    if (cfg.mode == "pooled")
        params += "&mode=pooled&max_connections=" + std::to_string(std::max(2L, inflight)) +
                  "&max_idle=" + std::to_string(std::max(2L, inflight));
    else if (cfg.resume_ms > 0)
        params += "&resume_ms=" + std::to_string(cfg.resume_ms);
    if (cfg.lane_window > 0) params += "&lane_window=" + std::to_string(cfg.lane_window);
    return with_params(base, params);
}

void check_echo(std::error_code ec, const std::string& r, std::size_t size, long i,
                const char* what) {
    if (ec) fail(std::string(what) + " call " + std::to_string(i) + " failed: " + ec.message());
    if (r.size() != size || seq_of(r.data()) != static_cast<std::uint64_t>(i))
        fail(std::string(what) + " call " + std::to_string(i) + ": wrong reply");
}

// Waits (polling a timer) until `done()`; the callbacks that make it true run meanwhile.
net::awaitable<void> wait_until(std::function<bool()> done) {
    net::steady_timer t(co_await net::this_coro::executor);
    while (!done()) {
        t.expires_after(std::chrono::microseconds(200));
        co_await t.async_wait(ordo::use_tuple);
    }
}

// Up to `inflight` calls outstanding on each channel of `chs` (`count` in all), each issued from
// the completion of an earlier one on the same channel. echo, or with `work_us` work (cpu), which
// spins that long on the server and fails after a minute.
net::awaitable<result> ordo_pipelined(const config& cfg, std::vector<ordo::channel> chs, long count,
                                      long inflight, long first_seq,
                                      std::optional<std::uint32_t> work_us = {}) {
    result res;
    res.lat_us.reserve(static_cast<std::size_t>(count));
    std::string p = payload(static_cast<std::size_t>(cfg.size), 0);
    long next = 0, done = 0;
    std::string error;
    ordo::metadata meta;  // --meta: copied into every call, as a caller would
    for (const auto& kv : cfg.meta) {
        const auto eq = kv.find('=');
        meta.emplace_back(kv.substr(0, eq), eq == std::string::npos ? "" : kv.substr(eq + 1));
    }
    // --traces: the metadata of call i is metas[i % N], each with a traceparent of its own.
    std::vector<ordo::metadata> metas;
    std::mt19937_64 rng(12345);
    for (long t = 0; t < cfg.traces; ++t) {
        char tp[56];
        std::snprintf(tp, sizeof tp, "00-%016llx%016llx-%016llx-01",
                      static_cast<unsigned long long>(rng() | 1),
                      static_cast<unsigned long long>(rng()),
                      static_cast<unsigned long long>(rng() | 1));
        ordo::metadata m = meta;
        m.emplace_back("traceparent", tp);
        metas.push_back(std::move(m));
    }
    std::function<void(const ordo::channel&)> issue = [&](const ordo::channel& ch) {
        const long i = first_seq + next++;
        stamp(p, static_cast<std::uint64_t>(i));
        const auto t0 = clock_type::now();
        auto on_reply = [&, i, t0, c = &ch](std::error_code ec, std::string r) {
            res.lat_us.push_back(static_cast<float>(micros(clock_type::now() - t0)));
            try {
                check_echo(ec, r, p.size(), i, work_us ? "work" : "pipelined");
            } catch (const std::exception& e) {
                if (error.empty()) error = e.what();
            }
            ++done;
            if (next < count) issue(*c);
        };
        if (work_us)
            ch.async_call<std::string>("work", *work_us, p, ordo::timeout(std::chrono::minutes(1)),
                                       std::move(on_reply));
        else
            ch.async_call<std::string>("echo", p, std::move(on_reply));
    };
    if (!meta.empty() || !metas.empty()) {
        // The same, each call with the metadata (a lambda of its own: the common one is
        // measured as it was).
        issue = [&](const ordo::channel& ch) {
            const long i = first_seq + next++;
            stamp(p, static_cast<std::uint64_t>(i));
            const auto t0 = clock_type::now();
            ordo::call_options o;
            o.metadata = metas.empty() ? meta : metas[static_cast<std::size_t>(i) % metas.size()];
            ch.async_call<std::string>(
                "echo", p, std::move(o), [&, i, t0, c = &ch](std::error_code ec, std::string r) {
                    res.lat_us.push_back(static_cast<float>(micros(clock_type::now() - t0)));
                    try {
                        check_echo(ec, r, p.size(), i, "pipelined");
                    } catch (const std::exception& e) {
                        if (error.empty()) error = e.what();
                    }
                    ++done;
                    if (next < count) issue(*c);
                });
        };
    }
    const auto start = clock_type::now();
    for (long k = 0; k < inflight; ++k)
        for (const auto& ch : chs)
            if (next < count) issue(ch);
    co_await wait_until([&] { return done == count; });
    res.seconds = seconds_since(start);
    res.calls = count;
    if (!error.empty()) fail(error);
    co_return res;
}

// `count` echo calls of `size` bytes, one at a time (a coroutine awaiting each), each timed and
// checked; `what` names them in an error. With `pause`, it waits that long between calls (not
// timed); with `limit`, a call that takes longer fails. The seq workload, and the small calls of
// hol and beside-slow.
net::awaitable<result> ordo_seq(ordo::channel ch, std::size_t size, long count, const char* what,
                                std::chrono::milliseconds pause = {},
                                std::chrono::milliseconds limit = {}) {
    result res;
    res.lat_us.reserve(static_cast<std::size_t>(count));
    std::string p = payload(size, 0);
    net::steady_timer t(co_await net::this_coro::executor);
    const auto start = clock_type::now();
    for (long i = 0; i < count; ++i) {
        stamp(p, static_cast<std::uint64_t>(i));
        const auto t0 = clock_type::now();
        std::string r = co_await ch.async_call<std::string>("echo", p, ordo::timeout(limit));
        res.lat_us.push_back(static_cast<float>(micros(clock_type::now() - t0)));
        check_echo({}, r, p.size(), i, what);
        if (pause.count() > 0) {
            t.expires_after(pause);
            co_await t.async_wait(ordo::use_tuple);
        }
    }
    res.seconds = seconds_since(start);
    res.calls = count;
    co_return res;
}

// The naive pool: every call opens its own connection, calls once and closes it; `inflight`
// such calls run at once.
net::awaitable<result> ordo_naive(const config& cfg, std::string url, long count, long inflight) {
    result res;
    res.lat_us.reserve(static_cast<std::size_t>(count));
    long next = 0, done = 0;
    std::string error;
    auto worker = [&]() -> net::awaitable<void> {
        std::string p = payload(static_cast<std::size_t>(cfg.size), 0);
        while (next < count) {
            const long i = next++;
            stamp(p, static_cast<std::uint64_t>(i));
            const auto t0 = clock_type::now();
            try {
                ordo::channel ch = co_await ordo::async_connect(url);
                std::string r = co_await ch.async_call<std::string>("echo", p);
                co_await std::dynamic_pointer_cast<ordo::peer>(ch.impl())->async_close();
                check_echo({}, r, p.size(), i, "naive");
            } catch (const std::exception& e) {
                if (error.empty()) error = e.what();
            }
            res.lat_us.push_back(static_cast<float>(micros(clock_type::now() - t0)));
            ++done;
        }
    };
    const auto ex = co_await net::this_coro::executor;
    const auto start = clock_type::now();
    for (long k = 0; k < std::min(inflight, count); ++k) net::co_spawn(ex, worker(), net::detached);
    co_await wait_until([&] { return done == count; });
    res.seconds = seconds_since(start);
    res.calls = count;
    if (!error.empty()) fail(error);
    co_return res;
}

// Small calls, one at a time, while --big-inflight big calls run back to back on the same
// channel (with --mode lanes, on its lane "bulk").
net::awaitable<result> ordo_hol(const config& cfg, ordo::channel ch) {
    result res;
    const std::string big = payload(static_cast<std::size_t>(cfg.size), 7);
    const ordo::channel big_ch = cfg.mode == "lanes" ? ch.lane("bulk") : ch;
    // The first call on a lane asks whether the server reads lanes: asked before the clock.
    if (cfg.mode == "lanes") (void)co_await big_ch.async_call<std::string>("echo", payload(16, 0));
    bool stop = false;
    int big_running = 0;
    long big_done = 0;
    std::string error;
    std::function<void()> issue_big = [&] {
        ++big_running;
        big_ch.async_call<std::string>("echo", big, [&](std::error_code ec, std::string r) {
            --big_running;
            ++big_done;
            try {
                check_echo(ec, r, big.size(), 7, "hol big");
            } catch (const std::exception& e) {
                if (error.empty()) error = e.what();
            }
            if (!stop) issue_big();
        });
    };
    const auto start = clock_type::now();
    for (long k = 0; k < cfg.big_inflight; ++k) issue_big();
    res = co_await ordo_seq(ch, 16, cfg.count, "hol small");
    stop = true;
    co_await wait_until([&] { return big_running == 0; });
    res.big_mb_s = double(big_done) * double(big.size()) / 1e6 / seconds_since(start);
    if (!error.empty()) fail(error);
    if (big_done == 0) fail("hol: no big call completed");
    co_return res;
}

// Small calls, one at a time with a millisecond between them, on one connection while another
// keeps one slow call (CPU for --slow-ms on the server) in flight at all times.
net::awaitable<result> ordo_beside_slow(const config& cfg, ordo::channel slow_ch,
                                        ordo::channel ch) {
    bool stop = false;
    int slow_running = 0;
    std::uint64_t slow_done = 0;
    std::string error;
    const auto slow_limit = std::chrono::milliseconds(cfg.slow_ms) + std::chrono::seconds(10);
    std::function<void()> issue_slow = [&] {
        ++slow_running;
        const std::uint64_t seq = slow_done;
        slow_ch.async_call<std::uint64_t>(
            "slow", static_cast<std::uint32_t>(cfg.slow_ms), seq, ordo::timeout(slow_limit),
            [&, seq](std::error_code ec, std::uint64_t r) {
                --slow_running;
                ++slow_done;
                if ((ec || r != seq) && error.empty())
                    error = "slow call " + std::to_string(seq) +
                            (ec ? " failed: " + ec.message() : ": wrong reply");
                if (!stop && error.empty()) issue_slow();
            });
    };
    issue_slow();
    result res = co_await ordo_seq(ch, static_cast<std::size_t>(cfg.size), cfg.count, "small",
                                   std::chrono::milliseconds(1), slow_limit);
    stop = true;
    co_await wait_until([&] { return slow_running == 0; });
    if (!error.empty()) fail(error);
    if (slow_done == 0) fail("beside-slow: no slow call completed");
    co_return res;
}

net::awaitable<result> ordo_oneway(const config& cfg, ordo::channel ch) {
    auto p = std::dynamic_pointer_cast<ordo::peer>(ch.impl());
    std::string pl = payload(static_cast<std::size_t>(cfg.size), 0);
    const std::size_t high_water = ordo::comm_options{}.high_water_bytes;
    result res;
    const auto start = clock_type::now();
    for (long i = 0; i < cfg.count; ++i) {
        stamp(pl, static_cast<std::uint64_t>(i));
        ch.notify("n", pl);
        if (p->comm().buffered_bytes > high_water) co_await p->async_drain();
    }
    auto verdict = co_await ch.async_call<std::vector<std::uint64_t>>("done");
    res.seconds = seconds_since(start);
    if (verdict.size() != 2 || verdict[0] != static_cast<std::uint64_t>(cfg.count) ||
        verdict[1] != 1)
        fail("oneway: the server received " + std::to_string(verdict.empty() ? 0 : verdict[0]) +
             " messages" + (verdict.size() == 2 && verdict[1] ? "" : ", out of order"));
    res.calls = cfg.count;
    res.msgs_per_write = p->comm().messages_per_write();
    res.peak_buffer_bytes = p->comm().peak_buffered_bytes;
    co_return res;
}

// Reads one stream of `n` items, checking that item i carries sequence number i.
template <class Stream>
net::awaitable<void> read_items(Stream& s, std::uint64_t n, std::string what) {
    std::uint64_t i = 0;
    while (auto v = co_await s.next()) {
        if (v->size() < 8 || seq_of(v->data()) != i)
            fail(what + ": item " + std::to_string(i) + " out of order");
        ++i;
    }
    if (i != n) fail(what + ": " + std::to_string(i) + " items, expected " + std::to_string(n));
}

net::awaitable<result> ordo_stream(const config& cfg, ordo::channel ch) {
    ordo::call_options o;
    o.window = static_cast<std::uint32_t>(cfg.window);
    const auto n = static_cast<std::uint64_t>(cfg.count);
    const auto size = static_cast<std::uint32_t>(cfg.size);
    result res;
    const auto start = clock_type::now();
    auto s = co_await ch.async_stream<std::string>("items", n, size, o);
    co_await read_items(s, n, "stream");
    res.seconds = seconds_since(start);
    res.calls = cfg.count;
    co_return res;
}

struct both_ways : ordo::interface {
    ordo::method<ordo::upload<std::string_view, std::uint64_t>()> upload_items{"upload_items"};
    ordo::method<ordo::two_way<std::string_view, std::string>()> echo_items{"echo_items"};
};

net::awaitable<result> ordo_upload(const config& cfg, ordo::channel ch) {
    const auto n = static_cast<std::uint64_t>(cfg.count);
    std::string p = payload(static_cast<std::size_t>(cfg.size), 0);
    result res;
    const auto start = clock_type::now();
    auto up = co_await ordo::stub<both_ways>(ch).upload_items();
    for (std::uint64_t i = 0; i < n; ++i) {
        stamp(p, i);
        if (!co_await up.write(p)) fail("upload: the call ended after " + std::to_string(i));
    }
    const std::uint64_t got = co_await up.finish();
    if (got != n) fail("upload: the server read " + std::to_string(got) + " items");
    res.seconds = seconds_since(start);
    res.calls = cfg.count;
    co_return res;
}

net::awaitable<result> ordo_bidi(const config& cfg, ordo::channel ch) {
    ordo::call_options o;
    o.window = static_cast<std::uint32_t>(cfg.window);
    const auto n = static_cast<std::uint64_t>(cfg.count);
    const auto ex = co_await net::this_coro::executor;
    result res;
    const auto start = clock_type::now();
    auto s = co_await ordo::stub<both_ways>(ch).echo_items(o);
    bool written = false;
    net::co_spawn(
        ex,
        [&]() -> net::awaitable<void> {
            std::string p = payload(static_cast<std::size_t>(cfg.size), 0);
            for (std::uint64_t i = 0; i < n; ++i) {
                stamp(p, i);
                if (!co_await s.write(p)) fail("bidi: the call ended after " + std::to_string(i));
            }
            s.close();
            written = true;
        },
        [](std::exception_ptr e) {
            if (e) std::rethrow_exception(e);
        });
    co_await read_items(s, n, "bidi");
    if (!written) fail("bidi: the echoes ended before the writes");
    res.seconds = seconds_since(start);
    res.calls = cfg.count;
    co_return res;
}

net::awaitable<result> ordo_stream_batch(const config& cfg, ordo::channel ch) {
    ordo::call_options o;
    o.window = static_cast<std::uint32_t>(cfg.window);
    const auto per = static_cast<std::uint64_t>(cfg.count / cfg.clients);
    const auto size = static_cast<std::uint32_t>(cfg.size);
    const auto ex = co_await net::this_coro::executor;
    result res;
    const auto start = clock_type::now();
    std::vector<ordo::stream<std::string>> streams;
    for (int c = 0; c < cfg.clients; ++c)
        streams.push_back(co_await ch.async_stream<std::string>("items_batch", per, size, o));
    int done = 0;
    net::steady_timer all_read(ex, clock_type::time_point::max());
    for (auto& s : streams)
        net::co_spawn(
            ex,
            [&]() -> net::awaitable<void> {
                co_await read_items(s, per, "stream-batch");
                // (Expired rather than cancelled: this may come before the wait below starts.)
                if (++done == cfg.clients) all_read.expires_at(clock_type::time_point::min());
            },
            net::detached);
    while (done < cfg.clients) co_await all_read.async_wait(ordo::use_tuple);
    if (done != cfg.clients) fail("stream-batch: a stream did not end");
    res.seconds = seconds_since(start);
    res.calls = static_cast<long>(per) * cfg.clients;
    co_return res;
}

/// A connected, warmed channel for the ordo transports.
net::awaitable<ordo::channel> ordo_channel(const config& cfg, const std::string& url,
                                           long inflight) {
    ordo::channel ch = co_await ordo::async_connect(client_url(cfg, url, inflight));
    // Warm: in pooled mode, this opens the connections the measured run will use. (hol's big
    // payloads are not needed for that.)
    config warm = cfg;
    if (cfg.workload == "hol") warm.size = 16;
    co_await ordo_pipelined(warm, std::vector<ordo::channel>(1, ch), std::min(4 * inflight, 4096L),
                            inflight, 0);
    co_return ch;
}

net::awaitable<result> ordo_run(const config& cfg, std::string url, long count, long inflight) {
    if (cfg.mode == "naive") {
        const std::string plain =
            with_params(url, "interval_ms=" + std::to_string(cfg.interval_ms));
        co_return co_await ordo_naive(cfg, plain, count, cfg.workload == "seq" ? 1 : inflight);
    }
    if (cfg.workload == "cpu" || cfg.workload == "beside-slow") {
        // Connections of their own (ordered), so that the server places them on its loops.
        const int n = cfg.workload == "cpu" ? cfg.clients : 2;
        std::vector<ordo::channel> chs;
        for (int k = 0; k < n; ++k) chs.push_back(co_await ordo_channel(cfg, url, 1));
        // (Not a conditional expression of two co_awaits: GCC 12 garbles its result.)
        result r;
        if (cfg.workload == "cpu")
            r = co_await ordo_pipelined(cfg, chs, count, std::max(1L, inflight / n), 0,
                                        static_cast<std::uint32_t>(cfg.work_us));
        else
            r = co_await ordo_beside_slow(cfg, chs[0], chs[1]);
        for (auto& ch : chs) {
            auto p = std::dynamic_pointer_cast<ordo::peer>(ch.impl());
            if (r.msgs_per_write == 0) r.msgs_per_write = p->comm().messages_per_write();
            r.peak_buffer_bytes = std::max(r.peak_buffer_bytes, p->comm().peak_buffered_bytes);
            co_await p->async_close();
        }
        co_return r;
    }
    const long connections = cfg.workload == "seq" ? 1 : cfg.workload == "hol" ? 2 : inflight;
    ordo::channel ch = co_await ordo_channel(cfg, url, connections);
    result r;
    if (cfg.workload == "oneway")
        r = co_await ordo_oneway(cfg, ch);
    else if (cfg.workload == "stream")
        r = co_await ordo_stream(cfg, ch);
    else if (cfg.workload == "stream-batch")
        r = co_await ordo_stream_batch(cfg, ch);
    else if (cfg.workload == "upload")
        r = co_await ordo_upload(cfg, ch);
    else if (cfg.workload == "bidi")
        r = co_await ordo_bidi(cfg, ch);
    else if (cfg.workload == "seq")
        r = co_await ordo_seq(ch, static_cast<std::size_t>(cfg.size), count, "seq");
    else if (cfg.workload == "hol")
        r = co_await ordo_hol(cfg, ch);
    else
        r = co_await ordo_pipelined(cfg, std::vector<ordo::channel>(1, ch), count, inflight, 0);
    if (auto p = std::dynamic_pointer_cast<ordo::peer>(ch.impl())) {
        if (r.msgs_per_write == 0) r.msgs_per_write = p->comm().messages_per_write();
        r.peak_buffer_bytes = p->comm().peak_buffered_bytes;
        co_await p->async_close();
    }
    co_return r;
}

// ---------------------------------------------------------------- one client run, any transport

result run_client(const config& cfg, const std::string& url, long count, long inflight) {
    if (cfg.transport == "raw-tcp") {
        const int fd = tcp_connect(url, "raw-tcp");
        result r = cfg.workload == "oneway"
                       ? raw_tcp_oneway(cfg, fd)
                       : raw_tcp_calls(cfg, fd, count, cfg.workload == "seq" ? 1 : inflight);
        ::close(fd);
        return r;
    }
    if (cfg.transport == "raw-zmq") {
        zmq::context_t ctx(1);
        if (cfg.workload == "oneway") return raw_zmq_oneway(cfg, ctx, url);
        return raw_zmq_calls(cfg, ctx, url, count, cfg.workload == "seq" ? 1 : inflight);
    }
    net::io_context io(1);
    std::optional<result> r;
    std::exception_ptr error;
    net::co_spawn(io, ordo_run(cfg, url, count, inflight), [&](std::exception_ptr e, result res) {
        if (e)
            error = e;
        else
            r = std::move(res);
    });
    ordo::run_spinning(io, std::chrono::microseconds(cfg.spin_us));
    if (error) std::rethrow_exception(error);
    return std::move(*r);
}

// ---------------------------------------------------------------- processes

/// The server of a run: a child process (or a thread, for inproc).
struct server_handle {
    pid_t pid = -1;
    std::thread thread;
    int stop_fd = -1;  // closing it tells the server to end
    std::string url;
    std::shared_ptr<double> thread_cpu = std::make_shared<double>(0);

    /// Ends the server; its CPU seconds.
    double stop() {
        if (stop_fd >= 0) ::close(stop_fd);
        stop_fd = -1;
        if (thread.joinable()) {
            thread.join();
            return *thread_cpu;
        }
        if (pid <= 0) return 0;
        int status = 0;
        rusage ru{};
        ::wait4(pid, &status, 0, &ru);
        pid = -1;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            fail("the server process ended badly (status " + std::to_string(status) + ")");
        return cpu_seconds(ru);
    }
};

std::string read_line(int fd) {
    std::string s;
    char c;
    while (::read(fd, &c, 1) == 1 && c != '\n') s += c;
    return s;
}

server_handle start_server(const config& cfg) {
    server_handle s;
    std::string listen;
    if (cfg.transport == "raw-tcp")
        listen = "raw-tcp://127.0.0.1:0";
    else if (cfg.transport == "raw-zmq")
        listen = "raw-zmq://127.0.0.1";
    else
        listen = ordo::test::listen_url(scheme_of(cfg.transport));  // tls: files made here
    int ready[2], stop[2];
    if (::pipe2(ready, O_CLOEXEC) != 0 || ::pipe2(stop, O_CLOEXEC) != 0) fail("pipe failed");
    if (cfg.transport == "inproc") {
        config served = cfg;
        served.threads = cfg.server_threads;
        s.thread = std::thread(
            [served, listen, ready_fd = ready[1], stop_fd = stop[0], cpu = s.thread_cpu] {
                try {
                    serve_ordo(served, listen, ready_fd, stop_fd);
                } catch (const std::exception& e) {
                    std::cerr << "ordo-bench server: " << e.what() << "\n";
                }
                ::close(stop_fd);
                *cpu = thread_cpu();
            });
    } else {
        const std::string interval = std::to_string(cfg.interval_ms);
        const std::string spin = std::to_string(cfg.spin_us);
        const std::string threads = std::to_string(cfg.server_threads);
        const std::string sample = std::to_string(cfg.trace_sample);
        const std::string lane_window = std::to_string(cfg.lane_window);
        const std::string fair_queue = std::to_string(cfg.fair_queue);
        s.pid = ::fork();
        if (s.pid < 0) fail("fork failed");
        if (s.pid == 0) {
            ::prctl(PR_SET_PDEATHSIG, SIGKILL);
            ::dup2(stop[0], 0);
            ::dup2(ready[1], 1);
            std::vector<const char*> args{
                "ordo-bench",          "--serve",       listen.c_str(),   "--transport",
                cfg.transport.c_str(), "--interval-ms", interval.c_str(), "--spin-us",
                spin.c_str(),          "--threads",     threads.c_str()};
            if (cfg.lane_window > 0) {
                args.push_back("--lane-window");
                args.push_back(lane_window.c_str());
            }
            if (cfg.offload) args.push_back("--offload");
            if (cfg.async_echo) args.push_back("--async-echo");
            if (!cfg.concurrency.empty()) {
                args.push_back("--concurrency");
                args.push_back(cfg.concurrency.c_str());
            }
            if (cfg.fair_queue > 0) {
                args.push_back("--fair-queue");
                args.push_back(fair_queue.c_str());
            }
            if (cfg.trace_sample >= 0) {
                args.push_back("--trace-sample");
                args.push_back(sample.c_str());
            }
            args.push_back(nullptr);
            ::execv("/proc/self/exe", const_cast<char* const*>(args.data()));
            std::_Exit(127);
        }
        ::close(ready[1]);
        ::close(stop[0]);
    }
    s.stop_fd = stop[1];
    s.url = read_line(ready[0]);
    ::close(ready[0]);
    if (s.url.empty()) {
        s.stop();
        fail("the server did not report its address");
    }
    if (!is_raw(cfg)) s.url = ordo::test::connect_url(s.url);
    return s;
}

int serve_main(const config& cfg) {
    if (cfg.transport == "raw-tcp") return serve_raw_tcp(1, cfg.spin_us);
    if (cfg.transport == "raw-zmq") return serve_raw_zmq(1);
    return serve_ordo(cfg, cfg.serve, 1, 0);
}

// fanin: `clients` processes, each running pipelined calls; they connect, say they are ready,
// wait for the start, and send back their latencies.
result run_fanin(const config& cfg, const std::string& url, double& clients_cpu) {
    const long per = std::max(1L, cfg.count / cfg.clients);
    struct child {
        pid_t pid;
        int from;  // results
        int go;    // start signal
    };
    std::vector<child> kids;
    for (int k = 0; k < cfg.clients; ++k) {
        int up[2], go[2];
        if (::pipe2(up, O_CLOEXEC) != 0 || ::pipe2(go, O_CLOEXEC) != 0) fail("pipe failed");
        const pid_t pid = ::fork();
        if (pid < 0) fail("fork failed");
        if (pid == 0) {
            ::prctl(PR_SET_PDEATHSIG, SIGKILL);
            ::close(up[0]);
            ::close(go[1]);
            int status = 0;
            try {
                config one = cfg;
                one.workload = "pipelined";
                // Connections are made in run_client before its clock starts; the start signal
                // comes first so that all clients overlap.
                char c;
                const char ready = 'r';
                write_all(up[1], &ready, 1);
                if (::read(go[0], &c, 1) != 1) std::_Exit(1);
                result r = run_client(one, url, per, cfg.inflight);
                const std::uint64_t n = r.lat_us.size();
                write_all(up[1], reinterpret_cast<const char*>(&r.seconds), sizeof r.seconds);
                write_all(up[1], reinterpret_cast<const char*>(&n), sizeof n);
                write_all(up[1], reinterpret_cast<const char*>(r.lat_us.data()), n * sizeof(float));
            } catch (const std::exception& e) {
                std::cerr << "ordo-bench fanin client: " << e.what() << "\n";
                status = 1;
            }
            std::_Exit(status);
        }
        ::close(up[1]);
        ::close(go[0]);
        kids.push_back({pid, up[0], go[1]});
    }
    for (auto& k : kids) {
        char c;
        if (!read_all(k.from, &c, 1)) fail("a fanin client did not start");
    }
    result res;
    for (auto& k : kids) write_all(k.go, "g", 1);
    double longest = 0;
    bool ok = true;
    for (auto& k : kids) {
        double secs = 0;
        std::uint64_t n = 0;
        if (!read_all(k.from, reinterpret_cast<char*>(&secs), sizeof secs) ||
            !read_all(k.from, reinterpret_cast<char*>(&n), sizeof n)) {
            ok = false;
        } else {
            const auto old = res.lat_us.size();
            res.lat_us.resize(old + n);
            if (!read_all(k.from, reinterpret_cast<char*>(res.lat_us.data() + old),
                          n * sizeof(float)))
                ok = false;
            longest = std::max(longest, secs);
        }
        ::close(k.from);
        ::close(k.go);
        int status = 0;
        rusage ru{};
        ::wait4(k.pid, &status, 0, &ru);
        clients_cpu += cpu_seconds(ru);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ok = false;
    }
    if (!ok) fail("a fanin client failed");
    // Every client ran for about as long; the rate is all calls over the slowest one's time.
    res.seconds = longest;
    res.calls = per * cfg.clients;
    return res;
}

// The latency distribution as [quantile, microseconds] pairs, for CDF plots.
std::string cdf(const std::vector<float>& sorted) {
    if (sorted.empty()) return "[]";
    std::string s = "[";
    char item[64];
    for (int i = 0; i <= 100; ++i) {
        const double q = i == 100 ? 0.999 : i / 100.0;
        std::snprintf(item, sizeof item, "%s[%.3f,%.2f]", i ? "," : "", q, percentile(sorted, q));
        s += item;
    }
    std::snprintf(item, sizeof item, ",[0.9999,%.2f],[1,%.2f]]", percentile(sorted, 0.9999),
                  sorted.back());
    return s + item;
}

// Out of line: bench/callgrind_counts.sh leaves it out of its counts (sorting the latencies costs
// more or less with their spread, which says nothing about ordo).
[[gnu::noinline]] void report(const config& cfg, result& r, double client_cpu,
                              std::optional<double> server_cpu) {
    std::sort(r.lat_us.begin(), r.lat_us.end());
    const double rate = r.seconds > 0 ? double(r.calls) / r.seconds : 0;
    char server[32] = "null", per_call[32] = "null";
    if (server_cpu) std::snprintf(server, sizeof server, "%.3f", *server_cpu);
    // The server's CPU over its whole life (warm-up calls included) per measured call.
    if (server_cpu && r.calls > 0)
        std::snprintf(per_call, sizeof per_call, "%.2f", *server_cpu * 1e6 / double(r.calls));
    const double max_us = r.lat_us.empty() ? 0 : r.lat_us.back();
    const bool one_at_a_time =
        cfg.workload == "seq" || cfg.workload == "hol" || cfg.workload == "beside-slow";
    if (cfg.json) {
        std::printf(
            "{\"workload\":\"%s\",\"transport\":\"%s\",\"mode\":\"%s\",\"interval_ms\":%d,"
            "\"count\":%ld,\"inflight\":%ld,\"size\":%ld,\"clients\":%d,\"seconds\":%.4f,"
            "\"rate\":%.0f,\"p50_us\":%.2f,\"p90_us\":%.2f,\"p99_us\":%.2f,\"p999_us\":%.2f,"
            "\"msgs_per_write\":%.1f,\"peak_buffer_bytes\":%llu,\"client_cpu_s\":%.3f,"
            "\"server_cpu_s\":%s,\"server_cpu_us_per_call\":%s,\"spin_us\":%d,"
            "\"max_us\":%.2f,\"server_threads\":%ld,\"work_us\":%ld,\"slow_ms\":%ld,"
            "\"offload\":%s,\"big_inflight\":%ld,\"big_mb_s\":%.1f,\"cdf_us\":%s}\n",
            cfg.workload.c_str(), cfg.transport.c_str(), cfg.mode.c_str(), cfg.interval_ms, r.calls,
            one_at_a_time ? 1 : cfg.inflight, cfg.size,
            cfg.workload.rfind("fanin", 0) == 0 || cfg.workload == "cpu" ? cfg.clients : 1,
            r.seconds, rate, percentile(r.lat_us, 0.5), percentile(r.lat_us, 0.9),
            percentile(r.lat_us, 0.99), percentile(r.lat_us, 0.999), r.msgs_per_write,
            static_cast<unsigned long long>(r.peak_buffer_bytes), client_cpu, server, per_call,
            cfg.spin_us, max_us, cfg.server_threads, cfg.work_us, cfg.slow_ms,
            cfg.offload ? "true" : "false", cfg.workload == "hol" ? cfg.big_inflight : 0,
            r.big_mb_s, cdf(r.lat_us).c_str());
    } else {
        std::printf("%s %s %s interval %d ms, size %ld: %ld in %.3f s = %.0f/s",
                    cfg.workload.c_str(), cfg.transport.c_str(), cfg.mode.c_str(), cfg.interval_ms,
                    cfg.size, r.calls, r.seconds, rate);
        if (!r.lat_us.empty())
            std::printf("; p50 %.1f us, p99 %.1f us, p99.9 %.1f us, max %.1f us",
                        percentile(r.lat_us, 0.5), percentile(r.lat_us, 0.99),
                        percentile(r.lat_us, 0.999), max_us);
        if (r.msgs_per_write > 0) std::printf("; %.1f msgs/write", r.msgs_per_write);
        if (r.big_mb_s > 0) std::printf("; big calls %.0f MB/s", r.big_mb_s);
        std::printf("; cpu client %.2f s, server %s s (%s us/call)\n", client_cpu, server,
                    per_call);
    }
    std::fflush(stdout);
}

int bench_main(const config& cfg) {
    std::optional<server_handle> srv;
    std::string url = cfg.connect;
    if (url.empty()) {
        srv.emplace(start_server(cfg));
        url = srv->url;
    }
    std::optional<bench_cuts> cuts;
    if (cfg.cuts > 0) {
        cuts.emplace(url, static_cast<std::size_t>(cfg.cuts), static_cast<std::uint64_t>(cfg.seed));
        url = cuts->url();
    }
    const double cpu0 = process_cpu();
    result r;
    double clients_cpu = 0;
    try {
        if (cfg.workload == "fanin")
            r = run_fanin(cfg, url, clients_cpu);
        else if (cfg.workload == "fanin-raw")
            r = run_fanin_raw(cfg, url);
        else
            r = run_client(cfg, url, cfg.count, cfg.inflight);
    } catch (...) {
        if (srv) srv->stop();
        throw;
    }
    double client_cpu = process_cpu() - cpu0 + clients_cpu;
    std::optional<double> server_cpu;
    if (srv) {
        server_cpu = srv->stop();
        if (cfg.transport == "inproc")
            client_cpu -= *server_cpu;  // the server ran on a thread here
    }
    report(cfg, r, client_cpu, server_cpu);
    if (cuts) {
        std::printf("cuts: %zu of %ld (--seed %ld)\n", cuts->cuts(), cfg.cuts, cfg.seed);
        if (cuts->cuts() == 0) fail("--cuts: the run ended before its first cut");
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    config cfg;
    if (const auto status = parse_command_line(argc, argv, cfg)) return *status;
    try {
        complete(cfg);
        if (!cfg.serve.empty()) return serve_main(cfg);
        ::signal(SIGPIPE, SIG_IGN);
        return bench_main(cfg);
    } catch (const std::exception& e) {
        std::cerr << "ordo-bench: " << e.what() << "\n";
        return 1;
    }
}
