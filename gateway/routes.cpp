// What one HTTP request asks of the gateway and the response it gets: framing checks that
// RFC 9112 asks for, the Host and origin rules, bearer tokens, routing to a call, a stream or
// an introspection route, and the response's bytes. The connection that carries requests is
// gateway/gateway.cpp; what a call does on the channel, gateway/calls.cpp.
#include <strings.h>

#include "gateway/gateway_state.hpp"

namespace ordo::gw {
namespace {

const char* reason_phrase(int status) {
    switch (status) {
        case 100: return "Continue";
        case 200: return "OK";
        case 202: return "Accepted";
        case 204: return "No Content";
        case 400: return "Bad Request";
        case 401: return "Unauthorized";
        case 403: return "Forbidden";
        case 404: return "Not Found";
        case 405: return "Method Not Allowed";
        case 408: return "Request Timeout";
        case 413: return "Content Too Large";
        case 415: return "Unsupported Media Type";
        case 429: return "Too Many Requests";
        case 431: return "Request Header Fields Too Large";
        case 500: return "Internal Server Error";
        case 502: return "Bad Gateway";
        case 503: return "Service Unavailable";
        case 504: return "Gateway Timeout";
    }
    return "Status";
}

// RFC 9112 section 6.3: a body's length must be unambiguous. http_parser refuses two
// Content-Length headers and one beside Transfer-Encoding; this says so for what it lets
// through, and refuses a duplicated Authorization (which of the two would be checked?).
std::optional<reply> framing_error(const http_request& req) {
    if (req.count("Content-Length") > 1)
        return closing_reply(400, "ordo gateway: two Content-Length headers (RFC 9112)");
    if (req.count("Content-Length") == 1 && req.count("Transfer-Encoding") > 0)
        return closing_reply(400, "ordo gateway: Content-Length with Transfer-Encoding (RFC 9112)");
    if (req.count("Authorization") > 1)
        return closing_reply(400, "ordo gateway: more than one Authorization header");
    if (req.count("Host") > 1)
        return closing_reply(400, "ordo gateway: more than one Host header (RFC 9112)");
    return std::nullopt;
}

// Content-Type: application/json, with or without parameters (charset=utf-8).
bool is_json(const http_request& req) {
    const std::string* t = req.header("Content-Type");
    if (!t) return false;
    std::string_view v(*t);
    v = v.substr(0, v.find(';'));
    while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
    return v.size() == 16 && strncasecmp(v.data(), "application/json", 16) == 0;
}

// gateway_options::allowed_hosts: the Host header's name, its port aside.
std::optional<reply> host_refused(const http_request& req, const gateway::state& s) {
    if (s.o.allowed_hosts.empty()) return std::nullopt;
    const std::string* h = req.header("Host");
    std::string host = h ? *h : "";
    if (!host.empty() && host.front() == '[') {
        host = host.substr(0, host.find(']') + 1);
    } else if (const auto colon = host.rfind(':'); colon != std::string::npos) {
        host.resize(colon);
    }
    for (const auto& allowed : s.o.allowed_hosts)
        if (strcasecmp(allowed.c_str(), host.c_str()) == 0) return std::nullopt;
    return request_error(403, "forbidden_host",
                         "ordo gateway: Host '" + host +
                             "' is not one this gateway serves (--allow-host)");
}

// A CORS preflight: granted to gateway_options::cors_origin only.
reply preflight(const http_request& req, const gateway::state& s) {
    const std::string* origin = req.header("Origin");
    if (!origin || s.o.cors_origin != *origin)
        return request_error(403, "forbidden_origin",
                             "ordo gateway: origin " + (origin ? *origin : "(none)") +
                                 " is not granted cross-origin calls (--cors-origin)");
    reply r;
    r.status = 204;
    r.type.clear();
    return r;
}

}  // namespace

// A response that closes the connection after it: the HTTP-level failures (a limit, a
// malformed request), as text.
reply closing_reply(int status, const std::string& reason) {
    reply r{status, "text/plain", reason + "\n"};
    r.close = true;
    return r;
}

// What one request does; the reply, or nothing when it wrote its own response (a stream).
net::awaitable<std::optional<reply>> route(gateway::state& s, connection& c,
                                           const http_request& req) {
    if (auto bad = framing_error(req)) co_return bad;
    const std::string& verb = req.method;
    const std::string& path = req.path.empty() ? std::string("/") : req.path;
    if (auto bad = host_refused(req, s)) co_return bad;
    if (verb == "OPTIONS" && !s.o.cors_origin.empty()) co_return preflight(req, s);
    std::string token;
    std::optional<reply> refused = bearer_refused(req, s, token);
    // Health is open to probes: a caller the gateway does not know learns only yes or no.
    if (path == "/-/healthz" && (verb == "GET" || verb == "HEAD"))
        co_return co_await healthz(s, !s.check_token || !refused);
    if (refused) co_return refused;
    const bool get = verb == "GET" || verb == "HEAD";
    if (path == "/metrics" && !s.o.metrics)
        co_return request_error(404, "not_found",
                                "ordo gateway: /metrics is off (gateway_options::metrics, "
                                "ordo gateway --metrics)");
    if (path == "/-/routes" || path == "/-/healthz" || path == "/metrics") {
        if (!get)
            co_return request_error(405, "method_not_allowed",
                                    "ordo gateway: " + path + " takes GET");
        if (path == "/metrics") co_return metrics(s);
        channel via;
        try {
            via = co_await upstream_for(s, token);
        } catch (const std::system_error& e) {
            co_return error_reply(e.code(), e.what(), e.what());
        }
        co_return co_await routes(s, via);
    }
    if (path.size() < 2 || path.starts_with("/-/") || path.find('/', 1) != std::string::npos)
        co_return request_error(404, "not_found",
                                "ordo gateway: no route " + path +
                                    " (POST /METHOD, GET /-/routes, /-/healthz)");
    if (verb != "POST")
        co_return request_error(405, "method_not_allowed",
                                "ordo gateway: call " + path.substr(1) + " with POST, not " +
                                    verb);
    call_request r;
    r.conn = &c;
    r.method = path.substr(1);
    if (r.method.starts_with("ordo.") && !s.o.expose_admin)
        co_return request_error(404, "not_found",
                                "ordo gateway: " + r.method +
                                    " is reserved (ordo gateway --expose-admin, "
                                    "gateway_options::expose_admin)");
    // A body must say it is JSON (or NDJSON, a stream's items): a form or text/plain is what a
    // page of another origin can post without a preflight.
    const bool items = c.reader.body_streams();
    if (!items && req.body.find_first_not_of(" \t\r\n") != std::string::npos && !is_json(req))
        co_return request_error(415, "unsupported_media_type",
                                "ordo gateway: call " + r.method +
                                    ": a body needs Content-Type: application/json");
    if (auto bad = parse_options(req, r)) co_return bad;
    try {
        r.via = co_await upstream_for(s, token);
    } catch (const std::system_error& e) {
        co_return error_reply(e.code(), e.what(), e.what());
    }
    r.body = req.body;
    const method_shape shape = r.notify ? method_shape::call : co_await shape_of(s, r.method);
    if (items) {
        // The items a caller writes (docs/gateway.md, "Client and two-way streams").
        if (r.notify || shape == method_shape::call || shape == method_shape::stream)
            co_return request_error(
                400, "not_a_client_stream",
                "ordo gateway: " + r.method + (r.notify ? " as a notification" : " is not a client "
                                                                                 "or two-way stream") +
                    ": an NDJSON body is the items a client or two-way stream reads");
        const bool two_way = shape == method_shape::two_way ||
                             (shape == method_shape::unknown && r.stream);
        s.count_status(co_await serve_body_stream(s, req, r, two_way));
        co_return std::nullopt;
    }
    if (r.params)
        co_return request_error(400, "bad_parameter",
                                "ordo gateway: params= goes with an NDJSON body (the items of a "
                                "client or two-way stream); a call's params are its body");
    if (shape == method_shape::upload || shape == method_shape::two_way)
        co_return request_error(
            415, "unsupported_media_type",
            "ordo gateway: " + r.method + " reads items: send them as NDJSON lines "
                                          "(Content-Type: application/x-ndjson), its params as "
                                          "params=");
    if (!r.notify && (r.stream || shape == method_shape::stream)) {
        s.count_status(co_await serve_stream(s, req, r));
        co_return std::nullopt;
    }
    co_return co_await run_call(s, r);
}

net::awaitable<bool> send_reply(gateway::state& s, connection& c, const http_request& req,
                                const reply& r) {
    const std::string* conn = req.header("Connection");
    const bool v10 = req.major == 1 && req.minor == 0;
    std::string out;
    out.reserve(160 + r.body.size());
    out += "HTTP/1.1 ";
    out += std::to_string(r.status);
    out += ' ';
    out += reason_phrase(r.status);
    if (!r.type.empty()) {
        out += "\r\nContent-Type: ";
        out += r.type;
    }
    const std::string& granted = s.o.cors_origin;
    if (const std::string* origin = req.header("Origin");
        !granted.empty() && origin && granted == *origin) {
        out += "\r\nAccess-Control-Allow-Origin: ";
        out += granted;
        out += "\r\nVary: Origin";
        if (req.method == "OPTIONS")
            out += "\r\nAccess-Control-Allow-Methods: POST, GET"
                   "\r\nAccess-Control-Allow-Headers: Content-Type, Authorization, Ordo-Notify, "
                   "Ordo-Stream, Ordo-Params\r\nAccess-Control-Max-Age: 600";
    }
    out += r.headers;
    out += "\r\nContent-Length: ";
    out += std::to_string(r.body.size());
    if (r.close)
        out += "\r\nConnection: close";
    else if (v10 && conn && strcasecmp(conn->c_str(), "keep-alive") == 0)
        out += "\r\nConnection: keep-alive";
    else if (!v10 && conn && strcasecmp(conn->c_str(), "close") == 0)
        out += "\r\nConnection: close";
    out += "\r\n\r\n";
    if (req.method != "HEAD") out += r.body;
    co_return co_await write_all(c, out);
}

}  // namespace ordo::gw
