#include "ordo/server.hpp"

#include <fcntl.h>
#include <unistd.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <future>
#include <list>
#include <thread>
#include <vector>

#include "lib/escaped.hpp"
#include "ordo/detail/memory_budget.hpp"
#include "rpc/detail/when_closed.hpp"
#include "rpc/session.hpp"

namespace ordo {

// The loops a server with threads > 1 runs itself: each an io_context on a thread of its own.
struct server::loops {
    explicit loops(std::size_t n) {
        for (std::size_t i = 0; i < n; ++i) {
            ios.push_back(std::make_unique<net::io_context>(1));
            guards.push_back(net::make_work_guard(*ios.back()));
        }
        for (auto& io : ios) threads.emplace_back([&ctx = *io] { run(ctx); });
    }
    ~loops() {
        for (auto& io : ios)
            if (io) io->stop();
        for (auto& t : threads)
            if (t.joinable()) t.join();
    }
    // What escapes a handler on a loop the server runs would end the process (std::terminate
    // on its thread); with one loop it came out of the application's io_context::run(). Here
    // it is said on stderr and the loop goes on.
    static void run(net::io_context& ctx) {
        for (;;) {
            try {
                ctx.run();
                return;
            } catch (const std::exception& e) {
                std::fprintf(stderr, "ordo: exception escaped on a server loop: %s\n", e.what());
            } catch (...) {
                std::fprintf(stderr, "ordo: exception escaped on a server loop\n");
            }
        }
    }
    // Waits up to `limit` for every loop to run out of work (their connections are aborted;
    // bodies still running on run_on executors hold work until their answers are posted back).
    bool drained(std::chrono::milliseconds limit) {
        guards.clear();
        const auto deadline = std::chrono::steady_clock::now() + limit;
        for (auto& io : ios)
            while (!io->stopped()) {
                if (std::chrono::steady_clock::now() >= deadline) return false;
                std::this_thread::sleep_for(std::chrono::milliseconds(1));
            }
        return true;
    }
    std::vector<std::unique_ptr<net::io_context>> ios;
    std::vector<net::executor_work_guard<net::io_context::executor_type>> guards;
    std::vector<std::thread> threads;
};

struct server::state : std::enable_shared_from_this<server::state> {
    state(net::any_io_executor e, server_options opt, const ordo::handlers* hs)
        : ex(std::move(e)),
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

    struct served {
        std::shared_ptr<peer> p;
        // idle_timeout: the bytes both ways when last looked at, and since when unchanged.
        std::uint64_t bytes = 0;
        std::chrono::steady_clock::time_point quiet_since = std::chrono::steady_clock::now();
        bool idle_closed = false;
    };
    // One event loop's connections. Everything but `open` and `thread` is touched on `ex` only.
    struct loop {
        loop(net::any_io_executor e, bool h) : ex(std::move(e)), home(h) {}
        net::any_io_executor ex;
        bool home;                              // the server's own executor
        std::atomic<std::thread::id> thread{};  // the thread running it (not home)
        std::atomic<std::size_t> open{0};       // connections placed here and not yet closed
        std::list<served> peers;
        std::uint64_t closed_bytes_received = 0, closed_bytes_sent = 0;  // of connections gone
        // The ticks of sweep_idle and watch_budget, cancelled by a stop so that neither keeps
        // the executor busy until its next tick (output_grace / 4 is 2.5 s).
        std::unique_ptr<net::steady_timer> sweep_tick, budget_tick;
        bool on_this_thread() const noexcept {
            return !home && thread.load() == std::this_thread::get_id();
        }
    };

    net::any_io_executor ex;
    server_options o;
    const ordo::handlers* h;
    std::shared_ptr<detail::session_registry> sessions;
    std::vector<std::unique_ptr<listener>> listeners;
    std::vector<std::unique_ptr<loop>> loops;  // [0] is the server's executor
    bool sweeping = false, watching_budget = false;
    int accept_loops = 0;
    // Counted on the server's executor, read from any loop (ordo.stats).
    std::atomic<std::uint64_t> accepted{0}, refused{0};
    std::atomic<bool> stopping{false};
    net::steady_timer changed;

