// detail::admission: one concurrency limit (ordo/rpc/concurrency.hpp), a server's or a method's,
// shared by every connection and loop that serves it. A call takes a slot before anything of it
// runs (try_enter) and gives it back when its handler has ended (leave), with how long it held
// it; an adaptive limit learns from those durations (docs/design.md, "Overload").
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>

#include "ordo/rpc/concurrency.hpp"

namespace ordo::detail {

class admission {
  public:
    using clock = std::chrono::steady_clock;

    explicit admission(const concurrency_limit& l);
    admission(const admission&) = delete;
    admission& operator=(const admission&) = delete;

    /// Takes a slot, or says no (over the limit: the call is refused). Any thread.
    bool try_enter() noexcept {
        const std::size_t n = in_flight_.fetch_add(1, std::memory_order_relaxed);
        if (n >= limit_.load(std::memory_order_relaxed)) [[unlikely]] {
            in_flight_.fetch_sub(1, std::memory_order_relaxed);
            refused_.fetch_add(1, std::memory_order_relaxed);
            return false;
        }
        admitted_.fetch_add(1, std::memory_order_relaxed);
        return true;
    }
    /// Gives back a slot just taken, for a call that will not run after all (another limit
    /// refused it). Any thread.
    void withdraw() noexcept {
        in_flight_.fetch_sub(1, std::memory_order_relaxed);
        admitted_.fetch_sub(1, std::memory_order_relaxed);
    }
    /// Gives a slot back: its call started at `since` and ended `now`. Any thread.
    void leave(clock::time_point since, clock::time_point now) noexcept;

    /// How long a refused caller should wait before it tries again, in milliseconds (at least
    /// 1): about the time a call takes here now.
    std::uint64_t retry_after_ms() const noexcept;
    bool adaptive() const noexcept { return what_.what() == concurrency_limit::kind::adaptive; }
    std::size_t limit() const noexcept { return limit_.load(std::memory_order_relaxed); }
    std::size_t in_flight() const noexcept { return in_flight_.load(std::memory_order_relaxed); }
    concurrency_stats stats() const noexcept;

  private:
    // A window has passed: the adaptive limit moves (under mu_, by one thread at a time).
    void close_window(clock::time_point now) noexcept;

    const concurrency_limit what_;
    std::atomic<std::size_t> limit_;
    std::atomic<std::size_t> in_flight_{0};
    std::atomic<std::uint64_t> admitted_{0}, refused_{0};
    // This window's calls: how many ended, their summed durations, and the most that were
    // running as one ended (an adaptive limit grows only while it is in use).
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
