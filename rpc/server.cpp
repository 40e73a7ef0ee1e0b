#include "ordo/server.hpp"

#include <fcntl.h>
#include <unistd.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <cerrno>
#include <list>
#include <vector>

#include "lib/escaped.hpp"
#include "ordo/detail/memory_budget.hpp"
#include "rpc/detail/when_closed.hpp"
#include "rpc/session.hpp"

namespace ordo {

struct server::state : std::enable_shared_from_this<server::state> {
    state(net::any_io_executor e, server_options opt, const ordo::handlers* hs)
        : ex(std::move(e)),
          o(std::move(opt)),
          h(hs),
          sessions(
              std::make_shared<detail::session_registry>(o.resume_window, o.max_detached_sessions)),
          changed(ex, std::chrono::steady_clock::time_point::max()),
          sweep_tick(ex),
          budget_tick(ex) {
        // Every accepted connection charges the same budget (one given in o.peer.comm is kept:
        // several servers may share one).
        if (o.memory_budget > 0 && !o.peer.comm.budget)
            o.peer.comm.budget = std::make_shared<detail::memory_budget>(o.memory_budget);
        keep_spare();
    }
    ~state() {
        if (spare_fd >= 0) ::close(spare_fd);
    }

    // A descriptor held in reserve: when accepting fails for want of descriptors, it is given
    // up so that the connection waiting can be accepted, told why and closed, rather than left
    // in the kernel's backlog with no answer; it is taken again once that one is closed.
    int spare_fd = -1;
    void keep_spare() {
        if (spare_fd < 0) spare_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    }
    static void give_back_memory() {
#ifdef __GLIBC__
        ::malloc_trim(0);
#endif
    }
    static bool out_of_descriptors(const std::error_code& ec) {
        // Asio reports errno values in a category of its own, which does not compare equal
        // to std::errc.
        const bool sys = ec.category() == std::system_category() ||
                         ec.category() == net::error::get_system_category();
        return sys && (ec.value() == EMFILE || ec.value() == ENFILE);
    }

    net::any_io_executor ex;
    server_options o;
    const ordo::handlers* h;
    std::shared_ptr<detail::session_registry> sessions;
    std::vector<std::unique_ptr<listener>> listeners;
    struct served {
        std::shared_ptr<peer> p;
        // idle_timeout: the bytes both ways when last looked at, and since when unchanged.
        std::uint64_t bytes = 0;
        std::chrono::steady_clock::time_point quiet_since = std::chrono::steady_clock::now();
        bool idle_closed = false;
    };
    std::list<served> peers;
    bool sweeping = false, watching_budget = false;
    int accept_loops = 0;
    std::uint64_t accepted = 0, refused = 0;
    std::uint64_t closed_bytes_received = 0, closed_bytes_sent = 0;  // of connections gone
    bool stopping = false;
    net::steady_timer changed;
    // The ticks of sweep_idle and watch_budget, cancelled by a stop so that neither keeps the
    // executor busy until its next tick (output_grace / 4 is 2.5 s).
    net::steady_timer sweep_tick, budget_tick;

    void event(server_event::kind what, std::string peer, std::error_code code = {},
               std::string reason = {}) {
        if (o.on_event) o.on_event({what, std::move(peer), code, std::move(reason)});
    }

    static net::awaitable<void> accept_loop(std::shared_ptr<state> s, listener* l) {
        net::steady_timer backoff(s->ex);
        while (!s->stopping) {
            std::unique_ptr<transport> t;
            bool no_descriptors = false;
            try {
                t = co_await l->async_accept();
            } catch (const std::system_error& e) {
                if (!s->stopping) {
                    s->event(server_event::kind::accept_failed, {}, e.code(), e.what());
                    no_descriptors = out_of_descriptors(e.code());
                }
            }
            if (s->stopping) break;
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
            if (s->peers.size() >= s->o.max_connections) {
                s->refuse(std::move(t), errc::overloaded,
                          "ordo: server has " + std::to_string(s->peers.size()) +
                              " connections open (max_connections); try again later");
                continue;
            }
            detail::resume_config rc;
            rc.registry = s->sessions;
            auto p = detail::make_peer(std::move(t), s->o.peer, s->h, std::move(rc));
            s->peers.push_back({p});
            auto it = std::prev(s->peers.end());
            s->event(server_event::kind::opened, p->remote_address());
            detail::when_closed(
                *p, s->ex, s,
                [st = s.get(), it](const std::error_code& code, const std::string& why) {
                    st->closed_bytes_received += it->p->comm().bytes_received;
                    st->closed_bytes_sent += it->p->comm().bytes_sent;
                    st->event(server_event::kind::closed, it->p->remote_address(), code, why);
                    st->peers.erase(it);
                    st->changed.cancel();
                });
            p->start();
        }
        --s->accept_loops;
        s->changed.cancel();
    }

