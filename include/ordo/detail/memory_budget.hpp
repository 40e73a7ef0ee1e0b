// One limit on the memory a server's connections hold for their peers (server_options::
// memory_budget): read buffers with the incomplete messages in them, queued incoming messages,
// output not yet written, and resend buffers. Every connection of the server charges the same
// budget; the budget itself decides nothing. Its users do (batched_comm stops growing a read
// buffer and stops reading for a peer that does not read its output; the dispatcher stops
// reading while its queue is charged; the server drops a connection whose output does not
// drain). Safe to use from several threads.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <mutex>
#include <vector>

namespace ordo::detail {

class memory_budget {
  public:
    explicit memory_budget(std::size_t limit) : limit_(limit) {}
    memory_budget(const memory_budget&) = delete;
    memory_budget& operator=(const memory_budget&) = delete;

    std::size_t limit() const noexcept { return limit_; }
    std::size_t used() const noexcept { return used_.load(std::memory_order_relaxed); }
    /// True when `more` bytes would not fit (always false for 0 bytes below the limit).
    bool over(std::size_t more = 0) const noexcept {
        const std::size_t u = used();
        return u >= limit_ || more > limit_ - u;
    }

    void charge(std::size_t n) noexcept { used_.fetch_add(n, std::memory_order_relaxed); }
    /// Gives back `n` bytes charged earlier, and wakes the waiters that now fit.
    void release(std::size_t n);

    /// Unless `more` bytes fit now (then it returns false and keeps nothing), keeps `wake` and
    /// calls it once, from the thread of some later release(), when they do. `wake` must be
    /// cheap and must not call into the budget (post to an executor and return).
    bool wait_for(std::size_t more, std::function<void()> wake);

    /// Moves `held` to `now` (charging or releasing the difference).
    void adjust(std::size_t& held, std::size_t now) {
        if (now > held)
            charge(now - held);
        else if (now < held)
            release(held - now);
        held = now;
    }

  private:
    struct waiter {
        std::size_t more;
        std::function<void()> wake;
    };
    const std::size_t limit_;
    std::atomic<std::size_t> used_{0};
    std::atomic<bool> has_waiters_{false};
    std::mutex m_;
    std::vector<waiter> waiters_;
};

}  // namespace ordo::detail
