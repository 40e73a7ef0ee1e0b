// ordo::router's state. Its data is membership's (the replicas and the sources followed) and the
// flow's (the waiting queue, retries, shadow copies); it owns the two other parts: placement
// (rpc/channels/placement.hpp: policy, hash ring, aperture, key guard) and accounting
// (rpc/channels/accounting.hpp). Membership's code is rpc/channels/router_members.cpp, the
// flow's rpc/channels/router.cpp.
#pragma once

#include <chrono>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "lib/task_scope.hpp"
#include "ordo/rpc/router.hpp"
#include "rpc/channels/accounting.hpp"
#include "rpc/channels/histogram.hpp"
#include "rpc/channels/placement.hpp"
#include "rpc/channels/retry_budget.hpp"
#include "rpc/channels/wait_queue.hpp"

namespace ordo {

struct router::state {
    using clock_type = std::chrono::steady_clock;
    using phase = detail::replica_phase;
    using replica = detail::replica;

    // Told of each call of one connection to a replica as it ends (peer::observe_calls): books
    // its outcome before the caller hears. Holds the replica, which holds the connection only
    // until it drops it (lose(), leave(), close_all()): no cycle outlives the router.
    struct conn_watch final : detail::call_observer {
        conn_watch(std::shared_ptr<replica> r, std::uint64_t g) : rep(std::move(r)), gen(g) {}
        void ended(std::unique_ptr<detail::pending_call>& call, std::error_code ec,
                   call_outcome& out, bool /*now*/) override {
            // The router's destruction began: the caller hears as from a plain peer.
            if (state* s = *rep->owner) s->finished(*rep, gen, call, ec, out);
        }
        std::shared_ptr<replica> rep;
        std::uint64_t gen;  // the connection's (replica::gen when it was made)
    };

    // A copy of a call sent to a shadow replica: its outcome is counted, and nobody waits.
    class shadow_call final : public detail::pending_call {
      public:
        void complete(std::error_code, call_outcome) override {}
        bool takes_borrowed() const noexcept override { return true; }
    };

    struct followed {
        std::unique_ptr<replica_source> src;
        std::string name;
        std::string last_problem;
    };

    state(router& r, net::any_io_executor e, router_options opt);

    router& self;
    std::shared_ptr<state*> anchor = std::make_shared<state*>(this);  // replica::owner
    net::any_io_executor ex;
    router_options o;
    std::vector<std::shared_ptr<replica>> reps;  // in the order added
    detail::wait_queue queue;
    router_counters c;
    std::string name;
    std::string last_loss;  // why the last replica was lost, for "no live replica" errors
    std::function<void(const std::string&)> on_event;
    // What least_loaded's aperture asks of the router.
    struct aperture_link final : detail::aperture::host {
        explicit aperture_link(state& st) : s(st) {}
        std::size_t usable() const override { return s.place.usable(); }
        void event(const std::string& line) override { s.event(line); }
        state& s;
    } ap_link{*this};
    detail::placement place{reps, o, ap_link};
    detail::accounting books;
    double shadow_credit = 0;
    bool pump_posted = false;
    detail::retry_budget budget{o.retry_budget_percent, o.min_retries_per_s};
    // Hedged calls (rpc/channels/router_hedge.cpp): whether any method is hedged, and the recent
    // send-to-answer times of those hedged after their p95.
    const bool hedging = o.hedge.on() || !o.hedge_methods.empty();
    struct hedge_times {
        detail::recent_histogram h;
        std::chrono::microseconds p95{0};
        std::uint64_t at_count = 0;  // h.count() when p95 was last taken
    };
    std::unordered_map<std::string, hedge_times> hedge_latency;
    bool closed = false;
    net::steady_timer wait_timer;  // wait_for_replica: the oldest waiting call's limit
    detail::task_scope tasks{ex};  // connection attempts (dial()), cancelled by close_all()
    std::vector<followed> sources;
    std::minstd_rand rng{std::random_device{}()};  // reconnection jitter
    // Replicas and connections that left while their peer may be on the stack (lose() runs
    // inside the peer's close): owned here until the executor comes back to release them.
    std::vector<std::shared_ptr<void>> retired;

    void update() {
        c.queued = queue.size();
        c.expired_in_queue = queue.expired();
    }

