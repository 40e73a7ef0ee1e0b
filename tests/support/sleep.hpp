// Simulated work for test handlers: a timer wait on the current executor.
#pragma once

#include <chrono>
#include <system_error>

#include "ordo/net.hpp"

namespace ordo::test {

/// Waits `d` on the current executor. Throws std::system_error (operation_aborted) when the
/// wait is cancelled, as a cancelled handler's work would; tests count cancellations by it.
/// Not for waiting until things settle: wait_until (run_test.hpp) waits for a condition.
inline net::awaitable<void> sleep_for(std::chrono::milliseconds d) {
    net::steady_timer t(co_await net::this_coro::executor, d);
    co_await t.async_wait(net::use_awaitable);
}

/// Waits `d` on the current executor; a cancelled wait ends early, without an error.
inline net::awaitable<void> sleep_quietly(std::chrono::milliseconds d) {
    net::steady_timer t(co_await net::this_coro::executor, d);
    co_await t.async_wait(net::experimental::as_tuple(net::use_awaitable));
}

/// sleep_for, adding one to `cancelled` when the wait is cancelled (the error is rethrown):
/// how tests see that a call's cancellation reached its handler.
/// (`Counter`: an int, or a std::atomic<int> read from other threads.)
template <class Counter>
net::awaitable<void> sleep_counting_cancels(std::chrono::milliseconds d, Counter& cancelled) {
    try {
        co_await sleep_for(d);
    } catch (const std::system_error&) {
        ++cancelled;
        throw;
    }
}

}  // namespace ordo::test
