// ordo::gateway's state, shared by gateway/gateway.cpp (civetweb: listening, routing, limits,
// responses) and gateway/calls.cpp (what a request does on the channel).
#pragma once

#include <atomic>
#include <chrono>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include <civetweb.h>

#include "gateway/tls_front.hpp"
#include "ordo/gateway/gateway.hpp"

namespace ordo {

struct gateway::state {
    using clock = std::chrono::steady_clock;

    state(channel c, gateway_options opt)
        : ch(std::move(c)), o(std::move(opt)), remote_(ch.remote_address()) {
        if (!o.auth_tokens.empty()) check_token = authenticate_tokens(o.auth_tokens);
    }

    /// The channel's name for messages. A router's changes with its members and may only be
    /// read on its executor: note_remote() copies it from there, after each call.
    std::string remote() const {
        std::lock_guard lk(remote_mu_);
        return remote_;
    }
    void note_remote() {
        const std::string& now = ch.impl()->remote_address();
        std::lock_guard lk(remote_mu_);
        if (remote_ != now) remote_ = now;
    }

    channel ch;
    gateway_options o;
    authenticate_fn check_token;  // set with auth_tokens
    // https: the listener's certificate, key and client CA (listen's parameters).
    std::string tls_cert, tls_key, tls_ca;
    std::unique_ptr<gw::tls_front> front;  // https: ordo's TLS in front of civetweb
    // What civetweb's threads read of it: `https` is set before civetweb starts; `front_seen`
    // once the front exists (civetweb's port must be known first). Until then, nothing is
    // served on that port.
    bool https = false;
    std::atomic<const gw::tls_front*> front_seen{nullptr};
    // The channels opened for callers' tokens (gateway_options::connect_as), by token.
    std::mutex upstream_mu;
    std::map<std::string, std::shared_ptr<const std::shared_future<channel>>> upstreams;
    std::string url;
    mg_context* ctx = nullptr;
    std::atomic<bool> stopping{false};

    std::atomic<std::uint64_t> requests{0}, calls{0}, notifications{0};
    std::atomic<std::uint64_t> s2xx{0}, s4xx{0}, s5xx{0};
    std::atomic<std::uint64_t> refused{0}, limit_closes{0}, abandoned{0}, calls_abandoned{0};
    std::atomic<std::size_t> connections{0}, in_flight{0};

    // ordo.methods, as last read: name -> signature ("(int)", "(int) [stream]").
    std::mutex methods_mu;
    std::map<std::string, std::string> methods;
    std::optional<clock::time_point> methods_at;

  private:
    mutable std::mutex remote_mu_;
    std::string remote_;

  public:
    void event(const std::string& line) const {
        if (o.on_event) o.on_event(line);
    }
    void count_status(int status) {
        ++requests;
        ++(status < 300 ? s2xx : status < 500 ? s4xx : s5xx);
    }
};

namespace gw {

/// What a request asks for, from its query string and headers.
struct call_request {
    mg_connection* conn = nullptr;  // the HTTP connection it came on (client_gone)
    channel via;  // the upstream that carries it: the gateway's, or the caller's own
    std::string method;
    std::string body;
    bool notify = false;
    bool stream = false;                   // asked for explicitly
    std::chrono::milliseconds timeout{0};  // 0: none
    bool already_due = false;              // an absolute deadline already passed
    std::string key;
    metadata meta;  // the call's metadata: a valid W3C traceparent (and its tracestate)
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
};

/// {"code": ..., "message": ...} with the status of `ec` (http_status()).
reply error_reply(std::error_code ec, const std::string& message, const std::string& detail);
/// {"code": code, "message": message} with `status`, for failures of the request itself.
reply request_error(int status, std::string_view code, const std::string& message);

/// Parses the query string and headers of `c` into `r` (method and body aside). Returns an
/// error reply (400) naming the problem, or nothing.
std::optional<reply> parse_options(const mg_connection* c, call_request& r);

/// Runs a call or notification for `r`; the reply to send. Streams are served by
/// serve_stream(), which writes its own response.
reply run_call(gateway::state& s, const call_request& r);
/// Serves a streaming call on `c` (NDJSON, chunked); returns the status sent.
int serve_stream(gateway::state& s, mg_connection* c, const call_request& r);
/// Whether ordo.methods marks `method` as a stream (read again at most once a second when it
/// is not listed, else every 10 s).
bool method_streams(gateway::state& s, const std::string& method);
reply routes(gateway::state& s);
reply healthz(gateway::state& s);
reply metrics(gateway::state& s);

/// Per connection (civetweb's connection user data): when its current request could start
/// arriving (accepted, or the previous response written), to tell a timeout from bad bytes;
/// its socket, once client_gone() has looked it up (-2: not yet; -1: not found).
struct conn_data {
    std::chrono::steady_clock::time_point since = std::chrono::steady_clock::now();
    int fd = -2;
};

/// Whether the client of `c` has closed its connection (checked without reading: a request
/// it pipelined stays unread).
bool client_gone(mg_connection* c);

/// The caller's bearer token into `token`, when the gateway has auth_tokens: no reply if it
/// has none or an accepted one; a 401 reply if the request carries no token it accepts.
std::optional<reply> bearer_refused(mg_connection* c, gateway::state& s, std::string& token);
/// The upstream that carries the calls of the caller with `token` (gateway_options::
/// connect_as), or the gateway's own channel. Throws std::system_error (timed_out, or why it
/// could not open).
channel upstream_for(gateway::state& s, const std::string& token);

/// Writes `r` as one HTTP/1.1 response (one write), keeping the connection.
void send_reply(mg_connection* c, const reply& r);

}  // namespace gw
}  // namespace ordo
