// What ordo::server reports: server_stats (its own counts and each loop's connections, read in
// place, asked for, or gathered without blocking for ordo.stats) and the text of a server_event.
#include "ordo/rpc/server.hpp"

#include <future>

#include "lib/printable.hpp"
#include "ordo/detail/memory_budget.hpp"
#include "ordo/rpc/router.hpp"
#include "rpc/server/server_state.hpp"

namespace ordo {

// What one loop's connections add to server_stats; on lp's executor.
void server::state::add_loop(server_stats& st, const loop& lp) {
    st.bytes_received += lp.closed_bytes_received;
    st.bytes_sent += lp.closed_bytes_sent;
    for (const auto& e : lp.peers) {
        const auto& cc = e.p->comm();
        st.bytes_received += cc.bytes_received;
        st.bytes_sent += cc.bytes_sent;
        st.queued_messages += e.p->counters().queued_messages;
        st.running_handlers += e.p->counters().running_handlers;
    }
}

// server_stats without the handlers' part or the loops' connections.
server_stats server::state::base_snapshot() const {
    server_stats st;
    st.connections = open_total();
    st.connections_accepted = accepted;
    st.connections_refused = refused;
    st.detached_sessions = sessions->detached_count();
    st.sessions_moved = sessions->moved();
    st.connections_closed_by_grace = closed_by_grace;
    if (const auto& b = o.peer.comm.budget) {
        st.memory_used = b->used();
        st.memory_budget = b->limit();
    }
    return st;
}

// server_stats without the handlers' part, for a caller that may block: the loop it runs
// on (if any) is read in place, each other is asked and waited for (up to 1 s).
server_stats server::state::snapshot() const {
    server_stats st = base_snapshot();
    for (const auto& l : loops) {
        if (l->home || l->on_this_thread()) {
            add_loop(st, *l);
            continue;
        }
        auto part = std::make_shared<std::promise<server_stats>>();
        auto got = part->get_future();
        net::post(l->ex, [part, &lp = *l, keep = shared_from_this()] {
            server_stats one;
            add_loop(one, lp);
            part->set_value(std::move(one));
        });
        if (got.wait_for(std::chrono::seconds(1)) != std::future_status::ready) continue;
        const server_stats one = got.get();
        st.bytes_received += one.bytes_received;
        st.bytes_sent += one.bytes_sent;
        st.queued_messages += one.queued_messages;
        st.running_handlers += one.running_handlers;
    }
    return st;
}

// snapshot() without blocking: each other loop is visited in turn (for ordo.stats).
namespace {

net::awaitable<router_view> read_router(std::shared_ptr<router> r, std::string name) {
    co_return r->view(std::move(name));
}

net::awaitable<router_view> view_on_its_executor(std::shared_ptr<router> r, std::string name) {
    auto ex = r->get_executor();
    return net::co_spawn(std::move(ex), read_router(std::move(r), std::move(name)),
                         net::bind_cancellation_slot(net::cancellation_slot(), net::use_awaitable));
}

}  // namespace

net::awaitable<server_stats> server::state::gather(std::shared_ptr<state> s) {
    if (!s) co_return server_stats{};
    server_stats st = s->base_snapshot();
    const auto here = co_await net::this_coro::executor;
    for (const auto& l : s->loops) {
        if (l->ex == here) {
            add_loop(st, *l);
            continue;
        }
        loop& lp = *l;
        st = co_await net::co_spawn(
            lp.ex,
            [&lp, st]() mutable -> net::awaitable<server_stats> {
                add_loop(st, lp);
                co_return st;
            },
            net::bind_cancellation_slot(net::cancellation_slot(), net::use_awaitable));
    }
    std::vector<std::pair<std::shared_ptr<router>, std::string>> shown;
    {
        std::lock_guard lock(s->routers_mu);
        for (const auto& entry : s->routers)
            if (auto r = entry.first.lock()) shown.emplace_back(std::move(r), entry.second);
    }
    // Each router is read on its own executor. (No structured bindings or braced temporaries
    // in this coroutine: GCC 12 miscompiles them inside co_await expressions.)
    for (std::size_t i = 0; i < shown.size(); ++i) {
        router_view v = co_await view_on_its_executor(shown[i].first, shown[i].second);
        st.routers.push_back(std::move(v));
    }
    co_return st;
}

void server::show_router(std::shared_ptr<router> r, std::string name) {
    std::lock_guard lock(s_->routers_mu);
    s_->routers.emplace_back(std::move(r), std::move(name));
}

// snapshot() with the handlers' counters.
server_stats server::state::full_snapshot() const {
    server_stats st = snapshot();
    if (h) {
        st.unknown_requests = h->unknown_requests();
        st.unknown_notifications = h->unknown_notifications();
        st.concurrency = h->concurrency();
        st.methods = h->stats_by_method();
        st.batches = h->stats_by_batch();
    }
    return st;
}

server_stats server::stats() const {
    return s_->full_snapshot();
}

std::function<std::optional<server_stats>()> server::stats_reader() const {
    return [w = std::weak_ptr<state>(s_)]() -> std::optional<server_stats> {
        auto s = w.lock();
        if (!s || s->stopping || !s->h) return std::nullopt;
        return s->full_snapshot();
    };
}

std::string to_string(const server_event& e) {
    static constexpr const char* names[] = {"opened",      "closed",  "refused",  "accept failed",
                                            "over budget", "dropped", "draining", "drained"};
    std::string line = "ordo: ";
    line += names[static_cast<int>(e.what)];
    // The reason may quote a peer's bytes (a method name): one event stays one line.
    if (!e.peer.empty()) line += " " + detail::printable(e.peer);
    if (e.code)
        line += std::string(": ") + (e.code.category() == error_category()
                                         ? to_string(static_cast<errc>(e.code.value()))
                                         : e.code.message());
    if (!e.reason.empty())
        line += (e.code ? " (" : ": ") + detail::printable(e.reason) + (e.code ? ")" : "");
    return line;
}

}  // namespace ordo
