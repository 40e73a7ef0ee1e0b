// Where a router's calls go: the policy (round robin, weighted, least loaded with its aperture),
// the hash ring that owns each key, and the key-order guard. It reads the router's member list
// and the replicas' phases and loads, and changes only its own state: the ring, the aperture's
// order, the cursors, the keys in flight, and each replica's seat and weighted-round-robin
// credit. Membership tells it who came and went.
#pragma once

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ordo/rpc/detail/pending_call.hpp"
#include "rpc/channels/aperture.hpp"
#include "rpc/channels/replica.hpp"

namespace ordo::detail {

class placement {
  public:
    using members = std::vector<std::shared_ptr<replica>>;
    // Beyond this many replicas, least_loaded compares two drawn at random instead of all.
    static constexpr std::size_t many_replicas = 16;

    /// Reads `m` (the router's replicas, in the order added) for as long as it lives. The
    /// aperture asks `h`.
    placement(const members& m, const router_options& o, aperture::host& h);

    // Who came and went (membership).
    /// A new replica: its points, and a random place in the aperture's order (so that routers
    /// spread their apertures over a fleet).
    void admit(replica& r);
    /// `r`'s weight changed: its points are computed again (refresh() puts them on).
    void reweigh(replica& r);
    /// `r` leaves for good: off the ring and out of the order.
    void forget(replica& r);
    /// Brings the ring in line with who takes calls now.
    void refresh();
    void clear();

    // Calls.
    /// The replica `call` goes to now (moving round-robin state), or null if it must wait.
    replica* pick(const pending_call& call);
    /// pick() without moving round-robin state.
    replica* peek(const pending_call& call) const;
    /// The replica whose arc of the ring holds `key`, whether it has room or not.
    replica* owner_of(const std::string& key) const;
    /// A key's call may go to `to` unless calls of that key are still in flight elsewhere.
    bool key_may_go(const std::string& key, const replica* to) const {
        auto it = keys_.find(key);
        return it == keys_.end() || it->second.at == to;
    }
    void key_sent(const std::string& key, replica& to) {
        key_flight& k = keys_[key];
        k.at = &to;
        ++k.calls;
    }
    void key_ended(const std::string& key) {
        auto it = keys_.find(key);
        if (it != keys_.end() && --it->second.calls == 0) keys_.erase(it);
    }
    bool has_room(const replica& r) const {
        return r.takes_calls() && r.in_flight < max_concurrent_;
    }
    /// Replicas that take calls without a key now (shadows not counted).
    std::size_t usable() const;

    // Overload (router_options::overload_cooldown).
    /// `r` answered errc::overloaded: until `until` it gets a quarter of its share of calls
    /// without a key (least loaded: as if its weight were a quarter and one more call were in
    /// flight; weighted: a quarter of its weight; round robin: one turn in four).
    void cool(replica& r, replica::clock_type::time_point until);
    /// The replica with room, other than `not_this` and none cooling, that a refused call moves
    /// to: the least loaded per unit of weight. Null if there is none.
    replica* elsewhere(const replica& not_this);

    // least_loaded's aperture.
    bool aperture_on() const noexcept { return aperture_on_; }
    /// What a call sent now carries for the aperture (aperture::tag()).
    std::uint8_t tag() const noexcept { return ap_.tag(); }
    void answered(std::uint8_t tag, aperture::clock_type::time_point sent,
                  aperture::clock_type::time_point arrived) {
        ap_.answered(tag, sent, arrived);
    }
    /// The aperture's size for router_counters (every usable replica when it is off).
    std::size_t aperture_size() const {
        return std::min(aperture_on_ ? ap_.chosen() : aperture::all, usable());
    }
    std::uint64_t aperture_trials() const noexcept { return ap_.trials(); }
    std::uint64_t aperture_changes() const noexcept { return ap_.changes(); }

  private:
    struct key_flight {  // a key's calls in flight, and where
        replica* at = nullptr;
        std::size_t calls = 0;
    };
    replica* least_loaded();
    // Ends the cooling of replicas whose time is up (only while some replica cools: the clock
    // is read then, and only then).
    void thaw_if_due() {
        if (next_thaw_ != replica::clock_type::time_point{}) [[unlikely]]
            thaw();
    }
    void thaw();

