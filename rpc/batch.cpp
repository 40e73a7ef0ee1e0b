#include "ordo/detail/batcher.hpp"

#include <algorithm>

#include "lib/escaped.hpp"
#include "ordo/handlers.hpp"

namespace ordo::detail {

using clock = std::chrono::steady_clock;

net::awaitable<void> batcher_core::submit(std::shared_ptr<batch_element> e, buffer& out) {
    auto self = shared_from_this();
    if (!wait_timer_) {
        ex_ = co_await net::this_coro::executor;
        wait_timer_ = std::make_unique<net::steady_timer>(ex_);
    }
    if (stopped_) throw_error(errc::shutting_down, "batch handler " + name_ + " is stopping");
    if (queue_.size() >= o_.max_queued)
        throw_error(errc::overloaded, std::to_string(queue_.size()) +
                                          " calls already wait for batch handler " + name_);
    e->arrived = clock::now();
    queue_.push_back(e);
    ++waiters_;
    stats_.queued = queue_.size();
    maybe_run();
    while (!e->done) {
        co_await e->done_event.async_wait(use_tuple);
        if (e->done) break;
        auto cs = co_await net::this_coro::cancellation_state;
        if (cs.cancelled() == net::cancellation_type::none) continue;
        // Cancelled (ordo.cancel, a deadline, or the peer died): leave a batch not yet started.
        waiter_left();
        auto it = std::find(queue_.begin(), queue_.end(), e);
        if (it != queue_.end()) {
            queue_.erase(it);
            stats_.queued = queue_.size();
            maybe_run();
        }
        throw_error(errc::cancelled, "call cancelled while waiting for batch handler " + name_);
    }
    waiter_left();
    if (e->error != errc{}) throw_error(e->error, e->error_text);
    out.write(e->result.data(), e->result.size());
}

void batcher_core::maybe_run() {
    if (!wait_timer_) return;
    const auto now = clock::now();
    while (running_ < o_.max_concurrent_batches && !queue_.empty()) {
        const bool full = queue_.size() >= o_.max_batch_size;
        const bool waited = now >= queue_.front()->arrived + o_.max_wait;
        if (!full && !waited) break;
        const std::size_t n = std::min(queue_.size(), std::max<std::size_t>(1, o_.max_batch_size));
        batch b(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(n));
        queue_.erase(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(n));
        ++running_;
        stats_.running = running_;
        net::co_spawn(ex_, run(std::move(b)), detail::rethrow_escaped{});
    }
    stats_.queued = queue_.size();
    arm_wait();
}

void batcher_core::arm_wait() {
    if (queue_.empty() || running_ >= o_.max_concurrent_batches) {
        wait_timer_->cancel();
        return;
    }
    wait_timer_->expires_at(queue_.front()->arrived + o_.max_wait);
    std::weak_ptr<batcher_core> w = weak_from_this();
    wait_timer_->async_wait([w](std::error_code ec) {
        if (ec) return;
        if (auto self = w.lock()) self->maybe_run();
    });
}

net::awaitable<void> batcher_core::run(batch b) {
    auto self = shared_from_this();
    try {
        co_await run_batch(b);
    } catch (const std::exception& e) {
        fail_all(b, errc::remote_error, "batch handler " + name_ + " failed: " + e.what());
    } catch (...) {
        // Not a std::exception: its callers still get an answer, and the batch slot is freed.
        fail_all(b, errc::remote_error, "batch handler " + name_ + " failed: unknown exception");
    }
    for (auto& e : b) {
        e->done = true;
        e->done_event.cancel();
    }
    ++stats_.batches;
    stats_.calls += b.size();
    ++stats_.size_histogram[b.size()];
    --running_;
    stats_.running = running_;
    maybe_run();
}

void batcher_core::fail_all(batch& b, errc code, const std::string& text) {
    for (auto& e : b) {
        e->error = code;
        e->error_text = text;
        e->result.clear();
    }
}

void batcher_core::waiter_left() {
    if (--waiters_ == 0 && idle_event_) idle_event_->cancel();
}

net::awaitable<void> batcher_core::async_wait_idle() {
    auto self = shared_from_this();
    while (waiters_ > 0) {
        if (!idle_event_)
            idle_event_ = std::make_unique<net::steady_timer>(co_await net::this_coro::executor,
                                                              clock::time_point::max());
        co_await idle_event_->async_wait(use_tuple);
        auto cs = co_await net::this_coro::cancellation_state;
        if (cs.cancelled() != net::cancellation_type::none) co_return;
    }
}

void batcher_core::stop() {
    stopped_ = true;
    auto queued = std::move(queue_);
    queue_.clear();
    stats_.queued = 0;
    for (auto& e : queued) {
        e->error = errc::shutting_down;
        e->error_text = "server stopping: batch handler " + name_ + " did not run this call";
        e->done = true;
        e->done_event.cancel();
    }
    if (wait_timer_) wait_timer_->cancel();
}

void batcher_core::set_max_batch_size(std::size_t n) {
    o_.max_batch_size = std::max<std::size_t>(1, n);
    maybe_run();
}

void batcher_core::set_max_wait(std::chrono::milliseconds w) {
    o_.max_wait = w;
    maybe_run();
}

}  // namespace ordo::detail

namespace ordo {

net::awaitable<void> handlers::async_wait_batches() const {
    for (const auto& b : batchers_) co_await b.core->async_wait_idle();
}

}  // namespace ordo
