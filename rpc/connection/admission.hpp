// detail::admission: one concurrency limit (ordo/rpc/concurrency.hpp), a server's or a method's,
// shared by every connection and loop that serves it. A call takes a slot before anything of it
// runs (try_enter) and gives it back when its handler has ended (leave), with how long it held
// it; an adaptive limit learns from those durations (docs/design.md, "Overload").
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>

#include "ordo/rpc/concurrency.hpp"

namespace ordo::detail {

class admission {
  public:
    using clock = std::chrono::steady_clock;

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
    concurrency_stats stats() const noexcept;

  private:
    explicit admission(const concurrency_limit& l);
    ~admission() = default;
    // One call's latency, from `since` to `now`; may close the window.
    void sample(clock::time_point since, clock::time_point now) noexcept;
    // A window has passed: the adaptive limit moves (under mu_, by one thread at a time).
    void close_window(clock::time_point now) noexcept;

    const concurrency_limit what_;
    std::atomic<std::size_t> limit_;
    std::atomic<std::size_t> count_{1};
    std::atomic<std::uint64_t> refused_{0};
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
};

}  // namespace ordo::detail
