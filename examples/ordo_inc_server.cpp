// ordo-inc-server --listen URL [--listen URL...] [--liveness-timeout-ms L] [--threads N]
//                 [--cert F --key F [--ca F]] [--metrics HOST:PORT] [--drain-ms N] [--verbose]
// Serves counter (examples/counter.hpp) and echo(any) on every URL, of any scheme: tcp://,
// unix://, tls://, zmq+tcp://, zmq+ipc:// (and inproc://, reachable from this process only).
// --cert/--key are the certificate and key of tls:// listeners; with --ca, clients must show a
// certificate signed by that CA (mutual TLS). Prints "listening on URL" for each (with the real
// port for port 0), "refused: <why>" on stderr for failed TLS handshakes, and exits 0 after a
// stop: SIGINT stops at once; SIGTERM drains (server::async_drain: prints "draining", refuses new
// connections, finishes calls in flight for up to --drain-ms, default 10000).
// What the server drops or refuses (server_options::on_event:
// protocol errors, timeouts, refused connections, dropped notifications...) goes to stderr, one
// line each; --verbose adds every connection opened and closed. --metrics serves Prometheus
// metrics (ordo/metrics/prometheus.hpp) and prints "metrics on http://HOST:PORT/metrics". --help
// lists the flags; a usage error (an unknown flag, a value that is not a number) prints CLI11's
// message naming the flag and exits 2. --threads N serves connections on N event loops (the main
// thread and N - 1 more); add() and total() then take turns on a strand. --journal FILE also serves
// note(key, n), which appends "key n" to FILE: replicas sharing one file show, in the file's
// order, which calls ran and in what order (tests/fleet/fleet_test.cpp).
// --register etcd://HOST:PORT/PREFIX keeps the first listen URL (with its real port) listed in
// etcd as the key PREFIX + URL under a lease of --register-ttl-s seconds (ordo/fleet/sources.hpp),
// prints "registered etcd://HOST:PORT/PREFIXURL" once it is there, and revokes it first on
// SIGINT/SIGTERM.
// --warm-up-ms N says not_serving (ordo.health) for N ms after starting, then serving (printing
// "serving"): routers send it nothing meanwhile, and `ordo health` exits 1.
// --auth-tokens FILE (lines `TOKEN SUBJECT`) refuses callers without one of those tokens, or a
// client certificate, with errc::unauthenticated (ordo::authenticate_tokens); whoami() answers
// the caller's subject. --allow-introspection SUBJECT (repeatable) lets that caller use
// ordo.stats and ordo.methods, which authentication otherwise closes.
// --concurrency adaptive|N limits the calls that suspend running at once; the limit is shared
// among callers (server_options::shares): each waits in a queue of its own of --fair-queue calls
// (default 8; 0: not shared, a call over the limit is refused at once), and each slot that frees
// goes to the caller with the fewest running for its --weight SUBJECT=N (others weigh 1).
#include <asio/signal_set.hpp>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <iostream>
#include <memory>
#include <vector>

#include "cli.hpp"
#include "inc_handlers.hpp"
#include "ordo/address.hpp"
#include "ordo/fleet/sources.hpp"
#ifdef ORDO_HAS_PROMETHEUS
#include "ordo/metrics/prometheus.hpp"
#endif

namespace net = ordo::net;

