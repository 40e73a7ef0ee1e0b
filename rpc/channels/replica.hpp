// One of a router's replicas: the record its three parts share. Membership (router_members.cpp)
// admits it, connects it, ejects and drains it; placement (placement.hpp) puts it on the hash
// ring and in the aperture's order, and picks it for calls; accounting (accounting.hpp) books
// its calls' outcomes.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ordo/rpc/router.hpp"
#include "rpc/channels/histogram.hpp"

namespace ordo::detail {

class placement;

/// Where a replica stands with its router.
enum class replica_phase { connecting, live, reconnecting, draining, gone };

/// A replica's places on the hash ring. Only placement reads or writes it.
class ring_seat {
    friend class placement;
    std::vector<std::uint64_t> points_;  // its hashes, sorted
    bool in_ring_ = false;               // its points are on the ring now
    bool replaced_ = false;              // its points changed: take the old ones off
};

struct replica : std::enable_shared_from_this<replica> {
    using clock_type = std::chrono::steady_clock;

    // Who it is (membership).
    std::string url, group;
    double weight = 1;
    bool shadow = false;     // in router_options::shadow_group: gets copies of calls only
    bool member = true;      // false once removed: it drains, then leaves
    bool goaway = false;     // draining because its server is going away
    bool unwell = false;     // its server says it is not serving (ordo.health_watch)
    std::size_t source = 0;  // 0: the URL or add_replica; else the router's source number
    replica_phase ph = replica_phase::connecting;
    std::shared_ptr<peer> conn;
    // The router's state while the router lives (null once its destruction began): a call's
    // end reaches the router through its replica, without a weak_ptr to lock per call.
    std::shared_ptr<router::state*> owner;
    std::uint64_t gen = 0;  // which connection: calls of an earlier one are not its news
    std::function<void()> stop_health;  // cancels the connection's ordo.health_watch, if any

    // Reconnection and ejection (membership).
    unsigned attempts = 0;  // failed connection attempts since the last success
    std::unique_ptr<net::steady_timer> retry_timer;  // the next attempt
    std::unique_ptr<net::steady_timer> eject_timer;  // the ejection's end
    std::size_t failures_in_a_row = 0;
    std::uint64_t streak = 0;                // ejections without a long stay in between
    clock_type::time_point ejected_until{};  // set while ejected ({} otherwise)
    clock_type::time_point last_ejected_end{};

    // Where it stands for calls: placement's (seat, current), and the calls in flight on it,
    // which the router counts as it sends and as they end.
    ring_seat seat;
    double current = 0;  // smooth weighted round robin
    std::size_t in_flight = 0;
    // Cooling after an errc::overloaded answer (router_options::overload_cooldown): until
    // cool_until, placement gives it `damp` of its share of calls. Only placement changes them.
    clock_type::time_point cool_until{};
    double damp = 1;
    unsigned cool_turns = 0;  // round robin: turns it let pass while cooling

    // What its calls did (accounting: completed, errors, latency), and what membership counts
    // (connects, ejections, the last error of a connection or a call).
    std::uint64_t completed = 0, errors = 0, shadow_calls = 0, connects = 0, ejections = 0,
                  overloaded = 0;
    histogram latency;
    std::string last_error;

    /// Ejected now. (The clock is read only while an ejection is on: pick() asks every replica.)
    bool ejected() const {
        return ejected_until != clock_type::time_point{} && ejected_until > clock_type::now();
    }
    bool cooling() const { return damp < 1; }
    /// Connected, neither draining, ejected nor said by its server not to be serving.
    bool takes_calls() const { return ph == replica_phase::live && !unwell && !ejected(); }
};

}  // namespace ordo::detail
