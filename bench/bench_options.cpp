// ordo-bench's command line, with CLI11 (bench_options.hpp says why it is apart).
#include "bench_options.hpp"

#include "cli.hpp"

namespace {

// The flags, into `c` (the header comment above lists them).
void declare_flags(CLI::App& app, config& c) {
    ordo_cli::use_defaults(app);
    app.add_option("--workload", c.workload,
                   "oneway, seq, pipelined, hol, fanin, fanin-raw, cpu or beside-slow");
    app.add_option("--transport", c.transport, "tcp, unix, inproc, zmq, tls, raw-tcp or raw-zmq");
    app.add_option("--mode", c.mode,
                   "ordered, pooled, naive (a connection per call) or lanes (hol: ordered, the "
                   "big calls on lane \"bulk\")");
    app.add_option("--lane-window", c.lane_window,
                   "peer_options::lane_window of the client and the server it starts (0: 256 KiB)")
        ->check(CLI::NonNegativeNumber);
    app.add_option("--big-inflight", c.big_inflight, "hol: big calls kept in flight (2)")
        ->check(ordo_cli::at_least(1));
    app.add_option("--interval-ms", c.interval_ms, "batching interval of each connection")
        ->check(ordo_cli::at_least(0));
    app.add_option("--count", c.count, "messages or calls (0: the workload's default)")
        ->check(ordo_cli::at_least(0));
    app.add_option("--inflight", c.inflight,
                   "calls in flight at once (at least 1; fanin, fanin-raw: per client)")
        ->check(ordo_cli::at_least(0));
    app.add_option("--window", c.window,
                   "stream, stream-batch: items the server may send ahead of the reader (0: "
                   "ordo's default, 8192; at most 65536)")
        ->check(ordo_cli::at_least(0));
    app.add_option("--size", c.size, "payload bytes, at least 8 (0: 16; hol: 1 MiB)")
        ->check(ordo_cli::at_least(0));
    app.add_option("--clients", c.clients,
                   "fanin: client processes; fanin-raw, cpu: connections (at least 1)")
        ->check(ordo_cli::at_least(0));
    app.add_option("--spin-us", c.spin_us, "poll this long before sleeping (ordo::run_spinning)")
        ->check(ordo_cli::at_least(0));
    app.add_option("--resume-ms", c.resume_ms, "ordered channels: a resumable session")
        ->check(ordo_cli::at_least(0));
    app.add_option("--cuts", c.cuts,
                   "tcp, --resume-ms: reach the server through a proxy that resets the "
                   "connection this many times, each after 100 KB to 8 MB")
        ->check(ordo_cli::at_least(0));
    app.add_option("--seed", c.seed, "--cuts: where the cuts fall (0: from the clock)");
    app.add_option("--work-us", c.work_us, "cpu: CPU microseconds each call spins on the server")
        ->check(ordo_cli::at_least(0));
    app.add_option("--slow-ms", c.slow_ms, "beside-slow: CPU milliseconds of each slow call")
        ->check(ordo_cli::at_least(0));
    app.add_option("--server-threads", c.server_threads,
                   "event loops of the server the client starts (its --threads)")
        ->check(ordo_cli::at_least(1));
    app.add_flag("--offload", c.offload,
                 "beside-slow: the slow handler runs on a worker_pool (passed to the server)");
    app.add_option("--threads", c.threads, "server only: event loops (server_options::threads)")
        ->check(ordo_cli::at_least(1));
    app.add_option("--meta", c.meta,
                   "pipelined: KEY=VALUE metadata every call carries (repeatable)");
    app.add_option("--traces", c.traces,
                   "pipelined: call i carries traceparent i mod N of N made up front, each of "
                   "its own random trace")
        ->check(ordo_cli::at_least(1));
    app.add_option("--trace-sample", c.trace_sample,
                   "the server records spans of this fraction of traces (ordo::record_spans; "
                   "passed to the server the client starts)")
        ->check(CLI::Range(0.0, 1.0));
    app.add_option("--concurrency", c.concurrency,
                   "the server's concurrency limit (server_options::concurrency): adaptive or a "
                   "number (passed to the server the client starts)")
        ->type_name("adaptive|N");
    app.add_option("--fair-queue", c.fair_queue,
                   "the concurrency limit shared among callers with a queue of N calls each "
                   "(server_options::shares.queue; passed to the server the client starts)");
    app.add_flag("--async-echo", c.async_echo,
                 "echo is a coroutine (concurrent), which a concurrency limit counts (passed to "
                 "the server the client starts)");
    app.add_flag("--json", c.json, "print the results as one JSON line");
    app.add_option("--connect", c.connect, "client only: a server started elsewhere")
        ->type_name("URL");
    app.add_option("--serve", c.serve, "serve on URL (what the client starts)")->type_name("URL");
    app.add_option("--auth-tokens", c.auth_tokens,
                   "server only: authenticate callers with FILE's tokens (server_options::"
                   "authenticate); a client presents one with ?token_file= on its URL")
        ->type_name("FILE");
}

}  // namespace

std::optional<int> parse_command_line(int argc, char** argv, config& c) {
    CLI::App app{"ordo's workloads and the raw baselines they are measured against.", "ordo-bench"};
    declare_flags(app, c);
    return ordo_cli::parse(app, argc, argv, 1);
}
