// An io_context run by a thread of its own, for tests with servers, clients or readers on
// several threads.
#pragma once

#include <thread>
#include <utility>

#include <asio/executor_work_guard.hpp>
#include <asio/use_future.hpp>

#include "ordo/net.hpp"

namespace ordo::test {

struct running_loop {
    net::io_context io;
    net::executor_work_guard<net::io_context::executor_type> guard = net::make_work_guard(io);
    std::thread t{[this] { io.run(); }};
    ~running_loop() {
        guard.reset();
        io.stop();
        t.join();
    }
    // Runs `f` there and waits for its result.
    template <class F>
    auto run(F f) {
        return net::co_spawn(io, std::move(f), net::use_future).get();
    }
};

}  // namespace ordo::test
