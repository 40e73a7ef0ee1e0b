#include "ordo/gateway/gateway.hpp"

// The HTTP side: civetweb's context, its options (the limits), routing a request, reading its
// body within the limits, writing responses. What a request does on the channel is in
// gateway/calls.cpp.
#include <strings.h>

#include <cstring>
#include <future>
#include <string>
#include <vector>

#include "gateway/gateway_state.hpp"
#include "gateway/tls_front.hpp"
#include "ordo/address.hpp"
#include "ordo/error.hpp"

namespace ordo {
namespace {

using clock_type = std::chrono::steady_clock;
using gw::conn_data;

gateway::state& state_of(const mg_connection* c) {
    return *static_cast<gateway::state*>(mg_get_user_data(mg_get_context(c)));
}

// An HTTP-level failure: civetweb writes `status` with `reason` as text and closes the
// connection (mg_send_http_error sets its must-close flag); the others are not touched.
int close_with(mg_connection* c, int status, const std::string& reason) {
    auto& s = state_of(c);
    s.count_status(status);
    mg_send_http_error(c, status, "%s\n", reason.c_str());
    return status;
}

int limit_close(mg_connection* c, int status, const std::string& reason) {
    auto& s = state_of(c);
    ++s.limit_closes;
    s.event("ordo gateway: closing a connection: " + reason);
    return close_with(c, status, reason);
}

// Reads the whole body, within max_body_bytes and request_timeout; nullopt when a limit closed
// the connection.
std::optional<std::string> read_body(mg_connection* c, const mg_request_info* ri,
                                     gateway::state& s, int& status) {
    const auto max = s.o.max_body_bytes;
    if (ri->content_length > 0 && static_cast<std::uint64_t>(ri->content_length) > max) {
        status = limit_close(c, 413,
                             "ordo gateway: a body of " + std::to_string(ri->content_length) +
                                 " bytes is over max_body_bytes (" + std::to_string(max) + ")");
        return std::nullopt;
    }
    std::string body;
    if (ri->content_length > 0) body.reserve(static_cast<std::size_t>(ri->content_length));
    const auto until = clock_type::now() + s.o.request_timeout;
    char buf[16 * 1024];
    for (;;) {
        const int n = mg_read(c, buf, sizeof buf);
        if (n <= 0) break;
        body.append(buf, static_cast<std::size_t>(n));
        if (body.size() > max) {
            status = limit_close(c, 413,
                                 "ordo gateway: the body is over max_body_bytes (" +
                                     std::to_string(max) + ")");
            return std::nullopt;
        }
        if (clock_type::now() > until) {
            status = limit_close(c, 408,
                                 "ordo gateway: the body did not arrive within " +
                                     std::to_string(s.o.request_timeout.count()) +
                                     " ms (request_timeout)");
            return std::nullopt;
        }
    }
    if (ri->content_length > 0 && body.size() < static_cast<std::size_t>(ri->content_length)) {
        status = limit_close(c, 408,
                             "ordo gateway: the body ended after " + std::to_string(body.size()) +
                                 " of " + std::to_string(ri->content_length) +
                                 " bytes (cut, or slower than request_timeout)");
        return std::nullopt;
    }
    return body;
}

// The request line and headers as received, give or take the separators' bytes.
std::size_t header_bytes(const mg_request_info* ri) {
    auto len = [](const char* p) { return p ? std::strlen(p) : 0; };
    std::size_t n = len(ri->request_method) + len(ri->request_uri) + len(ri->query_string) + 12;
    for (int i = 0; i < ri->num_headers; ++i)
        n += len(ri->http_headers[i].name) + len(ri->http_headers[i].value) + 4;
    return n + 2;
}

// RFC 9112 section 6.3: a body's length must be unambiguous. Two Content-Length headers that
// differ, a list of lengths, or a Content-Length beside a Transfer-Encoding could be read one
// way here and another by a proxy in front (request smuggling): 400, and the connection
// closes.
std::optional<std::string> framing_error(const mg_request_info* ri) {
    const char* length = nullptr;
    bool chunked = false;
    for (int i = 0; i < ri->num_headers; ++i) {
        const char* name = ri->http_headers[i].name;
        const char* value = ri->http_headers[i].value ? ri->http_headers[i].value : "";
        if (strcasecmp(name, "Transfer-Encoding") == 0) chunked = true;
        if (strcasecmp(name, "Content-Length") != 0) continue;
        if (std::strchr(value, ',') != nullptr)
            return "ordo gateway: a Content-Length with a list of values (RFC 9112)";
        if (length && std::strcmp(length, value) != 0)
            return std::string("ordo gateway: two different Content-Length headers (") + length +
                   ", " + value + "; RFC 9112)";
        length = value;
    }
    if (length && chunked)
        return "ordo gateway: Content-Length with Transfer-Encoding (RFC 9112)";
    return std::nullopt;
}

// Content-Type: application/json, with or without parameters (charset=utf-8).
bool is_json(const mg_connection* c) {
    const char* t = mg_get_header(c, "Content-Type");
    if (!t) return false;
    std::string_view v(t);
    v = v.substr(0, v.find(';'));
    while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
    return v.size() == 16 && strncasecmp(v.data(), "application/json", 16) == 0;
}

// gateway_options::allowed_hosts: the Host header's name, its port aside.
std::optional<gw::reply> host_refused(const mg_connection* c, const gateway::state& s) {
    if (s.o.allowed_hosts.empty()) return std::nullopt;
    const char* h = mg_get_header(c, "Host");
    std::string host = h ? h : "";
    if (!host.empty() && host.front() == '[') {
        host = host.substr(0, host.find(']') + 1);
    } else if (const auto colon = host.rfind(':'); colon != std::string::npos) {
        host.resize(colon);
    }
    for (const auto& allowed : s.o.allowed_hosts)
        if (strcasecmp(allowed.c_str(), host.c_str()) == 0) return std::nullopt;
    return gw::request_error(403, "forbidden_host",
                             "ordo gateway: Host '" + host +
                                 "' is not one this gateway serves (--allow-host)");
}

// A CORS preflight: granted to gateway_options::cors_origin only.
gw::reply preflight(const mg_connection* c, const gateway::state& s) {
    const char* origin = mg_get_header(c, "Origin");
    if (!origin || s.o.cors_origin != origin)
        return gw::request_error(403, "forbidden_origin",
                                 "ordo gateway: origin " + std::string(origin ? origin : "(none)") +
                                     " is not granted cross-origin calls (--cors-origin)");
    gw::reply r;
    r.status = 204;
    r.type.clear();
    return r;
}

int respond(mg_connection* c, gateway::state& s, const gw::reply& r) {
    s.count_status(r.status);
    gw::send_reply(c, r);
    return r.status;
}

}  // namespace

namespace {

int handle(mg_connection* c, gateway::state& s) {
    const mg_request_info* ri = mg_get_request_info(c);
    // Behind the https front, civetweb's loopback port serves the front's connections only.
    if (s.https) {
        const gw::tls_front* f = s.front_seen.load(std::memory_order_acquire);
        if (!f || std::strcmp(ri->remote_addr, "127.0.0.1") != 0 ||
            !f->relays(static_cast<std::uint16_t>(ri->remote_port)))
            return close_with(c, 403, "ordo gateway: this port serves the https listener only");
    }
    if (s.connections > s.o.max_connections) {
        ++s.refused;
        s.event("ordo gateway: refused a connection from " + std::string(ri->remote_addr) +
                ": " + std::to_string(s.o.max_connections) + " already open (max_connections)");
        return close_with(c, 503,
                          "ordo gateway: " + std::to_string(s.o.max_connections) +
                              " connections already open (max_connections)");
    }
    if (auto bad = framing_error(ri)) return limit_close(c, 400, *bad);
    const std::string_view verb = ri->request_method;
    const std::string_view path = ri->local_uri ? ri->local_uri : "/";
    if (auto bad = host_refused(c, s)) return respond(c, s, *bad);
    if (verb == "OPTIONS" && !s.o.cors_origin.empty()) return respond(c, s, preflight(c, s));
    std::string token;
    if (path != "/-/healthz")
        if (auto refused = gw::bearer_refused(c, s, token)) return respond(c, s, *refused);
    const bool get = verb == "GET" || verb == "HEAD";
    if (const auto n = header_bytes(ri); n > s.o.max_header_bytes)
        return limit_close(c, 431,
                           "ordo gateway: the request line and headers (" + std::to_string(n) +
                               " bytes) are over max_header_bytes (" +
                               std::to_string(s.o.max_header_bytes) + ")");
    if (path == "/metrics" && !s.o.metrics)
        return respond(c, s,
                       gw::request_error(404, "not_found",
                                         "ordo gateway: /metrics is off (gateway_options::metrics, "
                                         "ordo gateway --metrics)"));
    if (path == "/-/routes" || path == "/-/healthz" || (path == "/metrics" && s.o.metrics)) {
        if (!get)
            return respond(c, s,
                           gw::request_error(405, "method_not_allowed",
                                             "ordo gateway: " + std::string(path) + " takes GET"));
        if (path == "/-/routes") return respond(c, s, gw::routes(s));
        if (path == "/-/healthz") return respond(c, s, gw::healthz(s));
        return respond(c, s, gw::metrics(s));
    }
    if (path.size() < 2 || path.starts_with("/-/") ||
        path.find('/', 1) != std::string_view::npos)
        return respond(c, s,
                       gw::request_error(404, "not_found",
                                         "ordo gateway: no route " + std::string(path) +
                                             " (POST /METHOD, GET /-/routes, /-/healthz)"));
    if (verb != "POST")
        return respond(c, s,
                       gw::request_error(405, "method_not_allowed",
                                         "ordo gateway: call " + std::string(path.substr(1)) +
                                             " with POST, not " + std::string(verb)));
    gw::call_request r;
    r.conn = c;
    try {
        r.via = gw::upstream_for(s, token);
    } catch (const std::system_error& e) {
        return respond(c, s, gw::error_reply(e.code(), e.what(), e.what()));
    }
    r.method = std::string(path.substr(1));
    if (r.method.starts_with("ordo.") && !s.o.expose_admin)
        return respond(c, s,
                       gw::request_error(404, "not_found",
                                         "ordo gateway: " + r.method +
                                             " is reserved (ordo gateway --expose-admin, "
                                             "gateway_options::expose_admin)"));
    int status = 0;
    auto body = read_body(c, ri, s, status);
    if (!body) return status;
    r.body = std::move(*body);
    // A body must say it is JSON: a form or text/plain is what a page of another origin can
    // post without a preflight.
    if (r.body.find_first_not_of(" \t\r\n") != std::string::npos && !is_json(c))
        return respond(c, s,
                       gw::request_error(415, "unsupported_media_type",
                                         "ordo gateway: call " + r.method +
                                             ": a body needs Content-Type: application/json"));
    if (auto bad = gw::parse_options(c, r)) return respond(c, s, *bad);
    if (!r.notify && (r.stream || gw::method_streams(s, r.method))) {
        status = gw::serve_stream(s, c, r);
        s.count_status(status);
        return status;
    }
    return respond(c, s, gw::run_call(s, r));
}

int on_request(mg_connection* c, void*) {
    auto& s = state_of(c);
    ++s.in_flight;
    int status = 500;
    try {
        status = handle(c, s);
    } catch (const std::exception& e) {
        // A bug or an allocation failure: this request fails, the gateway goes on.
        status = close_with(c, 500, std::string("ordo gateway: ") + e.what());
    }
    if (auto* d = static_cast<conn_data*>(mg_get_user_connection_data(c)))
        d->since = clock_type::now();
    --s.in_flight;
    return status;
}

int on_init_connection(const mg_connection* c, void** data) {
    ++state_of(c).connections;
    *data = new conn_data;
    return 0;
}

void on_connection_close(const mg_connection* c) {
    --state_of(c).connections;
    delete static_cast<conn_data*>(mg_get_user_connection_data(c));
    mg_set_user_connection_data(c, nullptr);
}

// civetweb's own answers to requests it could not read: named by the limit that caused them.
int on_http_error(mg_connection* c, int status, const char* msg) {
    auto& s = state_of(c);
    const std::string_view m = msg ? msg : "";
    // civetweb reads headers into a buffer of 2 x max_header_bytes (header_buffer()): beyond
    // that it gives up with "Message too large" (413), or "Malformed message" (400).
    const std::string over = "ordo gateway: a malformed request, or its request line and headers "
                             "over 2 x max_header_bytes (" +
                             std::to_string(s.o.max_header_bytes) + ")";
    if (status == 413 && m.starts_with("Message too large")) return limit_close(c, 431, over) == 0;
    if (status == 400 && m.starts_with("Malformed message")) {
        // civetweb says so for bad bytes and for headers that stopped arriving alike; the time
        // tells them apart (its clock starts when the previous response was written).
        const auto* d = static_cast<conn_data*>(mg_get_user_connection_data(c));
        const auto limit = std::min(s.o.request_timeout, s.o.idle_timeout);
        if (d && clock_type::now() - d->since >= limit * 9 / 10)
            return limit_close(c, 408,
                               "ordo gateway: the request's headers did not arrive within " +
                                   std::to_string(limit.count()) + " ms (request_timeout)") == 0;
        return limit_close(c, 400, over) == 0;
    }
    s.count_status(status);
    return 1;  // civetweb's own page
}

int on_log(const mg_connection* c, const char* message) {
    if (c) state_of(c).event(std::string("ordo gateway: civetweb: ") + message);
    return 1;
}

[[noreturn]] void bad_listen(const std::string& url, const std::string& why) {
    throw std::system_error(make_error_code(errc::bad_address),
                            "ordo gateway: the listen address must be http://HOST:PORT or "
                            "https://HOST:PORT?cert=F&key=F[&ca=F], not " +
                                url + (why.empty() ? "" : " (" + why + ")"));
}

// HOST:PORT of `url`; for https://, its certificate, key and client CA go to `s`.
std::string listen_address(const std::string& url, gateway::state& s) {
    const bool tls = url.rfind("https://", 0) == 0;
    if (!tls && url.rfind("http://", 0) != 0) bad_listen(url, "");
    std::string hp = url.substr(tls ? 8 : 7);
    std::string query;
    if (const auto q = hp.find('?'); q != std::string::npos) {
        query = hp.substr(q + 1);
        hp.resize(q);
    }
    if (!hp.empty() && hp.back() == '/') hp.pop_back();
    if (hp.empty() || hp.find_first_of("/?#,") != std::string::npos ||
        hp.rfind(':') == std::string::npos)
        bad_listen(url, "");
    if (!tls && !query.empty()) bad_listen(url, "parameters are for https:// only");
    for (const auto& [key, value] : query_params(query)) {
        if (key == "cert")
            s.tls_cert = value;
        else if (key == "key")
            s.tls_key = value;
        else if (key == "ca")
            s.tls_ca = value;
        else
            bad_listen(url, "unknown parameter \"" + key + "\"");
    }
    if (tls && (s.tls_cert.empty() || s.tls_key.empty()))
        bad_listen(url, "https needs cert= and key=");
    return hp;
}


}  // namespace

gateway::gateway(channel ch, gateway_options o)
    : s_(std::make_unique<state>(std::move(ch), std::move(o))) {
    const std::string hp = listen_address(s_->o.listen, *s_);
    const bool tls = !s_->tls_cert.empty();
    s_->https = tls;
    // https: civetweb serves plain HTTP on a loopback port of its own, behind ordo's TLS.
    const std::string civetweb_at = tls ? "127.0.0.1:0" : hp;
    // Threads: one per connection served, and a few more that only answer refusals, so that a
    // connection over max_connections hears why instead of waiting in civetweb's queue.
    const auto num = [](auto v) { return std::to_string(v); };
    const std::vector<std::string> opts = {
        "listening_ports", civetweb_at,
        "num_threads", num(s_->o.max_connections + 4),
        // Headers up to 2 x max_header_bytes are read, so that those over max_header_bytes are
        // refused by name (431); beyond, civetweb refuses them itself (on_http_error). Each
        // civetweb thread keeps a buffer this large, whose pages a large request touches: with
        // the default 260 threads, 8 MiB in all (at 4 x, it was 16 MiB).
        "max_request_size", num(2 * s_->o.max_header_bytes),
        "request_timeout_ms", num(s_->o.request_timeout.count()),
        "keep_alive_timeout_ms", num(s_->o.idle_timeout.count()),
        "enable_keep_alive", "yes",
        "tcp_nodelay", "1",
        "decode_url", "yes",
        "enable_directory_listing", "no",
        // civetweb's default grants every origin ("*") on its own pages: none here (see
        // gateway_options::cors_origin).
        "access_control_allow_origin", "",
    };
    std::vector<const char*> argv;
    for (auto& x : opts) argv.push_back(x.c_str());
    argv.push_back(nullptr);
    mg_callbacks cb{};
    cb.init_connection = on_init_connection;
    cb.connection_close = on_connection_close;
    cb.http_error = on_http_error;
    cb.log_message = on_log;
    mg_init_library(0);
    mg_error_data err{};
    unsigned code = 0;
    char text[256] = {};
    err.code = &code;
    err.text = text;
    err.text_buffer_size = sizeof text;
    mg_init_data init{};
    init.callbacks = &cb;
    init.user_data = s_.get();
    init.configuration_options = argv.data();
    s_->ctx = mg_start2(&init, &err);
    if (!s_->ctx) {
        mg_exit_library();
        throw std::system_error(make_error_code(errc::bad_address),
                                "ordo gateway: cannot listen on " + s_->o.listen + ": " +
                                    (text[0] ? std::string(text) : "civetweb did not start"));
    }
    mg_set_request_handler(s_->ctx, "/", on_request, nullptr);
    mg_server_port ports[4] = {};
    const int n = mg_get_server_ports(s_->ctx, 4, ports);
    const std::string host = hp.substr(0, hp.rfind(':'));
    std::string port = n > 0 ? std::to_string(ports[0].port) : hp.substr(hp.rfind(':') + 1);
    if (tls) {
        std::string front = "tls://" + hp + "?cert=" + s_->tls_cert + "&key=" + s_->tls_key;
        if (!s_->tls_ca.empty()) front += "&ca=" + s_->tls_ca;
        try {
            s_->front = std::make_unique<gw::tls_front>(
                front, static_cast<std::uint16_t>(std::stoi(port)),
                2 * (s_->o.max_connections + 4), s_->o.on_event);
        } catch (const std::system_error& e) {
            mg_stop(s_->ctx);
            s_->ctx = nullptr;
            mg_exit_library();
            throw std::system_error(make_error_code(errc::bad_address),
                                    "ordo gateway: cannot listen on " + s_->o.listen + ": " +
                                        e.what());
        }
        port = std::to_string(s_->front->port());
        s_->front_seen.store(s_->front.get(), std::memory_order_release);
    }
    s_->url = std::string(tls ? "https://" : "http://") + host + ":" + port;
}

gateway::~gateway() {
    stop();
}

void gateway::stop() {
    if (!s_->ctx) return;
    s_->stopping = true;
    if (s_->front) s_->front->stop();
    mg_stop(s_->ctx);
    s_->ctx = nullptr;
    mg_exit_library();
    // The callers' channels are released on their executor, as channels must be.
    std::map<std::string, std::shared_ptr<const std::shared_future<channel>>> ups;
    {
        std::lock_guard lk(s_->upstream_mu);
        ups.swap(s_->upstreams);
    }
    if (ups.empty()) return;
    std::promise<void> released;
    net::post(s_->ch.get_executor(), [&] {
        ups.clear();
        released.set_value();
    });
    released.get_future().wait();
}

const std::string& gateway::url() const noexcept {
    return s_->url;
}

gateway_counters gateway::counters() const {
    gateway_counters c;
    c.requests = s_->requests;
    c.calls = s_->calls;
    c.notifications = s_->notifications;
    c.status_2xx = s_->s2xx;
    c.status_4xx = s_->s4xx;
    c.status_5xx = s_->s5xx;
    c.refused_connections = s_->refused;
    c.limit_closes = s_->limit_closes;
    c.streams_abandoned = s_->abandoned;
    c.calls_abandoned = s_->calls_abandoned;
    c.connections = s_->connections;
    c.in_flight = s_->in_flight;
    return c;
}

std::string code_name(std::error_code ec) {
    if (ec.category() != error_category()) return ec.message();
    switch (static_cast<errc>(ec.value())) {
        case errc::peer_lost: return "peer_lost";
        case errc::timed_out: return "timed_out";
        case errc::cancelled: return "cancelled";
        case errc::protocol_error: return "protocol_error";
        case errc::method_not_found: return "method_not_found";
        case errc::bad_arguments: return "bad_arguments";
        case errc::remote_error: return "remote_error";
        case errc::overloaded: return "overloaded";
        case errc::shutting_down: return "shutting_down";
        case errc::closed: return "closed";
        case errc::bad_address: return "bad_address";
        case errc::bad_result: return "bad_result";
        case errc::session_lost: return "session_lost";
        case errc::unauthenticated: return "unauthenticated";
        case errc::permission_denied: return "permission_denied";
    }
    return ec.message();
}

int http_status(std::error_code ec, const std::string& detail) {
    if (ec.category() != error_category()) return 500;
    switch (static_cast<errc>(ec.value())) {
        case errc::method_not_found: return 404;
        case errc::bad_arguments: return 400;
        case errc::timed_out: return 504;
        case errc::overloaded:
        case errc::shutting_down:
        case errc::closed:
        case errc::cancelled: return 503;
        case errc::peer_lost:
            // A router with no replica able to take calls (rpc/channels/router.cpp,
            // no_replica_reason) is unavailable, not a broken upstream.
            return detail.rfind("no live replica", 0) == 0 ? 503 : 502;
        case errc::session_lost:
        case errc::protocol_error:
        case errc::bad_result: return 502;
        case errc::remote_error:
        case errc::bad_address: return 500;
        // The backend refused the gateway's (or the forwarded caller's) credentials.
        case errc::unauthenticated: return 401;
        case errc::permission_denied: return 403;
    }
    return 500;
}

namespace gw {

void send_reply(mg_connection* c, const reply& r) {
    const mg_request_info* ri = mg_get_request_info(c);
    const char* conn = mg_get_header(c, "Connection");
    // HTTP/1.1 keeps the connection unless told otherwise; 1.0 only when asked (civetweb
    // decides the same way whether to read another request).
    const bool v10 = ri->http_version && std::strcmp(ri->http_version, "1.0") == 0;
    std::string out;
    out.reserve(160 + r.body.size());
    out += "HTTP/1.1 ";
    out += std::to_string(r.status);
    out += ' ';
    out += mg_get_response_code_text(c, r.status);
    if (!r.type.empty()) {
        out += "\r\nContent-Type: ";
        out += r.type;
    }
    const std::string& granted = state_of(c).o.cors_origin;
    if (const char* origin = mg_get_header(c, "Origin");
        !granted.empty() && origin && granted == origin) {
        out += "\r\nAccess-Control-Allow-Origin: ";
        out += granted;
        out += "\r\nVary: Origin";
        if (std::strcmp(ri->request_method, "OPTIONS") == 0)
            out += "\r\nAccess-Control-Allow-Methods: POST, GET"
                   "\r\nAccess-Control-Allow-Headers: Content-Type, Authorization, Ordo-Notify, "
                   "Ordo-Stream\r\nAccess-Control-Max-Age: 600";
    }
    out += r.headers;
    out += "\r\nContent-Length: ";
    out += std::to_string(r.body.size());
    if (v10 && conn && strcasecmp(conn, "keep-alive") == 0) out += "\r\nConnection: keep-alive";
    if (!v10 && conn && strcasecmp(conn, "close") == 0) out += "\r\nConnection: close";
    out += "\r\n\r\n";
    const bool head = std::strcmp(ri->request_method, "HEAD") == 0;
    if (!head) out += r.body;
    mg_write(c, out.data(), out.size());
}

}  // namespace gw
}  // namespace ordo
