// What an object starts on its executor and awaits nowhere (its children), owned and joined.
// A child is a coroutine (spawn()) or a single wait, post or callback that holds a ticket
// (hold()). close() cancels every coroutine still running (the operation it waits on ends with
// operation_aborted; one Asio cannot cancel, such as a host name lookup, runs to its end), and
// when_ended() runs its function once the scope is closed and its last child has ended. An
// object frees itself there, so that no child outlives what it touches: a child needs no
// token to find out whether its object still lives, only whether it is closing. A child that
// Asio destroys unrun with its io_context ends then. An exception that escapes a coroutine is
// rethrown from the executor (rethrow_escaped).
//
// Belongs to one executor: spawn() and close() run there. Tickets may end on any thread (a
// handler destroyed with its io_context); when_ended()'s function runs where the last one ends.
#pragma once

#include <atomic>
#include <cassert>
#include <functional>
#include <list>
#include <memory>
#include <utility>

#include "lib/escaped.hpp"
#include "ordo/net.hpp"

namespace ordo::detail {

class task_scope {
  public:
    explicit task_scope(net::any_io_executor ex) : ex_(std::move(ex)) {}
    // Only once ended: a scope whose owner never called when_ended() has no child left.
    ~task_scope() { assert(count_.load() <= 1); }
    task_scope(const task_scope&) = delete;
    task_scope& operator=(const task_scope&) = delete;

    /// One child: while a ticket (or a copy) lives, the scope has not ended.
    class ticket {
      public:
        ticket(const ticket& o) noexcept : s_(o.s_) {
            if (s_) s_->count_.fetch_add(1, std::memory_order_relaxed);
        }
        ticket(ticket&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
        ticket& operator=(ticket o) noexcept {
            std::swap(s_, o.s_);
            return *this;
        }
        ~ticket() {
            if (s_) s_->release();
        }

      private:
        friend class task_scope;
        explicit ticket(task_scope* s) noexcept : s_(s) {
            s_->count_.fetch_add(1, std::memory_order_relaxed);
        }
        task_scope* s_;
    };

    ticket hold() noexcept { return ticket(this); }

    /// Runs the coroutine `f()` (as net::co_spawn does) until it ends or the scope closes.
    /// Does nothing once the scope is closed.
    template <class F>
    void spawn(F&& f) {
        if (closed_) return;
        auto it = running_.emplace(running_.end());
        net::co_spawn(
            ex_, std::forward<F>(f),
            net::bind_cancellation_slot(it->slot(), [t = hold(), this, it](std::exception_ptr e) {
                running_.erase(it);
                rethrow_escaped{}(e);
            }));
    }

    /// Cancels every coroutine still running; later spawn()s do nothing.
    void close() {
        closed_ = true;
        for (auto& s : running_) s.emit(net::cancellation_type::terminal);
    }

    /// Closes the scope, and runs `done` once its last child has ended (at once if none runs).
    /// Called once, by the owner as it lets go; `done` usually frees the owner.
    void when_ended(std::function<void()> done) {
        close();
        done_ = std::move(done);
        release();
    }

    bool closed() const noexcept { return closed_; }
    /// Coroutines spawned here that have not ended.
    std::size_t running() const noexcept { return running_.size(); }

  private:
    void release() noexcept {
        if (count_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
            auto done = std::move(done_);
            if (done) done();
        }
    }

    net::any_io_executor ex_;
    std::list<net::cancellation_signal> running_;
    // The children, plus one for the owner until when_ended().
    std::atomic<std::size_t> count_{1};
    std::function<void()> done_;
    bool closed_ = false;
};

/// For an object whose last handle has gone, on any thread: on its state's executor (at once
/// when this thread runs it, else posted), `close(*s)` closes the state, whose scope
/// (`s->tasks`) then frees it once its last child has ended. If the io_context is destroyed
/// before the post runs, the state closes as the io_context is destroyed.
template <class State, class Close>
void close_and_join(std::unique_ptr<State> s, Close close) {
    struct teardown {
        std::unique_ptr<State> s;
        Close close;
        void operator()() { run(); }
        teardown(std::unique_ptr<State> st, Close c) : s(std::move(st)), close(std::move(c)) {}
        teardown(teardown&&) noexcept = default;
        ~teardown() { run(); }  // destroyed unrun with its io_context
        void run() {
            if (!s) return;
            State* st = s.release();
            close(*st);
            st->tasks.when_ended([st] { delete st; });
        }
    };
    auto ex = s->ex;
    net::dispatch(ex, teardown(std::move(s), std::move(close)));
}

}  // namespace ordo::detail
