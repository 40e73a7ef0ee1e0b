// What a gateway request does on the channel: its options (deadline, notification, stream,
// key), the call started on the channel's executor (where the gateway runs) and awaited by the
// request's coroutine, streams as NDJSON, and the introspection routes. A client that goes
// away, or a gateway that stops, cancels what its request started (ordo.cancel).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <asio/experimental/awaitable_operators.hpp>

#include "gateway/gateway_state.hpp"
#include "json/json_codec.hpp"
#include "ordo/rpc/context.hpp"
#include "ordo/rpc/router.hpp"
#include "ordo/rpc/stream_call.hpp"

namespace ordo::gw {
namespace {

using json = nlohmann::json;
using clock_type = std::chrono::steady_clock;

// One call's completion, awaited by its request's coroutine on the same executor: complete()
// keeps the outcome and wakes the connection (or, for the gateway's own calls, a timer).
struct waiter {
    bool done = false;
    std::error_code ec;
    call_outcome out;
    net::cancellation_signal signal;
    net::steady_timer* wake = nullptr;
};

class http_call final : public detail::pending_call {
  public:
    explicit http_call(std::shared_ptr<waiter> w) : w_(std::move(w)) {}
    void complete(std::error_code ec, call_outcome out) override {
        w_->ec = ec;
        w_->out = std::move(out);
        w_->done = true;
        if (w_->wake) w_->wake->cancel();
    }

