// A router's retry budget (router_options::retry_budget_percent, min_retries_per_s): what second
// tries and moves of calls may add to the calls made, so that retries cannot multiply the load
// of a fleet that is already failing (docs/design.md 5.12).
#pragma once

#include <algorithm>
#include <chrono>

namespace ordo::detail {

/// A bucket of tries: each call made puts in `percent` / 100 of a try, and time puts in
/// `per_s` a second; a try takes one out. It holds ten seconds of `per_s` and the share of a
/// thousand calls at most, and starts with a second's worth, so that a router's first failures
/// may be retried. Single-threaded (the router's executor).
class retry_budget {
  public:
    using clock_type = std::chrono::steady_clock;

    retry_budget(double percent, double per_s)
        : off_(percent < 0),
          share_(std::max(percent, 0.0) / 100),
          per_s_(std::max(per_s, 0.0)),
          cap_(std::max(10 * per_s_ + 1000 * share_, 1.0)),
          balance_(std::min(per_s_, cap_)),
          last_(clock_type::now()) {}

    /// A call was made.
    void deposit() noexcept { balance_ = std::min(balance_ + share_, cap_); }
    /// Takes a try out if there is one.
    bool withdraw(clock_type::time_point now) noexcept {
        if (off_) return true;
        const double s = std::chrono::duration<double>(now - last_).count();
        last_ = now;
        if (s > 0) balance_ = std::min(balance_ + s * per_s_, cap_);
        if (balance_ < 1) return false;
        balance_ -= 1;
        return true;
    }

  private:
    bool off_;
    double share_, per_s_, cap_, balance_;
    clock_type::time_point last_;
};

}  // namespace ordo::detail
