#include "ordo/server.hpp"

#include <list>
#include <vector>

#include "lib/escaped.hpp"
#include "rpc/detail/when_closed.hpp"

namespace ordo {

struct server::state : std::enable_shared_from_this<server::state> {
    state(net::any_io_executor e, server_options opt, const ordo::handlers* hs)
        : ex(std::move(e)),
          o(std::move(opt)),
          h(hs),
          changed(ex, std::chrono::steady_clock::time_point::max()) {}

    net::any_io_executor ex;
    server_options o;
    const ordo::handlers* h;
    std::vector<std::unique_ptr<listener>> listeners;
    std::list<std::shared_ptr<peer>> peers;
    int accept_loops = 0;
    std::uint64_t accepted = 0;
    bool stopping = false;
    net::steady_timer changed;

    static net::awaitable<void> accept_loop(std::shared_ptr<state> s, listener* l) {
        net::steady_timer backoff(s->ex);
        while (!s->stopping) {
            std::unique_ptr<transport> t;
            try {
                t = co_await l->async_accept();
            } catch (const std::system_error&) {
            }
            if (s->stopping) break;
            if (!t) {
                // Out of descriptors and the like: try again shortly rather than spin or quit.
                backoff.expires_after(std::chrono::milliseconds(100));
                co_await backoff.async_wait(use_tuple);
                continue;
            }
            ++s->accepted;
            auto p = make_peer(std::move(t), s->o.peer, s->h);
            s->peers.push_back(p);
            auto it = std::prev(s->peers.end());
            detail::when_closed(*p, s->ex, s, [st = s.get(), it](const std::string&) {
                st->peers.erase(it);
                st->changed.cancel();
            });
            p->start();
        }
        --s->accept_loops;
        s->changed.cancel();
    }
};

server::server(net::any_io_executor ex) : server(std::move(ex), server_options{}) {}

server::server(net::any_io_executor ex, server_options o)
    : s_(std::make_shared<state>(std::move(ex), std::move(o), &handlers_)) {}

server::~server() {
    s_->stopping = true;
    for (auto& l : s_->listeners) l->close();
    for (auto& p : s_->peers) p->abort();
}

std::string server::listen(std::string_view url) {
    auto l = ordo::listen(s_->ex, url, s_->o.peer.transport);
    std::string bound = l->local_address();
    ++s_->accept_loops;
    net::co_spawn(s_->ex, state::accept_loop(s_, l.get()), detail::rethrow_escaped{});
    s_->listeners.push_back(std::move(l));
    return bound;
}

net::awaitable<void> server::async_stop() {
    auto s = s_;
    s->stopping = true;
    for (auto& l : s->listeners) l->close();
    // Calls waiting for a batch get their shutting_down answers out before connections close.
    handlers_.stop_batches();
    {
        using namespace net::experimental::awaitable_operators;
        net::steady_timer give_up(s->ex, std::chrono::seconds(2));
        co_await (handlers_.async_wait_batches() || give_up.async_wait(use_tuple));
    }
    for (auto& p : s->peers) p->close();
    while (!s->peers.empty() || s->accept_loops > 0) co_await s->changed.async_wait(use_tuple);
    s->listeners.clear();
}

std::size_t server::peer_count() const noexcept {
    return s_->peers.size();
}
std::uint64_t server::connections_accepted() const noexcept {
    return s_->accepted;
}

}  // namespace ordo
