// The coroutines an object starts on its executor and awaits nowhere, owned: each is bound to a
// cancellation signal of the scope, and close() cancels every one still running (the operation
// it waits on ends with operation_aborted), so that a closed object is let go by what it
// started at once, not when each wait would have ended (an operation Asio cannot cancel, such
// as a host name lookup, still runs to its end). What a coroutine holds (its owner, kept
// alive while it runs) stays its own business; the scope ends it, and forgets it once it has
// ended. An exception that escapes one is rethrown from the executor (rethrow_escaped).
// Belongs to one executor: spawn() and close() run there.
#pragma once

#include <list>
#include <memory>
#include <utility>

#include "lib/escaped.hpp"
#include "ordo/net.hpp"

namespace ordo::detail {

class task_scope {
  public:
    explicit task_scope(net::any_io_executor ex) : ex_(std::move(ex)) {}
    ~task_scope() { close(); }
    task_scope(const task_scope&) = delete;
    task_scope& operator=(const task_scope&) = delete;

    /// Runs the coroutine `f()` (as net::co_spawn does) until it ends or the scope closes.
    /// Does nothing once the scope is closed.
    template <class F>
    void spawn(F&& f) {
        if (closed_) return;
        auto it = running_->emplace(running_->end());
        net::co_spawn(
            ex_, std::forward<F>(f),
            net::bind_cancellation_slot(it->slot(), [running = running_, it](std::exception_ptr e) {
                running->erase(it);
                rethrow_escaped{}(e);
            }));
    }

    /// Cancels every coroutine still running; later spawn()s do nothing.
    void close() {
        closed_ = true;
        for (auto& s : *running_) s.emit(net::cancellation_type::terminal);
    }

    bool closed() const noexcept { return closed_; }
    /// Coroutines spawned here that have not ended.
    std::size_t running() const noexcept { return running_->size(); }

  private:
    net::any_io_executor ex_;
    // Shared with the completions: a coroutine may end after the scope (and its owner) are gone.
    std::shared_ptr<std::list<net::cancellation_signal>> running_ =
        std::make_shared<std::list<net::cancellation_signal>>();
    bool closed_ = false;
};

}  // namespace ordo::detail
