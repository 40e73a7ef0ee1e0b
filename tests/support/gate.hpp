// A handler that holds its call until the test opens the gate; once open, calls pass at once.
#pragma once

#include <chrono>

#include "ordo/ordo.hpp"

namespace ordo::test {

struct gate {
    net::steady_timer timer;
    int waiting = 0;
    bool is_open = false;
    explicit gate(net::any_io_executor ex)
        : timer(ex, std::chrono::steady_clock::time_point::max()) {}
    net::awaitable<void> pass() {
        if (is_open) co_return;
        ++waiting;
        auto [ec] = co_await timer.async_wait(use_tuple);
        (void)ec;
        --waiting;
    }
    void open() {
        is_open = true;
        timer.cancel();
    }
};

}  // namespace ordo::test
