// Latencies in microseconds: 8 buckets per power of two, so that a percentile is within ~10%.
// The router keeps one per replica.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>

#include "ordo/rpc/router.hpp"

namespace ordo::detail {

class histogram {
  public:
    void record(std::chrono::steady_clock::duration d) {
        const auto us = static_cast<std::uint64_t>(std::max<std::int64_t>(
            1, std::chrono::duration_cast<std::chrono::microseconds>(d).count()));
        const int e = std::bit_width(us) - 1;
        const unsigned sub = e >= 3 ? (us >> (e - 3)) & 7 : (us << (3 - e)) & 7;
        ++b_[static_cast<std::size_t>(e) * 8 + sub];
        ++n_;
        max_ = std::max(max_, us);
    }
    latency_summary summary() const {
        latency_summary s;
        s.count = n_;
        s.p50 = at(0.50);
        s.p90 = at(0.90);
        s.p99 = at(0.99);
        s.max = std::chrono::microseconds(max_);
        return s;
    }

    /// The `q` quantile (0..1): the low end of its bucket, or 0 with nothing recorded.
    std::chrono::microseconds at(double q) const {
        if (n_ == 0) return std::chrono::microseconds(0);
        const auto rank = static_cast<std::uint64_t>(std::ceil(q * static_cast<double>(n_)));
        std::uint64_t seen = 0;
        for (std::size_t i = 0; i < b_.size(); ++i) {
            seen += b_[i];
            if (seen >= rank) {
                const std::size_t e = i / 8, sub = i % 8;
                const std::uint64_t low = e >= 3 ? (8 + sub) << (e - 3) : (8 + sub) >> (3 - e);
                return std::chrono::microseconds(std::min(low, max_));
            }
        }
        return std::chrono::microseconds(max_);
    }
    std::uint64_t count() const noexcept { return n_; }
    void merge(const histogram& o) {
        for (std::size_t i = 0; i < b_.size(); ++i) b_[i] += o.b_[i];
        n_ += o.n_;
        max_ = std::max(max_, o.max_);
    }

  private:
    std::array<std::uint64_t, 64 * 8> b_{};
    std::uint64_t n_ = 0, max_ = 0;
};

/// Recent latencies: two histograms, the older dropped when the newer holds `span` samples, so
/// that a percentile reflects the last `span` to 2 x `span` (a hedged method's p95).
class recent_histogram {
  public:
    explicit recent_histogram(std::uint64_t span = 1000) : span_(span) {}
    void record(std::chrono::steady_clock::duration d) {
        if (now_.count() >= span_) {
            old_ = now_;
            now_ = histogram{};
        }
        now_.record(d);
    }
    std::uint64_t count() const noexcept { return old_.count() + now_.count(); }
    /// The `q` quantile of both halves together.
    std::chrono::microseconds at(double q) const {
        histogram both = old_;
        both.merge(now_);
        return both.at(q);
    }

  private:
    std::uint64_t span_;
    histogram old_, now_;
};

}  // namespace ordo::detail
