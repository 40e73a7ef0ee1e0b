// ordo::run_spinning: an io_context loop for threads where latency matters more than a core.
#pragma once

#include "ordo/config.hpp"

#include <chrono>
#include <cstddef>

#include "ordo/net.hpp"

namespace ordo {

/// Runs `io` until it runs out of work or is stopped, like io_context::run(), but after the last
/// handler ran it keeps polling for `spin` before it sleeps in the kernel. A thread that sleeps
/// in epoll_wait pays a wake-up for the next message (tens of microseconds in a VM); one that
/// spins picks it up at once. The price is a core kept busy while waiting: use it on threads that
/// have a core of their own, with a spin of about one round trip (tens of microseconds).
/// spin = 0 is io.run(). Returns the number of handlers run.
std::size_t run_spinning(net::io_context& io, std::chrono::microseconds spin);

}  // namespace ordo
