#include "ordo/router.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>

#include "rpc/detail/connecting.hpp"
#include "rpc/detail/wait_queue.hpp"
#include "rpc/detail/when_closed.hpp"

namespace ordo {
namespace {

using clock_type = std::chrono::steady_clock;

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

// Latencies in microseconds: 8 buckets per power of two, so a percentile is within ~10%.
class histogram {
  public:
    void record(clock_type::duration d) {
        const auto us = static_cast<std::uint64_t>(std::max<std::int64_t>(
            1, std::chrono::duration_cast<std::chrono::microseconds>(d).count()));
        const int e = std::bit_width(us) - 1;
        const unsigned sub = e >= 3 ? (us >> (e - 3)) & 7 : (us << (3 - e)) & 7;
        ++b_[static_cast<std::size_t>(e) * 8 + sub];
        ++n_;
        max_ = std::max(max_, us);
    }
    latency_summary summary() const {
        latency_summary s;
        s.count = n_;
        s.p50 = at(0.50);
        s.p90 = at(0.90);
        s.p99 = at(0.99);
        s.max = std::chrono::microseconds(max_);
        return s;
    }

  private:
    std::chrono::microseconds at(double q) const {
        if (n_ == 0) return std::chrono::microseconds(0);
        const auto rank = static_cast<std::uint64_t>(std::ceil(q * static_cast<double>(n_)));
        std::uint64_t seen = 0;
        for (std::size_t i = 0; i < b_.size(); ++i) {
            seen += b_[i];
            if (seen >= rank) {
                const std::size_t e = i / 8, sub = i % 8;
                const std::uint64_t low = e >= 3 ? (8 + sub) << (e - 3) : (8 + sub) >> (3 - e);
                return std::chrono::microseconds(std::min(low, max_));
            }
        }
        return std::chrono::microseconds(max_);
    }
    std::array<std::uint64_t, 64 * 8> b_{};
    std::uint64_t n_ = 0, max_ = 0;
};

}  // namespace

struct router::state {
    enum class phase { connecting, live, draining, gone };

    struct replica {
        std::string url, group;
        double weight = 1;
        phase ph = phase::connecting;
        std::shared_ptr<peer> conn;
        std::size_t in_flight = 0;
        double current = 0;  // smooth weighted round robin
        std::uint64_t completed = 0, errors = 0, shadow_calls = 0;
        histogram latency;
    };

    // The call as sent to one replica: books its outcome, then completes the caller's call
    // (`inner`; none for shadow calls).
    class routed_call final : public detail::pending_call {
      public:
        routed_call(std::weak_ptr<router> r, std::shared_ptr<replica> rep)
            : router_(std::move(r)), rep(std::move(rep)) {}
        void complete(std::error_code ec, call_outcome out) override {
            if (auto r = router_.lock())
                r->s_->finished(*this, ec, std::move(out));
            else if (inner)
                inner->complete(ec, std::move(out));
        }

        std::weak_ptr<router> router_;
        std::shared_ptr<replica> rep;
        std::unique_ptr<pending_call> inner;
        std::optional<detail::params_buffer> saved_params;  // idempotent calls, for a retry
        clock_type::time_point started = clock_type::now();
        clock_type::time_point deadline = clock_type::time_point::max();
    };

    state(router& r, net::any_io_executor e, router_options opt)
        : self(r),
          ex(std::move(e)),
          o(std::move(opt)),
          queue(
              ex,
              [](std::chrono::milliseconds t) {
                  return "no replica had room within " + std::to_string(t.count()) + " ms";
              },
              "cancelled by the caller while waiting for a replica", [this] { update(); }) {
        o.max_concurrent = std::max<std::size_t>(1, o.max_concurrent);
        rename();
    }

    router& self;
    net::any_io_executor ex;
    router_options o;
    std::vector<std::shared_ptr<replica>> reps;            // in the order added
    std::vector<std::pair<std::uint64_t, replica*>> ring;  // sorted by hash
    detail::wait_queue queue;
    router_counters c;
    std::string name;
    std::string last_loss;  // why the last replica was lost, for "no live replica" errors
    std::function<void(const std::string&)> on_event;
    std::size_t cursor = 0;  // round robin and least-loaded ties
    double shadow_credit = 0;
    bool pump_posted = false;
    bool closed = false;
    // Replicas that left while their peer may be on the stack (lose() runs inside the peer's
    // close): owned here until the executor comes back to release them.
    std::vector<std::shared_ptr<replica>> retired;

    void update() { c.queued = queue.size(); }

    void event(const std::string& line) {
        if (on_event) on_event(line);
    }

    void rename() {
        name = "route:";
        for (std::size_t i = 0; i < reps.size(); ++i) name += (i ? "," : "") + reps[i]->url;
    }

