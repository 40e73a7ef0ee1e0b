// What a server has served, by method and in total: read in-process (server::stats), over the
// wire (the reserved method ordo.stats, `ordo stats URL`) and by the Prometheus exporter
// (ordo/metrics/prometheus.hpp).
#pragma once

#include "ordo/config.hpp"

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ordo/error.hpp"
#include "ordo/rpc/batch_handler.hpp"
#include "ordo/rpc/concurrency.hpp"

namespace ordo {

/// Upper bounds, in seconds, of the handler latency histogram's buckets (the last bucket, not
/// listed, holds everything slower).
inline constexpr std::array<double, 16> latency_bounds{
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
    0.025,   0.05,   0.1,     0.25,   0.5,   1.0,    2.5,   10.0};

/// Outcome codes counted per method: 0 is success, the rest are ordo::errc values (an error
/// with a code ordo does not know counts as errc::remote_error).
inline constexpr std::size_t outcome_count = 16;

/// One method's counters (a snapshot).
struct method_stats {
    std::string name;
    /// Requests answered, by outcome: [0] succeeded, [int(errc)] failed with that code.
    std::array<std::uint64_t, outcome_count> requests{};
    std::uint64_t notifications = 0;        ///< notifications handled
    std::uint64_t notification_errors = 0;  ///< of which the handler threw
    /// Handler latency of requests and notifications (from dispatch to the response queued
    /// for output; a cancelled or orphaned request counts too), kept only while
    /// handlers::time_calls is on. buckets[i] counts calls at most latency_bounds[i] (not
    /// cumulative); buckets.back() the slower ones.
    std::array<std::uint64_t, latency_bounds.size() + 1> latency_buckets{};
    std::uint64_t latency_count = 0;
    double latency_sum_seconds = 0;
    /// Its concurrency limit (handler_options::concurrency; what none: none).
    concurrency_stats concurrency;

    std::uint64_t requests_total() const noexcept {
        std::uint64_t n = 0;
        for (auto v : requests) n += v;
        return n;
    }
};

/// A batch handler's counters (a snapshot of batch_handle::stats()).
struct batch_handler_stats {
    std::string name;
    batch_stats stats;
};

/// A server's counters (server::stats()).
/// A router that a server shows in ordo.stats (server::show_router): its counts and where each
/// replica stands.
struct router_view {
    struct replica {
        std::string url;
        std::string state;  ///< connecting, ready, reconnecting, ejected, draining
        std::size_t in_flight = 0;
        std::uint64_t completed = 0, errors = 0;
        std::string last_error;  ///< why it last lost or failed to open its connection
    };
    std::string name;
    std::uint64_t calls = 0, replicas_lost = 0, reconnects = 0, ejections = 0, drains = 0,
                  source_problems = 0;
    std::uint64_t retried = 0, moved = 0, over_budget = 0, hedged = 0;  ///< router_counters'

    std::size_t queued = 0;
    std::vector<replica> replicas;
};

struct server_stats {
    std::size_t connections = 0;             ///< open now
    std::uint64_t connections_accepted = 0;  ///< since construction (refused ones included)
    std::uint64_t connections_refused = 0;   ///< beyond max_connections or out of descriptors
    std::uint64_t bytes_received = 0;        ///< over every connection, closed ones included
    std::uint64_t bytes_sent = 0;
    std::size_t queued_messages = 0;   ///< waiting for a serial handler, now
    std::size_t running_handlers = 0;  ///< now
    std::size_t detached_sessions = 0;
    /// Resumes whose connection arrived on another loop than its session's and moved there
    /// (server_options::threads > 1), since construction.
    std::uint64_t sessions_moved = 0;
    /// Connections still open when a drain's grace passed (server::async_drain), closed by
    /// the server rather than by their peers, since construction.
    std::uint64_t connections_closed_by_grace = 0;
    std::size_t memory_used = 0;              ///< charged to the memory budget
    std::size_t memory_budget = 0;            ///< its limit (0: none)
    std::uint64_t unknown_requests = 0;       ///< requests for a method with no handler
    std::uint64_t unknown_notifications = 0;  ///< notifications for a method with no handler
    /// The limit on calls running at once over all methods (server_options::concurrency;
    /// what none: none).
    concurrency_stats concurrency;
    std::vector<method_stats> methods;  ///< in name order
    std::vector<batch_handler_stats> batches;
    std::vector<router_view> routers;  ///< shown with server::show_router (ordo.stats only)
};

namespace detail {

/// A counter that threads may bump at once (relaxed: a figure, not a synchronisation), and that
/// copies by value, so that what holds it (ordo::handlers) stays copyable and movable.
class relaxed_counter {
  public:
    relaxed_counter() = default;
    relaxed_counter(const relaxed_counter& o) noexcept : v_(o.get()) {}
    relaxed_counter& operator=(const relaxed_counter& o) noexcept {
        set(o.get());
        return *this;
    }
    void add(std::uint64_t n) noexcept { v_.fetch_add(n, std::memory_order_relaxed); }
    void set(std::uint64_t n) noexcept { v_.store(n, std::memory_order_relaxed); }
    std::uint64_t get() const noexcept { return v_.load(std::memory_order_relaxed); }

  private:
    std::atomic<std::uint64_t> v_{0};
};

/// The live counters behind method_stats, one per registered name (kept when the name is
/// registered again). Atomic: the same handler may run on several threads.
class method_counters {
  public:
    void request_done(errc code) noexcept {
        requests_[index(code)].fetch_add(1, std::memory_order_relaxed);
    }
    void request_done() noexcept { requests_[0].fetch_add(1, std::memory_order_relaxed); }
    void notification_done(bool failed) noexcept {
        notifications_.fetch_add(1, std::memory_order_relaxed);
        if (failed) notification_errors_.fetch_add(1, std::memory_order_relaxed);
    }
    void took(std::chrono::steady_clock::duration d) noexcept;
    method_stats snapshot(std::string name) const;

  private:
    static std::size_t index(errc code) noexcept {
        const auto i = static_cast<std::size_t>(code);
        return i > 0 && i < outcome_count ? i : static_cast<std::size_t>(errc::remote_error);
    }
    std::array<std::atomic<std::uint64_t>, outcome_count> requests_{};
    std::atomic<std::uint64_t> notifications_{0}, notification_errors_{0};
    std::array<std::atomic<std::uint64_t>, latency_bounds.size() + 1> buckets_{};
    std::atomic<std::uint64_t> latency_count_{0}, latency_ns_{0};
};

}  // namespace detail
}  // namespace ordo
