#include "ordo/gateway/gateway.hpp"

// The HTTP side, on the channel's executor: the listener (ordo's tcp:// or tls://, with its
// handshake caps), connections capped per address and in all (a new one closes the oldest
// connection that has not sent a whole request yet rather than be refused), one coroutine
// pair per connection (a reader that takes bytes as they come, so that a client that goes
// away is noticed while its call runs; a server that reads requests and answers them in
// order), deadlines checked by one sweep, and the gateway's life (start, stop, counters). What
// one request does is gateway/routes.cpp; on the channel, gateway/calls.cpp; callers and
// their tokens, gateway/callers.cpp.
#include <strings.h>

#include <cstring>
#include <future>
#include <string>
#include <vector>

#include <asio/experimental/awaitable_operators.hpp>

#include "gateway/gateway_state.hpp"
#include "lib/address_group.hpp"
#include "lib/escaped.hpp"
#include "ordo/address.hpp"
#include "ordo/error.hpp"

namespace ordo {

gateway::state::state(channel c, gateway_options opt)
    : ch(std::move(c)), o(std::move(opt)), ex(ch.get_executor()) {
    if (!o.auth_tokens.empty()) check_token = authenticate_tokens(o.auth_tokens);
}

namespace gw {
namespace {

using clock_type = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr std::size_t min_read_chunk = 512, max_read_chunk = 16 * 1024;
constexpr std::size_t max_refusing = 64;
constexpr auto sweep_every = 100ms;

// Reads what arrives into c.in while the connection lives, waking the server at each read;
// stops taking more while a whole request's worth is unread (pipelining stays bounded).
net::awaitable<void> read_loop(gateway::state& s, connection& c) {
    const std::size_t cap = s.o.max_header_bytes + s.o.max_body_bytes + max_read_chunk;
    // Read into a buffer of its own (c.in may be compacted or grown while a read is pending),
    // small while the connection waits for a request (most of 10,000 idle connections' memory
    // would be their read buffers), doubled while reads come back full.
    std::size_t size = min_read_chunk;
    auto chunk = std::make_unique<char[]>(size);
    while (!c.eof && c.at != connection::phase::closing) {
        if (c.unread() >= cap) {
            co_await wait_event(c);
            continue;
        }
        if (c.in_taken == c.in.size()) {
            c.in_taken = 0;
            if (c.at == connection::phase::waiting) {
                std::string().swap(c.in);
                if (size > min_read_chunk) {
                    size = min_read_chunk;
                    chunk = std::make_unique<char[]>(size);
                }
            } else {
                c.in.clear();
            }
        }
        std::error_code ec;
        const std::size_t n = co_await c.t->async_read_some(net::buffer(chunk.get(), size), ec);
        if (c.in_taken == c.in.size()) {
            c.in.clear();
            c.in_taken = 0;
        }
        c.in.append(chunk.get(), n);
        if (n == size && size < max_read_chunk) {
            size *= 2;
            chunk = std::make_unique<char[]>(size);
        }
        if (ec) c.eof = true;
        c.wake.cancel();
    }
}

// Waits up to a second for the client to end its side (what it still sends is dropped), so
// that closing does not reset the connection before it has read the last response.
net::awaitable<void> linger(connection& c) {
    c.t->shutdown_send();
    const auto until = clock_type::now() + 1s;
    while (!c.eof && clock_type::now() < until) {
        c.in_taken = c.in.size();
        c.deadline = until;
        co_await wait_event(c);
        if (c.expired) break;
    }
}

// Serves the requests of `c` in order until it closes.
net::awaitable<void> serve(gateway::state& s, connection& c) {
    using phase = connection::phase;
    bool first = true;
    for (;;) {
        // A new connection has request_timeout for its first request; a kept one idle_timeout.
        c.at = phase::waiting;
        c.set_deadline(first ? std::min(s.o.request_timeout, s.o.idle_timeout) : s.o.idle_timeout);
        bool continued = false;
        // An NDJSON body is served as it comes (gateway/uploads.cpp takes it from the reader).
        while (!c.reader.ready() && !c.reader.failed() &&
               !(c.at == phase::body && c.reader.body_streams())) {
            if (c.unread() > 0) {
                const std::string_view pending(c.in.data() + c.in_taken, c.unread());
                c.in_taken += c.reader.feed(pending);
                c.wake.cancel();  // a reader waiting for room may read on
                if (c.at == phase::waiting && !c.reader.idle()) {
                    c.at = phase::head;
                    c.set_deadline(s.o.request_timeout);
                }
                if (c.at == phase::head && c.reader.head_done()) {
                    c.at = phase::body;
                    c.set_deadline(s.o.request_timeout);
                    const std::string* expect = c.reader.request().header("Expect");
                    if (!c.reader.ready() && expect && strcasecmp(expect->c_str(), "100-continue") == 0 &&
                        !continued) {
                        continued = true;
                        static constexpr std::string_view go_on = "HTTP/1.1 100 Continue\r\n\r\n";
                        if (!co_await write_all(c, go_on)) co_return;
                    }
                }
                continue;
            }
            if (c.eof || s.stopping || c.evicted) co_return;
            if (c.expired) {
                if (c.at == phase::waiting) {
                    if (!first) s.event("ordo gateway: closed an idle connection from " + c.remote +
                                        " (idle_timeout)");
                    co_return;
                }
                ++s.limit_closes;
                const std::string what = c.at == phase::head ? "headers" : "body";
                const std::string why =
                    "ordo gateway: the request's " + what + " did not arrive within " +
                    std::to_string(s.o.request_timeout.count()) + " ms (request_timeout)";
                s.event(why + " from " + c.remote + ": closing the connection");
                s.count_status(408);
                http_request none;
                const reply late = closing_reply(408, why);  // named: see calls.cpp's run_call
                if (co_await send_reply(s, c, none, late)) co_await linger(c);
                co_return;
            }
            co_await wait_event(c);
        }
        if (c.reader.failed()) {
            ++s.limit_closes;
            s.event(c.reader.error_reason() + " from " + c.remote + ": closing the connection");
            s.count_status(c.reader.error_status());
            http_request none;
            const reply bad = closing_reply(c.reader.error_status(), c.reader.error_reason());
            if (co_await send_reply(s, c, none, bad)) co_await linger(c);
            co_return;
        }
        first = false;
        c.served_one = true;
        c.at = phase::busy;
        c.deadline = clock_type::time_point::max();
        http_request req = std::move(c.reader.request());
        const bool streamed = c.reader.body_streams();  // its body is taken as it is served
        if (streamed)
            c.reader.request().body = std::move(req.body);  // what came with the head
        else
            c.reader.next();
        ++s.in_flight;
        std::optional<reply> r;
        try {
            r = co_await route(s, c, req);
        } catch (const std::exception& e) {
            // A bug or an allocation failure: this request fails, the gateway goes on.
            r = closing_reply(500, std::string("ordo gateway: ") + e.what());
        }
        --s.in_flight;
        // A streamed body not read to its end (the call ended first, the client went) leaves
        // no place to find the next request at: the connection closes after the response.
        const bool unread_body = streamed && !c.reader.ready();
        if (streamed && !unread_body) {
            req.keep_alive = c.reader.request().keep_alive;  // known at the body's end
            c.reader.next();
        }
        if (r) {
            if (r->close) ++s.limit_closes;
            r->close = r->close || unread_body;
            s.count_status(r->status);
            if (!co_await send_reply(s, c, req, *r)) co_return;
            if (r->close && !unread_body)
                s.event(r->body.substr(0, r->body.size() - 1) + " from " + c.remote +
                        ": closing the connection");
            if (r->close) {
                co_await linger(c);
                co_return;
            }
        }
        if (unread_body) {
            co_await linger(c);
            co_return;
        }
        if (c.eof) co_return;
        if (!req.keep_alive || s.stopping) {
            co_await linger(c);
            co_return;
        }
    }
}

// stop() completes once nothing of the gateway runs on the executor any more.
void maybe_done(gateway::state& s) {
    if (!s.stopping || !s.conns.empty() || s.tasks > 0 || s.refusing > 0 || !s.all_closed)
        return;
    auto done = std::move(s.all_closed);
    s.all_closed = nullptr;
    done();
}

void forget(gateway::state& s, connection& c) {
    s.conns.erase(c.where);
    if (!c.key.empty())
        if (auto it = s.per_address.find(c.key); it != s.per_address.end() && --it->second == 0)
            s.per_address.erase(it);
    --s.connections;
    maybe_done(s);
}

net::awaitable<void> run_connection(std::shared_ptr<gateway::state> s,
                                    std::unique_ptr<connection> c) {
    using namespace net::experimental::awaitable_operators;
    co_await (read_loop(*s, *c) && [](gateway::state& st, connection& cn) -> net::awaitable<void> {
        co_await serve(st, cn);
        cn.at = connection::phase::closing;
        cn.t->close();
    }(*s, *c));
    forget(*s, *c);
}

// A connection not served: answered 503 with the reason, then closed (at most max_refusing at
// once are answered; beyond, closed without a word).
net::awaitable<void> refuse(std::shared_ptr<gateway::state> s, std::unique_ptr<transport> t,
                            std::string why) {
    ++s->refused;
    s->count_status(503);
    s->event("ordo gateway: refused a connection from " + t->remote_address() + ": " + why);
    if (s->refusing >= max_refusing) {
        t->close();
        co_return;
    }
    ++s->refusing;
    const std::string out = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
                            "Connection: close\r\nContent-Length: " +
                            std::to_string(why.size() + 1) + "\r\n\r\n" + why + "\n";
    std::error_code ec;
    co_await t->async_write(net::buffer(out), ec);
    if (!ec) {
        using namespace net::experimental::awaitable_operators;
        t->shutdown_send();
        net::steady_timer limit(t->get_executor(), 1s);
        char sink[1024];
        auto drain = [&]() -> net::awaitable<void> {
            for (int i = 0; i < 64; ++i) {
                std::error_code e;
                co_await t->async_read_some(net::buffer(sink), e);
                if (e) co_return;
            }
        };
        co_await (drain() || limit.async_wait(use_tuple));
    }
    t->close();
    --s->refusing;
    maybe_done(*s);
}

// Closes, at once, the oldest connection that has not sent a whole request yet (a stranger:
// silent, or slow on purpose). False when there is none.
bool evict_a_stranger(gateway::state& s, const std::string& key, const std::string& why) {
    for (connection* c : s.conns) {
        if (c->served_one || c->evicted || (!key.empty() && c->key != key)) continue;
        c->evicted = true;
        ++s.limit_closes;
        s.event("ordo gateway: closed " + c->remote + " to make room: " + why);
        c->t->close();
        c->wake.cancel();
        return true;
    }
    return false;
}

net::awaitable<void> accept_loop(std::shared_ptr<gateway::state> s) {
    net::steady_timer backoff(s->ex);
    while (!s->stopping) {
        std::unique_ptr<transport> t;
        std::string failed;
        try {
            t = co_await s->l->async_accept();
        } catch (const std::system_error& e) {
            failed = e.what();
        }
        if (!t) {
            if (s->stopping) break;
            // Out of descriptors and the like: try again shortly rather than spin or quit.
            s->event("ordo gateway: accepting failed: " + failed);
            backoff.expires_after(100ms);
            co_await backoff.async_wait(use_tuple);
            continue;
        }
        if (s->stopping) {
            t->close();
            break;
        }
        const std::string key = detail::address_group(t->remote_address());
        const std::size_t mine = key.empty() ? 0 : s->per_address[key];
        if (s->o.max_connections_per_address > 0 && mine >= s->o.max_connections_per_address &&
            !evict_a_stranger(*s, key, std::to_string(mine) + " connections from " + key +
                                           " (max_connections_per_address)")) {
            net::co_spawn(s->ex,
                          refuse(s, std::move(t),
                                 "ordo gateway: " + std::to_string(mine) +
                                     " connections from " + key +
                                     " already open (max_connections_per_address)"),
                          detail::rethrow_escaped{});
            continue;
        }
        if (s->conns.size() >= s->o.max_connections &&
            !evict_a_stranger(*s, {}, std::to_string(s->conns.size()) +
                                          " connections open (max_connections)")) {
            net::co_spawn(s->ex,
                          refuse(s, std::move(t),
                                 "ordo gateway: " + std::to_string(s->o.max_connections) +
                                     " connections already open (max_connections)"),
                          detail::rethrow_escaped{});
            continue;
        }
        auto c = std::make_unique<connection>(std::move(t), s->o);
        c->write_limit = s->o.idle_timeout;
        c->key = key;
        if (!key.empty()) ++s->per_address[key];
        c->where = s->conns.insert(s->conns.end(), c.get());
        ++s->connections;
        net::co_spawn(s->ex, run_connection(s, std::move(c)), detail::rethrow_escaped{});
    }
    --s->tasks;
    maybe_done(*s);
}

// Every sweep_every: connections past their deadline are woken to close (with 408 mid-request),
// or closed at once while a response is being written to a client that does not read.
net::awaitable<void> sweep(std::shared_ptr<gateway::state> s) {
    while (!s->stopping) {
        s->sweep_tick->expires_after(sweep_every);
        co_await s->sweep_tick->async_wait(use_tuple);
        if (s->stopping) break;
        const auto now = clock_type::now();
        for (connection* c : s->conns) {
            if (c->deadline > now || c->expired) continue;
            c->expired = true;
            if (c->at == connection::phase::writing) {
                ++s->limit_closes;
                s->event("ordo gateway: " + c->remote + " did not read its response within " +
                         std::to_string(s->o.idle_timeout.count()) + " ms (idle_timeout): closed");
                c->t->close();
            }
            c->wake.cancel();
        }
    }
    --s->tasks;
    maybe_done(*s);
}

[[noreturn]] void bad_listen(const std::string& url, const std::string& why) {
    throw std::system_error(make_error_code(errc::bad_address),
                            "ordo gateway: the listen address must be http://HOST:PORT or "
                            "https://HOST:PORT?cert=F&key=F[&ca=F], not " +
                                url + (why.empty() ? "" : " (" + why + ")"));
}

// The listener's URL (tcp:// for http://, tls:// for https://, with its files).
std::string listener_url(const std::string& url) {
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
    bool cert = false, key = false;
    for (const auto& [k, v] : query_params(query)) {
        if (k == "cert")
            cert = !v.empty();
        else if (k == "key")
            key = !v.empty();
        else if (k != "ca")
            bad_listen(url, "unknown parameter \"" + k + "\"");
    }
    if (tls && (!cert || !key)) bad_listen(url, "https needs cert= and key=");
    return std::string(tls ? "tls://" : "tcp://") + hp + (query.empty() ? "" : "?" + query);
}

}  // namespace

net::awaitable<bool> write_all(connection& c, std::string_view bytes) {
    const auto was = c.at;
    c.at = connection::phase::writing;
    c.set_deadline(c.write_limit);
    std::error_code ec;
    co_await c.t->async_write(net::buffer(bytes.data(), bytes.size()), ec);
    c.at = was;
    c.deadline = clock_type::time_point::max();
    c.expired = false;
    if (ec) c.eof = true;
    co_return !ec;
}

net::awaitable<void> wait_event(connection& c) {
    // The timer never expires (it is made so): cancel() is the event, and it wakes every
    // coroutine waiting (the reader and the server may both be).
    co_await c.wake.async_wait(use_tuple);
}

}  // namespace gw

gateway::gateway(channel ch, gateway_options o)
    : s_(std::make_shared<state>(std::move(ch), std::move(o))) {
    const std::string lurl = gw::listener_url(s_->o.listen);
    s_->https = lurl.rfind("tls://", 0) == 0;
    transport_options to;
    to.on_refused = [w = std::weak_ptr<state>(s_)](const std::string& line) {
        if (auto s = w.lock()) s->event("ordo gateway: " + line);
    };
    try {
        s_->l = ordo::listen(s_->ex, lurl, to);
    } catch (const std::system_error& e) {
        throw std::system_error(make_error_code(errc::bad_address),
                                "ordo gateway: cannot listen on " + s_->o.listen + ": " + e.what());
    }
    const address bound = parse_address(s_->l->local_address());
    const std::string host = bound.host.find(':') != std::string::npos ? "[" + bound.host + "]"
                                                                        : bound.host;
    s_->url = std::string(s_->https ? "https://" : "http://") + host + ":" +
              std::to_string(bound.port);
    s_->sweep_tick = std::make_unique<net::steady_timer>(s_->ex);
    s_->tasks = 2;
    net::co_spawn(s_->ex, gw::accept_loop(s_), detail::rethrow_escaped{});
    net::co_spawn(s_->ex, gw::sweep(s_), detail::rethrow_escaped{});
}

gateway::~gateway() {
    stop();
}

void gateway::stop() {
    if (!s_ || stopped_) return;
    stopped_ = true;
    std::promise<void> done;
    net::post(s_->ex, [s = s_, &done] {
        s->stopping = true;
        s->l->close();
        s->sweep_tick->cancel();
        // Requests in flight have their calls cancelled (calls.cpp sees `stopping`); each
        // connection ends, and the last one says so.
        s->all_closed = [s, &done] {
            // The callers' channels and the listener are released here, on their executor, as
            // they must be; nothing of the gateway runs there after this.
            s->upstreams.clear();
            s->l.reset();
            done.set_value();
        };
        // A connection serving a request finishes it (its call cancelled; calls.cpp sees
        // `stopping`); any other (waiting, reading a request, writing to a client that may
        // not read) is closed now.
        for (gw::connection* c : s->conns) {
            c->wake.cancel();
            if (c->at != gw::connection::phase::busy) c->t->close();
        }
        gw::maybe_done(*s);
    });
    done.get_future().wait();
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

}  // namespace ordo
