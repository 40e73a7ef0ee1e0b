// Calls waiting for capacity (a pool's connections, a router's replicas): one queue, earliest
// deadline first (or FIFO), each call with its deadline and its caller's cancellation
// (call_watch, as in the peer's call table). Shared by rpc/channels/pool.cpp and
// rpc/channels/router.cpp.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "ordo/detail/shutdown_hook.hpp"
#include "ordo/rpc/channel.hpp"
#include "rpc/connection/call_watch.hpp"

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

/// Which waiting call goes first when room frees up.
enum class wait_order {
    /// Earliest deadline first: calls with a deadline, soonest first; then calls without one,
    /// oldest first. A keyed call takes its turn at the earliest deadline among the waiting
    /// calls of its key, but the oldest of them goes: never reordered within a key.
    earliest_deadline,
    fifo,  ///< oldest first
};

/// Belongs to the executor given at construction; every member runs there. Timers and
/// cancellation handlers that fire after the queue is gone do nothing. A call whose deadline
/// passes while it waits is failed with errc::timed_out and never taken (counted by expired()).
/// If the executor's context is destroyed first, the waiting calls fail with errc::closed
/// (shutdown_hook).
class wait_queue final : shutdown_hook {
  public:
    using clock = std::chrono::steady_clock;

    /// A call taken out to run, with the time left of its deadline (0: none).
    struct taken {
        std::unique_ptr<pending_call> call;
        std::chrono::milliseconds timeout{0};
        clock::time_point since{};  ///< when it was pushed
    };

    /// `timed_out_reason(timeout)` and `cancelled_reason` describe why a waiting call failed;
    /// `on_change` runs after a call left the queue by itself (deadline or cancellation).
    wait_queue(net::any_io_executor ex,
               std::function<std::string(std::chrono::milliseconds)> timed_out_reason,
               std::string cancelled_reason, std::function<void()> on_change = {})
        : shutdown_hook(ex),
          ex_(std::move(ex)),
          timed_out_reason_(std::move(timed_out_reason)),
          cancelled_reason_(std::move(cancelled_reason)),
          on_change_(std::move(on_change)) {}
    wait_queue(const wait_queue&) = delete;
    wait_queue& operator=(const wait_queue&) = delete;
    // Off the context's hooks first (see call_table's).
    ~wait_queue() { unhook(); }

    /// Applies to calls pushed from now on (set it before the first).
    void set_order(wait_order o) noexcept { order_ = o; }
    /// Told of each call the queue fails (its deadline, a cancellation, fail_all,
    /// fail_waiting_since), with the time it was pushed, just before its caller is.
    using failed_fn = std::function<void(const pending_call&, std::error_code, const std::string&,
                                         clock::time_point since)>;
    void on_failed(failed_fn f) { on_failed_ = std::move(f); }
    std::size_t size() const noexcept { return q_.size(); }
    bool empty() const noexcept { return q_.empty(); }
    /// Calls failed with errc::timed_out because their deadline passed while they waited.
    std::uint64_t expired() const noexcept { return expired_; }

    /// Adds `call`. A deadline (`timeout` > 0) or a cancellation through the call's slot
    /// takes it out and fails it with errc::timed_out or errc::cancelled.
    void push(std::unique_ptr<pending_call> call, std::chrono::milliseconds timeout) {
        const auto now = clock::now();
        const place at{order_ == wait_order::earliest_deadline && timeout.count() > 0
                           ? now + timeout
                           : clock::time_point::max(),
                       next_seq_++};
        entry& e = q_[at];
        e.since = now;
        e.watch.arm(ex_, timeout, *call, alive_, [this, at](errc why) { withdraw(at, why); });
        if (!call->options.key.empty()) by_key_[call->options.key].push_back(at);
        e.call = std::move(call);
    }

    /// Takes out the first call, in the queue's order, for which `fits(call)` holds (any,
    /// without `fits`). For a keyed call, the oldest waiting call of its key is the one asked
    /// and taken. Calls found past their deadline on the way, or with less of it left than
    /// `needed(call)` (they would not finish in time), are failed timed_out, never taken.
    std::optional<taken> take_first(
        const std::function<bool(const pending_call&)>& fits = {},
        const std::function<std::chrono::microseconds(const pending_call&)>& needed = {}) {
        const auto now = clock::now();
        std::vector<std::string_view> refused;  // keys `fits` said no to, in this pass
        for (auto it = q_.begin(); it != q_.end();) {
            auto at = it;
            const std::string& k = it->second.call->options.key;
            if (!k.empty()) {
                if (std::find(refused.begin(), refused.end(), k) != refused.end()) {
                    ++it;
                    continue;
                }
                at = q_.find(by_key_.at(k).front());
            }
            const auto need = needed && at->second.watch.deadline() != clock::time_point::max()
                                  ? needed(*at->second.call)
                                  : std::chrono::microseconds(0);
            if (at->second.watch.deadline() <= now + need) {
                // Due (its timer has not run yet: the loop was busy), or too close to it for
                // the time calls take: never send it.
                const place p = at->first;
                const auto left = std::chrono::duration_cast<std::chrono::microseconds>(
                    at->second.watch.deadline() - now);
                it = (at == it) ? std::next(it) : it;
                withdraw(p, errc::timed_out,
                         left.count() <= 0 ? std::string()
                                           : "not sent: " + std::to_string(left.count() / 1000) +
                                                 " ms of its deadline left, and calls of it "
                                                 "took " + std::to_string(need.count() / 2000) +
                                                 " ms lately");
                continue;
            }
            if (fits && !fits(*at->second.call)) {
                if (!k.empty()) refused.push_back(k);
                ++it;
                continue;
            }
            entry e = remove(at);
            e.watch.disarm(*e.call);  // the slot held the queue's handler; the connection sets its own
            return taken{std::move(e.call), e.watch.left(), e.since};
        }
        return std::nullopt;
    }

