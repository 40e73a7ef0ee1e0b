#include "ordo/rpc/router.hpp"

// How calls flow: to the replica placement picks, or into the waiting queue; shadow copies;
// second tries; booking each call's end. Who the replicas are is rpc/channels/router_members.cpp;
// which one a call goes to, rpc/channels/placement.hpp.
#include <algorithm>

#include "rpc/channels/router_state.hpp"
#include "rpc/context/context.hpp"
#include "rpc/context/spans.hpp"

namespace ordo {
namespace {
// Fails a call the router refuses before it waits; a traced one's refusal is a span of its trace.
void refuse_call(detail::pending_call& call, errc code, const std::string& why) {
    if (detail::recording_spans() && !call.options.metadata.empty()) [[unlikely]] {
        const auto now = std::chrono::steady_clock::now();
        detail::record_router_span(call.options.metadata, "wait", call.method, {},
                                   make_error_code(code), why, {now, {}, {}, now});
    }
    detail::fail_call(call, code, why);
}
}  // namespace

router::state::state(router& r, net::any_io_executor e, router_options opt)
    : self(r),
      ex(detail::without_context(std::move(e))),
      o(std::move(opt)),
      queue(
          ex,
          [](std::chrono::milliseconds t) {
              return "no replica had room within " + std::to_string(t.count()) + " ms";
          },
          "cancelled by the caller while waiting for a replica", [this] { update(); }),
      wait_timer(ex) {
    queue.set_order(o.queue == queue_order::fifo ? detail::wait_order::fifo
                                                 : detail::wait_order::earliest_deadline);
    if (auto w = o.caller_weights.find(""); w != o.caller_weights.end())
        anonymous.weight = std::max(w->second, 1u);
    // A traced call that fails while it waits for a replica: its wait is a span of its trace.
    queue.on_failed([this](const detail::pending_call& call, std::error_code ec,
                           const std::string& why, clock_type::time_point since) {
        note_waiting(call, false);
        if (detail::recording_spans() && !call.options.metadata.empty()) [[unlikely]]
            detail::record_router_span(call.options.metadata, "wait", call.method, {}, ec, why,
                                       {since, {}, {}, clock_type::now()});
    });
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
        return !r->shadow && (r->takes_calls() || r->ph == phase::connecting);
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

void router::state::start_call(std::unique_ptr<detail::pending_call> call) {
    if (closed)
        return detail::fail_call(*call, errc::closed, "ordo: router " + name + " is closed");
    if (!detail::take_context(*call, o.peer.default_timeout)) [[unlikely]]
        return detail::fail_call(*call, errc::timed_out, detail::inherited_timeout_reason(*call));
    const bool retry = call->attempt > 0;
    if (!retry) {
        ++c.calls;
        budget.deposit();
    }
    const auto timeout =
        call->options.timeout.count() > 0 ? call->options.timeout : o.peer.default_timeout;
    // Calls already waiting go first: a new call never overtakes them, even into room that
    // freed up before the queue was served (which keeps the order of a key across failover).
    if (queue.empty())
        if (replica* r = place.pick(*call)) return send(*r, std::move(call), timeout, retry);
    if (!any_usable() && o.wait_for_replica.count() == 0)
        return refuse_call(*call, errc::peer_lost, no_replica_reason());
    if (queue.size() >= o.max_queued_calls && !push_out_for(*call))
        return refuse_call(*call, errc::overloaded,
                           "ordo: " + std::to_string(queue.size()) +
                               " calls already wait for a replica of " + name +
                               " (max_queued_calls)" +
                               (waiting_callers > 0 && !call->options.caller.empty()
                                    ? ", and caller " + call->options.caller +
                                          " is as far over its share of them as any"
                                    : std::string()));
    if (!call->options.key.empty()) {
        const replica* owner = place.owner_of(call->options.key);
        if (owner && !place.key_may_go(call->options.key, owner)) ++c.key_waits;
    }
    note_waiting(*call, true);
    queue.push(std::move(call), timeout);
    update();
    schedule_pump();
}

router::state::caller_load& router::state::named_load(const std::string& caller) {
    auto [it, fresh] = callers.try_emplace(caller);
    if (fresh)
        if (auto w = o.caller_weights.find(caller); w != o.caller_weights.end())
            it->second.weight = std::max(w->second, 1u);
    return it->second;
}

void router::state::note_waiting(const detail::pending_call& call, bool more) {
    caller_load& l = load_of(call.options.caller);
    if (more) {
        if (l.waiting++ == 0) ++waiting_callers;
        return;
    }
    if (--l.waiting == 0) --waiting_callers;
    if (l.waiting == 0 && l.in_flight == 0 && &l != &anonymous) callers.erase(call.options.caller);
}

std::vector<std::string> router::state::next_callers() const {
    std::vector<std::string> best;
    if (waiting_callers < 2) return best;
    const caller_load* at = nullptr;
    // Fewest in flight for its weight: (in_flight + 1) / weight, compared by cross-multiplying;
    // those tied all take their turn, in the queue's order.
    auto consider = [&](const std::string& who, const caller_load& l) {
        if (l.waiting == 0) return;
        const std::size_t mine = (l.in_flight + 1) * (at ? at->weight : 1);
        const std::size_t theirs = at ? (at->in_flight + 1) * l.weight : 0;
        if (at && mine > theirs) return;
        if (!at || mine < theirs) best.clear();
        best.push_back(who);
        at = &l;
    };
    consider(std::string(), anonymous);
    for (const auto& [who, l] : callers) consider(who, l);
    return best;
}

bool router::state::push_out_for(const detail::pending_call& call) {
    if (waiting_callers == 0) return false;
    // The caller furthest over its share, counting this call among its caller's waiting.
    static const std::string none;
    const std::string& mine = call.options.caller;
    const caller_load& my_load = load_of(mine);  // listed while this looks
    const std::string* far = nullptr;
    std::size_t far_uses = 0;
    unsigned far_weight = 1;
    // Strictly further over than the one found so far; the arriving call's own caller is
    // looked at first, so that it keeps a tie (it is refused rather than push out an equal).
    auto consider = [&](const std::string& who, const caller_load& l) {
        const bool me = who == mine;
        if (l.waiting == 0 && !me) return;
        const std::size_t uses = l.in_flight + l.waiting + (me ? 1 : 0);
        if (!far || uses * far_weight > far_uses * l.weight) {
            far = &who;
            far_uses = uses;
            far_weight = l.weight;
        }
    };
    consider(mine, my_load);
    if (!mine.empty()) consider(none, anonymous);
    for (const auto& [who, l] : callers)
        if (who != mine) consider(who, l);
    const std::string pushed = far && *far != mine ? *far : mine;
    if (pushed == mine) {
        // Its own caller is the furthest over: the call is refused, and leaves no entry.
        if (auto it = callers.find(mine);
            it != callers.end() && it->second.waiting == 0 && it->second.in_flight == 0)
            callers.erase(it);
        return false;
    }
    // (The text names no other caller: a relaying server's tenants should not learn of one
    // another.)
    if (queue.fail_newest(
            [&](const detail::pending_call& w) { return w.options.caller == pushed; },
            errc::overloaded,
            "ordo: pushed out of " + name + "'s full queue (max_queued_calls) by another "
            "caller's call: this call's caller is the furthest over its share of the queue"))
        return true;
    if (auto it = callers.find(mine);
        it != callers.end() && it->second.waiting == 0 && it->second.in_flight == 0)
        callers.erase(it);
    return false;
}

std::string router::state::no_replica_reason() const {
    const auto unwell = std::count_if(reps.begin(), reps.end(), [](const auto& r) {
        return r->unwell && r->ph == phase::live && !r->shadow;
    });
    return "no live replica in " + name +
           (unwell ? " (" + std::to_string(unwell) + " not serving, by ordo.health)" : "") +
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
    if (hedging && !retry && !call->stream && call->options.key.empty()) [[unlikely]]
        if (const auto delay = hedge_delay(*call); delay.count() > 0)
            return send_hedged(rep, std::move(call), timeout, delay);
    // Its params stay with it until it ends: it may go out again (try_again).
    call->keep_params = !call->stream;
    call->options.timeout = timeout;
    if (!call->options.key.empty()) place.key_sent(call->options.key, rep);
    call->noted.sent = clock_type::now();  // its latency runs to the read that brings the answer
    call->noted.mark = place.tag();
    ++rep.in_flight;
    ++load_of(call->options.caller).in_flight;
    rep.conn->start_call(std::move(call));  // its end comes back through conn_watch
    // A write that failed inside that send ended the connection: the calls after this one go
    // elsewhere now, not to a connection that is only waiting for the event loop to end it.
    if (rep.conn && !rep.conn->takes_calls()) [[unlikely]]
        lose(rep, "its connection failed while a call was being written");
}

void router::state::send_again(replica& r, std::unique_ptr<detail::pending_call> call,
                               std::chrono::milliseconds timeout) {
    send(r, std::move(call), timeout, true);
}

void router::state::shadow(const detail::pending_call& call, std::chrono::milliseconds timeout) {
    replica* best = nullptr;
    for (auto& r : reps)
        if (r->shadow && place.has_room(*r) && (!best || r->in_flight < best->in_flight))
            best = r.get();
    if (!best) {
        ++c.shadow_skipped;
        return;
    }
    auto sc = std::make_unique<shadow_call>();
    sc->method = call.method;
    sc->params = call.params.copy();
    sc->options.timeout = timeout;
    ++best->in_flight;
    ++best->shadow_calls;
    sc->noted = {clock_type::now(), shadow_mark};
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
    const auto& n = sent.noted;
    const bool shadow = n.mark & shadow_mark;
    if (!shadow) {
        caller_load& l = load_of(sent.options.caller);
        --l.in_flight;
        if (l.in_flight == 0 && l.waiting == 0 && &l != &anonymous)
            callers.erase(sent.options.caller);
    }
    if (!sent.options.key.empty()) place.key_ended(sent.options.key);
    if (!ec) {
        // A response arrives only by a read of the replica's connection, which noted the time
        // (batched_comm's counters): its latency costs no second clock read.
        const auto arrived =
            r.conn && gen == r.gen ? r.conn->comm().last_receive : clock_type::now();
        const auto took = std::max(arrived - n.sent, clock_type::duration::zero());
        books.answered(r, sent, took, shadow);
        if (hedging && !shadow) [[unlikely]]
            note_hedge_latency(sent.method, took);
        if (place.aperture_on() && !shadow && sent.options.key.empty())
            place.answered(static_cast<std::uint8_t>(n.mark), n.sent, arrived);
    } else {
        books.failed(r);
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
    if (r.ph == phase::draining && r.in_flight == 0 && r.conn) close_idle(r);
    if (shadow) {
        ++(ec ? c.shadow_errors : c.shadow_ok);
        schedule_pump();
        return;
    }
    if (ec && try_again(r, call, ec, out)) return;
    if (ec) out.detail = "replica " + r.url + ": " + out.detail;
    if (!queue.empty()) schedule_pump();  // before the caller's handler, which may start calls
}

bool router::state::try_again(replica& r, std::unique_ptr<detail::pending_call>& call,
                              std::error_code ec, call_outcome& out) {
    detail::pending_call& sent = *call;
    const auto now = clock_type::now();
    replica* to = nullptr;  // a move's replica; a second try goes where start_call puts it
    const char* what = nullptr;
    if (ec == errc::overloaded && out.over_share) {
        // Refused for its caller's share, not because the replica is full: the caller is told
        // to slow down, and the replica stays open to the router's other callers.
        ++r.overloaded;
        return false;
    } else if (ec == errc::overloaded) {
        // Refused before any work: it may go anywhere else, unless its order or items tie it.
        ++r.overloaded;
        const auto hint = std::chrono::milliseconds(out.retry_after_ms);
        place.cool(r, now + std::max(hint, o.overload_cooldown));
        if (sent.attempt >= 2 || sent.stream || !sent.options.key.empty()) return false;
        to = place.elsewhere(r);
        if (!to) return false;
        what = "move";
    } else if (ec == errc::peer_lost && sent.attempt == 0 && !sent.stream &&
               o.idempotent_methods.count(sent.method)) {
        what = "retry";
    } else {
        return false;
    }
    const auto deadline = sent.options.timeout.count() > 0 ? sent.noted.sent + sent.options.timeout
                                                           : clock_type::time_point::max();
    if (deadline <= now) return false;
    if (!budget.withdraw(now)) {
        ++c.over_budget;
        out.detail += " (not tried again: the router's retry budget is spent)";
        return false;
    }
    // The caller's own call goes out again: its method, options, params and slot are as they
    // went out.
    auto again = std::move(call);
    again->options.timeout = detail::time_left(deadline);
    ++again->attempt;
    ++(to ? c.moved : c.retried);
    if (detail::recording_spans() && !again->options.metadata.empty()) [[unlikely]]
        detail::record_router_span(again->options.metadata, what, again->method, r.url, ec,
                                   "replica " + r.url + ": " + out.detail,
                                   {again->noted.sent, {}, {}, now});
    // Not from inside the replica's connection, which is still completing this call.
    std::shared_ptr<replica> target = to ? shared(to) : nullptr;
    net::post(ex, [this, t = tasks.hold(), call = std::move(again),
                   target = std::move(target)]() mutable {
        if (target && place.has_room(*target) && !closed) {
            const auto timeout = call->options.timeout;
            return send(*target, std::move(call), timeout, true);
        }
        start_call(std::move(call));  // where there is room now, or to wait for it (or closed)
    });
    schedule_pump();
    return true;
}

void router::state::schedule_pump() {
    if (pump_posted || queue.empty()) return;
    pump_posted = true;
    net::post(ex, [this, t = tasks.hold()] {
        pump_posted = false;
        if (!closed) pump();
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
    const auto needed = [this](const detail::pending_call& call) {
        return books.needed(call.method);
    };
    for (;;) {
        // Shared among callers: the next call is the waiting caller's furthest below its share,
        // if one of its calls can go; else any that can.
        const std::vector<std::string> turn = next_callers();
        std::optional<detail::wait_queue::taken> t;
        if (!turn.empty())
            t = queue.take_first(
                [this, &turn](const detail::pending_call& call) {
                    return std::find(turn.begin(), turn.end(), call.options.caller) !=
                               turn.end() &&
                           place.peek(call) != nullptr;
                },
                needed);
        if (!t)
            t = queue.take_first(
                [this](const detail::pending_call& call) { return place.peek(call) != nullptr; },
                needed);
        if (!t) break;
        note_waiting(*t->call, false);
        replica* r = place.pick(*t->call);
        const bool retry = t->call->attempt > 0;
        if (detail::recording_spans() && !t->call->options.metadata.empty()) [[unlikely]]
            detail::record_router_span(t->call->options.metadata, "wait", t->call->method, r->url,
                                       {}, {}, {t->since, {}, {}, clock_type::now()});
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
    wait_timer.async_wait([this, t = tasks.hold()](std::error_code ec) {
        if (!ec && !closed) pump();
    });
}

void router::state::notify(std::string_view method, std::string_view params, std::uint16_t lane) {
    if (closed) throw_error(errc::closed, "ordo: router " + name + " is closed");
    replica* best = nullptr;
    for (auto& r : reps)
        if (!r->shadow && r->takes_calls() && (!best || r->in_flight < best->in_flight))
            best = r.get();
    if (!best)
        throw rpc_error(make_error_code(errc::peer_lost), {}, {},
                        "ordo: notify " + std::string(method) + " failed: " + no_replica_reason());
    best->conn->notify_raw_on(lane, method, params);
}

router::router(private_tag, net::any_io_executor ex, router_options o)
    : s_(std::make_unique<state>(*this, std::move(ex), std::move(o))) {}

router::~router() {
    detail::close_and_join(std::move(s_), [](state& s) {
        *s.anchor = nullptr;  // calls that end from here on complete their callers directly
        s.close_all();
        // What waits for the loop to come back is let go now: a retired connection's watches
        // hold tickets, and the post that would have cleared them may never run.
        s.retired.clear();
    });
}

void router::start_call(std::unique_ptr<detail::pending_call> call) {
    s_->start_call(std::move(call));
}

void router::notify_raw(std::string_view method, std::string_view params) {
    s_->notify(method, params, 0);
}

void router::notify_raw_on(std::uint16_t lane, std::string_view method, std::string_view params) {
    s_->notify(method, params, lane);
}

const std::string& router::remote_address() const noexcept {
    return s_->name;
}

net::any_io_executor router::get_executor() const {
    return s_->ex;
}

const router_counters& router::counters() const noexcept {
    s_->update();
    s_->c.aperture = s_->place.aperture_size();
    s_->c.aperture_trials = s_->place.aperture_trials();
    s_->c.aperture_changes = s_->place.aperture_changes();
    return s_->c;
}

std::shared_ptr<router> make_router(net::any_io_executor ex) {
    return make_router(std::move(ex), router_options{});
}

std::shared_ptr<router> make_router(net::any_io_executor ex, router_options o) {
    return std::make_shared<router>(router::private_tag{}, std::move(ex), std::move(o));
}

}  // namespace ordo