    std::size_t open_total() const noexcept {
        std::size_t n = 0;
        for (const auto& l : loops) n += l->open.load(std::memory_order_relaxed);
        return n;
    }
    loop& least_loaded() const {
        loop* best = loops.front().get();
        for (const auto& l : loops)
            if (l->open.load(std::memory_order_relaxed) <
                best->open.load(std::memory_order_relaxed))
                best = l.get();
        return *best;
    }
    loop& loop_of(const net::any_io_executor& e) const {
        for (const auto& l : loops)
            if (l->ex == e) return *l;
        return *loops.front();  // a transport that does not follow the placement
    }
    // Runs `f` on `l`'s executor: at once on the home loop (where the server's own code runs),
    // posted on the others.
    template <class F>
    void on_loop(loop& l, F f) {
        if (l.home)
            f();
        else
            net::post(l.ex, std::move(f));
    }
    // Runs `f` on the server's executor (from any loop).
    template <class F>
    void at_home(const loop& from, F f) {
        if (from.home)
            f();
        else
            net::post(ex, [keep = shared_from_this(), f = std::move(f)]() mutable { f(); });
    }

    // A callback that throws (it must not) loses its own report, nothing else.
    void event(server_event::kind what, std::string peer, std::error_code code = {},
               std::string reason = {}) noexcept {
        if (!o.on_event) return;
        try {
            o.on_event({what, std::move(peer), code, std::move(reason)});
        } catch (...) {
        }
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
            const std::size_t open = s->open_total();
            if (open >= s->o.max_connections) {
                s->refuse(std::move(t), errc::overloaded,
                          "ordo: server has " + std::to_string(open) +
                              " connections open (max_connections); try again later");
                continue;
            }
            loop& lp = s->loop_of(t->get_executor());
            ++lp.open;
            s->on_loop(lp, [s, &lp, t = std::move(t)]() mutable { s->serve(lp, std::move(t)); });
        }
        --s->accept_loops;
        s->changed.cancel();
    }

    // On lp's executor: the accepted connection becomes a peer served there.
    void serve(loop& lp, std::unique_ptr<transport> t) {
        auto s = shared_from_this();
        if (stopping) {
            // Accepted just before a stop: not served.
            t->close();
            return closed_on(lp);
        }
        detail::resume_config rc;
        // A session is taken over by the connection its caller comes back on, which may land
        // on another loop: with several loops, sessions are not offered.
        if (loops.size() == 1) rc.registry = sessions;
        std::shared_ptr<peer> p;
        const std::string remote = t->remote_address();
        try {
            p = detail::make_peer(std::move(t), o.peer, h, std::move(rc));
        } catch (const std::exception& e) {
            at_home(lp, [s, remote, why = std::string(e.what())] {
                s->event(server_event::kind::closed, remote, make_error_code(errc::overloaded),
                         "ordo: connection not served: " + why);
            });
            return closed_on(lp);
        }
        lp.peers.push_back({p});
        auto it = std::prev(lp.peers.end());
        at_home(lp, [s, remote] { s->event(server_event::kind::opened, remote); });
        detail::when_closed(
            *p, lp.ex, s,
            [st = s.get(), &lp, it](const std::error_code& code, const std::string& why) {
                lp.closed_bytes_received += it->p->comm().bytes_received;
                lp.closed_bytes_sent += it->p->comm().bytes_sent;
                std::string remote = it->p->remote_address();
                lp.peers.erase(it);
                st->at_home(lp, [st, remote = std::move(remote), code, why] {
                    st->event(server_event::kind::closed, remote, code, why);
                });
                st->closed_on(lp);
            });
        p->start();
    }

    // On lp's executor: one of its connections is gone.
    void closed_on(loop& lp) {
        --lp.open;
        at_home(lp, [st = this] { st->changed.cancel(); });
    }

