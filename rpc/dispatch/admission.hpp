// detail::admission: one concurrency limit (ordo/rpc/concurrency.hpp), a server's or a method's,
// shared by every connection and loop that serves it. A call takes a slot before anything of it
// runs (try_enter) and gives it back when its handler has ended (leave), with how long it held
// it; an adaptive limit learns from those durations (docs/design.md, "Overload"). A server's
// limit may be shared among its callers (caller_shares): then a call enters as its caller's
// (enter), may wait for a slot in its caller's queue (wait), and leaves as its caller's; the
// sharing is in rpc/dispatch/caller_shares.cpp.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "ordo/identity.hpp"
#include "ordo/net.hpp"
#include "ordo/rpc/concurrency.hpp"

namespace ordo::detail {

class parked;

class admission : public std::enable_shared_from_this<admission> {
  public:
    using clock = std::chrono::steady_clock;
    struct ticket;

    struct seat;
    /// One caller of a shared limit (caller_shares): its connections' seats.
    struct caller {
        std::string key;  // as caller_shares names it
        unsigned weight = 1;
        // Calls granted a slot whose coroutine has not yet counted itself in its seat.
        std::atomic<std::size_t> in_transit{0};
        // Under the admission's share_mu_:
        std::vector<seat*> seats;
        std::deque<std::shared_ptr<ticket>> waiting;  // oldest first
        std::uint64_t queued = 0, refused = 0;
        std::uint64_t served_before = 0;  // by seats that are gone
        // Calls running (under share_mu_; the seats' counts are read as they are).
        std::size_t running() const noexcept;
        std::uint64_t served() const noexcept;
    };
    /// One connection's place in a shared limit: its calls running and served, counted by the
    /// connection's own thread alone (so a call pays no atomic read-modify-write for them),
    /// and read by others.
    struct seat {
        seat(std::shared_ptr<admission> a, std::shared_ptr<caller> c)
            : owner(std::move(a)), who(std::move(c)) {}
        ~seat();
        seat(const seat&) = delete;
        seat& operator=(const seat&) = delete;
        void count_in() noexcept {
            running.store(running.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
            served.store(served.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
        }
        void count_out() noexcept {
            running.store(running.load(std::memory_order_relaxed) - 1, std::memory_order_relaxed);
        }
        const std::shared_ptr<admission> owner;
        const std::shared_ptr<caller> who;
        std::atomic<std::uint32_t> running{0};
        std::atomic<std::uint64_t> served{0};
    };
    /// A call waiting in its caller's queue for a slot.
    struct ticket {
        enum class state : std::uint8_t { waiting, granted, refused, cancelled };
        std::shared_ptr<admission> owner;  // keeps the limit while the call waits
        seat* at = nullptr;                // its connection's (which outlives the wait)
        std::uint64_t seq = 0;             // arrival order, for ties
        // Under owner's share_mu_:
        state now = state::waiting;
        std::unique_ptr<parked> parked_at;  // the call's coroutine, once it waits
        std::string why;                    // refused: the reason
        bool over_share = false;            // refused: its caller was over its share
    };
    /// What enter() decided.
    enum class verdict : std::uint8_t { run, wait, refuse };

    /// The limit, held by its owner (handlers). Calls hold it too, from try_enter() to leave():
    /// it is freed when the owner has let go and the last call has left, so that a handler
    /// that outlives its server's table gives its slot back safely. Each holder costs nothing
    /// more than the count of calls in flight.
    static std::shared_ptr<admission> make(const concurrency_limit& l);
    admission(const admission&) = delete;
    admission& operator=(const admission&) = delete;

    /// Takes a slot, or says no (over the limit: the call is refused). Any thread; the caller
    /// holds the owner's shared_ptr while it asks.
    bool try_enter() noexcept {
        // count_ is the calls in flight, plus one for the owner.
        const std::size_t n = count_.fetch_add(1, std::memory_order_relaxed);
        if (n > limit_.load(std::memory_order_relaxed)) [[unlikely]] {
            count_.fetch_sub(1, std::memory_order_relaxed);
            refused_.fetch_add(1, std::memory_order_relaxed);
            return false;
        }
        return true;
    }
    /// Gives back a slot just taken, for a call that will not run after all (another limit
    /// refused it). Any thread.
    void withdraw() noexcept { count_.fetch_sub(1, std::memory_order_relaxed); }

    /// Shares the limit among callers from now on (before serving).
    void share(const caller_shares& s) { shares_ = s; }
    bool shared() const noexcept { return shares_.on(); }
    /// A seat for a connection of the caller `who` is, under a shared limit (once per
    /// connection). Any thread.
    std::shared_ptr<seat> seat_for(const identity& who);
    /// A call of `s`'s connection enters a shared limit: runs now (it holds a slot), waits
    /// (`t`: wait(t) says when), or is refused (`why`, and whether its caller was over its
    /// share). On the connection's thread.
    verdict enter(seat& s, std::shared_ptr<ticket>& t, std::string& why, bool& over_share) {
        if (waiting_.load(std::memory_order_seq_cst) == 0 && take()) {
            s.count_in();
            return verdict::run;
        }
        return enter_slow(s, t, why, over_share);
    }
    /// Completes once `t` is granted a slot (then counted in its seat), refused, or the
    /// awaiting coroutine is cancelled; gives which. On the call's connection's thread.
    /// (`t` by reference: GCC 12 would destroy a copy made for the call twice.)
    static net::awaitable<ticket::state> wait(const std::shared_ptr<ticket>& t);
    /// leave() of a call of `s`'s connection under a shared limit: its slot goes to the next
    /// waiting call. On the connection's thread.
    void leave_shared(seat& s, clock::time_point since) noexcept;
    /// Gives a slot back. `since`, if set, is when the call started, and `now` when it ended:
    /// a sample of its latency (the dispatcher times one call in four: the clock costs more
    /// than the rest of the limit). May free the limit. Any thread.
    void leave(clock::time_point since) noexcept {
        if (since != clock::time_point{}) [[unlikely]]
            sample(since, clock::now());
        if (count_.fetch_sub(1, std::memory_order_acq_rel) == 1) [[unlikely]]
            delete this;
    }
    /// leave() of a timed call with the clock given (a model on a simulated clock).
    void leave_at(clock::time_point since, clock::time_point now) noexcept {
        sample(since, now);
        if (count_.fetch_sub(1, std::memory_order_acq_rel) == 1) [[unlikely]]
            delete this;
    }

    /// How long a refused caller should wait before it tries again, in milliseconds (at least
    /// 1): about the time a call takes here now.
    std::uint64_t retry_after_ms() const noexcept;
    bool adaptive() const noexcept { return what_.what() == concurrency_limit::kind::adaptive; }
    std::size_t limit() const noexcept { return limit_.load(std::memory_order_relaxed); }
    /// While the owner holds it.
    std::size_t in_flight() const noexcept { return count_.load(std::memory_order_relaxed) - 1; }
    /// With caller_shares, the callers' figures too.
    concurrency_stats stats() const;

  private:
    concurrency_stats plain_stats() const noexcept;
    explicit admission(const concurrency_limit& l);
    ~admission() = default;
    // One call's latency, from `since` to `now`; may close the window.
    void sample(clock::time_point since, clock::time_point now) noexcept;
    // A window has passed: the adaptive limit moves (under mu_, by one thread at a time).
    void close_window(clock::time_point now) noexcept;
    // A slot taken for a waiting call (false: the limit is reached). Not counted as refused.
    bool take() noexcept {
        const std::size_t n = count_.fetch_add(1, std::memory_order_seq_cst);
        if (n > limit_.load(std::memory_order_relaxed)) {
            count_.fetch_sub(1, std::memory_order_seq_cst);
            return false;
        }
        return true;
    }
    verdict enter_slow(seat& s, std::shared_ptr<ticket>& t, std::string& why, bool& over_share);
    void cancel(ticket& t);
    // Under share_mu_: gives free slots (and `in_hand`, one already held) to the waiting calls,
    // the caller with the fewest running for its weight first; their coroutines go to `wake`.
    // Says whether `in_hand` is still held (nobody waited).
    bool pump(bool in_hand, std::vector<std::unique_ptr<parked>>& wake);
    // Under share_mu_: whether `c`, refused, was over its share (another caller is active and
    // `c` runs and waits at least its weight's part of the limit), and that part in words.
    bool over_share(const caller& c, std::string& words) const;
    void refuse_locked(ticket& t, std::string why);

    const concurrency_limit what_;
    std::atomic<std::size_t> limit_;
    std::atomic<std::size_t> count_{1};
    std::atomic<std::uint64_t> refused_{0};
    std::atomic<std::uint64_t> waited_{0};  // calls that waited for a slot (caller_shares)
    // This window's timed calls: how many ended, their summed durations, and the most that
    // were running as one ended (an adaptive limit grows only while it is in use).
    std::atomic<std::uint64_t> ended_{0}, held_ns_{0}, peak_{0};
    std::atomic<std::int64_t> window_end_ns_{0};
    std::atomic<std::uint64_t> no_load_ns_{0}, latency_ns_{0};
    std::mutex mu_;  // close_window's; tried, never waited for
    // Under mu_:
    double precise_limit_ = 0;
    std::uint64_t refused_before_ = 0;  // refused_ at the last window's close
    enum class probe : std::uint8_t { none, draining, measuring } probe_ = probe::none;
    std::size_t before_probe_ = 0;
    clock::time_point next_probe_{};
    std::uint64_t waited_before_ = 0;  // waited_ at the last window's close

    // Sharing (caller_shares): set before serving.
    caller_shares shares_;
    // Calls waiting for a slot, for the fast path of enter() and leave_shared().
    std::atomic<std::size_t> waiting_{0};
    mutable std::mutex share_mu_;
    // Under share_mu_:
    std::unordered_map<std::string, std::shared_ptr<caller>> callers_;
    std::size_t prune_at_ = 64;
    std::vector<caller*> waiting_callers_;  // those with calls waiting
    std::uint64_t seq_ = 0;
    caller_stats gone_;  // the figures of callers forgotten (no connection, nothing running)
};

}  // namespace ordo::detail
