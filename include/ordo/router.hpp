// ordo::router: one channel over several replicas of a service (DESIGN.md section 9b).
#pragma once

#include "ordo/config.hpp"

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "ordo/channel.hpp"
#include "ordo/peer.hpp"

namespace ordo {

/// How a call without a key picks its replica among those with room (keyed calls always go to
/// their key's replica on the hash ring).
enum class route_policy {
    least_loaded,  ///< fewest calls in flight per unit of weight (ties: in turn)
    round_robin,   ///< in turn
    weighted,      ///< in proportion to the replicas' weights (smooth weighted round robin)
};

struct router_options {
    /// Calls in flight on one replica at most.
    std::size_t max_concurrent = 8;
    /// Calls waiting when no replica they may use has room (one FIFO for the router). One more
    /// fails at once with errc::overloaded. A waiting call's deadline runs while it waits.
    std::size_t max_queued_calls = 65'536;
    route_policy policy = route_policy::least_loaded;
    /// Methods that are safe to run twice: a call in flight on a replica that dies is retried
    /// once on another replica instead of failing with errc::peer_lost.
    std::set<std::string> idempotent_methods{};
    /// Replicas of this group get only shadow traffic: `shadow_fraction` of the calls (0..1) is
    /// also sent to the least loaded replica of the group that has room (or not at all, when
    /// none has). Shadow results and errors are counted, never returned to callers.
    std::string shadow_group{};
    double shadow_fraction = 0;
    /// Points on the hash ring per unit of replica weight (at least one per replica).
    std::size_t ring_points = 64;
    /// Opening one replica's connection may take this long.
    std::chrono::milliseconds connect_timeout{10'000};
    /// For each replica's connection (an ordered ordo::peer): liveness, default deadline, TLS...
    peer_options peer{};
};

/// Latency percentiles from a fixed-size histogram (about 10% resolution).
struct latency_summary {
    std::uint64_t count = 0;
    std::chrono::microseconds p50{0}, p90{0}, p99{0}, max{0};
};

struct replica_counters {
    std::string url;
    std::string group;
    double weight = 1;
    bool live = false;           ///< connected and taking calls
    std::size_t in_flight = 0;   ///< calls sent and not yet answered
    std::size_t queued = 0;      ///< keyed calls waiting for this replica's room
    std::uint64_t completed = 0;  ///< calls answered with a result
    std::uint64_t errors = 0;     ///< calls that failed here (any reason)
    std::uint64_t shadow_calls = 0;
    latency_summary latency;      ///< of calls answered here, from send to response
};

struct router_counters {
    std::size_t queued = 0;  ///< calls waiting for room
    std::uint64_t calls = 0;
    std::uint64_t retried = 0;         ///< idempotent calls re-sent after their replica died
    std::uint64_t replicas_lost = 0;
    std::uint64_t shadow_sent = 0;
    std::uint64_t shadow_ok = 0;
    std::uint64_t shadow_errors = 0;
    std::uint64_t shadow_skipped = 0;  ///< due, but no shadow replica had room
};

/// One channel over several replicas. Each replica is reached over its own ordered connection
/// (an ordo::peer) with at most max_concurrent calls in flight; calls that find no room wait in
/// one bounded FIFO and are sent as room frees up, oldest first.
///
/// Order: calls with one key (call_options::key, `ordo::key("user-42")`) go to one replica,
/// chosen by a consistent hash of the key, and wait for it in the order made, so they reach the
/// server in that order, while calls with other keys run in parallel elsewhere. Order per key
/// holds only while the key's replica lives: when it dies or is removed, its keys move to the
/// next replica on the ring. Calls without a key, and notifications, have no order between
/// replicas.
///
/// Failure: a replica whose connection ends (crash, reset, liveness timeout: DESIGN.md section
/// 7) leaves the ring at once; calls waiting for it move to the next replica; its calls in
/// flight fail with errc::peer_lost, except those of idempotent methods, which are sent once
/// more to another replica. A lost replica is not reconnected: add it again when it is back.
/// With no replica left, waiting and later calls fail at once with errc::peer_lost.
///
/// Errors name the replica: `... failed: peer lost (replica tcp://10.0.0.2:7000: ...)`.
///
/// Belongs to the executor given at creation (a strand, if the io_context runs on several
/// threads); every member must be called there. Created shared (make_router); channels keep it
/// alive.
class router final : public channel_impl, public std::enable_shared_from_this<router> {
  public:
    struct private_tag {};
    router(private_tag, net::any_io_executor ex, router_options o);
    ~router() override;
    router(const router&) = delete;
    router& operator=(const router&) = delete;

    /// Connects to `url` and adds it as a replica of `group` ("" by default) with `weight`
    /// (> 0; its share under route_policy::weighted, its capacity share under least_loaded and
    /// its share of the hash ring). Completes when the replica takes calls; throws
    /// std::system_error naming the URL if it cannot be reached. A URL already present throws
    /// errc::bad_address.
    net::awaitable<void> async_add_replica(std::string url, double weight, std::string group);
    net::awaitable<void> async_add_replica(std::string url);
    /// The same without waiting: calls may wait for the replica while it connects; a failure
    /// is reported to `on_event` and the replica is dropped.
    void add_replica(std::string url, double weight = 1.0);
    /// Stops sending calls to `url`; calls in flight there complete, then its connection is
    /// closed. Its keys move to the next replica at once. Returns false if there is no such
    /// replica.
    bool remove_replica(const std::string& url);
    /// Called (on the router's executor) with a line for each replica added, removed, lost or
    /// failing to connect.
    void on_event(std::function<void(const std::string&)> f);

    void start_call(std::unique_ptr<detail::pending_call> call) override;
    /// Sends a one-way message to one replica (least loaded); unordered between replicas.
    void notify_raw(std::string_view method, std::string_view params) override;
    /// "route:" and the replicas' URLs, e.g. "route:tcp://h1:7000,tcp://h2:7000".
    const std::string& remote_address() const noexcept override;
    net::any_io_executor get_executor() const override;

    /// Closes every replica's connection; calls in flight and waiting fail with errc::closed.
    void close();

    const router_counters& counters() const noexcept;
    /// One entry per replica (live, connecting or draining after remove_replica).
    std::vector<replica_counters> replicas() const;

    struct state;

  private:
    std::unique_ptr<state> s_;
};

std::shared_ptr<router> make_router(net::any_io_executor ex, router_options o);
std::shared_ptr<router> make_router(net::any_io_executor ex);

/// A router as a URL describes it.
struct route_spec {
    struct replica {
        std::string url;
        double weight = 1;
        std::string group;
    };
    router_options options;
    std::vector<replica> replicas;
};

/// Parses `route+SCHEME://a,b,...?params` (e.g.
/// `route+tcp://h1:7000,h2:7000?max_concurrent=8&policy=least_loaded`): each replica is
/// `SCHEME://item` plus the URL's transport parameters (cert, key, ca, ...). Router
/// parameters: max_concurrent, max_queued, policy (least_loaded, round_robin, weighted),
/// weights (one per replica, comma-separated), idempotent (comma-separated method names),
/// shadow (comma-separated replica items, put in group "shadow") with shadow_fraction,
/// connect_timeout_ms; and the peer parameters timeout_ms, interval_ms, liveness_timeout_ms,
/// heartbeat_ms, applied on top of `base`. Throws std::system_error (errc::bad_address) naming
/// what is wrong.
route_spec parse_route_url(std::string_view url, peer_options base);

}  // namespace ordo
