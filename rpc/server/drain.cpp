// ordo::server's graceful stop (server::async_drain; docs/protocol.md "Draining"): closing the
// listeners, ordo.goaway to every connection on every loop, serving on until the peers have
// closed or the grace has passed, then stopping as async_stop() does.
#include "ordo/rpc/server.hpp"

#include "rpc/server/health.hpp"
#include "rpc/server/server_state.hpp"

namespace ordo {

std::chrono::milliseconds server::state::drain_left() const {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        drain_deadline - std::chrono::steady_clock::now());
    return std::max(left, std::chrono::milliseconds(0));
}

net::awaitable<void> server::async_drain(std::chrono::milliseconds grace, std::string reason) {
    auto s = s_;
    if (s->closed_to_new()) {
        // A drain or a stop is under way (or done): wait for it.
        while (!s->stopped) co_await s->changed.async_wait(use_tuple);
        co_return;
    }
    grace = std::max(grace, std::chrono::milliseconds(0));
    s->drain_reason = reason;
    s->drain_deadline = std::chrono::steady_clock::now() + grace;
    s->draining = true;
    for (auto& l : s->listeners) l->close();
    // Health first: a watcher (a router) hears "draining" before any goaway is sent (waited
    // for up to a second of the grace).
    handlers_.set_every_health(health_state::draining);
    co_await detail::tell_health_watchers(handlers_,
                                          std::min(grace, std::chrono::milliseconds(1000)));
    const std::size_t told = s->open_total();
    s->event(server_event::kind::draining, {}, {},
             "grace " + std::to_string(grace.count()) + " ms, reason \"" + reason + "\"; " +
                 std::to_string(told) + " connections told (ordo.goaway)");
    // Their callers cannot come back to resume them: the listeners are closed.
    s->sessions->end_detached("ordo: session ended: the server is draining (" + reason +
                              ") and its listeners are closed, so its caller cannot resume it");
    for (auto& l : s->loops)
        s->on_loop(*l, [s, &lp = *l] {
            for (auto& e : lp.peers) detail::send_goaway(*e.p, s->drain_left(), s->drain_reason);
        });

    // Serve on until every connection has closed (their peers close them once idle), or the
    // grace passes. The flag is shared with the timer's handler, which may run after this
    // frame is gone.
    auto expired = std::make_shared<bool>(false);
    net::steady_timer deadline(s->ex, grace);
    deadline.async_wait([s, expired](std::error_code ec) {
        if (ec) return;
        *expired = true;
        s->changed.cancel();
    });
    while ((s->open_total() > 0 || s->accept_loops > 0) && !*expired)
        co_await s->changed.async_wait(use_tuple);
    deadline.cancel();

    const std::size_t left = s->open_total();
    s->closed_by_grace += left;
    if (left > 0) {
        const std::string why = "ordo: the server is going away (" + reason +
                                ") and its grace of " + std::to_string(grace.count()) +
                                " ms has passed";
        for (auto& l : s->loops)
            s->on_loop(*l, [s, &lp = *l, why] {
                for (auto& e : lp.peers) e.p->close(errc::shutting_down, why);
            });
    }
    co_await async_stop();
    s->event(server_event::kind::drained, {}, {},
             left == 0 ? "every connection (" + std::to_string(told) +
                             " told) was closed by its peer within the grace of " +
                             std::to_string(grace.count()) + " ms"
                       : std::to_string(left) + " of " + std::to_string(told) +
                             " connections were still open when the grace of " +
                             std::to_string(grace.count()) + " ms passed and were closed by the server");
}

}  // namespace ordo
