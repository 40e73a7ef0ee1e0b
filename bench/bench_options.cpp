// ordo-bench's command line, with CLI11 (bench_options.hpp says why it is apart).
#include "bench_options.hpp"

#include "cli.hpp"

namespace {

// The flags, into `c` (the header comment above lists them).
void declare_flags(CLI::App& app, config& c) {
    ordo_cli::use_defaults(app);
    app.add_option("--workload", c.workload, "oneway, seq, pipelined, hol or fanin");
    app.add_option("--transport", c.transport, "tcp, unix, inproc, zmq, tls, raw-tcp or raw-zmq");
    app.add_option("--mode", c.mode, "ordered, pooled or naive (a connection per call)");
    app.add_option("--interval-ms", c.interval_ms, "batching interval of each connection")
        ->check(ordo_cli::at_least(0));
    app.add_option("--count", c.count, "messages or calls (0: the workload's default)")
        ->check(ordo_cli::at_least(0));
    app.add_option("--inflight", c.inflight, "calls in flight at once (at least 1)")
        ->check(ordo_cli::at_least(0));
    app.add_option("--size", c.size, "payload bytes, at least 8 (0: 16; hol: 1 MiB)")
        ->check(ordo_cli::at_least(0));
    app.add_option("--clients", c.clients, "fanin: client processes (at least 1)")
        ->check(ordo_cli::at_least(0));
    app.add_option("--spin-us", c.spin_us, "poll this long before sleeping (ordo::run_spinning)")
        ->check(ordo_cli::at_least(0));
    app.add_option("--resume-ms", c.resume_ms, "ordered channels: a resumable session")
        ->check(ordo_cli::at_least(0));
    app.add_flag("--json", c.json, "print the results as one JSON line");
    app.add_option("--connect", c.connect, "client only: a server started elsewhere")
        ->type_name("URL");
    app.add_option("--serve", c.serve, "serve on URL (what the client starts)")->type_name("URL");
}

}  // namespace

std::optional<int> parse_command_line(int argc, char** argv, config& c) {
    CLI::App app{"ordo's workloads and the raw baselines they are measured against.", "ordo-bench"};
    declare_flags(app, c);
    return ordo_cli::parse(app, argc, argv, 1);
}
