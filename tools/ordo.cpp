// ordo: msgpack-rpc from the command line, against any msgpack-rpc server and any URL ordo
// accepts (tcp://, unix://, tls://, zmq+tcp://, route+..., ?mode=pooled).
//
//   ordo call URL METHOD [ARG...] [--raw] [--timeout MS] [--meta K=V]...
//                                                          prints the result as JSON; a
//                                                          streaming method's items one a line
//   ordo notify URL METHOD [ARG...] [--timeout MS]         sends a one-way message
//   ordo ping URL [--timeout MS]                           prints "ok <ms>" (round trip)
//   ordo methods URL [--timeout MS]                        lists an ordo server's methods
//   ordo stats URL [--timeout MS]                          an ordo server's counters, as JSON
//   ordo traces URL... [--trace ID] [--slowest N]          the spans these servers recorded,
//                                                          as a tree per trace
//   ordo gateway --listen http://H:P --to URL [...]      serves HTTP in front of URL's channel
//                                                          (docs/gateway.md)
//   ordo health URL [SERVICE] [--timeout MS]               prints serving, not_serving or
//                                                          draining (ordo.health); exits 0
//                                                          only when serving (an exec probe)
//   ordo replicas route+URL [--timeout MS]                 a router's view of its replicas: one
//                                                          line each (URL, state, weight, ...),
//                                                          then its sources; exits 1 if none is
//                                                          ready
//
// A method that streams (ordo.methods marks it "[stream]" or "[batch stream]"; --stream forces
// it) is called as a stream: each item is printed on its own line as it arrives, and --timeout
// bounds the wait for each item. When the output closes (`ordo call URL count_to 1000000 |
// head -3`), the stream is cancelled (ordo.cancel) and ordo exits 0.
//
// Each ARG is JSON; a word that is not JSON is sent as a string (`greet bob` sends "bob").
// Failures print one line on stderr naming the method, the peer and the reason, and exit 1;
// usage errors exit 2.
//
// msgpack to JSON (the default output): bin is a string when it is valid UTF-8, else an array
// of byte values; ext is {"ext": type, "data": [bytes]}; a map key that is not a string becomes
// its JSON text. --raw prints msgpack-c's own rendering of the object instead, which shows the
// msgpack types as they are but is not always valid JSON.
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <iostream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <ordo/rpc/connect.hpp>

#include <ordo/rpc/peer.hpp>
#include <ordo/rpc/router.hpp>

#include "json/json_codec.hpp"
#include "tools/traces_command.hpp"
#ifdef ORDO_WITH_GATEWAY
#include "tools/gateway_command.hpp"
#endif

namespace net = ordo::net;
using json = nlohmann::json;

namespace {

struct request {
    std::string command;  // call, notify or ping
    std::string url;
    std::string method;
    std::vector<std::string> args;
    long timeout_ms = 10'000;
    bool raw = false;
    bool stream = false;  // call as a stream even if ordo.methods does not say it streams
    std::vector<std::string> meta;  // --meta KEY=VALUE: the call's metadata
    std::vector<std::string> more_urls;  // traces: the other servers asked
    std::string trace;                   // traces --trace
    std::size_t slowest = 0;             // traces --slowest
};

// A failure already worded for the user (method, peer, reason).
struct failure : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// ---- JSON <-> msgpack (json/json_codec.hpp) ---------------------------------------------

// One command-line word as a value: JSON if it parses, else the word itself as a string, so
// that plain words need no shell-quoted JSON quotes.
json parse_arg(const std::string& word) {
    json j = json::parse(word, nullptr, /*allow_exceptions=*/false);
    return j.is_discarded() ? json(word) : j;
}

ordo::detail::params_buffer pack_args(const std::vector<std::string>& args) {
    json a = json::array();
    for (const auto& w : args) a.push_back(parse_arg(w));
    return ordo::json_codec::pack_params(a);
}

using ordo::json_codec::to_json;

std::string render(const msgpack::object& o, bool raw) {
    if (raw) {
        std::ostringstream s;
        s << o;
        return s.str();
    }
    return ordo::json_codec::dump(o);
}

// ---- the commands -------------------------------------------------------------------------

// Stops the loop if connecting takes longer than the timeout: async_connect has no deadline of
// its own for an ordered connection (a host that drops SYNs keeps connect() waiting for
// minutes, a TLS server that never answers the handshake for handshake_timeout_ms).
class deadline {
  public:
    deadline(net::io_context& io, long ms) : io_(io), timer_(io), ms_(ms) {}

