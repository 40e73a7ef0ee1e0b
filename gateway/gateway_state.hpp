// What the gateway's files share: its state, one HTTP connection, and the parts of a request's
// work (gateway/gateway.cpp: listening, connections, limits, routing; gateway/calls.cpp: what a
// request does on the channel; gateway/callers.cpp: bearer tokens and each caller's upstream).
// Everything here lives on the channel's executor, but for the counters (atomics, read by
// gateway::counters() from any thread).
#pragma once

#include <atomic>
#include <chrono>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "gateway/http.hpp"
#include "lib/printable.hpp"
#include "ordo/comm/transport.hpp"
#include "ordo/gateway/gateway.hpp"
#include "ordo/rpc/stream_call.hpp"

namespace ordo {

namespace gw {
struct connection;
struct upstream;
}  // namespace gw

struct gateway::state : std::enable_shared_from_this<gateway::state> {
    using clock = std::chrono::steady_clock;

    state(channel c, gateway_options opt);

    /// The channel's name for messages (read on its executor, where the gateway runs).
    std::string remote() const { return ch.impl()->remote_address(); }

    channel ch;
    gateway_options o;
    net::any_io_executor ex;      // the channel's: HTTP connections run here too
    authenticate_fn check_token;  // set with auth_tokens
    std::unique_ptr<listener> l;
    std::string url;
    bool https = false;

    // The connections open, oldest first; per address group (detail::address_group).
    std::list<gw::connection*> conns;
    std::unordered_map<std::string, std::size_t> per_address;
    std::size_t refusing = 0;  // refusals being written (at most 64; beyond, closed unsaid)
    std::unique_ptr<net::steady_timer> sweep_tick;
    // stop(): set on the executor; the last connection to end fulfils `all_closed`.
    bool stopping = false;
    int tasks = 0;  // the accept loop and the sweep, while they run
    std::function<void()> all_closed;

    // The channels opened for callers' tokens (gateway_options::connect_as), by token.
    std::map<std::string, std::shared_ptr<gw::upstream>> upstreams;
    // ordo.methods, as last read: name -> signature ("(int)", "(int) [stream]").
    std::map<std::string, std::string> methods;
    std::optional<clock::time_point> methods_at;

    std::atomic<std::uint64_t> requests{0}, calls{0}, notifications{0};
    std::atomic<std::uint64_t> s2xx{0}, s4xx{0}, s5xx{0};
    std::atomic<std::uint64_t> refused{0}, limit_closes{0}, abandoned{0}, calls_abandoned{0};
    std::atomic<std::size_t> connections{0}, in_flight{0};

    // At most 10 event lines a second; the rest are counted and said in one line.
    clock::time_point events_since{};
    std::size_t events_said = 0, events_unsaid = 0;

    void event(const std::string& line) {
        if (!o.on_event) return;
        const auto now = clock::now();
        if (now - events_since >= std::chrono::seconds(1)) {
            if (events_unsaid > 0)
                o.on_event("ordo gateway: " + std::to_string(events_unsaid) +
                           " more events within a second, not said one by one");
            events_since = now;
            events_said = events_unsaid = 0;
        }
        if (events_said >= 10) {
            ++events_unsaid;
            return;
        }
        ++events_said;
        // Lines quote what callers sent (paths, methods): one event stays one line.
        o.on_event(detail::printable(line));
    }
    void count_status(int status) {
        ++requests;
        ++(status < 300 ? s2xx : status < 500 ? s4xx : s5xx);
    }
};

namespace gw {

/// One HTTP connection: its transport, the bytes read and not yet taken, the request being
/// read, and what wakes its serving coroutine (bytes, the end of the stream, an expired
/// deadline, a call's completion, the gateway stopping).
struct connection {
    using clock = std::chrono::steady_clock;
    connection(std::unique_ptr<transport> tr, const gateway_options& o)
        : t(std::move(tr)),
          remote(t->remote_address()),
          reader(o.max_header_bytes, o.max_body_bytes),
          wake(t->get_executor(), clock::time_point::max()) {}

