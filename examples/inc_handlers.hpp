// The handlers ordo-inc-server serves (counter, echo, square_batch), for every program that
// needs the same server: the tool itself and the fuzz targets.
#pragma once

#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

#include "counter.hpp"

/// Registers counter (examples/counter.hpp, count_to included), echo(any), whoami() and
/// square_batch(int) on `srv`. `total`
/// is the process-wide sum that add() changes; it must outlive the server. `shared` is how add()
/// and total() run: on a server with several loops, give them a strand (run_on) so that calls
/// from every loop take turns at `total`.
inline void serve_counter(ordo::server& srv, long& total, ordo::handler_options shared = {}) {
    namespace net = ordo::net;
    srv.on(counter{}.inc, [](int x) { return x + 1; });
    srv.on(
        counter{}.add, [&total](int x) { return total += x; }, shared);
    srv.on(
        counter{}.total, [&total] { return total; }, shared);
    srv.on(counter{}.sleep_ms, [](int ms) -> net::awaitable<int> {
        net::steady_timer t(co_await net::this_coro::executor, std::chrono::milliseconds(ms));
        co_await t.async_wait(net::use_awaitable);
        co_return ms;
    });
    srv.on(counter{}.fail, [](std::string why) { throw std::runtime_error(why); });
    srv.on("echo", [](msgpack::object v) { return v; });
    // Who the server took the caller to be (server_options::authenticate): empty without it.
    srv.on("whoami", [](ordo::peer& p) { return p.identity().subject; });
    // A stream: 0 .. n-1, each item sent as soon as the caller has credit for it.
    srv.on(counter{}.count_to, [](ordo::writer<int>& out, int n) -> net::awaitable<void> {
        for (int i = 0; i < n; ++i) co_await out.write(i);
    });
    // Single calls from every peer, squared in batches of up to 64 (or after 1 ms).
    srv.on_batch("square_batch", {.max_batch_size = 64, .max_wait = std::chrono::milliseconds(1)},
                 [](std::vector<int> xs) {
                     for (auto& x : xs) x *= x;
                     return xs;
                 });
    // Streams of callers batched together: step k gives every caller still open its item k,
    // or the end of its stream once it has n items.
    srv.on_batch_stream(
        counter{}.count_batch.name(),
        {.max_batch_size = 64, .max_wait = std::chrono::milliseconds(1)},
        [](ordo::batch_writer<int>& out, std::vector<int> ns) -> net::awaitable<void> {
            for (int k = 0; !out.open().empty(); ++k) {
                std::vector<ordo::stream_step<int>> step;
                step.reserve(out.open().size());
                for (std::size_t i : out.open()) {
                    if (k < ns[i])
                        step.emplace_back(k);
                    else
                        step.emplace_back(ordo::stream_end{});
                }
                co_await out.step(std::move(step));
            }
        });
}
