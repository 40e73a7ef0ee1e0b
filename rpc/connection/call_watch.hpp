// The one deadline-and-cancellation mechanism of a waiting call, shared by the ordered peer's
// call table (rpc/connection/call_table.cpp) and the wait queue of pools and routers
// (wait_queue.hpp).
#pragma once

#include <algorithm>
#include <chrono>
#include <memory>

#include "ordo/rpc/channel.hpp"

namespace ordo::detail {

/// Time left until `deadline`: at least 1 ms while any is left (0 means "no deadline" to the
/// options that take it), 0 for time_point::max().
inline std::chrono::milliseconds time_left(std::chrono::steady_clock::time_point deadline) {
    if (deadline == std::chrono::steady_clock::time_point::max())
        return std::chrono::milliseconds(0);
    return std::max(std::chrono::milliseconds(1),
                    std::chrono::duration_cast<std::chrono::milliseconds>(
                        deadline - std::chrono::steady_clock::now()));
}

/// Watches one waiting call: its deadline timer and its caller's cancellation slot. Whichever
/// fires first runs `withdraw(errc::timed_out)` or `withdraw(errc::cancelled)` on `ex`, and only
/// while `owner` can be locked (it is held across the call, so the owner may complete the call
/// and drop its last reference inside). A cancellation is posted, never run inside emit(): the
/// withdrawal clears the very slot that is emitting.
class call_watch {
  public:
    using clock = std::chrono::steady_clock;

    /// Starts watching `call`. `timeout` 0: no deadline.
    template <class Withdraw>
    void arm(const net::any_io_executor& ex, std::chrono::milliseconds timeout, pending_call& call,
             const std::weak_ptr<void>& owner, Withdraw withdraw) {
        timeout_ = timeout;
        if (timeout.count() > 0) {
            deadline_ = clock::now() + timeout;
            timer_ = std::make_unique<net::steady_timer>(ex, deadline_);
            timer_->async_wait([owner, withdraw](std::error_code ec) mutable {
                if (ec) return;
                if (auto keep = owner.lock()) withdraw(errc::timed_out);
            });
        }
        if (call.slot.is_connected()) {
            call.slot.assign([owner, withdraw, ex](net::cancellation_type) mutable {
                net::post(ex, [owner, withdraw]() mutable {
                    if (auto keep = owner.lock()) withdraw(errc::cancelled);
                });
            });
        }
    }

    /// Stops watching `call` (it completed or moves on): neither handler will run.
    void disarm(pending_call& call) {
        if (timer_) timer_->cancel();
        call.slot.clear();
    }

    /// The timeout given to arm().
    std::chrono::milliseconds timeout() const noexcept { return timeout_; }
    /// What is left of it now (0: no deadline).
    std::chrono::milliseconds left() const { return time_left(deadline_); }
    /// When the deadline passes (time_point::max(): none).
    clock::time_point deadline() const noexcept { return deadline_; }

  private:
    std::unique_ptr<net::steady_timer> timer_;
    clock::time_point deadline_ = clock::time_point::max();
    std::chrono::milliseconds timeout_{0};
};

}  // namespace ordo::detail