    /// Calls `f` on each waiting call, in the queue's order.
    void for_each(const std::function<void(const pending_call&)>& f) const {
        for (const auto& [at, e] : q_) f(*e.call);
    }

    /// When the oldest waiting call was pushed (nothing if none waits).
    std::optional<clock::time_point> oldest_since() const {
        std::optional<clock::time_point> t;
        for (const auto& [at, e] : q_)
            if (!t || e.since < *t) t = e.since;
        return t;
    }

    /// Fails the calls pushed at or before `t` with `ec` and `why`, oldest first.
    void fail_waiting_since(clock::time_point t, std::error_code ec, const std::string& why) {
        std::vector<place> due;
        for (const auto& [at, e] : q_)
            if (e.since <= t) due.push_back(at);
        std::sort(due.begin(), due.end(), [](const place& a, const place& b) { return a.seq < b.seq; });
        for (const place& p : due) {
            auto it = q_.find(p);
            if (it == q_.end()) continue;
            entry e = remove(it);
            e.watch.disarm(*e.call);
            failed(e, ec, why);
            fail_call(*e.call, ec, why);
        }
    }

    /// Fails the newest waiting call for which `which(call)` holds, with `ec` and `why`; false
    /// if there is none.
    bool fail_newest(const std::function<bool(const pending_call&)>& which, std::error_code ec,
                     const std::string& why) {
        auto newest = q_.end();
        for (auto it = q_.begin(); it != q_.end(); ++it)
            if (which(*it->second.call) && (newest == q_.end() || it->first.seq > newest->first.seq))
                newest = it;
        if (newest == q_.end()) return false;
        entry e = remove(newest);
        e.watch.disarm(*e.call);
        failed(e, ec, why);
        fail_call(*e.call, ec, why);
        return true;
    }

    /// Fails every waiting call with `ec` and `why`. Each is told to on_failed first, then
    /// every caller is: completing a call may let go of the queue's owner, so that loop
    /// touches nothing of the queue.
    void fail_all(std::error_code ec, const std::string& why) {
        auto all = std::move(q_);
        q_.clear();
        by_key_.clear();
        for (auto& [at, e] : all) {
            e.watch.disarm(*e.call);
            failed(e, ec, why);
        }
        for (auto& [at, e] : all) fail_call(*e.call, ec, why);
    }

  private:
    // The context is being destroyed: each caller is told, as a call table tells its own
    // (call_table::on_shutdown).
    void on_shutdown() noexcept override {
        fail_all(make_error_code(errc::closed),
                 "ordo: the io_context was destroyed while the call waited for a connection");
    }

    // Where a call stands: by deadline (max: none, or FIFO order), then by arrival.
    struct place {
        clock::time_point deadline;
        std::uint64_t seq;
        bool operator<(const place& o) const noexcept {
            return deadline != o.deadline ? deadline < o.deadline : seq < o.seq;
        }
    };
    struct entry {
        std::unique_ptr<pending_call> call;
        call_watch watch;
        clock::time_point since;
    };
    using queue_map = std::map<place, entry>;

    entry remove(typename queue_map::iterator it) {
        const std::string& k = it->second.call->options.key;
        if (!k.empty()) {
            auto kit = by_key_.find(k);
            auto& d = kit->second;
            d.erase(std::find_if(d.begin(), d.end(), [&](const place& p) {
                return p.seq == it->first.seq;
            }));
            if (d.empty()) by_key_.erase(kit);
        }
        entry e = std::move(it->second);
        q_.erase(it);
        return e;
    }

    void withdraw(place at, errc why, std::string reason = {}) {
        auto it = q_.find(at);
        if (it == q_.end()) return;
        entry e = remove(it);
        e.watch.disarm(*e.call);
        if (why == errc::timed_out) ++expired_;
        if (on_change_) on_change_();
        if (reason.empty())
            reason = why == errc::timed_out ? timed_out_reason_(e.watch.timeout()) : cancelled_reason_;
        failed(e, make_error_code(why), reason);
        fail_call(*e.call, why, std::move(reason));
    }

    void failed(const entry& e, std::error_code ec, const std::string& why) {
        if (on_failed_) on_failed_(*e.call, ec, why, e.since);
    }

    failed_fn on_failed_;
    net::any_io_executor ex_;
    std::shared_ptr<int> alive_ = std::make_shared<int>(0);  // handlers hold it weakly
    std::function<std::string(std::chrono::milliseconds)> timed_out_reason_;
    std::string cancelled_reason_;
    std::function<void()> on_change_;
    wait_order order_ = wait_order::earliest_deadline;
    queue_map q_;
    // Each key's waiting calls, oldest first (a key's turn goes to its oldest call).
    std::unordered_map<std::string, std::deque<place>> by_key_;
    std::uint64_t next_seq_ = 0;
    std::uint64_t expired_ = 0;
};

}  // namespace ordo::detail
