// Calls waiting for capacity (a pool's connections, a router's replicas): one FIFO, each call
// with its deadline and its caller's cancellation (call_watch, as in the peer's call table).
// Shared by rpc/pool.cpp and rpc/router.cpp.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "ordo/channel.hpp"
#include "rpc/detail/call_watch.hpp"

namespace ordo::detail {

/// Moves what `from` carries to the wire (method, params, options, slot) into `to`, the call
/// that wraps it on its way to a connection. `from` keeps its handler and completes the caller.
inline void move_call_fields(pending_call& from, pending_call& to, std::chrono::milliseconds timeout) {
    to.method = std::move(from.method);
    to.params = std::move(from.params);
    to.options = std::move(from.options);
    to.options.timeout = timeout;
    to.slot = from.slot;
    to.stream = std::move(from.stream);
}

/// Completes `call` with `ec` and `detail` (no result).
inline void fail_call(pending_call& call, std::error_code ec, std::string detail) {
    call_outcome out;
    out.detail = std::move(detail);
    call.complete(ec, std::move(out));
}

/// Belongs to the executor given at construction; every member runs there. Timers and
/// cancellation handlers that fire after the queue is gone do nothing.
class wait_queue {
  public:
    using clock = std::chrono::steady_clock;

    /// A call taken out to run, with the time left of its deadline (0: none).
    struct taken {
        std::unique_ptr<pending_call> call;
        std::chrono::milliseconds timeout{0};
    };

    /// `timed_out_reason(timeout)` and `cancelled_reason` describe why a waiting call failed;
    /// `on_change` runs after a call left the queue by itself (deadline or cancellation).
    wait_queue(net::any_io_executor ex,
               std::function<std::string(std::chrono::milliseconds)> timed_out_reason,
               std::string cancelled_reason, std::function<void()> on_change = {})
        : ex_(std::move(ex)),
          timed_out_reason_(std::move(timed_out_reason)),
          cancelled_reason_(std::move(cancelled_reason)),
          on_change_(std::move(on_change)) {}
    wait_queue(const wait_queue&) = delete;
    wait_queue& operator=(const wait_queue&) = delete;

    std::size_t size() const noexcept { return q_.size(); }
    bool empty() const noexcept { return q_.empty(); }

    /// Appends `call`. A deadline (`timeout` > 0) or a cancellation through the call's slot
    /// takes it out and fails it with errc::timed_out or errc::cancelled.
    void push(std::unique_ptr<pending_call> call, std::chrono::milliseconds timeout) {
        const std::uint64_t seq = next_seq_++;
        entry& e = q_[seq];
        e.since = clock::now();
        e.watch.arm(ex_, timeout, *call, alive_, [this, seq](errc why) { withdraw(seq, why); });
        e.call = std::move(call);
    }

    /// Takes out the oldest call for which `fits(call)` holds (all, without `fits`).
    std::optional<taken> take_first(const std::function<bool(const pending_call&)>& fits = {}) {
        for (auto it = q_.begin(); it != q_.end(); ++it) {
            if (fits && !fits(*it->second.call)) continue;
            entry e = std::move(it->second);
            q_.erase(it);
            e.watch.disarm(*e.call);  // the slot held the queue's handler; the connection sets its own
            return taken{std::move(e.call), e.watch.left()};
        }
        return std::nullopt;
    }

    /// Calls `f` on each waiting call, oldest first.
    void for_each(const std::function<void(const pending_call&)>& f) const {
        for (const auto& [seq, e] : q_) f(*e.call);
    }

    /// When the oldest waiting call was pushed (nothing if none waits).
    std::optional<clock::time_point> oldest_since() const {
        if (q_.empty()) return std::nullopt;
        return q_.begin()->second.since;
    }

    /// Fails the calls pushed at or before `t` with `ec` and `why` (oldest first: push times
    /// follow the FIFO's order).
    void fail_waiting_since(clock::time_point t, std::error_code ec, const std::string& why) {
        while (!q_.empty() && q_.begin()->second.since <= t) {
            entry e = std::move(q_.begin()->second);
            q_.erase(q_.begin());
            e.watch.disarm(*e.call);
            fail_call(*e.call, ec, why);
        }
    }

    /// Fails every waiting call with `ec` and `why`.
    void fail_all(std::error_code ec, const std::string& why) {
        auto all = std::move(q_);
        q_.clear();
        for (auto& [seq, e] : all) {
            e.watch.disarm(*e.call);
            fail_call(*e.call, ec, why);
        }
    }

  private:
    struct entry {
        std::unique_ptr<pending_call> call;
        call_watch watch;
        clock::time_point since;
    };

    void withdraw(std::uint64_t seq, errc why) {
        auto it = q_.find(seq);
        if (it == q_.end()) return;
        entry e = std::move(it->second);
        q_.erase(it);
        e.watch.disarm(*e.call);
        if (on_change_) on_change_();
        fail_call(*e.call, why,
                  why == errc::timed_out ? timed_out_reason_(e.watch.timeout()) : cancelled_reason_);
    }

    net::any_io_executor ex_;
    std::shared_ptr<int> alive_ = std::make_shared<int>(0);  // handlers hold it weakly
    std::function<std::string(std::chrono::milliseconds)> timed_out_reason_;
    std::string cancelled_reason_;
    std::function<void()> on_change_;
    std::map<std::uint64_t, entry> q_;  // FIFO by sequence number
    std::uint64_t next_seq_ = 0;
};

}  // namespace ordo::detail