    std::unique_ptr<transport> t;
    std::string remote;  // "tcp://1.2.3.4:5678": the client, as events name it
    std::string key;     // its address group
    http_reader reader;
    std::string in;            // bytes read, not yet fed to the reader
    std::size_t in_taken = 0;  // of `in`, fed already
    net::steady_timer wake;
    clock::time_point since = clock::now();
    clock::time_point deadline = clock::time_point::max();
    std::chrono::milliseconds write_limit{30'000};  // a response must be taken within it
    enum class phase { waiting, head, body, busy, writing, closing } at = phase::waiting;
    bool eof = false;         // the client ended the stream, or reading failed
    bool expired = false;     // the sweep found the deadline passed
    bool served_one = false;  // a whole request was read: not a stranger any more
    bool evicted = false;
    std::list<connection*>::iterator where;

    std::size_t unread() const noexcept { return in.size() - in_taken; }
    void set_deadline(std::chrono::milliseconds d) {
        deadline = d.count() > 0 ? clock::now() + d : clock::time_point::max();
    }
};

/// What a request asks for, from its query string and headers.
struct call_request {
    connection* conn = nullptr;  // the HTTP connection it came on (client gone, stopping)
    channel via;  // the upstream that carries it: the gateway's, or the caller's own
    std::string method;
    std::string body;
    bool notify = false;
    bool stream = false;                   // asked for explicitly
    std::chrono::milliseconds timeout{0};  // 0: none
    bool already_due = false;              // an absolute deadline already passed
    std::string key;
    metadata meta;  // the call's metadata: a valid W3C traceparent (and its tracestate)
    std::optional<std::string> params;  // params= (Ordo-Params): a stream's, its body NDJSON
};

/// A finished response: status, content type, body.
struct reply {
    reply() = default;
    reply(int st, std::string t, std::string b)
        : status(st), type(std::move(t)), body(std::move(b)) {}
    int status = 200;
    std::string type = "application/json";
    std::string body;
    std::string headers;  // more header lines, each "\r\nName: value"
    bool close = false;   // close the connection after it (a limit, a malformed request)
};

/// {"code": ..., "message": ...} with the status of `ec` (http_status()).
reply error_reply(std::error_code ec, const std::string& message, const std::string& detail);
/// {"code": code, "message": message} with `status`, for failures of the request itself.
reply request_error(int status, std::string_view code, const std::string& message);

/// Parses the query string and headers of `req` into `r` (method and body aside). Returns an
/// error reply (400) naming the problem, or nothing.
std::optional<reply> parse_options(const http_request& req, call_request& r);

/// Runs a call or notification for `r`; the reply to send. Streams are served by
/// serve_stream(), which writes its own response.
net::awaitable<reply> run_call(gateway::state& s, const call_request& r);
/// Serves a streaming call (NDJSON, chunked) on the request's connection; the status sent.
net::awaitable<int> serve_stream(gateway::state& s, const http_request& req,
                                 const call_request& r);
/// Serves a client stream (`two_way` false: the NDJSON body's lines are the items written, the
/// answer one JSON reply) or a two-way stream (the handler's items go back as NDJSON, chunked,
/// while the body is still read: HTTP/1.1 both ways at once) on the request's connection,
/// whose body is NDJSON (http_reader::body_streams); the status sent. gateway/uploads.cpp.
net::awaitable<int> serve_body_stream(gateway::state& s, const http_request& req,
                                      const call_request& r, bool two_way);
/// What ordo.methods says a method is, from its signature's suffix: " [stream]", " [client
/// stream]", " [two-way stream]"; `unknown` when it is not listed.
enum class method_shape { call, stream, upload, two_way, unknown };
/// ordo.methods' word on `method` (read again at most once a second when it is not listed,
/// else every 10 s).
net::awaitable<method_shape> shape_of(gateway::state& s, const std::string& method);
/// The params of `r`: its body (a JSON value or array), or its params= for a stream whose body
/// is NDJSON; null and `bad` set when they are refused (413 over a limit, 400 not JSON).
std::optional<detail::params_buffer> params_of(const call_request& r, std::string_view json_text,
                                               std::optional<reply>& bad);
call_options options_of(gateway::state& s, const call_request& r);
/// 504: an absolute deadline (absolute_slo_ms) had passed when the request arrived.
reply timed_out_before(gateway::state& s, const call_request& r);
/// One HTTP chunk in one write: its size, the data, CRLF. False once the client has gone.
net::awaitable<bool> write_chunk(connection& c, std::string_view data);
/// A stream's failure as the last NDJSON line, {"error": {...}}, then the last chunk.
net::awaitable<void> end_with_error(connection& c, const reply& rep);
/// The next item of `st`, or its failure as a value: `||` waits for the first operation that
/// succeeds, so one that threw would wait for the other (the connection's next event).
struct stream_step {
    std::optional<value> item;
    std::optional<rpc_error> failed;
};
net::awaitable<stream_step> next_step(std::shared_ptr<detail::stream_state<value>> st);
/// GET /-/routes, asked over `via` (the caller's own upstream: what it may see).
net::awaitable<reply> routes(gateway::state& s, const channel& via);
/// GET /-/healthz; `full`: with the backend's name and the reason (callers the gateway knows).
net::awaitable<reply> healthz(gateway::state& s, bool full);
reply metrics(gateway::state& s);

/// The caller's bearer token into `token`, when the gateway has auth_tokens: no reply if it
/// has none or an accepted one; a 401 reply if the request carries no token it accepts.
std::optional<reply> bearer_refused(const http_request& req, gateway::state& s,
                                    std::string& token);
/// The upstream that carries the calls of the caller with `token` (gateway_options::
/// connect_as), or the gateway's own channel. Throws std::system_error (timed_out, or why it
/// could not open).
net::awaitable<channel> upstream_for(gateway::state& s, const std::string& token);

/// A text/plain response that closes the connection after it: the HTTP-level failures (a
/// limit, a malformed request).
reply closing_reply(int status, const std::string& reason);
/// What one request does on connection `c`: the reply, or nothing when it wrote its own
/// response (a stream).
net::awaitable<std::optional<reply>> route(gateway::state& s, connection& c,
                                           const http_request& req);

/// Writes `r` as one HTTP/1.1 response to `req`. False when the client is gone.
net::awaitable<bool> send_reply(gateway::state& s, connection& c, const http_request& req,
                                const reply& r);
/// Writes raw bytes; false when the client is gone (the connection is then marked so).
net::awaitable<bool> write_all(connection& c, std::string_view bytes);
/// Waits on the connection's wake timer (any of its events).
net::awaitable<void> wait_event(connection& c);

}  // namespace gw
}  // namespace ordo