    bool is_shadow(const replica& r) const {
        return !o.shadow_group.empty() && r.group == o.shadow_group;
    }
    bool has_room(const replica& r) const {
        return r.ph == phase::live && r.in_flight < o.max_concurrent;
    }
    // Replicas that may still serve ordinary calls, now or once connected.
    bool any_usable() const {
        return std::any_of(reps.begin(), reps.end(), [&](const auto& r) {
            return !is_shadow(*r) && (r->ph == phase::live || r->ph == phase::connecting);
        });
    }

    void rebuild_ring() {
        ring.clear();
        for (auto& r : reps) {
            if (r->ph != phase::live || is_shadow(*r)) continue;
            const auto points = std::max<std::size_t>(
                1, static_cast<std::size_t>(
                       std::llround(static_cast<double>(o.ring_points) * r->weight)));
            for (std::size_t i = 0; i < points; ++i)
                ring.emplace_back(hash_of(r->url + "#" + std::to_string(i)), r.get());
        }
        std::sort(ring.begin(), ring.end());
    }

    replica* owner_of(const std::string& key) const {
        if (ring.empty()) return nullptr;
        auto it = std::lower_bound(ring.begin(), ring.end(),
                                   std::make_pair(hash_of(key), static_cast<replica*>(nullptr)));
        return (it == ring.end() ? ring.front() : *it).second;
    }

    // The replica `call` goes to now, or null if it must wait.
    replica* pick(const detail::pending_call& call) {
        if (!call.options.key.empty()) {
            replica* r = owner_of(call.options.key);
            return r && has_room(*r) ? r : nullptr;
        }
        const std::size_t n = reps.size();
        replica* best = nullptr;
        std::size_t best_at = 0;
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
        for (std::size_t k = 0; k < n; ++k) {
            const std::size_t i = (cursor + k) % n;
            replica& r = *reps[i];
            if (is_shadow(r) || !has_room(r)) continue;
            if (o.policy == route_policy::round_robin) {
                best = &r;
                best_at = i;
                break;
            }
            if (!best || static_cast<double>(r.in_flight) / r.weight <
                             static_cast<double>(best->in_flight) / best->weight) {
                best = &r;
                best_at = i;
            }
        }
        if (best) cursor = best_at + 1;
        return best;
    }

    std::shared_ptr<replica> shared(replica* r) const {
        for (auto& p : reps)
            if (p.get() == r) return p;
        return nullptr;
    }

    void start_call(std::unique_ptr<detail::pending_call> call) {
        if (closed)
            return detail::fail_call(*call, errc::closed, "ordo: router " + name + " is closed");
        const bool retry = call->attempt > 0;
        if (!retry) ++c.calls;
        const auto timeout =
            call->options.timeout.count() > 0 ? call->options.timeout : o.peer.default_timeout;
        // Calls already waiting go first: a new call never overtakes them, even into room that
        // freed up before the queue was served (which keeps the order of a key across failover).
        if (queue.empty())
            if (replica* r = pick(*call)) return send(shared(r), std::move(call), timeout, retry);
        if (!any_usable()) return detail::fail_call(*call, errc::peer_lost, no_replica_reason());
        if (queue.size() >= o.max_queued_calls)
            return detail::fail_call(*call, errc::overloaded,
                                     "ordo: " + std::to_string(queue.size()) +
                                         " calls already wait for a replica of " + name +
                                         " (max_queued_calls)");
        queue.push(std::move(call), timeout);
        update();
        schedule_pump();
    }

    std::string no_replica_reason() const {
        return "no live replica in " + name +
               (last_loss.empty() ? "" : " (last lost: " + last_loss + ")");
    }

    void send(std::shared_ptr<replica> r, std::unique_ptr<detail::pending_call> call,
              std::chrono::milliseconds timeout, bool retry) {
        // A stream is neither shadowed nor tried again: its items may have reached the caller.
        if (!retry && o.shadow_fraction > 0 && !call->stream) {
            shadow_credit += o.shadow_fraction;
            if (shadow_credit >= 1) {
                shadow_credit -= 1;
                shadow(*call, timeout);
            }
        }
        auto rc = std::make_unique<routed_call>(self.weak_from_this(), r);
        if (!retry && !call->stream && o.idempotent_methods.count(call->method))
            rc->saved_params = call->params.copy();
        detail::move_call_fields(*call, *rc, timeout);
        if (timeout.count() > 0) rc->deadline = clock_type::now() + timeout;
        rc->inner = std::move(call);
        ++r->in_flight;
        r->conn->start_call(std::move(rc));
    }