    // The queue shared among callers (router_options::caller_weights; rpc/channels/router.cpp):
    // each caller's calls in flight and waiting. The anonymous caller ("") is counted apart, so
    // that a call without one pays no lookup.
    struct caller_load {
        std::size_t in_flight = 0, waiting = 0;
        unsigned weight = 1;
    };
    caller_load anonymous;
    std::unordered_map<std::string, caller_load> callers;
    std::size_t waiting_callers = 0;  // callers with calls waiting
    caller_load& load_of(const std::string& caller) {
        return caller.empty() ? anonymous : named_load(caller);
    }
    caller_load& named_load(const std::string& caller);
    void note_waiting(const detail::pending_call& call, bool more);
    // The waiting callers furthest below their share (tied), while more than one caller
    // waits (else none: the queue's order alone).
    std::vector<std::string> next_callers() const;
    // The queue is full: pushes out the newest call of the caller furthest over its share,
    // if that is not `call`'s own; says whether it made room.
    bool push_out_for(const detail::pending_call& call);
    void event(const std::string& line) {
        if (on_event) on_event(line);
    }
    void rename();
    bool in_shadow_group(const std::string& group) const {
        return !o.shadow_group.empty() && group == o.shadow_group;
    }
    bool any_usable() const;
    std::shared_ptr<replica> shared(replica* r) const;
    std::shared_ptr<replica> find(const std::string& url) const;

    // rpc/channels/router.cpp: calls.
    void start_call(std::unique_ptr<detail::pending_call> call);
    std::string no_replica_reason() const;
    void send(replica& r, std::unique_ptr<detail::pending_call> call,
              std::chrono::milliseconds timeout, bool retry);
    // send() of a call that goes out again (a hedge's copy), from the other files.
    void send_again(replica& r, std::unique_ptr<detail::pending_call> call,
                    std::chrono::milliseconds timeout);
    void shadow(const detail::pending_call& call, std::chrono::milliseconds timeout);
    // What the router notes of a call it sends (pending_call::noted): when, and a mark that
    // holds the aperture's tag (aperture::tag()) and whether it is a shadow copy.
    static constexpr std::uint16_t shadow_mark = 0x100;
    void finished(replica& r, std::uint64_t gen, std::unique_ptr<detail::pending_call>& call,
                  std::error_code ec, call_outcome& out);
    // A call that ended with `ec` on `r` goes out again, elsewhere, if it may (a second try, or
    // a move away from an overloaded replica): true if it took the call.
    bool try_again(replica& r, std::unique_ptr<detail::pending_call>& call, std::error_code ec,
                   call_outcome& out);
    void schedule_pump();
    void pump();
    void arm_wait_timer();
    void notify(std::string_view method, std::string_view params, std::uint16_t lane);

    // rpc/channels/router_members.cpp: who the replicas are.
    std::shared_ptr<replica> admit(std::string url, double weight, std::string group,
                                   std::size_t source);
    net::awaitable<std::exception_ptr> connect_once(std::shared_ptr<replica> r, bool drop);
    void dial(std::shared_ptr<replica> r);
    std::chrono::milliseconds retry_later(const std::shared_ptr<replica>& r);
    void retire(std::shared_ptr<void> p);
    void attach(const std::shared_ptr<replica>& r, std::unique_ptr<transport> t);
    void lose(replica& r, const std::string& why);
    void leave(replica& r);
    void heard_goaway(replica& r, const std::string& reason);
    // rpc/channels/router_hedge.cpp: hedged calls.
    // The delay after which `call` is hedged, or 0 if it is not.
    std::chrono::milliseconds hedge_delay(const detail::pending_call& call);
    // Sends `call` as its first copy to `r` and hedges it after `delay`.
    void send_hedged(replica& r, std::unique_ptr<detail::pending_call> call,
                     std::chrono::milliseconds timeout, std::chrono::milliseconds delay);
    void note_hedge_latency(const std::string& method, clock_type::duration took);
    // rpc/channels/router_health.cpp: each connection watches its server's health.
    void watch_health(const std::shared_ptr<replica>& r);
    // Closes a draining replica's connection that has no call of the router's left: its
    // health watch is cancelled first, so that the server has nothing running and closes its
    // side at once.
    void close_idle(replica& r);
    void heard_health(replica& r, const std::string& state);
    void note_outcome(replica& r, std::error_code ec);
    void eject(replica& r);
    net::awaitable<void> add(std::string url, double weight, std::string group);
    bool remove(const std::string& url);
    void apply(std::size_t source, std::vector<member> set);
    void follow(std::unique_ptr<replica_source> src);
    bool trusted_with_token(const replica& r) const;
    void close_all();
};

}  // namespace ordo