    void arm(std::string step) {
        step_ = std::move(step);
        if (ms_ <= 0) return;
        timer_.expires_after(std::chrono::milliseconds(ms_));
        timer_.async_wait([this](std::error_code ec) {
            if (ec) return;
            expired_ = true;
            io_.stop();
        });
    }
    void disarm() { timer_.cancel(); }
    bool expired() const { return expired_; }
    const std::string& step() const { return step_; }

  private:
    net::io_context& io_;
    net::steady_timer timer_;
    long ms_;
    std::string step_;
    bool expired_ = false;
};

std::string what_for(const request& r) {
    return r.command == "call" || r.command == "notify" ? r.command + " " + r.method : r.command;
}

net::awaitable<ordo::channel> connect(const request& r, deadline& dl) {
    dl.arm(what_for(r) + " to " + r.url);
    try {
        // A server may send notifications back (neovim does, once subscribed); those with no
        // handler here are said on stderr rather than dropped unseen.
        ordo::peer_options po;
        po.on_dropped = [](const ordo::dropped_message& d) {
            std::cerr << "ordo: dropped from " << d.peer << ": " << d.reason << std::endl;
        };
        auto ch = co_await ordo::async_connect(r.url, po);
        dl.disarm();
        co_return ch;
    } catch (const ordo::rpc_error& e) {
        // Connect failures name the address already: say the step, the address and the reason
        // once ("ordo: call inc to tcp://127.0.0.1:1 failed: connection refused").
        throw failure("ordo: " + what_for(r) + " to " + r.url +
                      " failed: " + (e.detail().empty() ? e.what() : e.detail()));
    }
}

// There is no public call taking already packed params (channel::async_call packs a fixed
// number of C++ arguments), so the call goes through the same detail::call that it uses.
net::awaitable<ordo::value> call_packed(const ordo::channel& ch, const std::string& method,
                                        ordo::detail::params_buffer params, long timeout_ms,
                                        ordo::metadata meta = {}) {
    ordo::call_options o;
    o.timeout = std::chrono::milliseconds(timeout_ms);
    o.metadata = std::move(meta);
    return ordo::detail::call<ordo::value>(ch.impl(), method, std::move(params), std::move(o),
                                           net::use_awaitable);
}

// Named, not a braced temporary inside co_await (docs/calls-and-channels.md, "GCC 12 note").
const std::vector<std::string> no_args;

// A response that is an error still proves the round trip: a foreign peer answers ordo.ping
// with "no such method".
bool answered(const ordo::rpc_error& e) {
    return e.code() == ordo::errc::method_not_found || e.code() == ordo::errc::remote_error ||
           e.code() == ordo::errc::bad_arguments;
}

// A graceful close writes what is queued, ends our direction and waits for the server to end
// its (closing at once could reset the connection before the server has read the
// notification). A server that keeps its end open past the timeout is not an error once
// everything was written: the connection is then dropped.
net::awaitable<void> close_after_flush(ordo::peer& p, const request& r) {
    using namespace net::experimental::awaitable_operators;
    if (r.timeout_ms <= 0) co_return co_await p.async_close();
    net::steady_timer t(co_await net::this_coro::executor, std::chrono::milliseconds(r.timeout_ms));
    auto done = co_await (p.async_close() || t.async_wait(net::use_awaitable));
    if (done.index() == 0) co_return;
    const bool written = p.comm().buffered_bytes == 0;
    p.abort();
    if (!written)
        throw failure("ordo: " + what_for(r) + " to " + r.url + " failed: not written within " +
                      std::to_string(r.timeout_ms) + " ms");
}

// Whether the server says `method` streams (its signature in ordo.methods ends in
// "stream]"). A server without ordo.methods (any other msgpack-rpc server) does not, nor does
// one that keeps its method list from this caller (permission_denied): the call goes as given
// (--stream forces a stream).
net::awaitable<bool> says_it_streams(const ordo::channel& ch, const request& r) {
    if (r.method.starts_with("ordo.")) co_return false;
    try {
        auto v = co_await call_packed(ch, "ordo.methods", pack_args(no_args), r.timeout_ms);
        const msgpack::object& o = v.get();
        if (o.type != msgpack::type::MAP) co_return false;
        for (const auto& kv : o.via.map) {
            if (kv.key.type != msgpack::type::STR || kv.val.type != msgpack::type::STR) continue;
            const std::string_view name(kv.key.via.str.ptr, kv.key.via.str.size);
            const std::string_view sig(kv.val.via.str.ptr, kv.val.via.str.size);
            if (name == r.method) co_return sig.ends_with("stream]");
        }
    } catch (const ordo::rpc_error& e) {
        if (!answered(e) && e.code() != ordo::errc::permission_denied) throw;
    }
    co_return false;
}

// One item a line, flushed, as they arrive; --timeout bounds each wait. A closed output (the
// reader of a pipe left) cancels the stream, which is flushed to the server before ordo exits.
net::awaitable<void> print_stream(const ordo::channel& ch, const request& r, deadline& dl) {
    ordo::call_options o;  // named: docs/calls-and-channels.md, "GCC 12 note"
    auto s = co_await ordo::detail::open_stream<ordo::value>(ch.impl(), r.method, pack_args(r.args),
                                                             std::move(o));
    for (std::uint64_t n = 1;; ++n) {
        dl.arm("call " + r.method + " to " + r.url + " (waiting for item " + std::to_string(n) +
               ")");
        auto v = co_await s.next();
        dl.disarm();
        if (!v) co_return;
        std::cout << render(v->get(), r.raw) << '\n' << std::flush;
        if (!std::cout) break;
    }
    s.cancel();
    if (auto p = std::dynamic_pointer_cast<ordo::peer>(ch.impl())) {
        // The cancel is posted to the connection, which withdraws the call and sends
        // ordo.cancel: let that happen, then flush and close.
        auto ex = co_await net::this_coro::executor;
        for (int i = 0; i < 16 && p->counters().pending_calls > 0; ++i)
            co_await net::post(ex, net::use_awaitable);
        co_await close_after_flush(*p, r);
    }
}

// A router made from the URL, shown once every replica has had its first try (or --timeout
// passed): the replicas as the router sees them, then its sources.
net::awaitable<int> show_replicas(const request& r) {
    if (r.url.rfind("route+", 0) != 0)
        throw failure("ordo: replicas needs a route+ URL (a router's), not " + r.url);
    auto spec = ordo::parse_route_url(r.url, {});
    auto ex = co_await net::this_coro::executor;
    auto rt = ordo::make_router(ex, spec.options);
    for (auto& rep : spec.replicas) rt->add_replica(rep.url, rep.weight, rep.group);
    if (spec.source) rt->follow(spec.source(ex));
    using clock = std::chrono::steady_clock;
    const auto until = clock::now() + std::chrono::milliseconds(r.timeout_ms ? r.timeout_ms : 2000);
    net::steady_timer t(ex);
    for (;;) {
        bool settled = !rt->replicas().empty();
        for (auto& rc : rt->replicas()) settled = settled && rc.state != ordo::replica_state::connecting;
        for (auto& [name, sc] : rt->sources()) settled = settled && sc.refreshes + sc.failures > 0;
        if (settled || clock::now() >= until) break;
        t.expires_after(std::chrono::milliseconds(20));
        co_await t.async_wait(net::use_awaitable);
    }
    int ready = 0;
    for (auto& rc : rt->replicas()) {
        ready += rc.state == ordo::replica_state::ready;
        std::cout << rc.url << ' ' << ordo::to_string(rc.state) << " weight=" << rc.weight;
        if (!rc.group.empty()) std::cout << " group=" << rc.group;
        if (!rc.source.empty()) std::cout << " source=" << rc.source;
        if (rc.overloaded) std::cout << " overloaded=" << rc.overloaded;
        if (rc.cooling) std::cout << " cooling";
        if (rc.state != ordo::replica_state::ready && !rc.last_error.empty())
            std::cout << " (" << rc.last_error << ')';
        std::cout << '\n';
    }
    for (auto& [name, sc] : rt->sources()) {
        std::cout << "source " << name << ": " << sc.members << " members, " << sc.refreshes
                  << " lookups, " << sc.failures << " failed, " << sc.rejected << " rejected";
        if (!sc.last_error.empty()) std::cout << " (last: " << sc.last_error << ')';
        std::cout << '\n';
    }
    // The retry budget the URL sets (router_options), and what this router spent of it.
    const auto& c = rt->counters();
    std::cout << "retry budget: ";
    if (spec.options.retry_budget_percent < 0)
        std::cout << "off";
    else
        std::cout << spec.options.retry_budget_percent << "% of calls + "
                  << spec.options.min_retries_per_s << "/s";
    std::cout << " (retried " << c.retried << ", moved " << c.moved << ", over budget "
              << c.over_budget << ")\n"
              << std::flush;
    rt->close();
    co_return ready > 0 ? 0 : 1;
}

// ordo.traces [trace, slowest] of each server, merged (tools/traces_command.hpp).
net::awaitable<int> show_traces(const request& r, deadline& dl) {
    std::vector<std::string> urls{r.url};
    urls.insert(urls.end(), r.more_urls.begin(), r.more_urls.end());
    const std::vector<std::string> args{json(r.trace).dump(), std::to_string(r.slowest)};
    std::vector<ordo_tool::fetched_span> all;
    for (const auto& url : urls) {
        request one = r;
        one.url = url;
        auto ch = co_await connect(one, dl);
        auto v = co_await call_packed(ch, "ordo.traces", pack_args(args), r.timeout_ms);
        std::vector<ordo::span> spans;
        try {
            v.get().convert(spans);
        } catch (const std::exception& e) {
            throw failure("ordo: traces from " + url + ": the answer is not a list of spans (" +
                          e.what() + ")");
        }
        for (auto& s : spans) all.push_back({std::move(s), url});
    }
    std::cout << ordo_tool::format_traces(std::move(all), r.slowest) << std::flush;
    co_return 0;
}

net::awaitable<int> run(const request& r, deadline& dl) {
    if (r.command == "replicas") co_return co_await show_replicas(r);
    if (r.command == "traces") co_return co_await show_traces(r, dl);
    auto ch = co_await connect(r, dl);
    if (r.command == "call") {
        if (r.stream || co_await says_it_streams(ch, r)) {
            co_await print_stream(ch, r, dl);
            co_return 0;
        }
        ordo::metadata meta;
        for (const auto& kv : r.meta) {
            const auto eq = kv.find('=');
            meta.emplace_back(kv.substr(0, eq), eq == std::string::npos ? "" : kv.substr(eq + 1));
        }
        auto v =
            co_await call_packed(ch, r.method, pack_args(r.args), r.timeout_ms, std::move(meta));
        std::cout << render(v.get(), r.raw) << std::endl;
    } else if (r.command == "notify") {
        auto params = pack_args(r.args);
        ch.impl()->notify_raw(r.method, std::string_view(params.data(), params.size()));
        if (auto p = std::dynamic_pointer_cast<ordo::peer>(ch.impl())) {
            co_await close_after_flush(*p, r);
        } else {
            // Pools and routers only abort their connections: a round trip on the connection
            // the notification took shows that it was written (best effort on a router with
            // several replicas, where the ping may go elsewhere).
            try {
                co_await call_packed(ch, "ordo.ping", pack_args(no_args), r.timeout_ms);
            } catch (const ordo::rpc_error& e) {
                if (!answered(e)) throw;
            }
        }
    } else if (r.command == "methods") {
        // ordo.methods answers {name: "(parameter types)"}: one method a line, in name order.
        auto v = co_await call_packed(ch, "ordo.methods", pack_args(no_args), r.timeout_ms);
        const msgpack::object& o = v.get();
        if (o.type != msgpack::type::MAP)
            throw failure("ordo: methods from " + r.url + ": the answer is not a map");
        const auto text = [](const msgpack::object& x) {
            return x.type == msgpack::type::STR ? std::string(x.via.str.ptr, x.via.str.size)
                                                : render(x, false);
        };
        for (const auto& kv : o.via.map) std::cout << text(kv.key) << text(kv.val) << '\n';
        std::cout << std::flush;
    } else if (r.command == "health") {
        // ordo.health answers the service's state as a word; anything but serving exits 1, so
        // that a Kubernetes exec probe takes a draining server out of rotation.
        json service = json::array();
        if (!r.method.empty()) service.push_back(r.method);  // a name, never read as JSON
        auto v = co_await call_packed(ch, "ordo.health", ordo::json_codec::pack_params(service),
                                      r.timeout_ms);
        const msgpack::object& o = v.get();
        if (o.type != msgpack::type::STR)
            throw failure("ordo: health from " + r.url + ": the answer is not a word");
        const std::string state(o.via.str.ptr, o.via.str.size);
        std::cout << state << std::endl;
        co_return state == "serving" ? 0 : 1;
    } else if (r.command == "stats") {
        // ordo.stats answers a map (docs/protocol.md): printed as indented JSON.
        auto v = co_await call_packed(ch, "ordo.stats", pack_args(no_args), r.timeout_ms);
        std::cout << to_json(v.get()).dump(2, ' ', false, json::error_handler_t::replace)
                  << std::endl;
    } else {
        const auto start = std::chrono::steady_clock::now();
        try {
            co_await call_packed(ch, "ordo.ping", pack_args(no_args), r.timeout_ms);
        } catch (const ordo::rpc_error& e) {
            if (!answered(e)) throw;
        }
        const std::chrono::duration<double, std::milli> took =
            std::chrono::steady_clock::now() - start;
        char ms[32];
        std::snprintf(ms, sizeof ms, "%.3f", took.count());
        std::cout << "ok " << ms << std::endl;
    }
    co_return 0;
}

int execute(const request& r) {
    net::io_context io;
    deadline dl(io, r.timeout_ms);
    int status = 1;
    net::co_spawn(io, run(r, dl), [&](std::exception_ptr e, int rc) {
        dl.disarm();
        status = rc;
        if (!e) return;
        status = 1;
        try {
            std::rethrow_exception(e);
        } catch (const failure& f) {
            std::cerr << f.what() << '\n';
        } catch (const ordo::rpc_error& x) {
            // what() names the method, the peer and the reason.
            std::cerr << x.what() << '\n';
        } catch (const std::exception& x) {
            std::cerr << "ordo: " << what_for(r) << " to " << r.url << " failed: " << x.what()
                      << '\n';
        }
    });
    io.run();
    if (dl.expired()) {
        const bool item = dl.step().find("(waiting for item") != std::string::npos;
        std::cerr << "ordo: " << dl.step()
                  << " failed: " << (item ? "no item within " : "timed out connecting after ")
                  << r.timeout_ms << " ms\n";
        return 1;
    }
    return status;
}

// CLI11 reads a word in brackets given to a list option as a list of its own and splits it at
// commas: [1,[2,3]] would become the three words "1", "[2" and "3]". A marker byte after the
// closing bracket hides the word from that rule; unmark() takes it off after parsing.
constexpr char marker = '\x01';

std::vector<std::string> marked_words(int argc, char** argv) {
    std::vector<std::string> words;
    for (int i = argc - 1; i >= 1; --i) {  // CLI11 takes them in reverse order
        std::string w = argv[i];
        if (w.size() >= 2 && w.front() == '[' && w.back() == ']') w += marker;
        words.push_back(std::move(w));
    }
    return words;
}

void unmark(std::string& w) {
    if (!w.empty() && w.back() == marker) w.pop_back();
}

}  // namespace

