// What an object does when its io_context is destroyed while the object still holds callers'
// completion handlers outside Asio: a call table's waiting calls, a queue of calls waiting for
// a connection, a stream's parked reader or writer. Asio destroys the handlers of its own
// operations as their context shuts down; these it cannot see. A handler is often a coroutine
// frame that holds a channel, and so the very object that holds the handler: without the hook
// the two keep each other alive, and both leak with everything they own.
#pragma once

#include "ordo/net.hpp"

namespace ordo::detail {

struct hook_list;

/// Registered with its executor's execution context while it lives. When the context shuts
/// down first (io_context's destructor), on_shutdown() runs once, on the thread destroying it.
class shutdown_hook {
  public:
    explicit shutdown_hook(const net::any_io_executor& ex);
    shutdown_hook(const shutdown_hook&) = delete;
    shutdown_hook& operator=(const shutdown_hook&) = delete;

  protected:
    ~shutdown_hook();
    /// Takes this hook off its context. If the context's destruction has taken it already, on
    /// another thread, waits until its on_shutdown() no longer touches this object. A class
    /// that may be destroyed on another thread than its context's calls it first in its
    /// destructor, so that on_shutdown() never runs on a half-destroyed object.
    void unhook() noexcept;
    /// From on_shutdown(): this object is no longer touched, and may be destroyed (on another
    /// thread) from here on, while on_shutdown() goes on to let go of what it took out of it.
    void shutdown_done() noexcept;

  private:
    friend struct hook_list;
    /// Lets the handlers held go: completes them through their own executors (those of this
    /// context are queued there, and destroyed unrun with it), or destroys them unrun. What
    /// they own may free this object: nothing of it is touched after that, or after
    /// shutdown_done().
    virtual void on_shutdown() noexcept = 0;

    hook_list* list_;  // the context's hooks, shared with its service; null once unhooked
    shutdown_hook* prev_ = nullptr;
    shutdown_hook* next_ = nullptr;
    bool linked_ = false;  // under the list's lock
};

}  // namespace ordo::detail