// --register: etcd://HOST:PORT/PREFIX is the endpoint http://HOST:PORT and the key prefix
// /PREFIX (everything from the first '/' after the host, kept as written);
// etcd+https://HOST:PORT/PREFIX?ca=F&cert=F&key=F&user=U&password_file=F&token_file=F reaches
// etcd over https, with those files and etcd credentials (ordo::etcd_access).
ordo::etcd_registration_options etcd_options(std::string where, long ttl_s) {
    const bool https = where.rfind("etcd+https://", 0) == 0;
    const std::string scheme = https ? "etcd+https://" : "etcd://";
    std::string query;
    if (const auto q = where.find('?'); q != std::string::npos) {
        query = where.substr(q + 1);
        where.resize(q);
    }
    const auto slash = where.find('/', scheme.size());
    if (where.rfind(scheme, 0) != 0 || slash == std::string::npos || slash == scheme.size())
        throw std::invalid_argument("--register: '" + where +
                                    "' is not etcd://HOST:PORT/PREFIX or etcd+https://...");
    ordo::etcd_registration_options o;
    o.endpoint = (https ? "https://" : "http://") + where.substr(scheme.size(), slash - scheme.size());
    o.prefix = where.substr(slash);
    for (const auto& [key, value] : ordo::query_params(query)) {
        if (key == "ca")
            o.access.ca_file = value;
        else if (key == "cert")
            o.access.cert_file = value;
        else if (key == "key")
            o.access.key_file = value;
        else if (key == "user")
            o.access.user = value;
        else if (key == "password_file")
            o.access.password = ordo::read_token(value);
        else if (key == "token_file")
            o.access.token = ordo::read_token(value);
        else
            throw std::invalid_argument("--register: unknown parameter \"" + key + "\"");
    }
    o.ttl = std::chrono::seconds(ttl_s);
    o.on_event = [](const std::string& line) { std::cerr << line << std::endl; };
    return o;
}

// Revokes the registration, if any, so that routers stop sending here, then runs `next` (the
// server's stop).
net::awaitable<void> leave_etcd_then(ordo::etcd_registration* r, net::awaitable<void> next) {
    if (r) try {
            co_await r->async_stop();
        } catch (const std::exception& e) {
            std::cerr << "error: " << e.what() << std::endl;
        }
    co_await std::move(next);
}

// A JSON string: quotes, backslashes and control characters escaped.
std::string json_string(std::string_view s) {
    std::string out = "\"";
    for (const char ch : s) {
        if (ch == '"' || ch == '\\') {
            out += '\\';
            out += ch;
        } else if (static_cast<unsigned char>(ch) < 0x20) {
            char esc[8];
            std::snprintf(esc, sizeof esc, "\\u%04x", static_cast<unsigned>(ch));
            out += esc;
        } else {
            out += ch;
        }
    }
    return out + "\"";
}

// One access-log record as a JSON line (--access-log).
std::string access_line(const ordo::access_record& r) {
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(r.when.time_since_epoch()).count();
    const std::time_t secs = static_cast<std::time_t>(ms / 1000);
    std::tm utc{};
    gmtime_r(&secs, &utc);
    char when[64];
    std::snprintf(when, sizeof when, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", utc.tm_year + 1900,
                  utc.tm_mon + 1, utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec,
                  static_cast<int>(ms % 1000));
    std::string line = "{\"time\":\"" + std::string(when) + "\",\"trace_id\":";
    line += r.trace_id.empty() ? "null" : json_string(r.trace_id);
    line += ",\"method\":" + json_string(r.method) + ",\"peer\":" + json_string(r.peer) +
            ",\"subject\":" + json_string(r.subject) +
            ",\"status\":" + json_string(r.status ? r.status.message() : "ok") +
            ",\"code\":" + std::to_string(r.status.value()) +
            ",\"duration_us\":" + std::to_string(r.duration.count()) +
            ",\"bytes_in\":" + std::to_string(r.bytes_in) +
            ",\"bytes_out\":" + std::to_string(r.bytes_out) + "}\n";
    return line;
}

