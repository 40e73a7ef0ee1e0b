// Runs a test coroutine on a fresh io_context under a wall-clock watchdog.
#pragma once

#include <chrono>
#include <exception>
#include <functional>

#include <gtest/gtest.h>

#include "ordo/net.hpp"

namespace ordo::test {

/// Runs `body` to completion on a fresh io_context. Fails the test if it has not finished
/// within `limit` (the io_context is then stopped); rethrows what the body threw.
inline void run_test(std::function<net::awaitable<void>()> body,
                     std::chrono::seconds limit = std::chrono::seconds(60)) {
    net::io_context io;
    bool done = false;
    std::exception_ptr error;
    net::co_spawn(io, body(), [&](std::exception_ptr e) {
        done = true;
        error = e;
    });
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (!done && std::chrono::steady_clock::now() < deadline && !io.stopped())
        io.run_one_for(std::chrono::milliseconds(100));
    if (!done) {
        ADD_FAILURE() << "watchdog: the test coroutine did not finish within " << limit.count()
                      << " s";
        return;
    }
    if (error) std::rethrow_exception(error);
}

/// Waits, on the current executor, until `cond` holds or `limit` passes; returns cond().
inline net::awaitable<bool> wait_until(std::function<bool()> cond,
                                       std::chrono::milliseconds limit = std::chrono::seconds(30)) {
    net::steady_timer timer(co_await net::this_coro::executor);
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (!cond() && std::chrono::steady_clock::now() < deadline) {
        timer.expires_after(std::chrono::milliseconds(2));
        co_await timer.async_wait(use_tuple);
    }
    co_return cond();
}

}  // namespace ordo::test

// gtest's ASSERT_* macros `return`, which a coroutine cannot: these record the failure (with
// gtest's message) and co_return. The expressions are evaluated again on failure only.
#define ORDO_CO_ASSERT_TRUE(c) \
    do {                       \
        if (!(c)) {            \
            EXPECT_TRUE(c);    \
            co_return;         \
        }                      \
    } while (0)
#define ORDO_CO_ASSERT_EQ(a, b) \
    do {                        \
        if (!((a) == (b))) {    \
            EXPECT_EQ(a, b);    \
            co_return;          \
        }                       \
    } while (0)
#define ORDO_CO_ASSERT_GE(a, b) \
    do {                        \
        if (!((a) >= (b))) {    \
            EXPECT_GE(a, b);    \
            co_return;          \
        }                       \
    } while (0)