int main(int argc, char** argv) {
    // A closed output (`| head -3`) must not kill the process before it cancels its stream:
    // the write fails instead, and the stream is cancelled.
    std::signal(SIGPIPE, SIG_IGN);
    CLI::App app{"ordo: msgpack-rpc calls, notifications and pings from the command line", "ordo"};
    app.require_subcommand(1);
    request r;

    auto common = [&r](CLI::App* sub) {
        sub->add_option("URL", r.url,
                        "tcp://, unix://, tls://, zmq+tcp://, route+..., with ?parameters")
            ->required();
        sub->add_option("--timeout", r.timeout_ms,
                        "milliseconds for connecting and for the call (0: no limit)")
            ->capture_default_str()
            ->check(CLI::NonNegativeNumber);
    };
    auto method_and_args = [&r](CLI::App* sub) {
        sub->add_option("METHOD", r.method, "method name")->required();
        sub->add_option("ARG", r.args, "arguments as JSON; a word that is not JSON is a string");
    };

    auto* call = app.add_subcommand("call", "call METHOD and print its result as JSON");
    common(call);
    method_and_args(call);
    auto* raw = call->add_flag("--raw", r.raw, "print msgpack-c's rendering (not always JSON)");
    auto* as_json = call->add_flag("--json")->description("print the result as JSON (the default)");
    raw->excludes(as_json);
    call->add_option("--meta", r.meta,
                     "KEY=VALUE metadata for the call (repeatable); the handler reads it from "
                     "its call context, with the deadline --timeout gives");
    call->add_flag("--stream", r.stream,
                   "call METHOD as a stream and print its items one a line (methods that "
                   "ordo.methods marks as streaming are called so without it)");

    auto* notify = app.add_subcommand("notify", "send METHOD as a one-way message");
    common(notify);
    method_and_args(notify);

    auto* ping = app.add_subcommand("ping", "call ordo.ping and print \"ok <ms>\"");
    common(ping);

    auto* methods = app.add_subcommand(
        "methods", "list the methods an ordo server serves (ordo.methods), one a line");
    common(methods);

    auto* stats = app.add_subcommand(
        "stats",
        "print an ordo server's counters (ordo.stats) as JSON: connections, bytes, "
        "requests by method and outcome, latency, batches");
    common(stats);

    auto* traces = app.add_subcommand(
        "traces",
        "print the spans that ordo servers recorded (ordo.traces; servers record them with "
        "ordo::record_spans, ordo-inc-server --trace-sample) as one tree per trace across them");
    common(traces);
    traces->add_option("MORE", r.more_urls, "more servers to ask, merged into the same trees");
    traces->add_option("--trace", r.trace, "only this trace (its 32 hex digits)");
    traces->add_option("--slowest", r.slowest, "the N slowest spans instead, one line each")
        ->type_name("N");

    auto* health = app.add_subcommand(
        "health",
        "print whether an ordo server serves (ordo.health): serving, not_serving or draining; "
        "exit 0 only when serving, 1 otherwise or when it cannot be asked (for exec probes)");
    common(health);
    health->add_option("SERVICE", r.method, "a service the server names (default: the server)");

    auto* replicas = app.add_subcommand(
        "replicas",
        "show a router's replicas as it sees them (state: connecting, ready, reconnecting, "
        "ejected, draining) and its sources, once each replica has had its first try");
    common(replicas);

#ifdef ORDO_WITH_GATEWAY
    ordo_tool::gateway_args gw;
    auto* gateway = app.add_subcommand(
        "gateway",
        "serve HTTP/1.1 in front of a channel: POST /METHOD with JSON params answers the "
        "result as JSON (docs/gateway.md), until SIGINT or SIGTERM");
    ordo_tool::add_gateway_options(gateway, gw);
#endif

    try {
        app.parse(marked_words(argc, argv));
    } catch (const CLI::ParseError& e) {
        // --help is a ParseError too, with status 0; other usage errors exit 2, not CLI11's
        // own codes, so that 1 always means the call failed.
        return app.exit(e) == 0 ? 0 : 2;
    }
    r.command = app.get_subcommands().front()->get_name();
#ifdef ORDO_WITH_GATEWAY
    if (r.command == "gateway") return ordo_tool::run_gateway(std::move(gw));
#endif
    unmark(r.url);
    unmark(r.method);
    for (auto& a : r.args) unmark(a);
    return execute(r);
}