int main(int argc, char** argv) {
    std::vector<std::string> urls;
    ordo::server_options options;
    long liveness_timeout_ms = -1;  // -1: the library's default
    std::string metrics;
    bool verbose = false;
    std::size_t threads = 1;
    long drain_ms = 10'000;
    CLI::App app{"Serves counter and echo(any) on every URL until SIGINT or SIGTERM.",
                 "ordo-inc-server"};
    ordo_cli::use_defaults(app);
    app.add_option("--listen", urls,
                   "a URL to listen on, any scheme; repeat for more (default "
                   "tcp://127.0.0.1:7000)")
        ->type_name("URL")
        ->default_str("")
        ->take_all()
        ->allow_extra_args(false);
    app.add_option("--liveness-timeout-ms", liveness_timeout_ms,
                   "a peer silent for this long while calls are pending is lost (default: the "
                   "library's)")
        ->check(ordo_cli::at_least(0))
        ->default_str("");
    app.add_option("--cert", options.peer.transport.tls.cert_file,
                   "certificate of the tls:// listeners (PEM)")
        ->type_name("F");
    app.add_option("--key", options.peer.transport.tls.key_file,
                   "private key of the tls:// listeners (PEM)")
        ->type_name("F");
    app.add_option("--ca", options.peer.transport.tls.ca_file,
                   "clients must show a certificate signed by this CA (mutual TLS)")
        ->type_name("F");
    app.add_option("--metrics", metrics,
                   "serve Prometheus metrics on http://HOST:PORT/metrics (port 0: any free one)")
        ->type_name("HOST:PORT");
    app.add_option("--threads", threads,
                   "event loops serving connections (the main thread and N - 1 more)")
        ->check(ordo_cli::at_least(1))
        ->type_name("N");
    app.add_option("--drain-ms", drain_ms,
                   "on SIGTERM, serve calls in flight for up to this long, then stop (SIGINT "
                   "stops at once)")
        ->check(ordo_cli::at_least(0))
        ->type_name("N");
    long warm_up_ms = 0;
    app.add_option("--warm-up-ms", warm_up_ms,
                   "say `not_serving` (ordo.health) for this long after starting, as a server "
                   "that fills its caches first would, then `serving`")
        ->check(ordo_cli::at_least(0))
        ->type_name("N");
    app.add_flag("--verbose", verbose, "also print every connection opened and closed");
    std::string journal;
    app.add_option("--journal", journal,
                   "serve note(key, n): append \"key n\" to FILE (O_APPEND, one write per call), "
                   "so that several replicas' order and counts can be checked")
        ->type_name("FILE");
    std::string access_log;
    app.add_option("--access-log", access_log,
                   "append one JSON line per call answered to FILE: time, trace_id, method, peer, "
                   "subject, status, code, duration_us, bytes_in, bytes_out")
        ->type_name("FILE");
    double trace_sample = -1;  // -1: spans are not recorded
    app.add_option("--trace-sample", trace_sample,
                   "record spans of traced calls (a W3C traceparent in their metadata): this "
                   "fraction of traces, 0 to 1, plus every failed call and the slowest; read "
                   "them with `ordo traces URL`")
        ->check(CLI::Range(0.0, 1.0))
        ->type_name("RATE");
    std::string next_url;
    app.add_option("--next", next_url,
                   "the context method also calls context at URL from inside its handler "
                   "(which passes its deadline and trace on), and answers both")
        ->type_name("URL");
    std::string register_at;
    long register_ttl_s = 10;
    app.add_option("--register", register_at,
                   "keep the first listen URL registered in etcd under this key prefix while "
                   "serving (revoked on SIGINT/SIGTERM)")
        ->type_name("etcd://HOST:PORT/PREFIX");
    app.add_option("--register-ttl-s", register_ttl_s,
                   "the etcd lease's time to live: a killed server leaves etcd this long after "
                   "its last keep-alive")
        ->check(ordo_cli::at_least(1))
        ->type_name("N");
    std::string auth_tokens;
    app.add_option("--auth-tokens", auth_tokens,
                   "serve only callers that present a token listed in FILE (lines \"TOKEN "
                   "SUBJECT\"), or a client certificate signed by --ca")
        ->type_name("FILE");
    std::vector<std::string> introspectors;
    app.add_option("--allow-introspection", introspectors,
                   "with --auth-tokens: this subject may call ordo.stats and ordo.methods "
                   "(repeat for more)")
        ->type_name("SUBJECT");
    std::string concurrency;
    app.add_option("--concurrency", concurrency,
                   "calls that suspend (sleep_ms, context...) running at once, over every "
                   "connection: adaptive, or a number; one over it is answered overloaded with a "
                   "retry-after hint (default: no limit)")
        ->type_name("adaptive|N");
    std::size_t fair_queue = 8;
    app.add_option("--fair-queue", fair_queue,
                   "with --concurrency: the limit is shared among callers (by token subject, "
                   "certificate, uid or address), each with a queue of N calls waiting for a "
                   "slot; 0: not shared, a call over the limit is refused at once")
        ->capture_default_str()
        ->type_name("N");
    std::vector<std::string> weights;
    app.add_option("--weight", weights,
                   "with --concurrency: SUBJECT=N, that caller's weight in the shares (repeat "
                   "for more; others weigh 1)")
        ->type_name("SUBJECT=N");
    if (const auto status = ordo_cli::parse(app, argc, argv, 2)) return *status;
    options.shares.queue = fair_queue;
    for (const auto& w : weights) {
        const auto eq = w.rfind('=');
        unsigned long n = 0;
        std::size_t used = 0;
        try {
            if (eq != std::string::npos && eq > 0) n = std::stoul(w.substr(eq + 1), &used);
        } catch (const std::exception&) {
        }
        if (eq == std::string::npos || eq == 0 || used == 0 || used != w.size() - eq - 1 ||
            n == 0 || n > 1'000'000) {
            std::cerr << "error: --weight " << w << ": expected SUBJECT=N, N from 1 to 1000000\n";
            return 2;
        }
        options.shares.weights[w.substr(0, eq)] = static_cast<unsigned>(n);
    }
    if (concurrency == "adaptive") {
        options.concurrency = ordo::adaptive;
    } else if (!concurrency.empty()) {
        std::size_t used = 0;
        unsigned long n = 0;
        try {
            n = std::stoul(concurrency, &used);
        } catch (const std::exception&) {
        }
        if (used != concurrency.size() || n == 0) {
            std::cerr << "error: --concurrency " << concurrency
                      << ": expected adaptive or a number above 0\n";
            return 2;
        }
        options.concurrency = static_cast<std::size_t>(n);
    }
    if (!auth_tokens.empty()) {
        try {
            options.authenticate = ordo::authenticate_tokens(ordo::read_token_file(auth_tokens));
        } catch (const std::exception& e) {
            std::cerr << "error: --auth-tokens: " << e.what() << "\n";
            return 1;
        }
        if (!introspectors.empty())
            options.allow_introspection = ordo::allow_subjects(introspectors);
    }
    if (liveness_timeout_ms >= 0)
        options.peer.liveness_timeout = std::chrono::milliseconds(liveness_timeout_ms);
    if (urls.empty()) urls.push_back("tcp://127.0.0.1:7000");

    options.peer.transport.on_refused = [](const std::string& why) {
        std::cerr << "refused: " << why << std::endl;
    };
    options.on_event = [verbose](const ordo::server_event& e) {
        using kind = ordo::server_event::kind;
        // A peer that leaves (end of stream, reset) or is closed by the stop is no news.
        const bool routine = e.what == kind::opened ||
                             (e.what == kind::closed &&
                              (e.code == ordo::errc::peer_lost || e.code == ordo::errc::closed ||
                               e.code == ordo::errc::shutting_down || !e.code));
        if (verbose || !routine) std::cerr << ordo::to_string(e) << std::endl;
    };
    options.threads = threads;
    int access_fd = -1;
    if (!access_log.empty()) {
        access_fd = ::open(access_log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (access_fd < 0) {
            std::cerr << "error: --access-log " << access_log << ": " << std::strerror(errno)
                      << "\n";
            return 1;
        }
        // One write per record, O_APPEND: lines from several loops never interleave.
        options.access_log = [access_fd](const ordo::access_record& r) {
            const std::string line = access_line(r);
            if (::write(access_fd, line.data(), line.size()) < 0) {
                // A full disk loses records; the calls go on.
            }
        };
    }
    net::io_context io;
    ordo::server srv(io.get_executor(), options);
    long total = 0;  // process-wide, shared by every peer
    ordo::handler_options shared;
    if (threads > 1) shared.run_on = net::make_strand(io);
    serve_counter(srv, total, shared);
    if (trace_sample >= 0) ordo::record_spans({.sample_rate = trace_sample});
    if (!next_url.empty()) serve_context_via(srv, next_url);
    int journal_fd = -1;
    if (!journal.empty()) {
        journal_fd = ::open(journal.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (journal_fd < 0) {
            std::cerr << "error: --journal " << journal << ": " << std::strerror(errno) << "\n";
            return 1;
        }
        srv.on("note", [journal_fd](std::string key, int n) {
            const std::string line = key + " " + std::to_string(n) + "\n";
            if (::write(journal_fd, line.data(), line.size()) != static_cast<ssize_t>(line.size()))
                throw std::runtime_error(std::string("journal: ") + std::strerror(errno));
            return n;
        });
    }

#ifdef ORDO_HAS_PROMETHEUS
    std::unique_ptr<ordo::prometheus_exporter> exporter;  // stops serving before srv goes
#endif
    std::unique_ptr<ordo::etcd_registration> registration;  // --register
    std::string registered_url;
    int status = 0;
    try {
#ifdef ORDO_HAS_PROMETHEUS
        if (!metrics.empty()) {
            exporter = std::make_unique<ordo::prometheus_exporter>(metrics);
            exporter->add(srv);
            std::cout << "metrics on " << exporter->url() << std::endl;
        }
#else
        if (!metrics.empty()) {
            std::cerr << "error: --metrics: this ordo-inc-server was built without "
                         "prometheus-cpp (install prometheus-cpp-dev and rebuild)\n";
            return 1;
        }
#endif
        ordo::etcd_registration_options reg;
        if (!register_at.empty()) reg = etcd_options(register_at, register_ttl_s);
        std::vector<std::string> listening;
        for (const auto& u : urls) {
            listening.push_back(srv.listen(u));
            std::cout << "listening on " << listening.back() << std::endl;
        }
        if (!register_at.empty()) {
            reg.url = registered_url = listening.front();
            registration = std::make_unique<ordo::etcd_registration>(io.get_executor(), reg);
        }
    } catch (const std::exception& e) {
        std::cerr << "error: " << e.what() << "\n";
        return 1;
    }
    net::steady_timer warm_up(io);
    if (warm_up_ms > 0) {
        srv.set_health("", ordo::health_state::not_serving);
        warm_up.expires_after(std::chrono::milliseconds(warm_up_ms));
        warm_up.async_wait([&](std::error_code ec) {
            if (ec || srv.health() != ordo::health_state::not_serving) return;
            srv.set_health("", ordo::health_state::serving);
            std::cout << "serving" << std::endl;
        });
    }
    net::signal_set signals(io, SIGINT, SIGTERM);
    signals.async_wait([&](std::error_code ec, int sig) {
        if (ec) return;
        warm_up.cancel();
        if (sig == SIGTERM) {
            // A graceful stop (ordo.goaway to every client; see server::async_drain).
            std::cout << "draining" << std::endl;
            net::co_spawn(io,
                          leave_etcd_then(registration.get(),
                                          srv.async_drain(std::chrono::milliseconds(drain_ms))),
                          net::detached);
            return;
        }
        net::co_spawn(io, leave_etcd_then(registration.get(), srv.async_stop()), net::detached);
    });
    if (registration) {
        net::co_spawn(io, registration->async_start(), [&](std::exception_ptr e) {
            if (!e) {
                std::cout << "registered " << register_at.substr(0, register_at.find('?'))
                          << registered_url << std::endl;
                return;
            }
            try {
                std::rethrow_exception(e);
            } catch (const std::exception& x) {
                std::cerr << "error: " << x.what() << std::endl;
            }
            status = 1;
            signals.cancel();
            net::co_spawn(io, srv.async_stop(), net::detached);
        });
    }
    io.run();
    return status;
}
