#include "ordo/rpc/router.hpp"

// Where calls go: picking a replica, the waiting queue, the key-order guard, shadow traffic,
// retries. Who the replicas are is rpc/channels/router_members.cpp; how least_loaded's aperture
// moves, rpc/channels/aperture.cpp.
#include <algorithm>
#include <cmath>

#include "rpc/channels/router_state.hpp"

namespace ordo {
namespace {

std::uint64_t mix(std::uint64_t x) {  // splitmix64's finalizer: spreads FNV's similar outputs
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

std::uint64_t hash_of(std::string_view s) {
    std::uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a
    for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
    return mix(h);
}

}  // namespace

router::state::state(router& r, net::any_io_executor e, router_options opt)
    : self(r),
      ex(std::move(e)),
      o(std::move(opt)),
      queue(
          ex,
          [](std::chrono::milliseconds t) {
              return "no replica had room within " + std::to_string(t.count()) + " ms";
          },
          "cancelled by the caller while waiting for a replica", [this] { update(); }),
      wait_timer(ex) {
    o.max_concurrent = std::max<std::size_t>(1, o.max_concurrent);
    queue.set_order(o.queue == queue_order::fifo ? detail::wait_order::fifo
                                                 : detail::wait_order::earliest_deadline);
    aperture_on = o.aperture && o.policy == route_policy::least_loaded;
    rename();
}

void router::state::rename() {
    name = "route:";
    bool first = true;
    for (auto& r : reps) {
        if (!r->member) continue;
        name += (first ? "" : ",") + r->url;
        first = false;
    }
    for (auto& s : sources) name += (first ? "" : ",") + s.name, first = false;
}

// Replicas that may still serve ordinary calls, now or once connected for the first time.
bool router::state::any_usable() const {
    return std::any_of(reps.begin(), reps.end(), [&](const auto& r) {
        return !is_shadow(*r) && (takes_calls(*r) || r->ph == phase::connecting);
    });
}

std::shared_ptr<router::state::replica> router::state::shared(replica* r) const {
    return r->shared_from_this();
}

std::shared_ptr<router::state::replica> router::state::find(const std::string& url) const {
    for (auto& p : reps)
        if (p->url == url) return p;
    return nullptr;
}

// Computes `r`'s places on the ring (ring_points per unit of weight, at least one), once per
// URL and weight, sorted: a membership change then only takes points off and merges new ones in.
void router::state::place(replica& r) {
    const auto n = std::max<std::size_t>(
        1, static_cast<std::size_t>(std::llround(static_cast<double>(o.ring_points) * r.weight)));
    r.points.clear();
    r.points.reserve(n);
    for (std::size_t i = 0; i < n; ++i)
        r.points.push_back(hash_of(r.url + "#" + std::to_string(i)));
    std::sort(r.points.begin(), r.points.end());
    r.replaced = r.in_ring;
}

// Brings the ring in line with who takes calls: the points of replicas that stopped (or whose
// weight changed) come off in one pass, those of replicas that started are merged in. Linear
// in the ring's size (64 points per replica by default), with no full sort.
void router::state::rebuild_ring() {
    bool drop = false;
    for (auto& r : reps) {
        const bool keep = r->in_ring && !r->replaced && takes_calls(*r) && !is_shadow(*r);
        drop = drop || (r->in_ring && !keep);
        r->in_ring = keep;
        r->replaced = false;
    }
    if (drop) std::erase_if(ring, [](const auto& e) { return !e.second->in_ring; });
    const auto old_end = static_cast<std::ptrdiff_t>(ring.size());
    for (auto& r : reps) {
        if (r->in_ring || !takes_calls(*r) || is_shadow(*r)) continue;
        for (auto h : r->points) ring.emplace_back(h, r.get());
        r->in_ring = true;
    }
    if (ring.size() == static_cast<std::size_t>(old_end)) return;
    std::sort(ring.begin() + old_end, ring.end());
    std::inplace_merge(ring.begin(), ring.begin() + old_end, ring.end());
}

router::state::replica* router::state::owner_of(const std::string& key) const {
    if (ring.empty()) return nullptr;
    auto it = std::lower_bound(ring.begin(), ring.end(),
                               std::make_pair(hash_of(key), static_cast<replica*>(nullptr)));
    return (it == ring.end() ? ring.front() : *it).second;
}

// A key's call may go to `to` unless calls of that key are still in flight elsewhere.
bool router::state::key_may_go(const std::string& key, const replica* to) const {
    auto it = keys.find(key);
    return it == keys.end() || it->second.at == to;
}

// Fewest calls in flight per unit of weight among the aperture's replicas with room (ties: the
// first from the cursor on), else among the rest.
[[gnu::always_inline]] inline router::state::replica* router::state::least_loaded() {
    const std::size_t n = order.size();
    const std::size_t span = aperture_on ? ap.size() : detail::aperture::all;
    if (n > many_replicas && span > many_replicas) {
        // Many replicas: the less loaded of two drawn at random (the power of two choices, as
        // Envoy's least-request), so that a call costs the same at 1,000 replicas as at 20.
        // Only when neither draw finds room does the full scan below run. (The draws are among
        // the aperture's first places, a few of which may not take calls.)
        const std::size_t within = std::min(span, n);
        auto draw = [&]() -> replica* {
            for (int t = 0; t < 4; ++t) {
                replica& r = *order[std::uniform_int_distribution<std::size_t>(0, within - 1)(rng)];
                if (!is_shadow(r) && has_room(r)) return &r;
            }
            return nullptr;
        };
        replica* a = draw();
        replica* b = draw();
        auto load = [](const replica* r) { return static_cast<double>(r->in_flight) / r->weight; };
        if (a && b) return load(a) <= load(b) ? a : b;
        if (a || b) return a ? a : b;
    }
    replica* best = nullptr;
    std::size_t best_at = 0, seen = 0;
    // Ties go in turn: to the first from the cursor on.
    auto turn = [&](std::size_t i) { return i >= cursor ? i - cursor : i + n - cursor; };
    for (std::size_t i = 0; i < n; ++i) {
        replica& r = *order[i];
        if (is_shadow(r) || !takes_calls(r)) continue;
        if (seen++ >= span && best) break;  // the aperture had room
        if (r.in_flight >= o.max_concurrent) continue;
        if (best) {
            // in_flight / weight, compared by cross-multiplying (weights are positive): no
            // division per replica, as this runs once per call.
            const double mine = static_cast<double>(r.in_flight) * best->weight;
            const double theirs = static_cast<double>(best->in_flight) * r.weight;
            if (mine > theirs || (mine == theirs && turn(i) > turn(best_at))) continue;
        }
        best = &r;
        best_at = i;
    }
    if (best) cursor = best_at + 1;
    return best;
}

// The replica `call` goes to now, or null if it must wait.
[[gnu::always_inline]] inline router::state::replica* router::state::pick(
    const detail::pending_call& call) {
    if (!call.options.key.empty()) {
        replica* r = owner_of(call.options.key);
        return r && has_room(*r) && key_may_go(call.options.key, r) ? r : nullptr;
    }
    const std::size_t n = reps.size();
    replica* best = nullptr;
    if (o.policy == route_policy::weighted) {
        double total = 0;
        for (auto& r : reps)
            if (!is_shadow(*r) && has_room(*r)) {
                total += r->weight;
                r->current += r->weight;
                if (!best || r->current > best->current) best = r.get();
            }
        if (best) best->current -= total;
        return best;
    }
    if (o.policy == route_policy::least_loaded) return least_loaded();
    // round_robin: from the cursor on, wrapping.
    std::size_t i = cursor < n ? cursor : 0;
    for (std::size_t k = 0; k < n; ++k, i = i + 1 == n ? 0 : i + 1) {
        replica& r = *reps[i];
        if (is_shadow(r) || !has_room(r)) continue;
        cursor = i + 1;
        return &r;
    }
    return nullptr;
}

std::size_t router::state::usable() const {
    return std::size_t(std::count_if(reps.begin(), reps.end(), [&](const auto& r) {
        return !is_shadow(*r) && takes_calls(*r);
    }));
}

// pick() without moving round-robin state.
router::state::replica* router::state::peek(const detail::pending_call& call) const {
    if (!call.options.key.empty()) {
        replica* r = owner_of(call.options.key);
        return r && has_room(*r) && key_may_go(call.options.key, r) ? r : nullptr;
    }
    for (auto& r : reps)
        if (!is_shadow(*r) && has_room(*r)) return r.get();
    return nullptr;
}

void router::state::start_call(std::unique_ptr<detail::pending_call> call) {
    if (closed)
        return detail::fail_call(*call, errc::closed, "ordo: router " + name + " is closed");
    const bool retry = call->attempt > 0;
    if (!retry) ++c.calls;
    const auto timeout =
        call->options.timeout.count() > 0 ? call->options.timeout : o.peer.default_timeout;
    // Calls already waiting go first: a new call never overtakes them, even into room that
    // freed up before the queue was served (which keeps the order of a key across failover).
    if (queue.empty())
        if (replica* r = pick(*call)) return send(*r, std::move(call), timeout, retry);
    if (!any_usable() && o.wait_for_replica.count() == 0)
        return detail::fail_call(*call, errc::peer_lost, no_replica_reason());
    if (queue.size() >= o.max_queued_calls)
        return detail::fail_call(*call, errc::overloaded,
                                 "ordo: " + std::to_string(queue.size()) +
                                     " calls already wait for a replica of " + name +
                                     " (max_queued_calls)");
    if (!call->options.key.empty()) {
        const replica* owner = owner_of(call->options.key);
        if (owner && !key_may_go(call->options.key, owner)) ++c.key_waits;
    }
    queue.push(std::move(call), timeout);
    update();
    schedule_pump();
}

std::string router::state::no_replica_reason() const {
    return "no live replica in " + name +
           (last_loss.empty() ? "" : " (last lost: " + last_loss + ")");
}

[[gnu::always_inline]] inline void router::state::send(replica& rep,
                                                       std::unique_ptr<detail::pending_call> call,
                                                       std::chrono::milliseconds timeout,
                                                       bool retry) {
    // A stream is neither shadowed nor tried again: its items may have reached the caller.
    if (!retry && o.shadow_fraction > 0 && !call->stream) {
        shadow_credit += o.shadow_fraction;
        if (shadow_credit >= 1) {
            shadow_credit -= 1;
            shadow(*call, timeout);
        }
    }
    if (!retry && !call->stream && !o.idempotent_methods.empty() &&
        o.idempotent_methods.count(call->method))
        saved_params.insert_or_assign(call.get(), call->params.copy());
    call->options.timeout = timeout;
    // Started by a handler while a read is passed on, a call without a deadline takes that
    // read's time, as finished() takes a response's (its latency then spans read to read), and
    // no clock read (comm/read_clock.hpp).
    call->routed.sent = timeout.count() > 0 ? clock_type::now() : detail::read_time_or_now();
    if (!call->options.key.empty()) {
        key_flight& k = keys[call->options.key];
        k.at = &rep;
        ++k.calls;
    }
    call->routed.tag = ap.tag();
    ++rep.in_flight;
    rep.conn->start_call(std::move(call));  // its end comes back through conn_watch
    // A write that failed inside that send ended the connection: the calls after this one go
    // elsewhere now, not to a connection that is only waiting for the event loop to end it.
    if (rep.conn && !rep.conn->takes_calls()) [[unlikely]]
        lose(rep, "its connection failed while a call was being written");
}

void router::state::shadow(const detail::pending_call& call, std::chrono::milliseconds timeout) {
    replica* best = nullptr;
    for (auto& r : reps)
        if (is_shadow(*r) && has_room(*r) && (!best || r->in_flight < best->in_flight))
            best = r.get();
    if (!best) {
        ++c.shadow_skipped;
        return;
    }
    auto sc = std::make_unique<shadow_call>();
    sc->routed.sent = clock_type::now();
    sc->routed.shadow = true;
    sc->method = call.method;
    sc->params = call.params.copy();
    sc->options.timeout = timeout;
    ++best->in_flight;
    ++best->shadow_calls;
    ++c.shadow_sent;
    best->conn->start_call(std::move(sc));
}

// A call sent on connection `gen` of replica `r` ended, before its caller hears (conn_watch).
// Runs inside the replica's peer: what starts waiting calls is posted. The peer completes the
// caller's call after this returns, unless this took it for a second try.
void router::state::finished(replica& r, std::uint64_t gen,
                             std::unique_ptr<detail::pending_call>& call, std::error_code ec,
                             call_outcome& out) {
    --r.in_flight;
    const detail::pending_call& sent = *call;  // as it went out
    const auto& notes = sent.routed;
    if (!sent.options.key.empty()) {
        auto it = keys.find(sent.options.key);
        if (it != keys.end() && --it->second.calls == 0) keys.erase(it);
    }
    if (!ec) {
        ++r.completed;
        // A response arrives only by a read of the replica's connection, which noted the time
        // (batched_comm's counters): its latency costs no second clock read.
        const auto arrived =
            r.conn && gen == r.gen ? r.conn->comm().last_receive : clock_type::now();
        const auto took = std::max(arrived - notes.sent, clock_type::duration::zero());
        r.latency.record(took);
        if (aperture_on && !notes.shadow && sent.options.key.empty())
            ap.answered(notes.tag, notes.sent, arrived);
        // Only a waiting call with a deadline is judged by it: calls without one pay no
        // lookup.
        if (!notes.shadow && sent.options.timeout.count() > 0) {
            auto& e = service_estimates[sent.method];
            e += (std::chrono::duration_cast<std::chrono::microseconds>(took) - e) / 8;
        }
    } else {
        ++r.errors;
    }
    if (gen == r.gen) {
        if (!ec) {
            r.failures_in_a_row = 0;  // note_outcome's success, without the call
        } else {
            // A connection that ended, or whose other side ended its sending side (its calls
            // fail at once): lost now, before the pump gives it the calls that wait.
            if (ec == errc::peer_lost && r.conn && !r.conn->takes_calls()) lose(r, out.detail);
            note_outcome(r, ec);
        }
    }
    if (r.ph == phase::draining && r.in_flight == 0 && r.conn) r.conn->close();
    if (notes.shadow) {
        ++(ec ? c.shadow_errors : c.shadow_ok);
        schedule_pump();
        return;
    }
    if (!saved_params.empty()) {
        if (auto it = saved_params.find(call.get()); it != saved_params.end()) {
            auto params = std::move(it->second);
            saved_params.erase(it);
            if (ec == errc::peer_lost) {
                // The caller's own call comes back for its second (and last) try. Its method,
                // options and slot are as it went out; its params were sent and cleared.
                const auto deadline = sent.options.timeout.count() > 0
                                          ? notes.sent + sent.options.timeout
                                          : clock_type::time_point::max();
                auto again = std::move(call);
                again->params = std::move(params);
                again->options.timeout = detail::time_left(deadline);
                again->attempt = 1;
                ++c.retried;
                net::post(ex, [w = self.weak_from_this(), call = std::move(again)]() mutable {
                    if (auto rt = w.lock())
                        rt->s_->start_call(std::move(call));
                    else
                        detail::fail_call(*call, errc::closed, "ordo: the router was destroyed");
                });
                schedule_pump();
                return;
            }
        }
    }
    if (ec) out.detail = "replica " + r.url + ": " + out.detail;
    if (!queue.empty()) schedule_pump();  // before the caller's handler, which may start calls
}

void router::state::schedule_pump() {
    if (pump_posted || queue.empty()) return;
    pump_posted = true;
    net::post(ex, [w = self.weak_from_this()] {
        if (auto rt = w.lock()) {
            rt->s_->pump_posted = false;
            rt->s_->pump();
        }
    });
}

// Sends waiting calls, in the queue's order (earliest deadline first), while some replica they
// may use has room.
void router::state::pump() {
    if (!any_usable()) {
        if (o.wait_for_replica.count() == 0) {
            queue.fail_all(errc::peer_lost, no_replica_reason());
        } else {
            queue.fail_waiting_since(clock_type::now() - o.wait_for_replica, errc::peer_lost,
                                     no_replica_reason() + ", for " +
                                         std::to_string(o.wait_for_replica.count()) +
                                         " ms (wait_for_replica)");
            arm_wait_timer();
        }
        update();
        return;
    }
    while (auto t = queue.take_first(
               [this](const detail::pending_call& call) { return peek(call) != nullptr; },
               [this](const detail::pending_call& call) {
                   auto it = service_estimates.find(call.method);
                   return it == service_estimates.end() ? std::chrono::microseconds(0)
                                                        : 2 * it->second;
               })) {
        replica* r = pick(*t->call);
        const bool retry = t->call->attempt > 0;
        send(*r, std::move(t->call), t->timeout, retry);
    }
    update();
}

// While no replica can take calls, wakes pump() when the oldest waiting call has waited
// wait_for_replica.
void router::state::arm_wait_timer() {
    const auto oldest = queue.oldest_since();
    if (!oldest) return;
    wait_timer.expires_at(*oldest + o.wait_for_replica);
    wait_timer.async_wait([w = self.weak_from_this()](std::error_code ec) {
        if (ec) return;
        if (auto rt = w.lock()) rt->s_->pump();
    });
}

void router::state::notify(std::string_view method, std::string_view params) {
    if (closed) throw_error(errc::closed, "ordo: router " + name + " is closed");
    replica* best = nullptr;
    for (auto& r : reps)
        if (!is_shadow(*r) && takes_calls(*r) && (!best || r->in_flight < best->in_flight))
            best = r.get();
    if (!best)
        throw rpc_error(make_error_code(errc::peer_lost), {}, {},
                        "ordo: notify " + std::string(method) + " failed: " + no_replica_reason());
    best->conn->notify_raw(method, params);
}

router::router(private_tag, net::any_io_executor ex, router_options o)
    : s_(std::make_unique<state>(*this, std::move(ex), std::move(o))) {}

router::~router() {
    *s_->anchor = nullptr;  // calls that end from here on complete their callers directly
    s_->close_all();
}

void router::start_call(std::unique_ptr<detail::pending_call> call) {
    s_->start_call(std::move(call));
}

void router::notify_raw(std::string_view method, std::string_view params) {
    s_->notify(method, params);
}

const std::string& router::remote_address() const noexcept {
    return s_->name;
}

net::any_io_executor router::get_executor() const {
    return s_->ex;
}

const router_counters& router::counters() const noexcept {
    s_->update();
    s_->c.aperture =
        std::min(s_->aperture_on ? s_->ap.chosen() : detail::aperture::all, s_->usable());
    s_->c.aperture_trials = s_->ap.trials();
    s_->c.aperture_changes = s_->ap.changes();
    return s_->c;
}

std::shared_ptr<router> make_router(net::any_io_executor ex) {
    return make_router(std::move(ex), router_options{});
}

std::shared_ptr<router> make_router(net::any_io_executor ex, router_options o) {
    return std::make_shared<router>(router::private_tag{}, std::move(ex), std::move(o));
}

}  // namespace ordo
