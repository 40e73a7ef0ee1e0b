// What ordo::server shares between its files: the loops it runs itself (threads > 1) and its
// state, held by the server and by everything it starts (accept loops, connections, ticks).
// rpc/server/server.cpp accepts connections and places them over the loops; rpc/server/limits.cpp
// keeps the limits (idle_timeout, the memory budget, refusing beyond max_connections or when out
// of descriptors); rpc/server/stats.cpp gathers server_stats and names server_event kinds.
#pragma once

#include <atomic>
#include <list>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "ordo/rpc/server.hpp"
#include "rpc/session/session_registry.hpp"

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
    state(net::any_io_executor e, server_options opt, const ordo::handlers* hs);
    ~state();

    // A descriptor held in reserve: when accepting fails for want of descriptors, it is given
    // up so that the connection waiting can be accepted, told why and closed, rather than left
    // in the kernel's backlog with no answer; it is taken again once that one is closed.
    int spare_fd = -1;
    void keep_spare();
    static void give_back_memory();
    static bool out_of_descriptors(const std::error_code& ec);

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
    std::vector<std::unique_ptr<listener>> closed_listeners;  // by stop_listening()
    bool listening(const listener* l) const noexcept {
        for (const auto& x : listeners)
            if (x.get() == l) return true;
        return false;
    }
    std::vector<std::unique_ptr<loop>> loops;  // [0] is the server's executor
    bool sweeping = false, watching_budget = false;
    int accept_loops = 0;
    // Counted on the server's executor, read from any loop (ordo.stats).
    std::atomic<std::uint64_t> accepted{0}, refused{0};
    std::atomic<bool> stopping{false};
    // A drain (server::async_drain, rpc/server/drain.cpp): the reason and the grace's end are
    // written before `draining` is set, and read on any loop after it is seen set.
    std::atomic<bool> draining{false};
    std::string drain_reason;
    std::chrono::steady_clock::time_point drain_deadline;
    std::atomic<std::uint64_t> closed_by_grace{0};
    bool stopped = false;  // async_stop() has completed
    net::steady_timer changed;

    // No new connection is served: stopping, or draining.
    bool closed_to_new() const noexcept { return stopping || draining; }
    // The grace a drain has left, for a connection told late (accepted just before it began).
    std::chrono::milliseconds drain_left() const;

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

    // rpc/server/server.cpp: accepting and placing connections.
    static net::awaitable<void> accept_loop(std::shared_ptr<state> s, listener* l);
    struct stranger;
    void serve(loop& lp, std::unique_ptr<transport> t, std::shared_ptr<stranger> who);
    void closed_on(loop& lp);

    // rpc/server/limits.cpp: idle connections, the memory budget, refusing connections.
    static constexpr std::size_t max_refusing = 64;
    std::size_t refusing = 0;
    static net::awaitable<void> sweep_idle(std::shared_ptr<state> s, loop& lp);
    static net::awaitable<void> watch_budget(std::shared_ptr<state> s, loop& lp);
    void refuse(std::unique_ptr<transport> t, errc code, std::string why);
    static net::awaitable<void> say_closing(std::shared_ptr<state> s, std::unique_ptr<transport> t,
                                            errc code, std::string why);
    static net::awaitable<void> drain(transport& t);

    // rpc/server/strangers.cpp: connections not known yet (server_options::strangers).
    // Everything here but the fields marked otherwise is touched on the server's executor.
    struct stranger {
        std::string key;  // address_group() of its address ("": exempt from per-address caps)
        loop* lp = nullptr;
        std::chrono::steady_clock::time_point since = std::chrono::steady_clock::now();
        bool listed = true;  // in `strangers` (known, evicted or closed: not)
        bool met = false;    // known (the gate accepted it), as the server's executor heard
        std::list<std::shared_ptr<stranger>>::iterator where;
        // On lp's executor only:
        std::weak_ptr<peer> p;
        bool known = false;
    };
    struct address_count {
        std::size_t open = 0, strangers = 0;
        // Failed authentications in the window that began at failures_since.
        std::size_t failures = 0;
        std::chrono::steady_clock::time_point failures_since{};
    };
    // At most one report a second per address; the rest are counted and said with the next.
    struct report_window {
        std::chrono::steady_clock::time_point since{};
        std::size_t said = 0, unsaid = 0;
        std::error_code last_code;
    };
    std::list<std::shared_ptr<stranger>> strangers;  // oldest first
    std::unordered_map<std::string, address_count> addresses;
    std::unordered_map<std::string, report_window> reports;
    std::unique_ptr<net::steady_timer> stranger_tick;
    bool watching_strangers = false;
    static std::string address_group(std::string_view url);
    // At accept: null after refusing `t` (per-address cap, failed authentications), else its
    // record, after making room among strangers.
    std::shared_ptr<stranger> welcome(std::unique_ptr<transport>& t, loop& lp);
    // The gate for a connection of `st`: the application's authenticate, if any, and the
    // moment it becomes known.
    std::function<auth_verdict(identity&, const credentials&)> gate_for(
        std::shared_ptr<stranger> st);
    void known(const std::shared_ptr<stranger>& st);
    void unlist(stranger& st);
    void evict(std::shared_ptr<stranger> st, errc code, std::string why, bool tell);
    // Its counts go.
    void forget(const std::shared_ptr<stranger>& st);
    // The gate refused it: counted against its address (max_auth_failures).
    void failed_auth(const stranger& st);
    // A served connection ended: its counts, failed authentications, and its `closed` report.
    void left(const std::shared_ptr<stranger>& st, std::string remote, std::error_code code,
              std::string why);
    void report(server_event::kind what, const std::string& key, std::string peer,
                std::error_code code, std::string reason);
    void say_unsaid(const std::string& k, report_window& r);
    static net::awaitable<void> watch_strangers(std::shared_ptr<state> s);

    // rpc/server/stats.cpp: server_stats.
    static void add_loop(server_stats& st, const loop& lp);
    server_stats base_snapshot() const;
    server_stats snapshot() const;
    static net::awaitable<server_stats> gather(std::shared_ptr<state> s);
    server_stats full_snapshot() const;
    // Routers shown in ordo.stats (show_router), read on their own executors by gather().
    std::mutex routers_mu;
    std::vector<std::pair<std::weak_ptr<router>, std::string>> routers;
};

}  // namespace ordo
