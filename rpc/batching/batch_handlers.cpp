#include "ordo/rpc/detail/batcher.hpp"

#include <algorithm>
#include <optional>

#include <asio/bind_cancellation_slot.hpp>

#include "lib/escaped.hpp"
#include "ordo/rpc/detail/handler_entry.hpp"
#include "ordo/rpc/handlers.hpp"
#include "rpc/context/context.hpp"

namespace ordo::detail {

using clock = std::chrono::steady_clock;

namespace {
// A caller of a streaming batch that holds max_buffered items and sends none of them for this
// long is left behind: the batch goes on without waiting for it (it may be reading slowly, and
// tells only as each half window is read), and it fails once it holds a window's worth
// (docs/streams-and-batches.md, "Streaming batches").
constexpr auto left_behind_after = std::chrono::seconds(1);
constexpr std::size_t left_behind_items = default_stream_window;
constexpr std::size_t left_behind_bytes = default_stream_window_bytes;
}  // namespace

net::any_io_executor batcher_core::home(const net::any_io_executor& caller) {
    std::lock_guard lock(mutex_);
    if (!ex_) {
        ex_ =
            o_.run_on ? net::any_io_executor(net::make_strand(o_.run_on)) : without_context(caller);
        wait_timer_ = std::make_unique<net::steady_timer>(ex_);
    }
    return ex_;
}

// Runs `f` on the home executor: inline when already there, else posted. Before any call came,
// there is no home and nothing to touch but what f sets itself: it runs inline.
template <class F>
void batcher_core::at_home(F f) {
    net::any_io_executor ex;
    {
        std::lock_guard lock(mutex_);
        ex = ex_;
    }
    if (!ex) return f();
    net::dispatch(ex, [self = shared_from_this(), f = std::move(f)]() mutable { f(); });
}

// The element's outcome is set: wake its caller on the caller's executor.
void batcher_core::finish(const std::shared_ptr<batch_element>& e) {
    net::dispatch(e->done_event.get_executor(), [e] {
        e->done = true;
        e->done_event.cancel();
    });
}

void stream_room::bump() {
    std::unique_ptr<parked> w;
    {
        std::lock_guard lk(mu_);
        ++bumps_;
        w = std::move(waiter_);
    }
    if (w) w->wake();
}

namespace {
// Wakes a caller of a streaming batch on its own loop.
void wake_caller(const std::shared_ptr<stream_element>& e) {
    net::dispatch(e->done_event.get_executor(), [e] { e->done_event.cancel(); });
}
}  // namespace

stream_batch::stream_batch(std::string name, std::vector<std::shared_ptr<stream_element>> callers,
                           const std::atomic<std::size_t>* queued)
    : name_(std::move(name)), callers_(std::move(callers)), queued_(queued) {
    open_.reserve(callers_.size());
    for (std::size_t i = 0; i < callers_.size(); ++i) {
        std::lock_guard lk(callers_[i]->mu);
        callers_[i]->room = room_;
        if (!callers_[i]->gone) open_.push_back(i);
    }
}

stream_batch::~stream_batch() {
    for (auto& c : callers_) {
        std::lock_guard lk(c->mu);
        c->room.reset();
    }
}

void stream_batch::check_size(std::size_t n) const {
    if (closed_)
        throw_error(errc::cancelled, "batch handler " + name_ + " is stopping: its batch closed");
    if (n != open_.size())
        throw_error(errc::remote_error, "batch handler " + name_ + " gave a step of " +
                                            std::to_string(n) + " entries for " +
                                            std::to_string(open_.size()) + " open callers");
}

void stream_batch::item(std::size_t k, buffer packed) {
    auto& e = at(k);
    std::lock_guard lk(e.mu);
    if (e.gone || e.ended) return;
    // One item, however large, is always taken: the window counts what waits beside it.
    if (e.left_behind && !e.items.empty() &&
        (e.items.size() >= left_behind_items ||
         e.queued_bytes + packed.size() > left_behind_bytes)) {
        // What it holds stays, to be read before the failure.
        e.error = errc::overloaded;
        e.error_text = "the caller reads too slowly: batch handler " + name_ + " holds " +
                       std::to_string(e.items.size()) + " items (" +
                       std::to_string(e.queued_bytes) +
                       " bytes) for it beyond its credit, and went on without it";
        e.ended = true;
        return;
    }
    e.queued_bytes += packed.size();
    e.items.push_back(std::move(packed));
}

void stream_batch::end(std::size_t k) {
    auto& e = at(k);
    std::lock_guard lk(e.mu);
    e.ended = true;
}

void stream_batch::fail(std::size_t k, errc code, std::string text) {
    auto& e = at(k);
    std::lock_guard lk(e.mu);
    if (e.ended) return;
    e.error = code;
    e.error_text = std::move(text);
    e.ended = true;
}

void stream_batch::commit() {
    std::vector<std::size_t> still;
    still.reserve(open_.size());
    for (std::size_t i : open_) {
        auto& e = callers_[i];
        bool keep;
        {
            std::lock_guard lk(e->mu);
            keep = !e->ended && !e->gone;
        }
        wake_caller(e);
        if (keep) still.push_back(i);
    }
    open_ = std::move(still);
}

void stream_batch::close(errc code, const std::string& text) {
    closed_ = true;
    for (auto& e : callers_) {
        {
            std::lock_guard lk(e->mu);
            if (e->ended || e->gone) continue;
            e->error = code;
            e->error_text = text;
            e->ended = true;
        }
        wake_caller(e);
    }
    room_->bump();  // a step waiting for room ends
}

// Waits while an open caller holds max_buffered items or more. One that holds them and sends
// none for left_behind_after is left behind, so that the batch no longer waits for it, but only
// if another caller would gain: one of the batch that has room, or a call queued for the next
// batch. A lone slow reader is waited for, as long as it takes.
net::awaitable<void> stream_batch::wait_room() {
    struct full_caller {
        std::size_t i;            // in callers_
        std::size_t held;         // items it holds unsent
        clock::time_point since;  // when it was first seen holding them
    };
    std::vector<full_caller> watched;
    std::optional<net::steady_timer> timer;
    for (;;) {
        const std::uint64_t seen = room_->seen();  // before anything is looked at
        if (closed_) co_return;
        const auto now = clock::now();
        std::vector<full_caller> full;
        std::vector<stream_element*> due;  // stalled long enough to be left behind
        bool others_gain = queued_ && queued_->load(std::memory_order_relaxed) > 0;
        for (std::size_t i : open_) {
            auto& e = *callers_[i];
            std::lock_guard lk(e.mu);
            if (e.gone || e.left_behind) continue;
            const std::size_t held = e.items.size() + e.taken;
            if (held < max_buffered) {
                others_gain = true;
                continue;
            }
            // Still holding what it held: it has sent nothing since.
            auto w = std::find_if(watched.begin(), watched.end(), [&](const full_caller& f) {
                return f.i == i && f.held == held;
            });
            const auto since = w == watched.end() ? now : w->since;
            if (now - since >= left_behind_after) due.push_back(&e);
            full.push_back({i, held, since});
        }
        if (full.empty()) co_return;
        if (!due.empty() && others_gain) {
            for (auto* e : due) {
                std::lock_guard lk(e->mu);
                e->left_behind = true;
            }
            watched.clear();
            continue;  // look again: those left behind no longer count
        }
        watched = std::move(full);
        // Woken by a caller that sends items or leaves, when the first one's time is up, or,
        // once it is up with nobody to gain, each left_behind_after to see whether a call queued.
        auto first = clock::time_point::max();
        for (const auto& f : watched) first = std::min(first, f.since + left_behind_after);
        if (first <= now) first = now + left_behind_after;
        if (!timer) timer.emplace(co_await net::this_coro::executor);
        timer->expires_at(first);
        timer->async_wait([room = room_](std::error_code ec) {
            if (!ec) room->bump();
        });
        co_await room_->wait(seen);
        timer->cancel();
    }
}

void stream_batch::fail_open(errc code, const std::string& text) {
    for (std::size_t k = 0; k < open_.size(); ++k) fail(k, code, text);
    commit();
}

net::awaitable<void> batcher_core::submit_stream(std::shared_ptr<stream_element> e,
                                                 stream_out& out) {
    auto self = shared_from_this();
    const auto ex = home(co_await net::this_coro::executor);
    ++waiters_;
    net::dispatch(ex, [self, e] { self->enqueue(e); });
    std::deque<buffer> got;
    std::exception_ptr left;
    try {
        for (;;) {
            bool ended = false;
            std::shared_ptr<stream_room> room;
            {
                std::lock_guard lk(e->mu);
                got.swap(e->items);
                e->taken = got.size();
                e->queued_bytes = 0;
                ended = e->ended;
                room = e->room;
            }
            if (!got.empty()) {
                for (std::size_t k = 0; k < got.size(); ++k) {
                    if (!out.has_credit()) {
                        // What it still holds: the batch sees that it reads (wait_room).
                        {
                            std::lock_guard lk(e->mu);
                            e->taken = got.size() - k;
                        }
                        if (room) room->bump();
                        co_await out.wait_credit();
                    }
                    buffer& o = out.begin_item();
                    o.write(got[k].data(), got[k].size());
                    out.end_item();
                }
                got.clear();
                {
                    std::lock_guard lk(e->mu);
                    e->taken = 0;
                    // Caught up with what the batch gave it: the batch waits for it again.
                    if (e->items.empty()) e->left_behind = false;
                }
                if (room) room->bump();  // the batch may wait for this caller's room
                continue;
            }
            if (ended || e->done) break;
            co_await e->done_event.async_wait(use_tuple);
            auto cs = co_await net::this_coro::cancellation_state;
            if (cs.cancelled() != net::cancellation_type::none)
                throw_error(errc::cancelled,
                            "stream cancelled while batch handler " + name_ + " was producing it");
        }
    } catch (...) {
        left = std::current_exception();
    }
    if (left) {
        // Cancelled, or the connection ended: leave the queue, or the running batch.
        std::shared_ptr<stream_room> room;
        {
            std::lock_guard lk(e->mu);
            e->gone = true;
            e->items.clear();
            e->taken = 0;
            e->queued_bytes = 0;
            room = e->room;
        }
        if (room) room->bump();
        net::dispatch(ex, [self, e] { self->withdraw(e); });
        std::rethrow_exception(left);
    }
    --waiters_;
    errc code{};
    std::string text;
    {
        std::lock_guard lk(e->mu);
        code = e->error;
        text = e->error_text;
    }
    if (code != errc{}) throw_error(code, text);
}

net::awaitable<void> batcher_core::submit(std::shared_ptr<batch_element> e, buffer& out) {
    auto self = shared_from_this();
    const auto ex = home(co_await net::this_coro::executor);
    ++waiters_;
    net::dispatch(ex, [self, e] { self->enqueue(e); });
    while (!e->done) {
        co_await e->done_event.async_wait(use_tuple);
        if (e->done) break;
        auto cs = co_await net::this_coro::cancellation_state;
        if (cs.cancelled() == net::cancellation_type::none) continue;
        // Cancelled (ordo.cancel, a deadline, or the peer died): leave a batch not yet started
        // (a batch that has started goes on; its result for this call is dropped).
        net::dispatch(ex, [self, e] { self->withdraw(e); });
        throw_error(errc::cancelled, "call cancelled while waiting for batch handler " + name_);
    }
    --waiters_;
    if (e->error != errc{}) throw_error(e->error, e->error_text);
    out.write(e->result.data(), e->result.size());
}

// On home.
void batcher_core::enqueue(const std::shared_ptr<batch_element>& e) {
    if (stopped_) {
        e->error = errc::shutting_down;
        e->error_text = "batch handler " + name_ + " is stopping";
        return finish(e);
    }
    if (queue_.size() >= o_.max_queued) {
        e->error = errc::overloaded;
        e->error_text =
            std::to_string(queue_.size()) + " calls already wait for batch handler " + name_;
        return finish(e);
    }
    e->arrived = clock::now();
    queue_.push_back(e);
    set_queued(queue_.size());
    maybe_run();
}

// On home: the caller of `e` left. When every caller of a running batch has, it is cancelled.
void batcher_core::withdraw(const std::shared_ptr<batch_element>& e) {
    --waiters_;
    if (running_batch* rb = e->in) {
        if (++rb->left == rb->size && !rb->cancelled) {
            rb->cancelled = true;
            rb->signal.emit(net::cancellation_type::terminal);
        }
        return;
    }
    auto it = std::find(queue_.begin(), queue_.end(), e);
    if (it == queue_.end()) return;
    queue_.erase(it);
    set_queued(queue_.size());
    maybe_run();
}

void batcher_core::track(stream_batch* sb) {
    std::lock_guard lock(streams_mutex_);
    running_streams_.push_back(sb);
    if (stopped_) sb->close(errc::cancelled, "batch handler " + name_ + " stopped");
}

void batcher_core::untrack(stream_batch* sb) {
    std::lock_guard lock(streams_mutex_);
    running_streams_.erase(std::find(running_streams_.begin(), running_streams_.end(), sb));
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
        auto rb = std::make_shared<running_batch>();
        rb->size = b.size();
        for (auto& e : b) e->in = rb.get();
        running_batches_.push_back(rb);
        // The completion keeps `rb`, and with it the signal its coroutine is bound to, until
        // that coroutine is over.
        net::co_spawn(ex_, run(std::move(b), rb),
                      net::bind_cancellation_slot(rb->signal.slot(), [rb](std::exception_ptr e) {
                          detail::rethrow_escaped{}(e);
                      }));
    }
    set_queued(queue_.size());
    publish();
    arm_wait();
}