    void shadow(const detail::pending_call& call, std::chrono::milliseconds timeout) {
        replica* best = nullptr;
        for (auto& r : reps)
            if (is_shadow(*r) && has_room(*r) && (!best || r->in_flight < best->in_flight))
                best = r.get();
        if (!best) {
            ++c.shadow_skipped;
            return;
        }
        auto sc = std::make_unique<routed_call>(self.weak_from_this(), shared(best));
        sc->method = call.method;
        sc->params = call.params.copy();
        sc->options.timeout = timeout;
        ++best->in_flight;
        ++best->shadow_calls;
        ++c.shadow_sent;
        best->conn->start_call(std::move(sc));
    }

    // A replica's call ended. Runs inside the replica's peer: what starts new calls is posted.
    void finished(routed_call& rc, std::error_code ec, call_outcome out) {
        replica& r = *rc.rep;
        --r.in_flight;
        if (!ec) {
            ++r.completed;
            r.latency.record(clock_type::now() - rc.started);
        } else {
            ++r.errors;
        }
        if (ec == errc::peer_lost && r.conn && !r.conn->is_open()) lose(r, out.detail);
        if (r.ph == phase::draining && r.in_flight == 0) r.conn->close();
        if (!rc.inner) {  // shadow
            ++(ec ? c.shadow_errors : c.shadow_ok);
        } else if (ec == errc::peer_lost && rc.saved_params) {
            // The caller's own call comes back for its second (and last) try.
            auto again = std::move(rc.inner);
            again->method = std::move(rc.method);
            again->params = std::move(*rc.saved_params);
            again->options = std::move(rc.options);
            again->options.timeout = detail::time_left(rc.deadline);
            again->slot = rc.slot;
            again->attempt = 1;
            ++c.retried;
            net::post(ex, [w = self.weak_from_this(), call = std::move(again)]() mutable {
                if (auto rt = w.lock())
                    rt->s_->start_call(std::move(call));
                else
                    detail::fail_call(*call, errc::closed, "ordo: the router was destroyed");
            });
        } else {
            if (ec) out.detail = "replica " + r.url + ": " + out.detail;
            rc.inner->complete(ec, std::move(out));
        }
        schedule_pump();
    }

    void schedule_pump() {
        if (pump_posted || queue.empty()) return;
        pump_posted = true;
        net::post(ex, [w = self.weak_from_this()] {
            if (auto rt = w.lock()) {
                rt->s_->pump_posted = false;
                rt->s_->pump();
            }
        });
    }

    // Sends waiting calls, oldest first, while some replica they may use has room.
    void pump() {
        if (!any_usable()) {
            queue.fail_all(errc::peer_lost, no_replica_reason());
            update();
            return;
        }
        while (auto t = queue.take_first(
                   [this](const detail::pending_call& call) { return peek(call) != nullptr; })) {
            replica* r = pick(*t->call);
            const bool retry = t->call->attempt > 0;
            send(shared(r), std::move(t->call), t->timeout, retry);
        }
        update();
    }

    // pick() without moving round-robin state.
    replica* peek(const detail::pending_call& call) const {
        if (!call.options.key.empty()) {
            replica* r = owner_of(call.options.key);
            return r && has_room(*r) ? r : nullptr;
        }
        for (auto& r : reps)
            if (!is_shadow(*r) && has_room(*r)) return r.get();
        return nullptr;
    }

    // The replica's connection ended (or is ending): it leaves the ring at once.
    void lose(replica& r, const std::string& why) {
        if (r.ph == phase::gone) return;
        const bool was_draining = r.ph == phase::draining;
        r.ph = phase::gone;
        // Its peer may be the caller, inside its own close: release it later, not here.
        if (retired.empty())
            net::post(ex, [w = self.weak_from_this()] {
                if (auto rt = w.lock()) rt->s_->retired.clear();
            });
        retired.push_back(shared(&r));
        std::erase_if(reps, [&](const auto& p) { return p.get() == &r; });
        rebuild_ring();
        rename();
        if (!was_draining) {
            ++c.replicas_lost;
            last_loss = r.url + ": " + why;
            event("replica " + r.url + " lost: " + why);
        }
        schedule_pump();  // waiting calls move to the next replica, or fail if none is left
    }

