// Health (docs/protocol.md, "Health"): the states a server's services are in, what the reserved
// method ordo.health answers (rpc/dispatch/dispatcher.cpp reads health()), and the streaming
// handler behind ordo.health_watch, which writes a service's state and then each change.
#include "ordo/rpc/handlers.hpp"
#include "ordo/rpc/server.hpp"

#include "ordo/rpc/peer.hpp"
#include "rpc/server/health.hpp"

namespace ordo {

const char* to_string(health_state s) noexcept {
    switch (s) {
        case health_state::serving: return "serving";
        case health_state::not_serving: return "not_serving";
        case health_state::draining: return "draining";
    }
    return "unknown";
}

std::optional<health_state> health_from_string(std::string_view s) noexcept {
    if (s == "serving") return health_state::serving;
    if (s == "not_serving") return health_state::not_serving;
    if (s == "draining") return health_state::draining;
    return std::nullopt;
}

namespace detail {

namespace {

std::string service_of(const msgpack::object& params) {
    const auto& a = params.via.array;
    if (params.type != msgpack::type::ARRAY || a.size == 0) return {};
    if (a.size > 1 || a.ptr[0].type != msgpack::type::STR)
        throw_error(errc::bad_arguments,
                    "ordo.health_watch takes [] or [service], the service's name as a str");
    return std::string(a.ptr[0].via.str.ptr, a.ptr[0].via.str.size);
}

// The service's state, then each change, until the caller cancels or the connection ends.
// `params` lives as long as the call (the dispatcher owns its message).
net::awaitable<void> watch_health(std::shared_ptr<health_board> board, msgpack::object params,
                                  stream_out& out) {
    const std::string service = service_of(params);
    writer<std::string> w(out);
    auto ex = co_await net::this_coro::executor;
    net::steady_timer timer(ex, std::chrono::steady_clock::time_point::max());
    auto me = std::make_shared<health_board::watcher>();
    me->ex = ex;
    me->timer = &timer;
    const auto it = board->watch(me);
    struct unwatch {
        health_board& b;
        std::list<std::shared_ptr<health_board::watcher>>::iterator it;
        std::shared_ptr<health_board::watcher> me;
        ~unwatch() {
            me->timer = nullptr;
            b.unwatch(it);
        }
    } guard{*board, it, me};
    std::optional<health_state> last;
    for (;;) {
        me->pending = false;
        const auto [now, generation] = board->get_with_generation(service);
        if (!now)
            throw_error(errc::method_not_found,
                        "no service \"" + service + "\" (server::set_health names them)");
        if (now != last) {
            co_await w.write(to_string(*now));
            last = now;
        }
        me->seen.store(generation, std::memory_order_release);
        if (me->pending) continue;  // changed while the item was written
        co_await timer.async_wait(use_tuple);
        if ((co_await net::this_coro::cancellation_state).cancelled() !=
            net::cancellation_type::none)
            throw_error(errc::cancelled, "ordo.health_watch cancelled");
    }
}

}  // namespace
}  // namespace detail

// Adds an entry to the table: before serving, as every registration.
void handlers::serve_health() {
    if (health_) return;
    health_ = std::make_shared<detail::health_board>();
    detail::handler_entry e;
    e.signature = "(service: str) [stream]";
    e.concurrent = true;
    e.stream = [board = health_](peer&, msgpack::object params, detail::stream_out& out) {
        return detail::watch_health(board, params, out);
    };
    add("ordo.health_watch", std::move(e));
}

void handlers::set_health(std::string_view service, health_state s) {
    serve_health();
    health_->set(service, s);
}

void handlers::set_every_health(health_state s) {
    serve_health();
    health_->set_every(s);
}

namespace detail {

net::awaitable<void> tell_health_watchers(const handlers& h, std::chrono::milliseconds limit) {
    const auto& board = h.health_board();
    if (!board) co_return;
    const std::uint64_t generation = board->generation();
    net::steady_timer t(co_await net::this_coro::executor);
    const auto until = std::chrono::steady_clock::now() + limit;
    while (!board->heard(generation) && std::chrono::steady_clock::now() < until) {
        t.expires_after(std::chrono::milliseconds(1));
        co_await t.async_wait(use_tuple);
    }
}

}  // namespace detail

std::optional<health_state> handlers::health(std::string_view service) const {
    if (health_) return health_->get(service);
    if (service.empty()) return health_state::serving;
    return std::nullopt;
}

void server::set_health(std::string_view service, health_state s) {
    handlers_.set_health(service, s);
}

std::optional<health_state> server::health(std::string_view service) const {
    return handlers_.health(service);
}

}  // namespace ordo