void batcher_core::publish() {
    std::lock_guard lock(mutex_);
    published_ = stats_;
}

batch_stats batcher_core::stats() const {
    std::lock_guard lock(mutex_);
    return published_;
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

// The user's function, with its failures turned into the calls' errors.
net::awaitable<void> batcher_core::run_here(batch& b, std::stop_token stop) {
    try {
        co_await run_batch(b, std::move(stop));
    } catch (const std::exception& e) {
        fail_all(b, errc::remote_error, "batch handler " + name_ + " failed: " + e.what());
    } catch (...) {
        // Not a std::exception: its callers still get an answer, and the batch slot is freed.
        fail_all(b, errc::remote_error, "batch handler " + name_ + " failed: unknown exception");
    }
}

net::awaitable<void> batcher_core::run(batch b, std::shared_ptr<running_batch> rb) {
    auto self = shared_from_this();
    // On the worker executor (batch_options::run_on), else on a strand of home; back here when
    // it is done. run_offloaded passes this coroutine's cancellation (rb->signal) over to it.
    try {
        co_await run_offloaded(o_.run_on,
                               [&](std::stop_token stop) { return run_here(b, std::move(stop)); });
    } catch (...) {
        // Only errc::cancelled gets here (run_here catches the rest): a streaming batch's
        // callers have ended or left already; a plain batch's have all left.
        if (!streams_)
            fail_all(b, errc::cancelled, "batch handler " + name_ + " cancelled: its callers left");
    }
    for (auto& e : b) {
        e->in = nullptr;
        finish(e);
    }
    running_batches_.erase(std::find(running_batches_.begin(), running_batches_.end(), rb));
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

net::awaitable<void> batcher_core::async_wait_idle() {
    auto self = shared_from_this();
    // Polled: the count is kept on other executors, and this wait must stay cancellable here.
    net::steady_timer tick(co_await net::this_coro::executor);
    while (waiters_.load() > 0) {
        tick.expires_after(std::chrono::milliseconds(5));
        co_await tick.async_wait(use_tuple);
        auto cs = co_await net::this_coro::cancellation_state;
        if (cs.cancelled() != net::cancellation_type::none) co_return;
    }
}

void batcher_core::stop() {
    stopped_ = true;
    if (streams_) {
        std::lock_guard lock(streams_mutex_);
        for (stream_batch* sb : running_streams_)
            sb->close(errc::cancelled, "batch handler " + name_ + " stopped");
    }
    at_home([this] {
        if (streams_)
            for (auto& rb : running_batches_) {
                if (rb->cancelled) continue;
                rb->cancelled = true;
                rb->signal.emit(net::cancellation_type::terminal);
            }
        auto queued = std::move(queue_);
        queue_.clear();
        set_queued(0);
        for (auto& e : queued) {
            e->error = errc::shutting_down;
            e->error_text = "server stopping: batch handler " + name_ + " did not run this call";
            finish(e);
        }
        if (wait_timer_) wait_timer_->cancel();
        publish();
    });
}

void batcher_core::set_max_batch_size(std::size_t n) {
    at_home([this, n] {
        o_.max_batch_size = std::max<std::size_t>(1, n);
        maybe_run();
    });
}

void batcher_core::set_max_wait(std::chrono::milliseconds w) {
    at_home([this, w] {
        o_.max_wait = w;
        maybe_run();
    });
}

}  // namespace ordo::detail

namespace ordo {

net::awaitable<void> handlers::async_wait_batches() const {
    for (const auto& b : batchers_) co_await b.core->async_wait_idle();
}

}  // namespace ordo
