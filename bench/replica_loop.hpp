// In-process replicas for the router benchmarks: ordo servers on an event loop and thread of
// their own, so that the router's loop only routes; and how a benchmark reports a failed run.
#pragma once

#include <cstdio>
#include <exception>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <ordo/ordo.hpp>

namespace ordo_bench {

class replica_loop {
  public:
    replica_loop() : guard_(ordo::net::make_work_guard(io_)) {}
    ~replica_loop() { stop(); }
    /// A new server on the loop (before start()).
    ordo::server& add() {
        servers_.push_back(std::make_unique<ordo::server>(io_.get_executor()));
        return *servers_.back();
    }
    void start() {
        thread_ = std::thread([this] { io_.run(); });
    }
    /// Stops every server (async_stop, on the loop), then the loop and its thread.
    void stop() {
        if (!thread_.joinable()) return;
        std::promise<void> stopped;
        ordo::net::co_spawn(
            io_,
            [this]() -> ordo::net::awaitable<void> {
                for (auto& s : servers_) co_await s->async_stop();
            },
            [&](std::exception_ptr) { stopped.set_value(); });
        stopped.get_future().wait();
        guard_.reset();
        io_.stop();
        thread_.join();
    }

  private:
    ordo::net::io_context io_;
    ordo::net::executor_work_guard<ordo::net::io_context::executor_type> guard_;
    std::vector<std::unique_ptr<ordo::server>> servers_;
    std::thread thread_;
};

/// Prints `e`'s message after `name` and returns 1, the exit status of a failed run.
inline int report_failure(const char* name, std::exception_ptr e) {
    try {
        std::rethrow_exception(e);
    } catch (const std::exception& x) {
        std::fprintf(stderr, "%s: %s\n", name, x.what());
    }
    return 1;
}

}  // namespace ordo_bench
