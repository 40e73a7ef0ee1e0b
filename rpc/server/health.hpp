// detail::health_board: the health states of a server's services and the ordo.health_watch
// streams that follow them (rpc/server/health.cpp; docs/protocol.md, "Health").
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "ordo/net.hpp"
#include "ordo/rpc/handlers.hpp"
#include "ordo/rpc/health.hpp"

namespace ordo::detail {

// The states by service, and the watchers to wake when one changes. Any thread.
class health_board {
  public:
    // One ordo.health_watch, on its connection's loop: woken there (wake()) when a state
    // changes. `pending` says a change came while it was not waiting.
    struct watcher {
        net::any_io_executor ex;
        net::steady_timer* timer = nullptr;  // null once the watch has ended
        bool pending = false;
        std::atomic<std::uint64_t> seen{0};  // the generation its last item (or check) showed
    };

    health_board() { states_.emplace(std::string(), health_state::serving); }

    void set(std::string_view service, health_state s) {
        std::lock_guard lock(mu_);
        auto it = states_.find(service);
        if (it == states_.end())
            states_.emplace(std::string(service), s);
        else if (it->second == s)
            return;
        else
            it->second = s;
        wake_all();
    }
    void set_every(health_state s) {
        std::lock_guard lock(mu_);
        for (auto& [name, state] : states_) state = s;
        wake_all();
    }
    std::optional<health_state> get(std::string_view service) const {
        return get_with_generation(service).first;
    }
    // The state, and the generation (how many changes so far) it belongs to.
    std::pair<std::optional<health_state>, std::uint64_t> get_with_generation(
        std::string_view service) const {
        std::lock_guard lock(mu_);
        auto it = states_.find(service);
        if (it == states_.end()) return {std::nullopt, generation_};
        return {it->second, generation_};
    }
    std::uint64_t generation() const {
        std::lock_guard lock(mu_);
        return generation_;
    }
    // Whether every watcher has written (or found nothing to write for) `g`'s states.
    bool heard(std::uint64_t g) const {
        std::lock_guard lock(mu_);
        for (const auto& w : watchers_)
            if (w->seen.load(std::memory_order_acquire) < g) return false;
        return true;
    }
    std::list<std::shared_ptr<watcher>>::iterator watch(std::shared_ptr<watcher> w) {
        std::lock_guard lock(mu_);
        return watchers_.insert(watchers_.end(), std::move(w));
    }
    void unwatch(std::list<std::shared_ptr<watcher>>::iterator it) {
        std::lock_guard lock(mu_);
        watchers_.erase(it);
    }

  private:
    void wake_all() {
        ++generation_;
        for (const auto& w : watchers_)
            net::post(w->ex, [w] {
                w->pending = true;
                if (w->timer) w->timer->cancel();
            });
    }

    mutable std::mutex mu_;
    std::map<std::string, health_state, std::less<>> states_;
    std::list<std::shared_ptr<watcher>> watchers_;
    std::uint64_t generation_ = 0;
};

/// Waits until every ordo.health_watch of `h` has written the states set so far, or `limit`
/// has passed (a drain's goaway follows the "draining" item on each connection).
net::awaitable<void> tell_health_watchers(const handlers& h, std::chrono::milliseconds limit);

}  // namespace ordo::detail