    // idle_timeout: every quarter of it, closes the connections that have been quiet for it.
    static net::awaitable<void> sweep_idle(std::shared_ptr<state> s) {
        using clock = std::chrono::steady_clock;
        const auto limit = s->o.idle_timeout;
        auto& tick = s->sweep_tick;
        while (!s->stopping) {
            tick.expires_after(std::max(std::chrono::milliseconds(10), limit / 4));
            co_await tick.async_wait(use_tuple);
            if (s->stopping) break;
            const auto now = clock::now();
            for (auto& e : s->peers) {
                const auto& pc = e.p->counters();
                const auto& cc = e.p->comm();
                const std::uint64_t bytes = cc.bytes_sent + cc.bytes_received;
                if (bytes != e.bytes || pc.pending_calls != 0 || pc.running_handlers != 0 ||
                    pc.queued_messages != 0) {
                    e.bytes = bytes;
                    e.quiet_since = now;
                } else if (now - e.quiet_since >= limit && !e.idle_closed && e.p->is_open()) {
                    e.idle_closed = true;
                    e.p->close(errc::closed, "ordo: the server closed the connection after " +
                                                 std::to_string(limit.count()) +
                                                 " ms without traffic (idle_timeout)");
                }
            }
        }
    }

    // While the memory budget is used up: says so (once each time), and closes the connections
    // whose output has not been written for output_grace. The rest of the budget's policy
    // works without it, inside each connection (comm_options::budget).
    static net::awaitable<void> watch_budget(std::shared_ptr<state> s) {
        using clock = std::chrono::steady_clock;
        constexpr std::size_t output_floor = 32 * 1024;
        const auto grace = std::max(s->o.output_grace, std::chrono::milliseconds(1));
        auto& b = *s->o.peer.comm.budget;
        auto& tick = s->budget_tick;
        bool told = false;
        std::size_t peak = 0;  // the most charged since memory was last given back
        while (!s->stopping) {
            tick.expires_after(std::max(std::chrono::milliseconds(10), grace / 4));
            co_await tick.async_wait(use_tuple);
            if (s->stopping) break;
            peak = std::max(peak, b.used());
            if (peak >= (std::size_t{64} << 20) && b.used() < peak / 4) {
                // A burst has passed: give what it freed back to the system (glibc keeps
                // freed memory otherwise, and the process's RSS stays at the burst's peak).
                give_back_memory();
                peak = b.used();
            }
            if (!b.over()) {
                told = false;
                continue;
            }
            if (!told) {
                told = true;
                s->event(server_event::kind::over_budget, {}, errc::overloaded,
                         "ordo: the server's memory budget is used up (" +
                             std::to_string(b.used()) + " of " + std::to_string(b.limit()) +
                             " bytes): large messages wait, connections with queued messages "
                             "or unread output stop reading");
            }
            const auto now = clock::now();
            std::vector<std::shared_ptr<peer>> stuck;  // closed after the walk: it may erase
            for (auto& e : s->peers) {
                const auto& cc = e.p->comm();
                if (cc.write_since != clock::time_point{} && now - cc.write_since >= grace &&
                    cc.buffered_bytes > output_floor && e.p->is_open())
                    stuck.push_back(e.p);
            }
            for (auto& p : stuck)
                p->abort(errc::overloaded,
                         "ordo: the server's memory budget is used up (" +
                             std::to_string(b.used()) + " of " + std::to_string(b.limit()) +
                             " bytes) and " + std::to_string(p->comm().buffered_bytes) +
                             " bytes of output to " + p->remote_address() +
                             " have not been written for " + std::to_string(grace.count()) +
                             " ms (output_grace): the peer does not read; closed");
        }
    }

    // A connection not served (beyond max_connections, or no descriptors left): told why,
    // then closed. At most max_refusing are told at once; beyond that a connection is closed
    // without a word.
    void refuse(std::unique_ptr<transport> t, errc code, std::string why) {
        const std::string remote = t->remote_address();
        ++refused;
        event(server_event::kind::refused, remote, code, why);
        if (refusing >= max_refusing) {
            t->close();
            return keep_spare();
        }
        ++refusing;
        net::co_spawn(ex, say_closing(shared_from_this(), std::move(t), code, std::move(why)),
                      detail::rethrow_escaped{});
    }

    // Writes ordo.closing [code, reason], ends the sending side, and reads what the peer still
    // sends (discarded, for up to a second) so that closing does not reset the connection
    // before the peer has read the reason.
    static net::awaitable<void> say_closing(std::shared_ptr<state> s, std::unique_ptr<transport> t,
                                            errc code, std::string why) {
        using namespace net::experimental::awaitable_operators;
        buffer b(small_buffer);
        encode_notification(b, "ordo.closing", static_cast<int>(code), why);
        std::error_code ec;
        co_await t->async_write(net::buffer(b.data(), b.size()), ec);
        if (!ec) {
            t->shutdown_send();
            net::steady_timer limit(s->ex, std::chrono::seconds(1));
            co_await (drain(*t) || limit.async_wait(use_tuple));
        }
        t->close();
        --s->refusing;
        s->keep_spare();
    }

