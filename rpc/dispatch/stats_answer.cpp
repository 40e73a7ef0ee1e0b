// Per-method counters (ordo/rpc/stats.hpp), the answer to the reserved method ordo.stats, and
// the record of a request answered (the access log and spans).
#include "rpc/dispatch/stats_answer.hpp"

#include "rpc/dispatch/admission.hpp"
#include "rpc/dispatch/dispatcher.hpp"
#include "rpc/context/spans.hpp"
#include "rpc/wire/errors.hpp"

#include <algorithm>

#include "ordo/rpc/handlers.hpp"
#include "ordo/rpc/peer.hpp"

namespace ordo {
namespace detail {

void method_counters::took(std::chrono::steady_clock::duration d) noexcept {
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
    const double s = static_cast<double>(ns) / 1e9;
    const auto i = static_cast<std::size_t>(
        std::lower_bound(latency_bounds.begin(), latency_bounds.end(), s) - latency_bounds.begin());
    buckets_[i].fetch_add(1, std::memory_order_relaxed);
    latency_count_.fetch_add(1, std::memory_order_relaxed);
    latency_ns_.fetch_add(static_cast<std::uint64_t>(ns < 0 ? 0 : ns), std::memory_order_relaxed);
}

method_stats method_counters::snapshot(std::string name) const {
    method_stats m;
    m.name = std::move(name);
    for (std::size_t i = 0; i < outcome_count; ++i)
        m.requests[i] = requests_[i].load(std::memory_order_relaxed);
    m.notifications = notifications_.load(std::memory_order_relaxed);
    m.notification_errors = notification_errors_.load(std::memory_order_relaxed);
    for (std::size_t i = 0; i < buckets_.size(); ++i)
        m.latency_buckets[i] = buckets_[i].load(std::memory_order_relaxed);
    m.latency_count = latency_count_.load(std::memory_order_relaxed);
    m.latency_sum_seconds = static_cast<double>(latency_ns_.load(std::memory_order_relaxed)) / 1e9;
    return m;
}

namespace {

template <class V>
void pack_kv(msgpack::packer<buffer>& p, const char* key, const V& v) {
    p.pack(key);
    p.pack(v);
}

// {"kind": "adaptive", "limit": n, "in_flight": n, "refused": n,
//  "no_load_us": n, "latency_us": n}, and with caller_shares "callers": [{"caller": s,
//  "weight": n, "running": n, "waiting": n, "served": n, "queued": n, "refused": n}, ...]
void pack_concurrency(msgpack::packer<buffer>& p, const concurrency_stats& c) {
    p.pack("concurrency");
    p.pack_map(c.callers.empty() ? 6 : 7);
    if (!c.callers.empty()) {
        p.pack("callers");
        p.pack_array(static_cast<std::uint32_t>(c.callers.size()));
        for (const auto& k : c.callers) {
            p.pack_map(7);
            pack_kv(p, "caller", k.caller);
            pack_kv(p, "weight", k.weight);
            pack_kv(p, "running", k.running);
            pack_kv(p, "waiting", k.waiting);
            pack_kv(p, "served", k.served);
            pack_kv(p, "queued", k.queued);
            pack_kv(p, "refused", k.refused);
        }
    }
    pack_kv(p, "kind", c.what == concurrency_limit::kind::adaptive ? "adaptive" : "fixed");
    pack_kv(p, "limit", c.limit);
    pack_kv(p, "in_flight", c.in_flight);
    pack_kv(p, "refused", c.refused);
    pack_kv(p, "no_load_us", c.no_load_us);
    pack_kv(p, "latency_us", c.latency_us);
}

void pack_method(msgpack::packer<buffer>& p, const method_stats& m) {
    std::uint32_t failed_kinds = 0;
    for (std::size_t i = 1; i < outcome_count; ++i) failed_kinds += m.requests[i] != 0;
    const bool timed = m.latency_count != 0;
    const bool limited = m.concurrency.what != concurrency_limit::kind::none;
    p.pack_map(4 + (timed ? 1 : 0) + (limited ? 1 : 0));
    if (limited) pack_concurrency(p, m.concurrency);
    pack_kv(p, "requests", m.requests_total());
    // {"timed out": n, ...}: failed requests by the code's words (error.hpp's to_string).
    p.pack("errors");
    p.pack_map(failed_kinds);
    for (std::size_t i = 1; i < outcome_count; ++i)
        if (m.requests[i] != 0) {
            p.pack(to_string(static_cast<errc>(i)));
            p.pack(m.requests[i]);
        }
    pack_kv(p, "notifications", m.notifications);
    pack_kv(p, "notification_errors", m.notification_errors);
    if (timed) {
        // {"count": n, "sum_seconds": s, "buckets": [[upper bound in seconds, calls], ...]}:
        // only the buckets that have calls; the bound of the last one is nil (slower).
        std::uint32_t used = 0;
        for (auto b : m.latency_buckets) used += b != 0;
        p.pack("latency");
        p.pack_map(3);
        pack_kv(p, "count", m.latency_count);
        pack_kv(p, "sum_seconds", m.latency_sum_seconds);
        p.pack("buckets");
        p.pack_array(used);
        for (std::size_t i = 0; i < m.latency_buckets.size(); ++i) {
            if (m.latency_buckets[i] == 0) continue;
            p.pack_array(2);
            if (i < latency_bounds.size())
                p.pack(latency_bounds[i]);
            else
                p.pack_nil();
            p.pack(m.latency_buckets[i]);
        }
    }
}

// {name: {"calls": n, ..., "replicas": [{"url": u, "state": s, ...}, ...]}}
void pack_routers(msgpack::packer<buffer>& p, const std::vector<router_view>& routers) {
    p.pack_map(static_cast<std::uint32_t>(routers.size()));
    for (const auto& r : routers) {
        p.pack(r.name);
        p.pack_map(11);
        pack_kv(p, "calls", r.calls);
        pack_kv(p, "queued", r.queued);
        pack_kv(p, "replicas_lost", r.replicas_lost);
        pack_kv(p, "reconnects", r.reconnects);
        pack_kv(p, "ejections", r.ejections);
        pack_kv(p, "drains", r.drains);
        pack_kv(p, "source_problems", r.source_problems);
        pack_kv(p, "retried", r.retried);
        pack_kv(p, "moved", r.moved);
        pack_kv(p, "over_budget", r.over_budget);
        p.pack("replicas");
        p.pack_array(static_cast<std::uint32_t>(r.replicas.size()));
        for (const auto& rep : r.replicas) {
            p.pack_map(6);
            pack_kv(p, "url", rep.url);
            pack_kv(p, "state", rep.state);
            pack_kv(p, "in_flight", rep.in_flight);
            pack_kv(p, "completed", rep.completed);
            pack_kv(p, "errors", rep.errors);
            pack_kv(p, "last_error", rep.last_error);
        }
    }
}

void pack_server(msgpack::packer<buffer>& p, const server_stats& s) {
    p.pack_map(s.routers.empty() ? 12 : 13);
    pack_kv(p, "connections", s.connections);
    pack_kv(p, "connections_accepted", s.connections_accepted);
    pack_kv(p, "connections_refused", s.connections_refused);
    pack_kv(p, "bytes_received", s.bytes_received);
    pack_kv(p, "bytes_sent", s.bytes_sent);
    pack_kv(p, "queued_messages", s.queued_messages);
    pack_kv(p, "running_handlers", s.running_handlers);
    pack_kv(p, "detached_sessions", s.detached_sessions);
    pack_kv(p, "sessions_moved", s.sessions_moved);
    pack_kv(p, "connections_closed_by_grace", s.connections_closed_by_grace);
    pack_kv(p, "memory_used", s.memory_used);
    pack_kv(p, "memory_budget", s.memory_budget);
    if (!s.routers.empty()) {  // a server that fronts routers (server::show_router)
        p.pack("routers");
        pack_routers(p, s.routers);
    }
}

}  // namespace

void pack_stats(buffer& out, const handlers& h, const server_stats* server) {
    msgpack::packer<buffer> p(out);
    const auto methods = h.stats_by_method();
    const auto batches = h.stats_by_batch();
    const concurrency_stats limit = h.concurrency();
    const bool limited = limit.what != concurrency_limit::kind::none;
    p.pack_map((server ? 5 : 4) + (limited ? 1 : 0));
    if (limited) pack_concurrency(p, limit);
    if (server) {
        p.pack("server");
        pack_server(p, *server);
    }
    pack_kv(p, "unknown_requests", h.unknown_requests());
    pack_kv(p, "unknown_notifications", h.unknown_notifications());
    p.pack("methods");
    p.pack_map(static_cast<std::uint32_t>(methods.size()));
    for (const auto& m : methods) {
        p.pack(m.name);
        pack_method(p, m);
    }
    // {name: {"batches": n, "calls": n, "queued": n, "running": n, "sizes": {size: batches}}}
    p.pack("batches");
    p.pack_map(static_cast<std::uint32_t>(batches.size()));
    for (const auto& b : batches) {
        p.pack(b.name);
        p.pack_map(5);
        pack_kv(p, "batches", b.stats.batches);
        pack_kv(p, "calls", b.stats.calls);
        pack_kv(p, "queued", b.stats.queued);
        pack_kv(p, "running", b.stats.running);
        pack_kv(p, "sizes", b.stats.size_histogram);
    }
}

void pack_methods_answer(buffer& out, std::uint32_t msgid, const handlers& h) {
    msgpack::packer<buffer> p(out);
    p.pack_array(4);
    p.pack(1);
    p.pack(msgid);
    p.pack_nil();
    std::size_t n = 0;
    h.for_each_method([&](const std::string&, const std::string&) { ++n; });
    p.pack_map(static_cast<std::uint32_t>(n));
    h.for_each_method([&](const std::string& name, const std::string& sig) {
        p.pack(name);
        p.pack(sig);
    });
}

// Defined here, with what else a server counts and records: one request answered, in the
// access log and as a span.
void dispatcher::log_access(std::string_view method, const call_context* ctx,
                            std::error_code status, const span_times& times, std::size_t bytes_in,
                            std::size_t bytes_out) {
    const auto now = std::chrono::steady_clock::now();
    const auto at = times.start;
    if (ctx && !ctx->trace_id().empty() && recording_spans()) {
        span_times t = times;
        if (t.start == span_times::time_point{}) t.start = now;
        t.end = now;
        record_server_span(*ctx, method, self_.remote_address(), self_.identity().subject, status,
                           t, bytes_in, bytes_out);
    }
    if (!h_ || !h_->access_log()) return;
    access_record r;
    r.when = std::chrono::system_clock::now();
    if (ctx) r.trace_id = ctx->trace_id();
    r.method = method;
    r.peer = self_.remote_address();
    r.subject = self_.identity().subject;
    r.status = status;
    if (at != std::chrono::steady_clock::time_point{})
        r.duration = std::chrono::duration_cast<std::chrono::microseconds>(now - at);
    r.bytes_in = bytes_in;
    r.bytes_out = bytes_out;
    try {
        h_->access_log()(r);
    } catch (...) {
        // Documented as must not throw; one that does loses its record, not the connection.
    }
}

// Defined here, with the rest of the answer to ordo.stats.
net::awaitable<void> dispatcher::answer_stats(dispatcher* d, std::shared_ptr<void> keep,
                                              std::uint32_t msgid) {
    buffer b(small_buffer);
    write_response_head(b, msgid);
    try {
        const server_stats server = co_await d->h_->stats_source()();
        // The connection (and with it the server's handler table) may have ended meanwhile.
        if (d->stopped_) co_return;
        pack_stats(b, *d->h_, &server);
    } catch (...) {
        const auto why = describe_current_exception();
        b.clear();
        encode_error_response(b, msgid, why.first, why.second);
    }
    // `keep` holds the connection, and so `d`, until here; once it has ended nothing is sent.
    if (!d->stopped_) d->host_.send_response(b);
    keep.reset();
}

}  // namespace detail

void handlers::add(std::string name, detail::handler_entry e) {
    auto it = map_.find(name);
    if (it != map_.end())
        e.counters = it->second.counters;  // the name's figures go on
    else
        e.counters = std::make_shared<detail::method_counters>();
    if (e.concurrency.limited()) e.limit = detail::admission::make(e.concurrency);
    // Run straight from the read: open to everyone, and nothing to log (the inline path keeps
    // no access log).
    e.direct = e.sync && !e.stream && !e.allow && !access_log_;
    map_.insert_or_assign(std::move(name), std::move(e));
}

handlers& handlers::access_log(access_log_fn f) {
    access_log_ = std::move(f);
    for (auto& [name, e] : map_) e.direct = e.sync && !e.stream && !e.allow && !access_log_;
    return *this;
}

std::vector<method_stats> handlers::stats_by_method() const {
    std::vector<ordo::method_stats> v;
    v.reserve(map_.size());
    for (const auto& [name, e] : map_) {
        if (name.starts_with("ordo.")) continue;  // served by the table itself
        v.push_back(e.counters->snapshot(name));
        if (e.limit) v.back().concurrency = e.limit->stats();
    }
    return v;
}

handlers& handlers::concurrency(const concurrency_limit& l, const caller_shares& shares) {
    limit_ = l.limited() ? detail::admission::make(l) : nullptr;
    if (limit_ && shares.on()) limit_->share(shares);
    return *this;
}

concurrency_stats handlers::concurrency() const {
    return limit_ ? limit_->stats() : concurrency_stats{};
}

std::vector<batch_handler_stats> handlers::stats_by_batch() const {
    // A name registered again keeps its earlier batcher (for stop_batches) but reports only the
    // one that serves it now.
    std::vector<batch_handler_stats> v;
    v.reserve(batchers_.size());
    for (auto b = batchers_.rbegin(); b != batchers_.rend(); ++b) {
        const bool seen = std::any_of(
            v.begin(), v.end(), [&](const batch_handler_stats& x) { return x.name == b->name; });
        if (!seen) v.push_back({b->name, b->core->stats()});
    }
    std::reverse(v.begin(), v.end());
    return v;
}

}  // namespace ordo
