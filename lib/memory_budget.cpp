#include "ordo/detail/memory_budget.hpp"

#include <utility>

namespace ordo::detail {

void memory_budget::release(std::size_t n) {
    used_.fetch_sub(n, std::memory_order_seq_cst);
    if (!has_waiters_.load(std::memory_order_seq_cst)) return;
    std::vector<std::function<void()>> ready;
    {
        std::lock_guard lock(m_);
        for (auto it = waiters_.begin(); it != waiters_.end();) {
            if (!over(it->more)) {
                ready.push_back(std::move(it->wake));
                it = waiters_.erase(it);
            } else {
                ++it;
            }
        }
        has_waiters_.store(!waiters_.empty(), std::memory_order_seq_cst);
    }
    for (auto& f : ready) f();
}

bool memory_budget::wait_for(std::size_t more, std::function<void()> wake) {
    std::lock_guard lock(m_);
    // Set before looking at `used`: a release() that lowers it after this look sees the flag
    // and takes the lock, so the wake-up cannot fall between the look and the registration.
    has_waiters_.store(true, std::memory_order_seq_cst);
    if (!over(more)) {
        has_waiters_.store(!waiters_.empty(), std::memory_order_seq_cst);
        return false;
    }
    waiters_.push_back({more, std::move(wake)});
    return true;
}

}  // namespace ordo::detail
