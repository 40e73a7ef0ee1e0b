#include "ordo/run.hpp"

#include <asio/thread_pool.hpp>

#include <algorithm>
#include <exception>
#include <thread>

namespace ordo {

void run(net::awaitable<void> main) {
    net::io_context io;
    std::exception_ptr failed;
    net::co_spawn(io, std::move(main), [&](std::exception_ptr e) { failed = e; });
    io.run();
    if (failed) std::rethrow_exception(failed);
}

std::size_t run_spinning(net::io_context& io, std::chrono::microseconds spin) {
    if (spin.count() <= 0) return io.run();
    using clock = std::chrono::steady_clock;
    std::size_t handlers = 0;
    auto last = clock::now();
    while (!io.stopped()) {
        if (const std::size_t n = io.poll(); n > 0) {
            handlers += n;
            last = clock::now();
        } else if (clock::now() - last >= spin) {
            // Nothing for a while: sleep until the next event (0: no work left at all).
            const std::size_t one = io.run_one();
            if (one == 0) break;
            handlers += one;
            last = clock::now();
        }
    }
    return handlers;
}

struct worker_pool::impl {
    explicit impl(std::size_t n) : pool(n) {}
    net::thread_pool pool;
};

worker_pool::worker_pool(std::size_t threads)
    : threads_(threads > 0 ? threads
                           : std::max<std::size_t>(1, std::thread::hardware_concurrency())) {
    impl_ = std::make_unique<impl>(threads_);
}

worker_pool::~worker_pool() {
    join();
}

net::any_io_executor worker_pool::get_executor() const {
    return impl_->pool.get_executor();
}

net::any_io_executor worker_pool::make_strand() const {
    return net::make_strand(impl_->pool.get_executor());
}

void worker_pool::join() {
    impl_->pool.join();
}

}  // namespace ordo
