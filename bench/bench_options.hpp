// ordo-bench's options (ordo_bench.cpp's header comment lists them). The command line is read in a
// translation unit of its own (bench_options.cpp): CLI11's templates in ordo_bench.cpp made GCC
// stop inlining msgpack's buffer writes in the served handlers, which cost the one-way server
// 3.5% more instructions per message.
#pragma once

#include <optional>
#include <string>
#include <vector>

/// What one run does (defaults as --help shows them).
struct config {
    std::string workload = "pipelined";
    std::string transport = "tcp";
    std::string mode = "ordered";
    int interval_ms = 0;
    long count = 0;  // 0: the workload's default
    long inflight = 256;
    long big_inflight = 2;  // hol: big calls kept in flight
    long lane_window = 0;   // peer_options::lane_window of both sides (0: the default)
    long window = 0;  // stream, stream-batch: call_options::window (0: the library's default)
    long size = 0;  // 0: 16 bytes (hol: the big calls, 1 MiB)
    int clients = 4;
    int spin_us = 0;     // both sides run ordo::run_spinning (raw-tcp: poll before each read)
    long resume_ms = 0;  // ordered channels: a resumable session with this window
    long cuts = 0;       // tcp with --resume-ms: connections reset this many times (bench_cuts)
    long seed = 0;       // --cuts: where they fall (0: drawn from the clock, and printed)
    bool json = false;
    std::string connect;      // client only, to a server started elsewhere
    std::string serve;        // server only
    std::string auth_tokens;  // server only: authenticate callers with this token file
    long work_us = 100;       // cpu: CPU each "work" call spins on the server
    long slow_ms = 50;        // beside-slow: CPU each "slow" call spins on the server
    long threads = 1;         // server only: its event loops (server_options::threads)
    long server_threads = 1;  // client: --threads of the server it starts
    bool offload = false;     // server: "slow" on a worker_pool; client: for the server it starts
    std::vector<std::string> meta;  // pipelined: KEY=VALUE metadata on every call
    long traces = 0;                // pipelined: calls carry one of this many traceparents
    double trace_sample = -1;       // the server records spans of this fraction (-1: off)
    // The server's server_options::concurrency ("adaptive", a number; empty: none), and echo as
    // a coroutine (concurrent) instead of a plain function; the client passes both on.
    std::string concurrency;
    std::size_t fair_queue = 0;  // server_options::shares.queue (0: not shared)
    bool async_echo = false;
};

/// Reads argv into `c`. Returns the status to exit with when the program should stop (0 after
/// --help, 1 after a usage error, CLI11's message on stderr); std::nullopt to go on.
std::optional<int> parse_command_line(int argc, char** argv, config& c);