    static net::awaitable<void> drain(transport& t) {
        char sink[1024];
        for (int i = 0; i < 64; ++i) {
            std::error_code ec;
            co_await t.async_read_some(net::buffer(sink, sizeof sink), ec);
            if (ec) co_return;
        }
    }

    // server_stats without the handlers' part.
    server_stats snapshot() const {
        server_stats st;
        st.connections = peers.size();
        st.connections_accepted = accepted;
        st.connections_refused = refused;
        st.bytes_received = closed_bytes_received;
        st.bytes_sent = closed_bytes_sent;
        for (const auto& e : peers) {
            const auto& cc = e.p->comm();
            st.bytes_received += cc.bytes_received;
            st.bytes_sent += cc.bytes_sent;
            st.queued_messages += e.p->counters().queued_messages;
            st.running_handlers += e.p->counters().running_handlers;
        }
        st.detached_sessions = sessions->detached_count();
        if (const auto& b = o.peer.comm.budget) {
            st.memory_used = b->used();
            st.memory_budget = b->limit();
        }
        return st;
    }

    // snapshot() with the handlers' counters.
    server_stats full_snapshot() const {
        server_stats st = snapshot();
        if (h) {
            st.unknown_requests = h->unknown_requests();
            st.unknown_notifications = h->unknown_notifications();
            st.methods = h->stats_by_method();
            st.batches = h->stats_by_batch();
        }
        return st;
    }

    static constexpr std::size_t max_refusing = 64;
    std::size_t refusing = 0;
};

server::server(net::any_io_executor ex) : server(std::move(ex), server_options{}) {}

server::server(net::any_io_executor ex, server_options o)
    : s_(std::make_shared<state>(std::move(ex), std::move(o), &handlers_)) {
    std::weak_ptr<state> w = s_;
    if (s_->o.on_event && !s_->o.peer.on_dropped)
        s_->o.peer.on_dropped = [w](const dropped_message& d) {
            if (auto s = w.lock()) s->event(server_event::kind::dropped, d.peer, d.code, d.reason);
        };
    handlers_.stats_source([w] {
        auto s = w.lock();
        return s ? s->snapshot() : server_stats{};
    });
}

server::~server() {
    s_->stopping = true;
    s_->sweep_tick.cancel();
    s_->budget_tick.cancel();
    s_->h = nullptr;
    for (auto& l : s_->listeners) l->close();
    for (auto& e : s_->peers) e.p->abort();
}

std::string server::listen(std::string_view url) {
    auto l = ordo::listen(s_->ex, url, s_->o.peer.transport);
    std::string bound = l->local_address();
    ++s_->accept_loops;
    net::co_spawn(s_->ex, state::accept_loop(s_, l.get()), detail::rethrow_escaped{});
    if (s_->o.idle_timeout.count() > 0 && !s_->sweeping) {
        s_->sweeping = true;
        net::co_spawn(s_->ex, state::sweep_idle(s_), detail::rethrow_escaped{});
    }
    if (s_->o.peer.comm.budget && !s_->watching_budget) {
        s_->watching_budget = true;
        net::co_spawn(s_->ex, state::watch_budget(s_), detail::rethrow_escaped{});
    }
    s_->listeners.push_back(std::move(l));
    return bound;
}

net::awaitable<void> server::async_stop() {
    auto s = s_;
    s->stopping = true;
    s->sweep_tick.cancel();
    s->budget_tick.cancel();
    for (auto& l : s->listeners) l->close();
    // Calls waiting for a batch get their shutting_down answers out before connections close.
    handlers_.stop_batches();
    {
        using namespace net::experimental::awaitable_operators;
        net::steady_timer give_up(s->ex, std::chrono::seconds(2));
        co_await (handlers_.async_wait_batches() || give_up.async_wait(use_tuple));
    }
    for (auto& e : s->peers) e.p->close();
    while (!s->peers.empty() || s->accept_loops > 0) co_await s->changed.async_wait(use_tuple);
    s->listeners.clear();
}

std::size_t server::peer_count() const noexcept {
    return s_->peers.size();
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

net::any_io_executor server::get_executor() const {
    return s_->ex;
}

std::string to_string(const server_event& e) {
    static constexpr const char* names[] = {"opened",        "closed",      "refused",
                                            "accept failed", "over budget", "dropped"};
    std::string line = "ordo: ";
    line += names[static_cast<int>(e.what)];
    if (!e.peer.empty()) line += " " + e.peer;
    if (e.code)
        line += std::string(": ") + (e.code.category() == error_category()
                                         ? to_string(static_cast<errc>(e.code.value()))
                                         : e.code.message());
    if (!e.reason.empty()) line += (e.code ? " (" : ": ") + e.reason + (e.code ? ")" : "");
    return line;
}

}  // namespace ordo