  private:
    std::shared_ptr<waiter> w_;
};

// Makes the call and waits for it. `conn`, when given, is the HTTP connection the call
// serves: a call still pending when its client goes away, or when the gateway stops, is
// cancelled (ordo.cancel reaches the server) and its end awaited.
net::awaitable<std::shared_ptr<waiter>> call(gateway::state& s, const channel& ch,
                                             const std::string& method,
                                             detail::params_buffer params, call_options o,
                                             connection* conn = nullptr) {
    auto w = std::make_shared<waiter>();
    std::optional<net::steady_timer> own;
    if (conn) {
        w->wake = &conn->wake;
    } else {
        own.emplace(s.ex, std::chrono::steady_clock::time_point::max());
        w->wake = &*own;
    }
    auto c = std::make_unique<http_call>(w);
    c->method = method;
    c->params = std::move(params);
    c->options = std::move(o);
    c->slot = w->signal.slot();
    ++s.calls;
    ch.impl()->start_call(std::move(c));
    bool cancel_sent = false;
    while (!w->done) {
        if (!cancel_sent && conn && conn->eof) {
            cancel_sent = true;
            ++s.calls_abandoned;
            s.event("ordo gateway: call " + method + " cancelled: its client " + conn->remote +
                    " went away");
            w->signal.emit(net::cancellation_type::terminal);
            continue;
        }
        if (!cancel_sent && s.stopping) {
            cancel_sent = true;
            w->signal.emit(net::cancellation_type::terminal);
            continue;
        }
        co_await w->wake->async_wait(use_tuple);
    }
    w->wake = nullptr;
    co_return w;
}

std::string failure_text(gateway::state& s, const std::string& method, std::error_code ec,
                         const std::string& detail) {
    return rpc_error(ec, method, s.remote(), detail).what();
}

// A number of milliseconds, > 0, finite: e.g. "50", "12.5" (rounded up to whole ms).
std::optional<double> positive_ms(std::string_view text) {
    if (text.empty() || text.size() > 32) return std::nullopt;
    const std::string t(text);
    char* end = nullptr;
    const double v = std::strtod(t.c_str(), &end);
    if (end != t.c_str() + t.size() || !std::isfinite(v) || v <= 0 || v > 1e13) return std::nullopt;
    return v;
}

std::string url_decoded(std::string_view in) {
    return percent_decoded(in, true);
}

bool flag_value(std::string_view v) {
    return v.empty() || v == "1" || v == "true" || v == "yes";
}

// Sets r.timeout (or r.already_due) from one deadline given as `name` = `value`.
std::optional<reply> apply_deadline(call_request& r, const std::string& name,
                                    const std::string& value, bool absolute) {
    auto ms = positive_ms(value);
    if (!ms)
        return request_error(400, "bad_deadline",
                             "ordo gateway: " + name +
                                 " must be a positive number of "
                                 "milliseconds, not \"" +
                                 value + "\"");
    if (!absolute) {
        r.timeout = std::chrono::milliseconds(static_cast<long long>(std::ceil(*ms)));
        return std::nullopt;
    }
    // Milliseconds since the Unix epoch, on the wall clock (Ray Serve's absolute_slo_ms).
    const double now = std::chrono::duration<double, std::milli>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count();
    if (*ms <= now) {
        r.already_due = true;
        return std::nullopt;
    }
    r.timeout = std::chrono::milliseconds(static_cast<long long>(std::ceil(*ms - now)));
    return std::nullopt;
}

}  // namespace

reply request_error(int status, std::string_view code, const std::string& message) {
    json j = {{"code", code}, {"message", message}};
    return {status, "application/json",
            j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n"};
}

reply error_reply(std::error_code ec, const std::string& message, const std::string& detail) {
    return request_error(http_status(ec, detail), code_name(ec), message);
}

std::optional<reply> parse_options(const http_request& req, call_request& r) {
    std::vector<std::string> deadlines;  // where each deadline came from
    auto deadline = [&](const std::string& name, const std::string& value,
                        bool absolute) -> std::optional<reply> {
        deadlines.push_back(name);
        if (deadlines.size() > 1)
            return request_error(
                400, "bad_deadline",
                "ordo gateway: give one deadline, not both " + deadlines[0] + " and " + name);
        return apply_deadline(r, name, value, absolute);
    };
    std::string_view q = req.query;
    while (!q.empty()) {
        const auto amp = q.find('&');
        const std::string_view item = q.substr(0, amp);
        q = amp == std::string_view::npos ? std::string_view{} : q.substr(amp + 1);
        if (item.empty()) continue;
        const auto eq = item.find('=');
        const std::string name = url_decoded(item.substr(0, eq));
        const std::string value =
            eq == std::string_view::npos ? std::string() : url_decoded(item.substr(eq + 1));
        std::optional<reply> bad;
        if (name == "relative_slo_ms" || name == "absolute_slo_ms")
            bad = deadline(name, value, name == "absolute_slo_ms");
        else if (name == "notify")
            r.notify = flag_value(value);
        else if (name == "stream")
            r.stream = flag_value(value);
        else if (name == "key")
            r.key = value;
        else if (name == "params")
            r.params = value;
        else
            bad = request_error(400, "bad_parameter",
                                "ordo gateway: unknown query parameter \"" + name +
                                    "\" (relative_slo_ms, absolute_slo_ms, notify, stream, key, "
                                    "params)");
        if (bad) return bad;
    }
    for (const char* h : {"Ordo-Relative-Slo-Ms", "Ordo-Absolute-Slo-Ms"})
        if (const std::string* v = req.header(h))
            if (auto bad = deadline(std::string("header ") + h, *v,
                                    std::strcmp(h, "Ordo-Absolute-Slo-Ms") == 0))
                return bad;
    if (const std::string* v = req.header("Ordo-Notify")) r.notify = flag_value(*v);
    if (const std::string* v = req.header("Ordo-Stream")) r.stream = flag_value(*v);
    if (const std::string* v = req.header("Ordo-Key")) r.key = *v;
    if (const std::string* v = req.header("Ordo-Params")) r.params = *v;
    // W3C Trace Context: passed on as the call's metadata (docs/protocol.md, "Call context")
    // when well formed; a malformed one is dropped, as the recommendation says.
    if (const std::string* tp = req.header("traceparent"); tp && valid_traceparent(*tp)) {
        r.meta.emplace_back("traceparent", *tp);
        if (const std::string* ts = req.header("tracestate"); ts && ts->size() <= 512)
            r.meta.emplace_back("tracestate", *ts);
    }
    return std::nullopt;
}

std::optional<detail::params_buffer> params_of(const call_request& r, std::string_view json_text,
                                               std::optional<reply>& bad) {
    const char* what = r.params ? "params=" : "the body";
    try {
        return json_codec::params_from_body(json_text, limits{});
    } catch (const json_codec::over_limit& e) {
        // Within what the server accepts: a body it would refuse would close the connection
        // every caller of this gateway shares.
        bad = request_error(413, "too_large",
                            "ordo gateway: call " + r.method + ": " + what +
                                " is over a limit: " + e.what());
    } catch (const json_codec::bad_json& e) {
        bad = request_error(400, "bad_json",
                            "ordo gateway: call " + r.method + ": " + what + " is not JSON (" +
                                e.what() + ")");
    }
    return std::nullopt;
}

call_options options_of(gateway::state& s, const call_request& r) {
    call_options o;
    o.timeout = r.timeout.count() > 0 ? r.timeout : s.o.default_timeout;
    o.key = r.key;
    o.metadata = r.meta;
    return o;
}

reply timed_out_before(gateway::state& s, const call_request& r) {
    const auto ec = make_error_code(errc::timed_out);
    const std::string why = "absolute_slo_ms had passed when the request arrived";
    return error_reply(ec, failure_text(s, r.method, ec, why), why);
}

namespace {

reply notify(gateway::state& s, const call_request& r, detail::params_buffer params) {
    // Taken at once on the channel's executor (here), or refused (overloaded, closed).
    ++s.notifications;
    try {
        r.via.impl()->notify_raw(r.method, std::string_view(params.data(), params.size()));
    } catch (const std::system_error& e) {
        return error_reply(e.code(), e.what(), e.what());
    }
    return {202, "application/json", ""};
}

}  // namespace

net::awaitable<reply> run_call(gateway::state& s, const call_request& r) {
    std::optional<reply> bad;
    auto p = params_of(r, r.body, bad);
    if (!p) co_return *bad;
    detail::params_buffer params = std::move(*p);
    if (r.already_due) co_return timed_out_before(s, r);
    if (r.notify) co_return notify(s, r, std::move(params));
    // Arguments named, not temporaries inside the co_await (GCC 12 destroys those twice).
    call_options o = options_of(s, r);
    auto w = co_await call(s, r.via, r.method, std::move(params), std::move(o), r.conn);
    if (w->ec) {
        auto rep =
            error_reply(w->ec, failure_text(s, r.method, w->ec, w->out.detail), w->out.detail);
        // An overloaded backend (or router) says when to come back: RFC 9110's Retry-After, in
        // whole seconds, rounded up from the server's hint (at least 1 without one). A caller
        // the backend refused for being over its share (server_options::shares) is told 429
        // (RFC 6585): it, not the backend, should slow down.
        if (w->ec == errc::overloaded && w->out.over_share) rep.status = 429;
        if (w->ec == errc::overloaded)
            rep.headers += "\r\nRetry-After: " + std::to_string(std::max<std::uint32_t>(
                                                     1, (w->out.retry_after_ms + 999) / 1000));
        co_return rep;
    }
    std::string body = json_codec::dump(w->out.result);
    body += '\n';
    co_return reply{200, "application/json", std::move(body)};
}

net::awaitable<bool> write_chunk(connection& c, std::string_view data) {
    char head[24];
    const int n = std::snprintf(head, sizeof head, "%zx\r\n", data.size());
    std::string out;
    out.reserve(static_cast<std::size_t>(n) + data.size() + 2);
    out.append(head, static_cast<std::size_t>(n));
    out.append(data);
    out += "\r\n";
    co_return co_await write_all(c, out);
}

net::awaitable<void> end_with_error(connection& c, const reply& rep) {
    json line = {{"error", json::parse(rep.body)}};
    const std::string last = line.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
    if (co_await write_chunk(c, last)) co_await write_chunk(c, "");
}

net::awaitable<stream_step> next_step(std::shared_ptr<detail::stream_state<value>> st) {
    stream_step r;
    try {
        r.item = co_await detail::stream_state<value>::next(std::move(st));
    } catch (const rpc_error& e) {
        r.failed = e;
    }
    co_return r;
}

net::awaitable<int> serve_stream(gateway::state& s, const http_request& req,
                                 const call_request& r) {
    using namespace net::experimental::awaitable_operators;
    connection& c = *r.conn;
    std::optional<reply> bad;
    auto p = params_of(r, r.body, bad);
    if (!p) {
        co_await send_reply(s, c, req, *bad);
        co_return bad->status;
    }
    detail::params_buffer params = std::move(*p);
    if (r.already_due) {
        auto rep = timed_out_before(s, r);
        co_await send_reply(s, c, req, rep);
        co_return rep.status;
    }
    auto o = options_of(s, r);
    auto st = std::make_shared<detail::stream_state<value>>(
        r.method, s.remote(), r.via.get_executor(), default_stream_window,
        default_stream_window_bytes);
    ++s.calls;
    detail::start_stream(r.via.impl(), st, std::move(params), std::move(o));
    bool started = false;
    auto gone = [&] {
        st->cancel();
        ++s.abandoned;
        s.event("ordo gateway: stream " + r.method + " cancelled: its client " + c.remote +
                " went away");
    };
    for (;;) {
        std::optional<value> v;
        std::optional<reply> failed;
        // The next item, or an event of the connection: its client went away, the gateway
        // stops (the item is then not taken).
        auto got = co_await (next_step(st) || wait_event(c));
        if (got.index() == 1) {
            if (c.eof) {
                gone();
                co_return 200;
            }
            if (s.stopping) st->cancel();
            continue;
        }
        stream_step& step = std::get<0>(got);
        if (step.failed)
            failed = error_reply(step.failed->code(), step.failed->what(), step.failed->detail());
        else
            v = std::move(step.item);
        if (failed) {
            const reply& rep = *failed;
            if (!started) {
                co_await send_reply(s, c, req, rep);
                co_return rep.status;
            }
            // Mid-stream: the status is sent; the failure is the last line.
            co_await end_with_error(c, rep);
            co_return 200;
        }
        if (!started) {
            started = true;
            static constexpr std::string_view head =
                "HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\n"
                "Transfer-Encoding: chunked\r\n\r\n";
            if (!co_await write_all(c, head)) {
                gone();
                co_return 200;
            }
        }
        if (!v) {
            co_await write_chunk(c, "");
            co_return 200;
        }
        const std::string item = json_codec::dump(v->get()) + "\n";
        if (!co_await write_chunk(c, item)) {
            // The client went away: the handler is cancelled (ordo.cancel).
            gone();
            co_return 200;
        }
    }
}

namespace {

// ordo.methods as {name: signature}; throws rpc_error.
net::awaitable<std::map<std::string, std::string>> read_methods(gateway::state& s,
                                                                const channel& via) {
    call_options o;
    o.timeout = std::chrono::milliseconds(5'000);
    const std::string method = "ordo.methods";  // named: see run_call
    auto none = json_codec::pack_params(json::array());
    auto w = co_await call(s, via, method, std::move(none), std::move(o));
    if (w->ec) throw rpc_error(w->ec, "ordo.methods", s.remote(), w->out.detail);
    std::map<std::string, std::string> m;
    const msgpack::object& obj = w->out.result;
    if (obj.type != msgpack::type::MAP)
        throw rpc_error(make_error_code(errc::bad_result), "ordo.methods", s.remote(),
                        "the answer is not a map");
    for (const auto& kv : obj.via.map) {
        if (kv.key.type != msgpack::type::STR || kv.val.type != msgpack::type::STR) continue;
        m.emplace(std::string(kv.key.via.str.ptr, kv.key.via.str.size),
                  std::string(kv.val.via.str.ptr, kv.val.via.str.size));
    }
    co_return m;
}

method_shape shape_in(const std::string& signature) {
    const auto ends = [&](std::string_view tail) {
        return signature.size() >= tail.size() &&
               signature.compare(signature.size() - tail.size(), tail.size(), tail) == 0;
    };
    if (ends(" [client stream]")) return method_shape::upload;
    if (ends(" [two-way stream]")) return method_shape::two_way;
    if (ends(" [stream]")) return method_shape::stream;
    return method_shape::call;
}

// Its answer streams: a server stream or a two-way stream.
bool is_stream(const std::string& signature) {
    const method_shape m = shape_in(signature);
    return m == method_shape::stream || m == method_shape::two_way;
}

const char* shape_name(method_shape m) {
    switch (m) {
        case method_shape::stream: return "stream";
        case method_shape::upload: return "client_stream";
        case method_shape::two_way: return "two_way_stream";
        default: return "call";
    }
}

}  // namespace

net::awaitable<method_shape> shape_of(gateway::state& s, const std::string& method) {
    const auto now = clock_type::now();
    auto it = s.methods.find(method);
    const bool fresh = s.methods_at && now - *s.methods_at < std::chrono::seconds(10);
    const bool recent = s.methods_at && now - *s.methods_at < std::chrono::seconds(1);
    if (!(fresh && (it != s.methods.end() || recent))) {
        s.methods_at = now;
        std::map<std::string, std::string> m;
        try {
            m = co_await read_methods(s, s.ch);
        } catch (const rpc_error&) {
            // Not an ordo server, or unreachable: calls say why.
        }
        s.methods = std::move(m);
        it = s.methods.find(method);
    }
    co_return it == s.methods.end() ? method_shape::unknown : shape_in(it->second);
}

net::awaitable<reply> routes(gateway::state& s, const channel& via) {
    std::map<std::string, std::string> m;
    try {
        m = co_await read_methods(s, via);
    } catch (const rpc_error& e) {
        co_return error_reply(e.code(), e.what(), e.detail());
    }
    json list = json::array();
    for (const auto& [name, sig] : m)
        list.push_back({{"path", "/" + name},
                        {"method", name},
                        {"params", sig.substr(0, sig.find(')') + 1)},
                        {"stream", is_stream(sig)},
                        {"shape", shape_name(shape_in(sig))}});
    if (via.impl() == s.ch.impl()) {
        s.methods = m;
        s.methods_at = clock_type::now();
    }
    json j = {{"to", s.remote()}, {"routes", std::move(list)}};
    co_return reply{200, "application/json",
                    j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n"};
}

net::awaitable<reply> healthz(gateway::state& s, bool full) {
    call_options o;
    o.timeout = std::chrono::milliseconds(2'000);
    // The backend's own word (docs/protocol.md, "Health"): through a router, a replica that is
    // serving answers, as the router sends nothing to one that is not.
    const std::string method = "ordo.health";  // named: see run_call
    auto none = json_codec::pack_params(json::array());
    auto w = co_await call(s, s.ch, method, std::move(none), std::move(o));
    // A foreign msgpack-rpc server (or an ordo without ordo.health) answers with an error: it
    // is alive, and taken as serving.
    const bool alive = !w->ec || w->ec == errc::method_not_found || w->ec == errc::remote_error ||
                       w->ec == errc::bad_arguments;
    std::string said = "serving";
    if (!w->ec && w->out.result.type == msgpack::type::STR)
        said.assign(w->out.result.via.str.ptr, w->out.result.via.str.size);
    const bool ok = alive && said == "serving";
    json j = {{"status", ok ? "ok" : "unavailable"}};
    // A caller the gateway does not know learns yes or no, not where the backend is or why.
    if (full) {
        j["to"] = s.remote();
        if (!alive)
            j["message"] = failure_text(s, "ordo.health", w->ec, w->out.detail);
        else if (!ok)
            j["message"] = "ordo gateway: " + s.remote() + " is not serving: it says " + said;
    }
    co_return reply{ok ? 200 : 503, "application/json",
                    j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n"};
}

reply metrics(gateway::state& s) {
    std::string t;
    auto line = [&](const char* name, const char* type, const char* help,
                    std::initializer_list<std::pair<const char*, double>> values) {
        t += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
        for (const auto& [labels, v] : values) {
            char num[48];
            std::snprintf(num, sizeof num, "%.17g", v);
            t += std::string(name) + labels + " " + num + "\n";
        }
    };
    line("ordo_gateway_requests_total", "counter", "HTTP requests answered, by status class",
         {{"{status=\"2xx\"}", double(s.s2xx)},
          {"{status=\"4xx\"}", double(s.s4xx)},
          {"{status=\"5xx\"}", double(s.s5xx)}});
    line("ordo_gateway_calls_total", "counter", "Calls and streams started on the channel",
         {{"", double(s.calls)}});
    line("ordo_gateway_notifications_total", "counter", "Notifications sent",
         {{"", double(s.notifications)}});
    line("ordo_gateway_refused_connections_total", "counter",
         "Connections refused over max_connections", {{"", double(s.refused)}});
    line("ordo_gateway_limit_closes_total", "counter", "Connections closed by a size or time limit",
         {{"", double(s.limit_closes)}});
    line("ordo_gateway_calls_abandoned_total", "counter",
         "Calls cancelled because their client went away", {{"", double(s.calls_abandoned)}});
    line("ordo_gateway_streams_abandoned_total", "counter",
         "Streams cancelled because their client went away", {{"", double(s.abandoned)}});
    line("ordo_gateway_connections", "gauge", "HTTP connections open",
         {{"", double(s.connections.load())}});
    line("ordo_gateway_in_flight", "gauge", "HTTP requests being served",
         {{"", double(s.in_flight.load())}});
    // A router's queue, read on its executor.
    if (auto rt = std::dynamic_pointer_cast<router>(s.ch.impl())) {
        const auto c = rt->counters();  // on its executor: the gateway runs there
        line("ordo_gateway_router_queued_calls", "gauge", "Calls waiting for a replica with room",
             {{"", double(c.queued)}});
        line("ordo_gateway_router_expired_in_queue_total", "counter",
             "Calls whose deadline passed while they waited for a replica (never sent)",
             {{"", double(c.expired_in_queue)}});
    }
    return {200, "text/plain; version=0.0.4", std::move(t)};
}

}  // namespace ordo::gw
