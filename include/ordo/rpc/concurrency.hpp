// How many calls a server, or one of its methods, runs at once (server_options::concurrency,
// handler_options::concurrency; docs/protocol.md "Overload"). A call over the limit is refused
// at once with errc::overloaded and a retry-after hint, before anything of it runs.
#pragma once

#include "ordo/config.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ordo {

/// The settings of an adaptive limit (docs/design.md, "Overload"). Each `window` it compares the
/// latency of the calls that ended in it (one in four is timed) (from their start to their end,
/// waits for a worker or a lock included) with the latency it learned with little load, `no_load`:
///   limit <- limit · clamp(tolerance · no_load / latency, 0.5, 1) + √limit
/// so the limit grows while latency stays within `tolerance` of the no-load latency and the
/// limit is in use, and shrinks, at most by half a window, once calls queue for longer.
/// `no_load` is the lowest window's latency seen. To learn it under load, and to follow a
/// workload that has become slower or faster, the limit drops to a quarter for two windows
/// (a probe, soon after the first calls and then every `probe_every`), and the second window's
/// latency becomes `no_load`; while a probe finds it far lower than before (calls still
/// queued), the next probe follows three windows later.
struct adaptive_limit {
    std::size_t initial = 16;  ///< the limit before anything is learned
    std::size_t min = 2;       ///< never below
    std::size_t max = 4096;    ///< never above
    double tolerance = 2.0;    ///< latency allowed over the no-load latency before shrinking
    std::chrono::milliseconds window{100};
    std::chrono::milliseconds probe_every{10'000};
};

/// `server_options::concurrency = ordo::adaptive;`
inline constexpr adaptive_limit adaptive{};

/// None (the default: calls are bounded only by the connection's queue limits), a fixed
/// number (`= 256`), or adaptive (`= ordo::adaptive`, or an adaptive_limit with other settings).
class concurrency_limit {
  public:
    enum class kind : std::uint8_t { none, fixed, adaptive };

    concurrency_limit() noexcept = default;
    // Implicit, so that options read `o.concurrency = 256` and `o.concurrency = ordo::adaptive`.
    concurrency_limit(std::size_t fixed) noexcept : kind_(kind::fixed), fixed_(fixed) {}
    concurrency_limit(const adaptive_limit& a) noexcept : kind_(kind::adaptive), adaptive_(a) {}

    kind what() const noexcept { return kind_; }
    bool limited() const noexcept { return kind_ != kind::none; }
    std::size_t fixed() const noexcept { return fixed_; }
    const adaptive_limit& settings() const noexcept { return adaptive_; }

  private:
    kind kind_ = kind::none;
    std::size_t fixed_ = 0;
    adaptive_limit adaptive_{};
};

/// How a server's concurrency limit is shared among its callers (server_options::shares;
/// docs/protocol.md "Overload"). A caller is its identity: identity::subject (a token's or a
/// certificate's), else its certificate's subject, else its unix uid, else its address (an
/// IPv4 address or an IPv6 /64). While the limit is reached, a call waits in its caller's
/// queue, and each slot that frees goes to the waiting caller with the fewest calls running
/// for its weight (weighted fair queuing). A call that finds its caller's queue full is
/// refused; while more calls wait than the limit, the caller furthest over its share (calls
/// running and waiting, for its weight) loses its newest waiting call. Refusals are
/// errc::overloaded with a retry-after hint, and say whether the caller was over its share.
struct caller_shares {
    /// Calls one caller may have waiting for a slot. 0 (the default): no sharing, a call over
    /// the limit is refused at once, whoever makes it.
    std::size_t queue = 0;
    /// Weights by identity::subject; any other caller weighs 1. A caller of weight 3 gets three
    /// times the slots of one of weight 1 while both want more than they get.
    std::map<std::string, unsigned> weights{};
    bool on() const noexcept { return queue > 0; }
};

/// One caller's figures under caller_shares (concurrency_stats::callers).
struct caller_stats {
    std::string caller;  ///< as caller_shares names it; "other" sums the callers not listed
    unsigned weight = 1;
    std::size_t running = 0;  ///< calls running now
    std::size_t waiting = 0;  ///< calls waiting for a slot now
    std::uint64_t served = 0;  ///< calls that ran (at once or after waiting)
    std::uint64_t queued = 0;  ///< calls that waited for a slot
    std::uint64_t refused = 0; ///< calls refused (errc::overloaded)
};

/// Where a limit stands (server::concurrency(), ordo.stats).
struct concurrency_stats {
    concurrency_limit::kind what = concurrency_limit::kind::none;
    std::size_t limit = 0;      ///< calls it lets run at once now
    std::size_t in_flight = 0;  ///< calls running now
    std::uint64_t refused = 0;  ///< answered errc::overloaded (notifications: dropped)
    /// What the adaptive limit learned (0 before it has): the no-load latency, and the
    /// latency of the last window, in microseconds.
    std::uint64_t no_load_us = 0;
    std::uint64_t latency_us = 0;
    /// With caller_shares: the callers that called most (at most 8), then "other" for the rest.
    std::vector<caller_stats> callers;
};

}  // namespace ordo
