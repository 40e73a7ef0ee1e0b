// ordo::router: one channel over several replicas of a service (docs/protocol.md, "Router
// guarantees").
#pragma once

#include "ordo/config.hpp"

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "ordo/rpc/channel.hpp"
#include "ordo/fleet/sources.hpp"
#include "ordo/rpc/peer.hpp"
#include "ordo/rpc/stats.hpp"

namespace ordo {

/// How a call without a key picks its replica among those with room (keyed calls always go to
/// their key's replica on the hash ring).
enum class route_policy {
    least_loaded,  ///< fewest calls in flight per unit of weight (ties: in turn); beyond 16
                   ///< replicas, the less loaded of two drawn at random (power of two choices);
                   ///< within the aperture (router_options::aperture)
    round_robin,   ///< in turn
    weighted,      ///< in proportion to the replicas' weights (smooth weighted round robin)
};

/// The order in which calls waiting for a replica with room are sent.
enum class queue_order {
    /// Earliest deadline first: calls with a deadline, soonest first, then calls without one,
    /// oldest first. Keyed calls keep their order: a key's turn comes at the earliest deadline
    /// among its waiting calls, and its oldest waiting call is the one sent.
    earliest_deadline,
    fifo,  ///< oldest first, deadline or not (for comparison: `queue=fifo` in a route+ URL)
};

/// When a router hedges a call (router_options::hedge): after a fixed delay, or after its method's
/// recent 95th percentile of send-to-answer time.
struct hedge_policy {
    /// The delay; with p95, the least delay. 0 without p95: no hedging.
    std::chrono::milliseconds after{0};
    /// After the method's recent 95th percentile (of its last 1,000 to 2,000 answers, at least
    /// `after`); until 100 answers are known, after `after` alone (none if it is 0).
    bool p95 = false;
    bool on() const noexcept { return after.count() > 0 || p95; }
};

struct router_options {
    /// Calls in flight on one replica at most. An ordered connection pipelines calls cheaply,
    /// so this is a bound on what piles up on one replica, not a parallelism setting: the
    /// default is Envoy's circuit-breaker default for requests to a cluster (1024). A small
    /// bound makes calls wait in the router's queue and go out a few per completion
    /// (docs/design.md, 5.7).
    std::size_t max_concurrent = 1024;
    /// Calls waiting when no replica they may use has room (one queue for the router, in
    /// `queue` order). One more fails at once with errc::overloaded. A waiting call's deadline
    /// runs while it waits: one that passes there fails with errc::timed_out and is never sent
    /// (router_counters::expired_in_queue); so does one that, when its turn comes, has less of
    /// its deadline left than twice what calls of its method have recently taken from send to
    /// response (a moving average): it would time out on the replica, in the room of a call
    /// that could finish.
    std::size_t max_queued_calls = 65'536;
    queue_order queue = queue_order::earliest_deadline;
    /// The queue is shared among callers (call_options::caller): as room frees up, the next
    /// call is the waiting caller's with the fewest calls in flight for its weight (its
    /// `queue` order within it), and a call that finds the queue full pushes out the newest
    /// call of the caller furthest over its share (in flight and waiting, for its weight)
    /// instead, unless that is its own caller. Weights by caller; any other weighs 1. Calls
    /// without a caller are one caller, "".
    std::map<std::string, unsigned> caller_weights{};
    route_policy policy = route_policy::least_loaded;
    /// least_loaded only: an adaptive aperture (as Finagle's). Calls without a key go to the
    /// least loaded of the first N replicas in an order of the router's own, chosen at random;
    /// replicas beyond them get calls only when those N have no room. N starts at every
    /// replica. Every so often the router tries one replica fewer or one more, in a trial of
    /// eight slots that take turns between the two sizes (old, new, new, old; twice), each
    /// four times the calls' recent mean time and at least 5 ms long, with at least 16
    /// answers. Each call counts for the slot it was sent in. It keeps the new size
    /// only if the calls sent at it took less time, send to response, on average than those
    /// sent at the old size in each of the four pairs of slots, and 10% less in the whole. A
    /// change that does not pay waits twice as long (in spells of 20 ms and at least 64
    /// answered calls, up to 64 spells) before it is tried again, unless calls become three
    /// times as fast or as slow meanwhile (the load changed). So calls spread over every
    /// replica unless spreading measurably slows them, as for replicas that share a machine's
    /// CPU, where each connection costs its own wake-ups and writes. false: always every
    /// replica. (URL: `aperture=adaptive` or `aperture=all`.)
    bool aperture = true;
    /// Methods that are safe to run twice: a call in flight on a replica that dies is retried
    /// once on another replica instead of failing with errc::peer_lost (within the retry
    /// budget).
    std::set<std::string> idempotent_methods{};