    const members& reps_;
    route_policy policy_;
    std::size_t max_concurrent_;
    std::size_t ring_points_;
    bool aperture_on_;
    std::vector<std::pair<std::uint64_t, replica*>> ring_;  // sorted by hash
    // Every replica, each put at a random place as it is admitted. Calls without a key go to
    // the first aperture size of those that take calls, while one of them has room.
    std::vector<replica*> order_;
    aperture ap_;
    std::unordered_map<std::string, key_flight> keys_;
    std::size_t cursor_ = 0;  // round robin and least-loaded ties
    replica::clock_type::time_point next_thaw_{};  // the soonest cool_until; {} if none cools
    std::minstd_rand rng_{std::random_device{}()};
};

// Fewest calls in flight per unit of weight among the aperture's replicas with room (ties: the
// first from the cursor on), else among the rest.
[[gnu::always_inline]] inline replica* placement::least_loaded() {
    const std::size_t n = order_.size();
    const std::size_t span = aperture_on_ ? ap_.size() : aperture::all;
    if (n > many_replicas && span > many_replicas) {
        // Many replicas: the less loaded of two drawn at random (the power of two choices, as
        // Envoy's least-request), so that a call costs the same at 1,000 replicas as at 20.
        // Only when neither draw finds room does the full scan below run. (The draws are among
        // the aperture's first places, a few of which may not take calls.)
        const std::size_t within = std::min(span, n);
        auto draw = [&]() -> replica* {
            for (int t = 0; t < 4; ++t) {
                replica& r =
                    *order_[std::uniform_int_distribution<std::size_t>(0, within - 1)(rng_)];
                if (!r.shadow && has_room(r)) return &r;
            }
            return nullptr;
        };
        replica* a = draw();
        replica* b = draw();
        auto load = [](const replica* r) {
            return (static_cast<double>(r->in_flight) + (r->cooling() ? 1 : 0)) /
                   (r->weight * r->damp);
        };
        if (a && b) return load(a) <= load(b) ? a : b;
        if (a || b) return a ? a : b;
    }
    replica* best = nullptr;
    std::size_t best_at = 0, seen = 0;
    // Ties go in turn: to the first from the cursor on.
    auto turn = [&](std::size_t i) { return i >= cursor_ ? i - cursor_ : i + n - cursor_; };
    for (std::size_t i = 0; i < n; ++i) {
        replica& r = *order_[i];
        if (r.shadow || !r.takes_calls()) continue;
        if (seen++ >= span && best) break;  // the aperture had room
        if (r.in_flight >= max_concurrent_) continue;
        if (best) {
            // in_flight / weight, compared by cross-multiplying (weights are positive): no
            // division per replica, as this runs once per call. A cooling replica counts one
            // call more, at a quarter of its weight (damp is 1 otherwise).
            const double mine = (static_cast<double>(r.in_flight) + (r.cooling() ? 1 : 0)) *
                                best->weight * best->damp;
            const double theirs =
                (static_cast<double>(best->in_flight) + (best->cooling() ? 1 : 0)) * r.weight *
                r.damp;
            if (mine > theirs || (mine == theirs && turn(i) > turn(best_at))) continue;
        }
        best = &r;
        best_at = i;
    }
    if (best) cursor_ = best_at + 1;
    return best;
}

[[gnu::always_inline]] inline replica* placement::pick(const pending_call& call) {
    if (!call.options.key.empty()) {
        replica* r = owner_of(call.options.key);
        return r && has_room(*r) && key_may_go(call.options.key, r) ? r : nullptr;
    }
    thaw_if_due();
    const std::size_t n = reps_.size();
    replica* best = nullptr;
    if (policy_ == route_policy::weighted) {
        double total = 0;
        for (auto& r : reps_)
            if (!r->shadow && has_room(*r)) {
                const double w = r->weight * r->damp;
                total += w;
                r->current += w;
                if (!best || r->current > best->current) best = r.get();
            }
        if (best) best->current -= total;
        return best;
    }
    if (policy_ == route_policy::least_loaded) return least_loaded();
    // round_robin: from the cursor on, wrapping. A cooling replica lets three turns in four
    // pass, unless no other replica has room.
    std::size_t i = cursor_ < n ? cursor_ : 0;
    replica* passed = nullptr;
    for (std::size_t k = 0; k < n; ++k, i = i + 1 == n ? 0 : i + 1) {
        replica& r = *reps_[i];
        if (r.shadow || !has_room(r)) continue;
        if (r.cooling() && (r.cool_turns++ & 3) != 0) [[unlikely]] {
            passed = passed ? passed : &r;
            continue;
        }
        cursor_ = i + 1;
        return &r;
    }
    return passed;
}

}  // namespace ordo::detail
