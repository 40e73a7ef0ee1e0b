#include "rpc/dispatch/admission.hpp"

#include <algorithm>
#include <cmath>

namespace ordo::detail {

namespace {
std::int64_t ns_of(admission::clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}
}  // namespace

admission::admission(const concurrency_limit& l)
    : what_(l),
      limit_(l.what() == concurrency_limit::kind::fixed ? std::max<std::size_t>(l.fixed(), 1)
             : l.what() == concurrency_limit::kind::adaptive
                 ? std::clamp(l.settings().initial, std::max<std::size_t>(l.settings().min, 1),
                              l.settings().max)
                 : SIZE_MAX) {
    precise_limit_ = static_cast<double>(limit_.load());
}

std::shared_ptr<admission> admission::make(const concurrency_limit& l) {
    // The owner's share is the 1 count_ starts at.
    return std::shared_ptr<admission>(new admission(l), [](admission* a) { a->leave({}); });
}

void admission::sample(clock::time_point since, clock::time_point now) noexcept {
    ended_.fetch_add(1, std::memory_order_relaxed);
    held_ns_.fetch_add(
        static_cast<std::uint64_t>(std::max<std::int64_t>(ns_of(now) - ns_of(since), 0)),
        std::memory_order_relaxed);
    if (what_.what() != concurrency_limit::kind::adaptive) return;
    const std::uint64_t n = in_flight();
    if (n > peak_.load(std::memory_order_relaxed)) peak_.store(n, std::memory_order_relaxed);
    if (ns_of(now) >= window_end_ns_.load(std::memory_order_relaxed)) [[unlikely]]
        close_window(now);
}

void admission::close_window(clock::time_point now) noexcept {
    std::unique_lock lock(mu_, std::try_to_lock);
    if (!lock.owns_lock() || ns_of(now) < window_end_ns_.load(std::memory_order_relaxed)) return;
    const adaptive_limit& a = what_.settings();
    const std::int64_t window_ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(a.window).count();
    if (window_end_ns_.load(std::memory_order_relaxed) == 0) {  // the first call: a window opens
        window_end_ns_.store(ns_of(now) + window_ns, std::memory_order_relaxed);
        next_probe_ = now + a.window * 2;  // learn the no-load latency early
        ended_.store(0, std::memory_order_relaxed);
        held_ns_.store(0, std::memory_order_relaxed);
        return;
    }
    // Too few calls timed for a latency worth trusting: the window goes on.
    if (ended_.load(std::memory_order_relaxed) < 8) return;
    window_end_ns_.store(ns_of(now) + window_ns, std::memory_order_relaxed);
    const std::uint64_t ended = ended_.exchange(0, std::memory_order_relaxed);
    const std::uint64_t held = held_ns_.exchange(0, std::memory_order_relaxed);
    const std::uint64_t peak = peak_.exchange(0, std::memory_order_relaxed);
    const std::uint64_t refused = refused_.load(std::memory_order_relaxed);
    const std::uint64_t waited = waited_.load(std::memory_order_relaxed);
    // Calls refused, or made to wait (caller_shares): the limit was reached.
    const bool refusing = refused != refused_before_ || waited != waited_before_;
    refused_before_ = refused;
    waited_before_ = waited;
    const double latency = static_cast<double>(held) / static_cast<double>(ended);
    latency_ns_.store(static_cast<std::uint64_t>(latency), std::memory_order_relaxed);
    const double lo = static_cast<double>(std::max<std::size_t>(a.min, 1));
    const double hi = static_cast<double>(std::max(a.max, std::max<std::size_t>(a.min, 1)));
    auto set = [&](double v) {
        precise_limit_ = std::clamp(v, lo, hi);
        limit_.store(static_cast<std::size_t>(std::lround(precise_limit_)),
                     std::memory_order_relaxed);
    };
    switch (probe_) {
        case probe::draining:  // the calls admitted before the drop end in this window
            probe_ = probe::measuring;
            return;
        case probe::measuring: {  // what calls take with a quarter of the limit: no-load
            // Far less than before: calls still queued at a quarter, and there may be less
            // to learn at a quarter of this one: probe again soon (3 windows). Else in
            // probe_every.
            const auto before = no_load_ns_.load(std::memory_order_relaxed);
            no_load_ns_.store(static_cast<std::uint64_t>(latency), std::memory_order_relaxed);
            probe_ = probe::none;
            next_probe_ =
                now + (latency < 0.9 * static_cast<double>(before) ? a.window * 3 : a.probe_every);
            set(static_cast<double>(before_probe_));
            return;
        }
        case probe::none: break;
    }
    double no_load = static_cast<double>(no_load_ns_.load(std::memory_order_relaxed));
    if (no_load == 0 || latency < no_load) {
        no_load = latency;
        no_load_ns_.store(static_cast<std::uint64_t>(latency), std::memory_order_relaxed);
    }
    if (now >= next_probe_) {
        before_probe_ = static_cast<std::size_t>(std::lround(precise_limit_));
        probe_ = probe::draining;
        set(precise_limit_ / 4);
        return;
    }
    const double gradient = std::clamp(a.tolerance * no_load / latency, 0.5, 1.0);
    // In use: calls were refused, or at least half the limit ran at once. A limit that is
    // not reached says nothing about a larger one.
    const bool in_use = refusing || static_cast<double>(peak) * 2 >= precise_limit_;
    double next = precise_limit_ * gradient;
    if (in_use || gradient < 1.0) next += std::sqrt(precise_limit_);
    if (!in_use) next = std::min(next, precise_limit_);
    set(next);
}

std::uint64_t admission::retry_after_ms() const noexcept {
    const std::uint64_t ns = latency_ns_.load(std::memory_order_relaxed);
    if (ns) return std::max<std::uint64_t>(ns / 1'000'000, 1);
    const std::uint64_t ended = ended_.load(std::memory_order_relaxed);
    const std::uint64_t held = held_ns_.load(std::memory_order_relaxed);
    return ended ? std::max<std::uint64_t>(held / ended / 1'000'000, 1) : 1;
}

concurrency_stats admission::plain_stats() const noexcept {
    concurrency_stats s;
    s.what = what_.what();
    s.limit = what_.limited() ? limit() : 0;
    s.in_flight = in_flight();
    s.refused = refused_.load(std::memory_order_relaxed);
    s.no_load_us = no_load_ns_.load(std::memory_order_relaxed) / 1000;
    s.latency_us = latency_ns_.load(std::memory_order_relaxed) / 1000;
    return s;
}

}  // namespace ordo::detail