    net::awaitable<void> add(std::string url, double weight, std::string group) {
        if (closed) throw_error(errc::closed, "ordo: router " + name + " is closed");
        if (!(weight > 0))
            throw_error(errc::bad_address, "ordo: replica " + url + ": weight must be positive");
        for (auto& r : reps)
            if (r->url == url)
                throw_error(errc::bad_address, "ordo: replica " + url + " is already in " + name);
        auto r = std::make_shared<replica>();
        r->url = std::move(url);
        r->group = std::move(group);
        r->weight = weight;
        reps.push_back(r);
        rename();
        auto keep = self.shared_from_this();
        std::unique_ptr<transport> t;
        try {
            t = co_await detail::open_transport_within(r->url, o.connect_timeout, o.peer.transport);
        } catch (const std::system_error& e) {
            if (r->ph == phase::connecting) {  // not removed or closed meanwhile
                r->ph = phase::gone;
                std::erase(reps, r);
                rename();
                event("replica " + r->url + " not added: " + e.what());
                schedule_pump();  // waiting calls may have no replica left
            }
            throw;
        }
        if (r->ph != phase::connecting) co_return;  // removed or closed while connecting
        r->conn = detail::make_connected_peer(std::move(t), r->url, o.peer, nullptr);
        r->conn->start();
        detail::when_closed(
            *r->conn, ex, self.weak_from_this(),
            [this, wr = std::weak_ptr<replica>(r)](const std::error_code&, const std::string& why) {
                if (auto rep = wr.lock()) lose(*rep, why);
            });
        r->ph = phase::live;
        rebuild_ring();
        event("replica " + r->url + " added");
        pump();
    }

    bool remove(const std::string& url) {
        auto it =
            std::find_if(reps.begin(), reps.end(), [&](const auto& r) { return r->url == url; });
        if (it == reps.end()) return false;
        auto r = *it;
        const phase was = r->ph;
        r->ph = phase::draining;
        rebuild_ring();
        event("replica " + url + " removed");
        if (was == phase::connecting || !r->conn) {
            r->ph = phase::gone;
            std::erase(reps, r);
            rename();
        } else if (r->in_flight == 0) {
            r->conn->close();
        }
        schedule_pump();
        return true;
    }

    void notify(std::string_view method, std::string_view params) {
        if (closed) throw_error(errc::closed, "ordo: router " + name + " is closed");
        replica* best = nullptr;
        for (auto& r : reps)
            if (!is_shadow(*r) && r->ph == phase::live && (!best || r->in_flight < best->in_flight))
                best = r.get();
        if (!best)
            throw rpc_error(
                make_error_code(errc::peer_lost), {}, {},
                "ordo: notify " + std::string(method) + " failed: " + no_replica_reason());
        best->conn->notify_raw(method, params);
    }

    void close_all() {
        if (closed) return;
        closed = true;
        queue.fail_all(errc::closed, "ordo: router " + name + " closed");
        update();
        auto all = std::move(reps);
        reps.clear();
        ring.clear();
        for (auto& r : all) {
            r->ph = phase::gone;
            // Calls still pending on the peer hold their replica: dropping the replica's hold
            // on the peer leaves no cycle, even if the loop never runs again to fail them.
            if (auto conn = std::move(r->conn)) conn->abort();
        }
    }
};

router::router(private_tag, net::any_io_executor ex, router_options o)
    : s_(std::make_unique<state>(*this, std::move(ex), std::move(o))) {}

router::~router() {
    s_->close_all();
}

net::awaitable<void> router::async_add_replica(std::string url, double weight, std::string group) {
    return s_->add(std::move(url), weight, std::move(group));
}

net::awaitable<void> router::async_add_replica(std::string url) {
    return s_->add(std::move(url), 1.0, std::string());
}

void router::add_replica(std::string url, double weight) {
    // The function object (and with it the router) lives until the coroutine ends.
    net::co_spawn(
        s_->ex,
        [keep = shared_from_this(), url = std::move(url), weight]() mutable {
            return keep->s_->add(std::move(url), weight, std::string());
        },
        [](std::exception_ptr) {});  // a failure went to on_event
}

bool router::remove_replica(const std::string& url) {
    return s_->remove(url);
}

void router::on_event(std::function<void(const std::string&)> f) {
    s_->on_event = std::move(f);
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

void router::close() {
    s_->close_all();
}

const router_counters& router::counters() const noexcept {
    s_->update();
    return s_->c;
}

std::vector<replica_counters> router::replicas() const {
    std::vector<replica_counters> out;
    for (auto& r : s_->reps) {
        replica_counters rc;
        rc.url = r->url;
        rc.group = r->group;
        rc.weight = r->weight;
        rc.live = r->ph == state::phase::live;
        rc.in_flight = r->in_flight;
        rc.completed = r->completed;
        rc.errors = r->errors;
        rc.shadow_calls = r->shadow_calls;
        rc.latency = r->latency.summary();
        s_->queue.for_each([&](const detail::pending_call& call) {
            if (!call.options.key.empty() && s_->owner_of(call.options.key) == r.get()) ++rc.queued;
        });
        out.push_back(std::move(rc));
    }
    return out;
}

std::shared_ptr<router> make_router(net::any_io_executor ex) {
    return make_router(std::move(ex), router_options{});
}

std::shared_ptr<router> make_router(net::any_io_executor ex, router_options o) {
    return std::make_shared<router>(router::private_tag{}, std::move(ex), std::move(o));
}

}  // namespace ordo
