// ordo::run: a program's coroutine run to its end, in one call;
// ordo::run_spinning: an io_context loop for threads where latency matters more than a core;
// ordo::worker_pool: threads for handler bodies that should not run on an event loop.
#pragma once

#include "ordo/config.hpp"

#include <chrono>
#include <cstddef>
#include <memory>

#include "ordo/net.hpp"

namespace ordo {

/// Runs `main` on a fresh io_context in the calling thread until it and everything it started
/// on that io_context have finished, then rethrows what `main` threw, if anything:
/// `int main() { ordo::run(hello()); }`. Compiled once in libordo, so that a program's `main`
/// does not instantiate co_spawn.
void run(net::awaitable<void> main);

/// Runs `io` until it runs out of work or is stopped, like io_context::run(), but after the last
/// handler ran it keeps polling for `spin` before it sleeps in the kernel. A thread that sleeps
/// in epoll_wait pays a wake-up for the next message (tens of microseconds in a VM); one that
/// spins picks it up at once. The price is a core kept busy while waiting: use it on threads that
/// have a core of their own, with a spin of about one round trip (tens of microseconds).
/// spin = 0 is io.run(). Returns the number of handlers run.
std::size_t run_spinning(net::io_context& io, std::chrono::microseconds spin);

/// Threads for work that should not run on an event loop: handler_options::run_on and
/// batch_options::run_on take its executor (or a strand on it, make_strand()). A handler
/// offloaded there still answers on its connection's loop, in order.
class worker_pool {
  public:
    /// `threads` 0: one per core the machine has.
    explicit worker_pool(std::size_t threads = 0);
    /// Waits for the work given to it (running and queued), then joins its threads.
    ~worker_pool();
    worker_pool(const worker_pool&) = delete;
    worker_pool& operator=(const worker_pool&) = delete;

    /// Runs work on any of its threads, several at once.
    net::any_io_executor get_executor() const;
    /// A strand on the pool: work given to it runs one piece at a time, in order.
    net::any_io_executor make_strand() const;
    std::size_t size() const noexcept { return threads_; }
    /// Waits for the work given to it, then joins its threads; later work is not run.
    void join();

  private:
    struct impl;
    std::unique_ptr<impl> impl_;
    std::size_t threads_;
};

}  // namespace ordo
