#include "ordo/run.hpp"

namespace ordo {

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

}  // namespace ordo