    /// Health (docs/protocol.md, "Health"): each replica's connection watches its server's
    /// state with ordo.health_watch. A replica whose server says `not_serving` or `draining`
    /// gets no new calls (its calls in flight finish) until it says `serving` again, so a drain
    /// or a handler's set_health moves calls away before any fails there. A server that does
    /// not know ordo.health_watch (a foreign one, an older ordo) is taken as serving. (URL:
    /// `health=watch`, the default, or `health=off`.)
    bool watch_health = true;
    /// Where the route's credentials go (peer.credentials, the URL's token_file=; docs/security.md
    /// "Tokens and routes"). Replicas the route's author named (the URL's list, route+dns's own
    /// name, add_replica) always get them. Replicas a file or etcd names (route+file://,
    /// route+etcd://, follow() of such a source) get them only when their host, or host:port,
    /// is one of these, or when they are tls:// with ca= (the certificate then proves the
    /// name); the others are connected without credentials, and told of with an event, so that
    /// whoever can write a replica file cannot collect the token with a listener of their own.
    /// (URL: `token_hosts=H1,H2:PORT,...`.)
    std::vector<std::string> token_hosts{};

    /// Hedged calls (as brpc's backup requests and gRPC's hedging policy), for idempotent
    /// methods only (`idempotent_methods`), never for keyed calls (their order) or streams: a
    /// call still unanswered after its delay goes once more, to another replica with room; the
    /// first answer completes it and the other copy is cancelled (ordo.cancel). An error waits
    /// for the other copy's answer. The second copy draws on the retry budget.
    /// `hedge_methods` sets a method's own policy over `hedge`. (URL: `hedge_after_ms=N`,
    /// `hedge_after=p95`; per method `hedge=METHOD:N` or `METHOD:p95`, comma-separated.)
    hedge_policy hedge{};
    std::map<std::string, hedge_policy> hedge_methods{};

    /// Overload (docs/design.md 5.12). A replica that answers errc::overloaded refused the call
    /// before doing any of it, so the call, idempotent or not, moves to another replica that
    /// has room and has not refused calls lately, within its deadline and the retry budget, at
    /// most twice. Keyed calls (their order) and streams do not move: they fail with the
    /// replica's answer, as a call does when no replica can take it. The replica is never ejected
    /// for it: it gets a quarter of its share of calls for the time its server asked callers
    /// to wait (rpc_error::retry_after), and at least this long.
    std::chrono::milliseconds overload_cooldown{100};
    /// The retry budget (as Finagle's and Linkerd's): second tries of idempotent calls, moves
    /// of refused ones and hedges together add at most `retry_budget_percent` of the calls made,
    /// plus
    /// `min_retries_per_s` a second (and at most ten seconds' worth saved up). A try the budget
    /// has no room for is not made: the call fails with its original error
    /// (router_counters::over_budget). A negative percentage turns the budget off.
    double retry_budget_percent = 20;
    double min_retries_per_s = 10;
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

