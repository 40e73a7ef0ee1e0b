// ordo::server: its life (listen, async_stop, destruction), accepting connections and placing
// them over its loops (the least loaded; one loop: the server's executor), and serving each as
// a peer. Its state and loops are rpc/server/server_state.hpp; limits and stats have files of
// their own (rpc/server/limits.cpp, rpc/server/stats.cpp).
#include "ordo/rpc/server.hpp"

#include <unistd.h>

#include <cstdio>
#include <future>

#include "lib/escaped.hpp"
#include "ordo/detail/memory_budget.hpp"
#include "rpc/context/context.hpp"
#include "rpc/session/session.hpp"
#include "rpc/connection/when_closed.hpp"
#include "rpc/server/server_state.hpp"

namespace ordo {

server::state::state(net::any_io_executor e, server_options opt, const ordo::handlers* hs)
    : ex(detail::without_context(std::move(e))),
      o(std::move(opt)),
      h(hs),
      sessions(
          std::make_shared<detail::session_registry>(o.resume_window, o.max_detached_sessions)),
      changed(ex, std::chrono::steady_clock::time_point::max()) {
    // Every accepted connection charges the same budget (one given in o.peer.comm is kept:
    // several servers may share one).
    if (o.memory_budget > 0 && !o.peer.comm.budget)
        o.peer.comm.budget = std::make_shared<detail::memory_budget>(o.memory_budget);
    keep_spare();
}

server::state::~state() {
    if (spare_fd >= 0) ::close(spare_fd);
}

net::awaitable<void> server::state::accept_loop(std::shared_ptr<state> s, listener* l) {
    net::steady_timer backoff(s->ex);
    // Until the server stops, drains or stops listening (stop_listening()).
    const auto taking = [&] { return !s->closed_to_new() && s->listening(l); };
    while (taking()) {
        std::unique_ptr<transport> t;
        bool no_descriptors = false;
        try {
            t = co_await l->async_accept();
        } catch (const std::system_error& e) {
            if (taking()) {
                s->event(server_event::kind::accept_failed, {}, e.code(), e.what());
                no_descriptors = out_of_descriptors(e.code());
            }
        }
        if (!taking()) {
            // Accepted as the listener closed: not served (as if it had come a moment later).
            if (t) t->close();
            break;
        }
        if (!t && no_descriptors && s->spare_fd >= 0) {
            ::close(s->spare_fd);
            s->spare_fd = -1;
            try {
                t = co_await l->async_accept();
            } catch (const std::system_error&) {
                // Taken by another thread of this process meanwhile: back off below.
            }
            if (t) {
                ++s->accepted;
                s->refuse(std::move(t), errc::overloaded,
                          "ordo: server is out of file descriptors; try again later");
                continue;
            }
            s->keep_spare();
        }
        if (!t) {
            // Out of descriptors and the like: try again shortly rather than spin or quit.
            backoff.expires_after(std::chrono::milliseconds(100));
            co_await backoff.async_wait(use_tuple);
            continue;
        }
        ++s->accepted;
        const std::size_t open = s->open_total();
        if (open >= s->o.max_connections) {
            s->refuse(std::move(t), errc::overloaded,
                      "ordo: server has " + std::to_string(open) +
                          " connections open (max_connections); try again later");
            continue;
        }
        loop& lp = s->loop_of(t->get_executor());
        auto st = s->welcome(t, lp);
        if (!st) continue;  // refused (per-address cap, failed authentications)
        ++lp.open;
        s->on_loop(lp, [s, &lp, t = std::move(t), st = std::move(st)]() mutable {
            s->serve(lp, std::move(t), std::move(st));
        });
    }
    --s->accept_loops;
    s->changed.cancel();
}

// On lp's executor: the accepted connection becomes a peer served there.
// `who` is its record as a stranger (rpc/server/strangers.cpp) until the gate accepts it.
void server::state::serve(loop& lp, std::unique_ptr<transport> t, std::shared_ptr<stranger> who) {
    auto s = shared_from_this();
    if (stopping) {
        // Accepted just before a stop: not served.
        t->close();
        at_home(lp, [s, who] { s->forget(who); });
        return closed_on(lp);
    }
    detail::resume_config rc;
    // A caller coming back lands on any loop; its session's connection moves to the loop the
    // session lives on (session_handshake.cpp).
    rc.registry = sessions;
    // Every connection passes the gate with its first message: that is when it stops being a
    // stranger. With authenticate, its messages are held to the strangers' limits until then.
    rc.gate = gate_for(who);
    if (o.authenticate) {
        limits strict = o.peer.comm.limits;
        strict.max_message_bytes = std::min(strict.max_message_bytes, o.strangers.max_message_bytes);
        strict.max_string_bytes = std::min(strict.max_string_bytes, o.strangers.max_message_bytes);
        rc.gated_limits = strict;
    }
    std::shared_ptr<peer> p;
    const std::string remote = t->remote_address();
    try {
        p = detail::make_peer(std::move(t), o.peer, h, std::move(rc));
    } catch (const std::exception& e) {
        at_home(lp, [s, who, remote, why = std::string(e.what())] {
            s->left(who, remote, make_error_code(errc::overloaded),
                    "ordo: connection not served: " + why);
        });
        return closed_on(lp);
    }
    who->p = p;
    lp.peers.push_back({p});
    auto it = std::prev(lp.peers.end());
    at_home(lp, [s, remote] { s->event(server_event::kind::opened, remote); });
    detail::when_closed(*p, lp.ex, s,
                        [st = s.get(), &lp, it, who](const std::error_code& code,
                                                     const std::string& why) {
                            lp.closed_bytes_received += it->p->comm().bytes_received;
                            lp.closed_bytes_sent += it->p->comm().bytes_sent;
                            std::string remote = it->p->remote_address();
                            lp.peers.erase(it);
                            st->at_home(lp, [st, who, remote = std::move(remote), code, why] {
                                st->left(who, remote, code, why);
                            });
                            st->closed_on(lp);
                        });
    p->start();
    // Accepted just before a drain began, placed here after this loop told its connections.
    if (draining) detail::send_goaway(*p, drain_left(), drain_reason);
}

// On lp's executor: one of its connections is gone.
void server::state::closed_on(loop& lp) {
    --lp.open;
    at_home(lp, [st = this] { st->changed.cancel(); });
}

server::server(net::any_io_executor ex) : server(std::move(ex), server_options{}) {}

server::server(net::any_io_executor ex, server_options o)
    : s_(std::make_shared<state>(std::move(ex), std::move(o), &handlers_)) {
    if (s_->o.access_log) handlers_.access_log(s_->o.access_log);
    if (s_->o.concurrency.limited()) handlers_.concurrency(s_->o.concurrency, s_->o.shares);
    handlers_.serve_health();
    const std::size_t n = std::max<std::size_t>(1, s_->o.threads);
    s_->loops.push_back(std::make_unique<state::loop>(s_->ex, true));
    if (n > 1) {
        loops_ = std::make_unique<loops>(n - 1);
        for (std::size_t i = 0; i + 1 < n; ++i) {
            auto& lp = *s_->loops.emplace_back(
                std::make_unique<state::loop>(loops_->ios[i]->get_executor(), false));
            lp.thread = loops_->threads[i].get_id();
        }
    }
    for (auto& l : s_->loops) {
        l->sweep_tick = std::make_unique<net::steady_timer>(l->ex);
        l->budget_tick = std::make_unique<net::steady_timer>(l->ex);
    }
    s_->stranger_tick = std::make_unique<net::steady_timer>(s_->ex);
    std::weak_ptr<state> w = s_;
    if (s_->o.on_event && !s_->o.peer.on_dropped)
        s_->o.peer.on_dropped = [w](const dropped_message& d) {
            auto s = w.lock();
            if (!s) return;
            net::dispatch(
                s->ex, [s, d] { s->event(server_event::kind::dropped, d.peer, d.code, d.reason); });
        };
    // Not a coroutine lambda: its captures would be read from the lambda while it may be gone.
    handlers_.stats_source([w] { return state::gather(w.lock()); });
}

server::~server() {
    auto& s = *s_;
    s.stopping = true;
    // With several loops, a connection being set up on another loop may still read the
    // handler table: it is let go once those loops have stopped (below).
    if (!loops_) s.h = nullptr;
    for (auto& l : s.listeners) l->close();
    s.stranger_tick->cancel();
    for (auto& l : s.loops) {
        if (!l->home) continue;
        l->sweep_tick->cancel();
        l->budget_tick->cancel();
        for (auto& e : l->peers) e.p->abort();
    }
    if (loops_) {
        // Each loop aborts its connections, then the loops stop and their threads are joined;
        // what was left on them is destroyed with their io_contexts, before the handler table.
        std::vector<std::future<void>> done;
        for (auto& l : s.loops) {
            if (l->home) continue;
            auto task = std::make_shared<std::packaged_task<void()>>([&lp = *l] {
                lp.sweep_tick->cancel();
                lp.budget_tick->cancel();
                for (auto& e : lp.peers) e.p->abort();
            });
            done.push_back(task->get_future());
            net::post(l->ex, [task] { (*task)(); });
        }
        for (auto& f : done) f.wait_for(std::chrono::seconds(5));
        // Bodies still running on run_on executors post their answers back to these loops:
        // wait for them (10 s at most) before the loops go.
        const bool drained = loops_->drained(std::chrono::seconds(10));
        for (auto& io : loops_->ios) io->stop();
        for (auto& t : loops_->threads) t.join();
        s.h = nullptr;
        for (auto& l : s.loops) {
            if (l->home) continue;
            l->peers.clear();
            l->sweep_tick.reset();
            l->budget_tick.reset();
        }
        if (!drained) {
            // Something still runs elsewhere and will post to these loops: keep them (a leak,
            // said on stderr) rather than let it write into freed memory.
            std::fprintf(stderr,
                         "ordo: a server's loops still had work 10 s after it was destroyed "
                         "(a run_on body still running?); their memory is kept\n");
            for (auto& io : loops_->ios) (void)io.release();
        }
        loops_.reset();
    }
}

std::string server::listen(std::string_view url) {
    auto l = ordo::listen(s_->ex, url, s_->o.peer.transport);
    std::string bound = l->local_address();
    if (s_->loops.size() > 1) {
        // Batch handlers keep their state on the server's executor, whichever loop calls.
        handlers_.home_batches(s_->ex);
    }
    if (s_->loops.size() > 1)
        l->set_placement([w = std::weak_ptr<state>(s_)]() -> net::any_io_executor {
            auto s = w.lock();
            return s ? s->least_loaded().ex : net::any_io_executor();
        });
    // Listed first: its accept loop takes connections while it is (stop_listening()).
    listener* accepting = l.get();
    s_->listeners.push_back(std::move(l));
    ++s_->accept_loops;
    net::co_spawn(s_->ex, state::accept_loop(s_, accepting), detail::rethrow_escaped{});
    if (s_->o.idle_timeout.count() > 0 && !s_->sweeping) {
        s_->sweeping = true;
        for (auto& lp : s_->loops)
            net::co_spawn(lp->ex, state::sweep_idle(s_, *lp), detail::rethrow_escaped{});
    }
    if (!s_->watching_strangers) {
        s_->watching_strangers = true;
        net::co_spawn(s_->ex, state::watch_strangers(s_), detail::rethrow_escaped{});
    }
    if (s_->o.peer.comm.budget && !s_->watching_budget) {
        s_->watching_budget = true;
        for (auto& lp : s_->loops)
            net::co_spawn(lp->ex, state::watch_budget(s_, *lp), detail::rethrow_escaped{});
    }
    return bound;
}

void server::stop_listening() {
    // Kept (closed) until the server stops: their accept loops may still be inside them.
    for (auto& l : s_->listeners) {
        l->close();
        s_->closed_listeners.push_back(std::move(l));
    }
    s_->listeners.clear();
}

net::awaitable<void> server::async_stop() {
    auto s = s_;
    s->stopping = true;
    for (auto& l : s->listeners) l->close();
    s->stranger_tick->cancel();
    for (auto& l : s->loops)
        s->on_loop(*l, [s, &lp = *l] {
            lp.sweep_tick->cancel();
            lp.budget_tick->cancel();
        });
    // Calls waiting for a batch get their shutting_down answers out before connections close.
    handlers_.stop_batches();
    {
        using namespace net::experimental::awaitable_operators;
        net::steady_timer give_up(s->ex, std::chrono::seconds(2));
        co_await (handlers_.async_wait_batches() || give_up.async_wait(use_tuple));
    }
    for (auto& l : s->loops)
        s->on_loop(*l, [s, &lp = *l] {
            for (auto& e : lp.peers) e.p->close();
        });
    while (s->open_total() > 0 || s->accept_loops > 0) co_await s->changed.async_wait(use_tuple);
    s->listeners.clear();
    s->closed_listeners.clear();
    s->stopped = true;
    s->changed.cancel();  // a second async_drain() waits for this
}

std::size_t server::peer_count() const noexcept {
    return s_->open_total();
}
std::uint64_t server::connections_accepted() const noexcept {
    return s_->accepted;
}
std::size_t server::detached_sessions() const noexcept {
    return s_->sessions->detached_count();
}
std::size_t server::memory_used() const noexcept {
    return s_->o.peer.comm.budget ? s_->o.peer.comm.budget->used() : 0;
}

net::any_io_executor server::get_executor() const {
    return s_->ex;
}

}  // namespace ordo
