// Who a router's replicas are: members added by the URL, by add_replica or by the sources it
// follows; their connections, opened again with backoff when they end; outlier ejection; drains
// announced by their servers; removal. Where calls go is rpc/channels/router.cpp.
#include <algorithm>
#include <cmath>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "ordo/address.hpp"
#include "rpc/channels/connecting.hpp"
#include "rpc/channels/router_state.hpp"
#include "rpc/connection/when_closed.hpp"

namespace ordo {

const char* to_string(replica_state s) noexcept {
    switch (s) {
        case replica_state::connecting: return "connecting";
        case replica_state::ready: return "ready";
        case replica_state::reconnecting: return "reconnecting";
        case replica_state::ejected: return "ejected";
        case replica_state::draining: return "draining";
        case replica_state::not_serving: return "not_serving";
    }
    return "unknown";
}

namespace {

using ms = std::chrono::milliseconds;

// Failures that say something about the replica, not about the caller. Not errc::overloaded: a
// replica that refuses calls it has no room for works as it should, and gets fewer calls for a
// while instead (router::state::try_again).
bool counts_against(std::error_code ec) {
    if (ec.category() != error_category()) return true;
    switch (static_cast<errc>(ec.value())) {
        case errc::remote_error:
        case errc::timed_out:
        case errc::shutting_down:
        case errc::protocol_error:
            return true;
        default:
            return false;
    }
}

std::string in_ms(ms d) {
    return std::to_string(d.count()) + " ms";
}

}  // namespace

// A new member, or one removed and still draining taken back. Throws for a bad weight or a
// URL that is already a member.
std::shared_ptr<router::state::replica> router::state::admit(std::string url, double weight,
                                                             std::string group,
                                                             std::size_t source) {
    if (closed) throw_error(errc::closed, "ordo: router " + name + " is closed");
    if (!(weight > 0))
        throw_error(errc::bad_address, "ordo: replica " + url + ": weight must be positive");
    // At the door, not when its connection is made: a replica that can never connect as asked
    // is refused by name (else each attempt would fail the same way, in the connect loop).
    detail::check_resume_scheme(url, o.peer.resume);
    if (auto r = find(url)) {
        if (r->member)
            throw_error(errc::bad_address, "ordo: replica " + url + " is already in " + name);
        r->member = true;  // removed, still draining: it stays
        r->source = source;
        r->weight = weight;
        r->group = std::move(group);
        r->shadow = in_shadow_group(r->group);
        place.reweigh(*r);
        if (r->ph == phase::draining && !r->goaway) r->ph = phase::live;
        place.refresh();
        rename();
        event("replica " + url + " added back");
        return r;
    }
    auto r = std::make_shared<replica>();
    r->owner = anchor;
    r->url = std::move(url);
    r->group = std::move(group);
    r->shadow = in_shadow_group(r->group);
    r->weight = weight;
    r->source = source;
    reps.push_back(r);
    place.admit(*r);
    return r;  // the caller renames the router once it has admitted what it had to
}

// One attempt to open `r`'s connection. Null when it is open, or when the attempt no longer
// matters (removed, closed, superseded); else what went wrong. With `drop`, a failed first
// attempt removes the replica (async_add_replica); without, it is tried again later.
net::awaitable<std::exception_ptr> router::state::connect_once(std::shared_ptr<replica> r,
                                                               bool drop) {
    const auto gen = ++r->gen;
    std::unique_ptr<transport> t;
    std::exception_ptr failure;
    std::string why;
    try {
        t = co_await detail::open_transport_within(r->url, o.connect_timeout, o.peer.transport);
    } catch (const std::system_error& e) {
        failure = std::current_exception();
        why = e.what();
    }
    if (closed || r->gen != gen || r->ph == phase::gone) co_return nullptr;
    if (t) {
        attach(r, std::move(t));
        co_return nullptr;
    }
    r->last_error = why;
    if (drop && r->ph == phase::connecting) {
        leave(*r);
        event("replica " + r->url + " not added: " + why);
        schedule_pump();  // waiting calls may have no replica left
        co_return failure;
    }
    const bool first = r->ph == phase::connecting;
    r->ph = phase::reconnecting;
    const ms delay = retry_later(r);
    event("replica " + r->url + (first ? " cannot connect: " : " still down: ") + why +
          "; next try in " + in_ms(delay));
    schedule_pump();  // calls waiting for its first connection may have no replica left
    co_return nullptr;
}

void router::state::dial(std::shared_ptr<replica> r) {
    tasks.spawn([this, r]() -> net::awaitable<void> { co_await connect_once(r, false); });
}

// Schedules the next attempt (jittered exponential backoff) and says when it will be.
ms router::state::retry_later(const std::shared_ptr<replica>& r) {
    double d = static_cast<double>(o.reconnect_initial.count()) *
               std::pow(std::max(1.0, o.reconnect_multiplier), r->attempts);
    d = std::min(d, static_cast<double>(o.reconnect_max.count()));
    std::uniform_real_distribution<double> spread(1 - o.reconnect_jitter, 1 + o.reconnect_jitter);
    const ms delay(static_cast<ms::rep>(std::max(1.0, d * spread(rng))));
    ++r->attempts;
    r->retry_timer = std::make_unique<net::steady_timer>(ex, delay);
    r->retry_timer->async_wait(
        [this, t = tasks.hold(), wr = std::weak_ptr<replica>(r)](std::error_code ec) {
            if (ec) return;
            auto rep = wr.lock();
            if (rep && rep->member && rep->ph == phase::reconnecting && !closed) dial(rep);
        });
    return delay;
}

// Whether `r` may be given the route's credentials (router_options::token_hosts).
bool router::state::trusted_with_token(const replica& r) const {
    if (r.source == 0 || sources[r.source - 1].src->resolves_own_name()) return true;
    address a;
    try {
        a = parse_address(r.url);
    } catch (const std::system_error&) {
        return false;
    }
    if (const auto ca = a.param("ca"); a.scheme == "tls" && ca && !ca->empty()) return true;
    const std::string host_port = a.host + ":" + std::to_string(a.port);
    for (const auto& h : o.token_hosts)
        if (h == a.host || h == host_port || h == "[" + a.host + "]:" + std::to_string(a.port))
            return true;
    return false;
}

void router::state::attach(const std::shared_ptr<replica>& r, std::unique_ptr<transport> t) {
    if (!o.peer.credentials.empty() && !trusted_with_token(*r)) {
        peer_options without = o.peer;
        without.credentials = {};
        event("replica " + r->url + " (from " + sources[r->source - 1].name +
              ") is connected without the route's token: its host is not in token_hosts, and "
              "it is not tls:// with ca=");
        r->conn = detail::make_connected_peer(std::move(t), r->url, without, nullptr);
    } else {
        r->conn = detail::make_connected_peer(std::move(t), r->url, o.peer, nullptr);
    }
    r->conn->observe_calls(std::make_unique<conn_watch>(r, r->gen));
    r->conn->start();
    detail::when_closed(*r->conn, ex, tasks.hold(),
                        [this, wr = std::weak_ptr<replica>(r), gen = r->gen](
                            const std::error_code&, const std::string& why) {
                            if (auto rep = wr.lock(); rep && rep->gen == gen) lose(*rep, why);
                        });
    // A server that drains says so first: no new calls there, those in flight finish.
    r->conn->on_goaway([this, t = tasks.hold(), wr = std::weak_ptr<replica>(r), gen = r->gen](
                           std::chrono::milliseconds, const std::string& reason) {
        auto rep = wr.lock();
        if (rep && rep->gen == gen && !closed) heard_goaway(*rep, reason);
    });
    const bool again = r->connects > 0;
    ++r->connects;
    if (again) ++c.reconnects;
    r->attempts = 0;
    r->goaway = false;
    r->unwell = false;  // until its server says otherwise
    r->failures_in_a_row = 0;
    r->ph = phase::live;
    watch_health(r);
    place.refresh();
    event("replica " + r->url + (again ? " back" : " added"));
    pump();
}

// The replica's connection ended (or is ending): it leaves the ring at once. A member connects
// again; a removed replica is gone.
void router::state::lose(replica& r, const std::string& why) {
    if (r.ph == phase::gone || r.ph == phase::reconnecting || r.ph == phase::connecting) return;
    // Its peer may be the caller, inside its own close: release it later, not here.
    if (r.conn) retire(std::move(r.conn));
    r.conn = nullptr;
    const bool drained = r.ph == phase::draining;
    if (!r.member) {
        leave(r);
        schedule_pump();
        return;
    }
    r.ph = phase::reconnecting;
    place.refresh();
    const std::string next = "; next try in " + in_ms(retry_later(shared(&r)));
    if (drained && r.goaway) {
        event("replica " + r.url + " drained" + next);
    } else {
        ++c.replicas_lost;
        last_loss = r.url + ": " + why;
        r.last_error = why;
        event("replica " + r.url + " lost: " + why + next);
        for (auto& s : sources) s.src->refresh_now();
    }
    schedule_pump();  // waiting calls move to the next replica, or fail if none is left
}

// Keeps `p` alive until the executor comes back (it may be on the stack now).
void router::state::retire(std::shared_ptr<void> p) {
    if (retired.empty()) net::post(ex, [this, t = tasks.hold()] { retired.clear(); });
    retired.push_back(std::move(p));
}

// A removed replica with no connection left: it is gone.
void router::state::leave(replica& r) {
    r.ph = phase::gone;
    r.retry_timer.reset();
    r.eject_timer.reset();
    if (r.conn) retire(std::move(r.conn));
    r.conn = nullptr;
    retire(shared(&r));
    place.forget(r);
    std::erase_if(reps, [&](const auto& p) { return p.get() == &r; });
    place.refresh();
    rename();
}

void router::state::heard_goaway(replica& r, const std::string& reason) {
    if (r.ph != phase::live) return;
    r.ph = phase::draining;
    r.goaway = true;
    ++c.drains;
    place.refresh();
    event("replica " + r.url + " is going away (" + reason + "): draining");
    if (r.in_flight == 0 && r.conn) close_idle(r);
    schedule_pump();  // its waiting keyed calls move on
}

void router::state::note_outcome(replica& r, std::error_code ec) {
    if (o.eject_after == 0 || r.shadow) return;  // shadow calls only count
    if (!ec) {
        r.failures_in_a_row = 0;
        return;
    }
    if (!counts_against(ec)) return;
    if (++r.failures_in_a_row < o.eject_after || r.ejected() || r.ph != phase::live) return;
    eject(r);
}

void router::state::eject(replica& r) {
    std::size_t members = 0, out = 0;
    for (auto& p : reps)
        if (p->member && !p->shadow) {
            ++members;
            out += p->ejected() ? 1 : 0;
        }
    if ((out + 1) * 100 > o.max_ejected_percent * members) return;  // the cap
    const auto now = clock_type::now();
    // A replica that stayed in for eject_max since its last ejection starts over.
    if (r.last_ejected_end != clock_type::time_point{} && now - r.last_ejected_end > o.eject_max)
        r.streak = 0;
    ++r.streak;
    ++r.ejections;
    ++c.ejections;
    const ms d = std::min<ms>(o.eject_base * static_cast<ms::rep>(r.streak), o.eject_max);
    r.ejected_until = now + d;
    r.failures_in_a_row = 0;
    place.refresh();
    event("replica " + r.url + " ejected for " + in_ms(d) + ": its last " +
          std::to_string(o.eject_after) + " calls failed");
    r.eject_timer = std::make_unique<net::steady_timer>(ex, r.ejected_until);
    r.eject_timer->async_wait(
        [this, t = tasks.hold(), wr = std::weak_ptr<replica>(shared(&r))](std::error_code ec) {
            if (ec) return;
            auto rep = wr.lock();
            if (!rep || rep->ph == phase::gone || closed) return;
            rep->ejected_until = {};
            rep->last_ejected_end = clock_type::now();
            place.refresh();
            event("replica " + rep->url + " back from ejection");
            schedule_pump();
        });
    schedule_pump();  // its waiting keyed calls move on
}

net::awaitable<void> router::state::add(std::string url, double weight, std::string group) {
    auto keep = self.shared_from_this();
    auto r = admit(std::move(url), weight, std::move(group), 0);
    rename();
    if (r->ph != phase::connecting) co_return;  // taken back while draining
    if (auto failure = co_await connect_once(r, true)) std::rethrow_exception(failure);
}

bool router::state::remove(const std::string& url) {
    auto r = find(url);
    if (!r || !r->member) return false;
    r->member = false;
    event("replica " + url + " removed");
    if (!r->conn) {
        leave(*r);  // connecting or reconnecting: nothing to drain
    } else {
        if (r->ph != phase::draining) r->ph = phase::draining;
        place.refresh();
        rename();
        if (r->in_flight == 0) close_idle(*r);
    }
    schedule_pump();
    return true;
}

// A source's new set: its members that are not in it drain and leave, new ones connect,
// changed weights and groups apply. A URL that the router lists already from elsewhere stays
// with whoever listed it first.
void router::state::apply(std::size_t source, std::vector<member> set) {
    if (closed) return;
    ++c.source_updates;
    // By URL, so that a set of thousands applies in linear time.
    std::unordered_set<std::string_view> listed;
    for (auto& m : set) listed.insert(m.url);
    std::vector<std::string> dropped;
    for (auto& r : reps)
        if (r->member && r->source == source && !listed.count(r->url)) dropped.push_back(r->url);
    for (auto& u : dropped) remove(u);
    std::unordered_map<std::string_view, std::shared_ptr<replica>> known;
    for (auto& r : reps) known.emplace(r->url, r);
    for (auto& m : set) {
        auto it = known.find(m.url);
        auto r = it == known.end() ? nullptr : it->second;
        if (r && r->member) {
            if (r->source != source) continue;
            if (r->weight != m.weight || r->group != m.group) {
                r->weight = m.weight;
                r->group = m.group;
                r->shadow = in_shadow_group(r->group);
                place.reweigh(*r);
                place.refresh();
                event("replica " + r->url + " now has weight " + std::to_string(m.weight) +
                      (m.group.empty() ? "" : " in group " + m.group));
            }
            continue;
        }
        try {
            auto a = admit(m.url, m.weight, m.group, source);
            if (a->ph == phase::connecting) dial(a);
        } catch (const std::system_error& e) {
            ++c.source_problems;
            event(std::string("source ") + sources[source - 1].name + ": " + e.what());
        }
    }
    rename();
    schedule_pump();
}

void router::state::follow(std::unique_ptr<replica_source> src) {
    if (closed) throw_error(errc::closed, "ordo: router " + name + " is closed");
    const std::size_t id = sources.size() + 1;
    sources.push_back(followed{std::move(src), {}, {}});
    sources.back().name = sources.back().src->describe();
    rename();
    auto w = self.weak_from_this();
    sources.back().src->start(
        [w, id](std::vector<member> set) {
            if (auto rt = w.lock()) rt->s_->apply(id, std::move(set));
        },
        [w, id](const std::string& problem) {
            auto rt = w.lock();
            if (!rt) return;
            auto& s = *rt->s_;
            ++s.c.source_problems;
            s.sources[id - 1].last_problem = problem;
            s.event("source " + s.sources[id - 1].name + ": " + problem);
        });
}

void router::state::close_all() {
    if (closed) return;
    closed = true;
    tasks.close();  // connection attempts end now
    for (auto& s : sources) s.src->stop();
    queue.fail_all(errc::closed, "ordo: router " + name + " closed");
    update();
    wait_timer.cancel();
    auto all = std::move(reps);
    reps.clear();
    place.clear();
    for (auto& r : all) {
        r->ph = phase::gone;
        r->retry_timer.reset();
        r->eject_timer.reset();
        // Calls still pending on the peer hold their replica: dropping the replica's hold
        // on the peer leaves no cycle, even if the loop never runs again to fail them.
        if (auto conn = std::move(r->conn)) conn->abort();
    }
}

net::awaitable<void> router::async_add_replica(std::string url, double weight, std::string group) {
    return s_->add(std::move(url), weight, std::move(group));
}

net::awaitable<void> router::async_add_replica(std::string url) {
    return s_->add(std::move(url), 1.0, std::string());
}

void router::add_replica(std::string url, double weight, std::string group) {
    std::shared_ptr<detail::replica> r;
    try {
        r = s_->admit(url, weight, std::move(group), 0);
        s_->rename();
    } catch (const std::system_error& e) {  // already there, a bad weight, closed: as documented
        s_->event("replica " + url + " not added: " + e.what());
        return;
    }
    if (r->ph == state::phase::connecting) s_->dial(r);
}

bool router::remove_replica(const std::string& url) {
    return s_->remove(url);
}

void router::on_event(std::function<void(const std::string&)> f) {
    s_->on_event = std::move(f);
}

void router::follow(std::unique_ptr<replica_source> source) {
    s_->follow(std::move(source));
}

net::awaitable<void> router::async_follow(std::unique_ptr<replica_source> source) {
    auto keep = shared_from_this();
    const std::string what = source->describe();
    const std::size_t id = s_->sources.size() + 1;
    s_->follow(std::move(source));
    const auto deadline = std::chrono::steady_clock::now() + s_->o.connect_timeout;
    net::steady_timer t(s_->ex);
    // Bounded by connect_timeout; a few checks a second cost nothing next to a connect.
    while (!s_->closed && std::chrono::steady_clock::now() < deadline) {
        if (std::any_of(s_->reps.begin(), s_->reps.end(),
                        [](const auto& r) { return r->takes_calls(); }))
            co_return;
        t.expires_after(ms(10));
        co_await t.async_wait(net::use_awaitable);
    }
    std::string why = s_->sources[id - 1].last_problem;
    for (auto& r : s_->reps)
        if (why.empty() && !r->last_error.empty()) why = r->url + ": " + r->last_error;
    if (why.empty()) why = "no replica listed yet";
    throw_error(errc::peer_lost, "ordo: no replica from " + what + " took calls within " +
                                     in_ms(s_->o.connect_timeout) + " (" + why + ")");
}

void router::close() {
    s_->close_all();
}

std::vector<replica_counters> router::replicas() const {
    std::vector<replica_counters> out;
    for (auto& r : s_->reps) {
        replica_counters rc;
        rc.url = r->url;
        rc.group = r->group;
        rc.weight = r->weight;
        rc.live = r->takes_calls();
        using phase = state::phase;
        rc.state = r->ph == phase::connecting     ? replica_state::connecting
                   : r->ph == phase::reconnecting ? replica_state::reconnecting
                   : r->ph == phase::draining     ? replica_state::draining
                   : r->ejected()                 ? replica_state::ejected
                   : r->unwell                    ? replica_state::not_serving
                                                  : replica_state::ready;
        rc.member = r->member;
        rc.source = r->source ? s_->sources[r->source - 1].name : std::string();
        rc.last_error = r->last_error;
        rc.connects = r->connects;
        rc.ejections = r->ejections;
        rc.in_flight = r->in_flight;
        rc.completed = r->completed;
        rc.errors = r->errors;
        rc.shadow_calls = r->shadow_calls;
        rc.overloaded = r->overloaded;
        rc.cooling = r->cooling() && r->cool_until > state::clock_type::now();
        rc.latency = r->latency.summary();
        s_->queue.for_each([&](const detail::pending_call& call) {
            if (!call.options.key.empty() && s_->place.owner_of(call.options.key) == r.get()) ++rc.queued;
        });
        out.push_back(std::move(rc));
    }
    return out;
}

router_view router::view(std::string name) const {
    router_view v;
    v.name = std::move(name);
    const auto& c = counters();
    v.calls = c.calls;
    v.queued = c.queued;
    v.replicas_lost = c.replicas_lost;
    v.reconnects = c.reconnects;
    v.ejections = c.ejections;
    v.drains = c.drains;
    v.source_problems = c.source_problems;
    v.retried = c.retried;
    v.moved = c.moved;
    v.over_budget = c.over_budget;
    for (auto& rc : replicas())
        v.replicas.push_back({rc.url, to_string(rc.state), rc.in_flight, rc.completed, rc.errors,
                              rc.last_error});
    return v;
}

std::vector<std::pair<std::string, source_counters>> router::sources() const {
    std::vector<std::pair<std::string, source_counters>> out;
    for (auto& s : s_->sources) out.emplace_back(s.name, s.src->counters());
    return out;
}

}  // namespace ordo