    /// Reconnection. A member whose connection ends (or cannot be opened) stays a member and
    /// connects again after `reconnect_initial`, then after each failure `reconnect_multiplier`
    /// times longer, up to `reconnect_max`; each delay is drawn within +-`reconnect_jitter` of
    /// its value. A connection that comes up starts the sequence over. (gRPC's defaults are 1 s,
    /// x1.6, 20%, 120 s: these are shorter, so that a replica restarted in place takes calls
    /// again within a second or two of listening.)
    std::chrono::milliseconds reconnect_initial{100};
    double reconnect_multiplier = 1.6;
    double reconnect_jitter = 0.2;
    std::chrono::milliseconds reconnect_max{5'000};

    /// Outlier ejection (as Envoy's): a replica whose last `eject_after` calls all failed (a
    /// handler error, a deadline or shutting down: not a caller's cancellation or bad arguments,
    /// nor errc::overloaded, which only sends it fewer calls for a while) takes no calls for
    /// `eject_base` times the number of its ejections in a row, at most `eject_max`, while its
    /// connection stays open. At most `max_ejected_percent` of the members (rounded down: never the
    /// only one) are ejected at once. 0 turns it off.
    std::size_t eject_after = 5;
    std::chrono::milliseconds eject_base{10'000};
    std::chrono::milliseconds eject_max{300'000};
    std::size_t max_ejected_percent = 50;

    /// A call that finds no replica able to take it (every member lost, draining or ejected, or
    /// none listed yet) waits this long for one, within its own deadline, instead of failing at
    /// once with errc::peer_lost (gRPC's wait_for_ready). 0: fail at once.
    std::chrono::milliseconds wait_for_replica{0};
};

/// Where a replica stands (replica_counters::state).
enum class replica_state {
    connecting,    ///< opening its first connection; calls may wait for it
    ready,         ///< connected and taking calls
    reconnecting,  ///< its connection ended or could not be opened: backing off, then again
    ejected,       ///< connected, but out of the ring for a while after failing every call
    draining,      ///< no new calls; those in flight finish (removed, or its server is going away)
    not_serving,   ///< connected, but its server says it is not serving (ordo.health_watch):
                   ///< no new calls until it says it is again
};
/// "connecting", "ready", "reconnecting", "ejected", "draining", "not_serving".
const char* to_string(replica_state s) noexcept;

/// Latency percentiles from a fixed-size histogram (about 10% resolution).
struct latency_summary {
    std::uint64_t count = 0;
    std::chrono::microseconds p50{0}, p90{0}, p99{0}, max{0};
};

struct replica_counters {
    std::string url;
    std::string group;
    double weight = 1;
    bool live = false;           ///< connected and taking calls (state == ready)
    replica_state state = replica_state::connecting;
    bool member = true;          ///< false once removed (it drains, then leaves)
    std::string source;          ///< what listed it: "" (the URL or add_replica), or a source
    std::string last_error;      ///< why it last lost or failed to open its connection
    std::uint64_t connects = 0;   ///< connections opened to it
    std::uint64_t ejections = 0;
    std::size_t in_flight = 0;   ///< calls sent and not yet answered
    std::size_t queued = 0;      ///< keyed calls waiting for this replica's room
    std::uint64_t completed = 0;  ///< calls answered with a result
    std::uint64_t errors = 0;     ///< calls that failed here (any reason)
    std::uint64_t shadow_calls = 0;
    std::uint64_t overloaded = 0;  ///< calls it refused with errc::overloaded
    bool cooling = false;          ///< getting fewer calls after refusing some (overload_cooldown)
    /// Of calls answered here: from the router's send to the read that brought the response.
    /// A call that a handler started while its connection passed on a read counts from that
    /// read (no clock read per call), so the handlers' time before the send is included.
    latency_summary latency;
};

struct router_counters {
    std::size_t queued = 0;  ///< calls waiting for room
    std::uint64_t calls = 0;
    std::uint64_t retried = 0;         ///< idempotent calls re-sent after their replica died
    std::uint64_t moved = 0;           ///< calls sent elsewhere after a replica was overloaded
    std::uint64_t over_budget = 0;     ///< second tries and moves the retry budget refused
    std::uint64_t hedged = 0;          ///< second copies sent after a call's hedge delay
    std::uint64_t hedge_wins = 0;      ///< hedged calls whose second copy answered first
    std::uint64_t replicas_lost = 0;     ///< connections that ended without a drain
    std::uint64_t reconnects = 0;        ///< connections opened again to a member
    std::uint64_t ejections = 0;
    std::uint64_t drains = 0;            ///< replicas whose server said it was going away
    std::uint64_t expired_in_queue = 0;  ///< calls failed timed_out while waiting, never sent
    std::uint64_t key_waits = 0;         ///< keyed calls held until their key's calls on its
                                         ///< previous replica finished
    std::uint64_t source_updates = 0;    ///< sets applied from sources
    std::uint64_t source_problems = 0;   ///< failed lookups and rejected entries of sources
    std::uint64_t shadow_sent = 0;
    std::uint64_t shadow_ok = 0;
    std::uint64_t shadow_errors = 0;
    std::uint64_t shadow_skipped = 0;  ///< due, but no shadow replica had room
    /// least_loaded's aperture: the replicas that calls without a key go to while they have
    /// room (router_options::aperture; with it off, every replica that takes calls; during a
    /// trial, the size the trial started from), how often the router tried a change of it, and
    /// how often it kept one.
    std::size_t aperture = 0;
    std::uint64_t aperture_trials = 0;
    std::uint64_t aperture_changes = 0;
};

/// One channel over several replicas. Each replica is reached over its own ordered connection
/// (an ordo::peer) with at most max_concurrent calls in flight; calls that find no room wait in
/// one bounded queue and are sent as room frees up, earliest deadline first (calls without a
/// deadline after those with one, oldest first; router_options::queue). A call whose deadline
/// passes while it waits fails with errc::timed_out and never reaches a replica.
///
/// Order: calls with one key (call_options::key, `ordo::key("user-42")`) go to one replica,
/// chosen by a consistent hash of the key, and wait for it in the order made, so they reach the
/// server in that order, while calls with other keys run in parallel elsewhere. When a key's
/// replica changes (lost, back, added, removed, ejected, draining), the key's next call waits
/// until its calls still in flight on the previous replica have finished: a key's calls never
/// overtake each other. Calls without a key, and notifications, have no order between replicas.
///
/// Membership: replicas come from the URL, from add_replica/remove_replica, and from sources
/// that follow DNS, a file or etcd (follow(), include/ordo/fleet/sources.hpp). An added replica
/// connects; a removed one drains (its calls in flight finish) and leaves; a changed weight
/// applies at once. A source's failed lookup keeps the last good set.
///
/// Failure: a replica whose connection ends (crash, reset, liveness timeout: docs/protocol.md,
/// "Liveness") leaves the ring at once and stays a member: it connects again with backoff
/// (router_options::reconnect_*), and is back in the ring as soon as it is connected. Calls
/// waiting for it move to the next replica; its calls in flight fail with errc::peer_lost,
/// except those of idempotent methods, which are sent once more to another replica. A server
/// that drains (server::async_drain) says so first: its replica takes no new calls, lets those
/// in flight finish, and reconnects when it is back. With no replica able to take a call,
/// waiting and later calls fail at once with errc::peer_lost, or wait up to
/// router_options::wait_for_replica for one.
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
    /// to connect is reported to `on_event` and the replica, still a member, connects again
    /// with backoff. A URL already present or a bad weight is reported there too ("not added").
    void add_replica(std::string url, double weight = 1.0, std::string group = {});
    /// Stops sending calls to `url`; calls in flight there complete, then its connection is
    /// closed. Its keys move to the next replica at once. Returns false if there is no such
    /// replica.
    bool remove_replica(const std::string& url);
    /// Called (on the router's executor) with a line for each replica added, removed, lost,
    /// failing to connect, back, ejected or draining, and for each problem of a source.
    void on_event(std::function<void(const std::string&)> f);

    /// Follows `source`: its sets become the replicas it owns (added, removed, re-weighted), next
    /// to those of the URL and of add_replica. When a replica is lost the source is asked to
    /// look again (refresh_now).
    void follow(std::unique_ptr<replica_source> source);
    /// follow(), then waits until some replica takes calls. Throws std::system_error
    /// (errc::peer_lost) within connect_timeout if none does, naming the source's last problem or
    /// the replicas' last errors.
    net::awaitable<void> async_follow(std::unique_ptr<replica_source> source);

    void start_call(std::unique_ptr<detail::pending_call> call) override;
    /// Sends a one-way message to one replica (least loaded); unordered between replicas.
    void notify_raw(std::string_view method, std::string_view params) override;
    void notify_raw_on(std::uint16_t lane, std::string_view method,
                       std::string_view params) override;
    /// "route:" and the replicas' URLs, e.g. "route:tcp://h1:7000,tcp://h2:7000".
    const std::string& remote_address() const noexcept override;
    net::any_io_executor get_executor() const override;

    /// Closes every replica's connection; calls in flight and waiting fail with errc::closed.
    void close() override;

    const router_counters& counters() const noexcept;
    /// One entry per replica: every member in whatever state, and removed ones still draining.
    std::vector<replica_counters> replicas() const;
    /// What a server shows of this router in ordo.stats (server::show_router).
    router_view view(std::string name) const;
    /// The counters of each source followed, with what it watches.
    std::vector<std::pair<std::string, source_counters>> sources() const;

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
    /// For `route+dns+SCHEME://`, `route+file://` and `route+etcd://` URLs: makes the source
    /// the router follows.
    std::function<std::unique_ptr<replica_source>(net::any_io_executor)> source;
};

/// Parses `route+SCHEME://a,b,...?params` (e.g.
/// `route+tcp://h1:7000,h2:7000?max_concurrent=8&policy=least_loaded`): each replica is
/// `SCHEME://item` plus the URL's transport parameters (cert, key, ca, ...). Router
/// parameters: max_concurrent, max_queued, queue (edf, the default, or fifo), policy
/// (least_loaded, round_robin, weighted), aperture (adaptive, the default, or all), weights (one
/// per replica, comma-separated), idempotent (comma-separated method names), shadow
/// (comma-separated replica items, put in group "shadow") with shadow_fraction, connect_timeout_ms,
/// reconnect_ms, reconnect_max_ms, eject_after, eject_ms, eject_max_ms, max_ejected_percent,
/// wait_for_replica_ms, hedge_after_ms, hedge_after (p95), hedge (METHOD:N or METHOD:p95, comma-
/// separated), health (watch or off), overload_cooldown_ms, retry_budget_percent (a
/// number, or off),
/// min_retries_per_s, token_hosts (comma-separated); and the
/// peer parameters timeout_ms, interval_ms, liveness_timeout_ms,
/// heartbeat_ms, applied on top of `base`.
///
/// Replicas from a source instead of a list:
/// - `route+dns+SCHEME://NAME:PORT` (A and AAAA records of NAME) or
///   `route+dns+SCHEME://_service._proto.NAME` (SRV records: ports and weights), with
///   dns_server=IP[:PORT] (default: the system's), refresh_ms (5000), min_refresh_ms (500);
/// - `route+file:///PATH`: one replica a line (fleet.hpp), watched, with refresh_ms its poll
///   (1000);
/// - `route+etcd://HOST:PORT/PREFIX`: the keys under /PREFIX of etcd's v3 API at
///   http://HOST:PORT, watched (what etcd_registration puts), and read whole again every
///   refresh_ms (30000).
///
/// Throws std::system_error (errc::bad_address) naming what is wrong.
route_spec parse_route_url(std::string_view url, peer_options base);

}  // namespace ordo