    // idle_timeout: every quarter of it, closes the connections of `lp` that have been quiet
    // for it. Runs on lp's executor.
    static net::awaitable<void> sweep_idle(std::shared_ptr<state> s, loop& lp) {
        using clock = std::chrono::steady_clock;
        const auto limit = s->o.idle_timeout;
        auto& tick = *lp.sweep_tick;
        while (!s->stopping) {
            tick.expires_after(std::max(std::chrono::milliseconds(10), limit / 4));
            co_await tick.async_wait(use_tuple);
            if (s->stopping) break;
            const auto now = clock::now();
            for (auto& e : lp.peers) {
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

    // While the memory budget is used up: says so (once each time, from the home loop), and
    // closes the connections of `lp` whose output has not been written for output_grace. The
    // rest of the budget's policy works without it, inside each connection
    // (comm_options::budget). Runs on lp's executor.
    static net::awaitable<void> watch_budget(std::shared_ptr<state> s, loop& lp) {
        using clock = std::chrono::steady_clock;
        constexpr std::size_t output_floor = 32 * 1024;
        const auto grace = std::max(s->o.output_grace, std::chrono::milliseconds(1));
        auto& b = *s->o.peer.comm.budget;
        auto& tick = *lp.budget_tick;
        bool told = false;
        std::size_t peak = 0;  // the most charged since memory was last given back
        while (!s->stopping) {
            tick.expires_after(std::max(std::chrono::milliseconds(10), grace / 4));
            co_await tick.async_wait(use_tuple);
            if (s->stopping) break;
            if (lp.home) {
                peak = std::max(peak, b.used());
                if (peak >= (std::size_t{64} << 20) && b.used() < peak / 4) {
                    // A burst has passed: give what it freed back to the system (glibc keeps
                    // freed memory otherwise, and the process's RSS stays at the burst's peak).
                    give_back_memory();
                    peak = b.used();
                }
            }
            if (!b.over()) {
                told = false;
                continue;
            }
            if (!told && lp.home) {
                s->event(server_event::kind::over_budget, {}, errc::overloaded,
                         "ordo: the server's memory budget is used up (" +
                             std::to_string(b.used()) + " of " + std::to_string(b.limit()) +
                             " bytes): large messages wait, connections with queued messages "
                             "or unread output stop reading");
            }
            told = true;
            const auto now = clock::now();
            std::vector<std::shared_ptr<peer>> stuck;  // closed after the walk: it may erase
            for (auto& e : lp.peers) {
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
    // without a word. Runs on the server's executor; the telling runs on the transport's.
    void refuse(std::unique_ptr<transport> t, errc code, std::string why) {
        const std::string remote = t->remote_address();
        ++refused;
        event(server_event::kind::refused, remote, code, why);
        if (refusing >= max_refusing) {
            t->close();
            return keep_spare();
        }
        ++refusing;
        auto te = t->get_executor();
        net::co_spawn(te, say_closing(shared_from_this(), std::move(t), code, std::move(why)),
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
            net::steady_timer limit(t->get_executor(), std::chrono::seconds(1));
            co_await (drain(*t) || limit.async_wait(use_tuple));
        }
        t->close();
        net::dispatch(s->ex, [s] {
            --s->refusing;
            s->keep_spare();
        });
    }

    static net::awaitable<void> drain(transport& t) {
        char sink[1024];
        for (int i = 0; i < 64; ++i) {
            std::error_code ec;
            co_await t.async_read_some(net::buffer(sink, sizeof sink), ec);
            if (ec) co_return;
        }
    }

    // What one loop's connections add to server_stats; on lp's executor.
    static void add_loop(server_stats& st, const loop& lp) {
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
    server_stats base_snapshot() const {
        server_stats st;
        st.connections = open_total();
        st.connections_accepted = accepted;
        st.connections_refused = refused;
        st.detached_sessions = sessions->detached_count();
        if (const auto& b = o.peer.comm.budget) {
            st.memory_used = b->used();
            st.memory_budget = b->limit();
        }
        return st;
    }

    // server_stats without the handlers' part, for a caller that may block: the loop it runs
    // on (if any) is read in place, each other is asked and waited for (up to 1 s).
    server_stats snapshot() const {
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
    static net::awaitable<server_stats> gather(std::shared_ptr<state> s) {
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
        co_return st;
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
    ++s_->accept_loops;
    net::co_spawn(s_->ex, state::accept_loop(s_, l.get()), detail::rethrow_escaped{});
    if (s_->o.idle_timeout.count() > 0 && !s_->sweeping) {
        s_->sweeping = true;
        for (auto& lp : s_->loops)
            net::co_spawn(lp->ex, state::sweep_idle(s_, *lp), detail::rethrow_escaped{});
    }
    if (s_->o.peer.comm.budget && !s_->watching_budget) {
        s_->watching_budget = true;
        for (auto& lp : s_->loops)
            net::co_spawn(lp->ex, state::watch_budget(s_, *lp), detail::rethrow_escaped{});
    }
    s_->listeners.push_back(std::move(l));
    return bound;
}

net::awaitable<void> server::async_stop() {
    auto s = s_;
    s->stopping = true;
    for (auto& l : s->listeners) l->close();
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
