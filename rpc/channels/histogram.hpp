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

  private:
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
    std::array<std::uint64_t, 64 * 8> b_{};
    std::uint64_t n_ = 0, max_ = 0;
};

}  // namespace ordo::detail
