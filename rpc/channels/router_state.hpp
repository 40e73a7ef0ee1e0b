// ordo::router's state, shared by its two halves: rpc/channels/router.cpp (where calls go) and
// rpc/channels/router_members.cpp (who the replicas are: connecting, reconnecting, ejecting,
// draining, following sources).
#pragma once

#include <chrono>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "comm/read_clock.hpp"
#include "ordo/rpc/router.hpp"
#include "rpc/channels/aperture.hpp"
#include "rpc/channels/histogram.hpp"
#include "rpc/channels/wait_queue.hpp"

namespace ordo {

struct router::state {
    using clock_type = std::chrono::steady_clock;
    enum class phase { connecting, live, reconnecting, draining, gone };

    struct replica : std::enable_shared_from_this<replica> {
        std::string url, group;
        double weight = 1;
        std::vector<std::uint64_t> points;  // its places on the hash ring (place()), sorted
        bool in_ring = false;               // its points are on the ring now
        bool replaced = false;              // its points changed: take the old ones off
        phase ph = phase::connecting;
        bool member = true;       // false once removed: it drains, then leaves
        bool goaway = false;      // draining because its server is going away
        std::size_t source = 0;   // 0: the URL or add_replica; else sources[source - 1]
        std::shared_ptr<peer> conn;
        // The router's state while the router lives (null once its destruction began), shared
        // by all its replicas: a call's end reaches the router through its replica (conn_watch),
        // without a weak_ptr to lock per call.
        std::shared_ptr<state*> owner;
        std::uint64_t gen = 0;    // which connection: calls of an earlier one are not its news
        std::size_t in_flight = 0;
        double current = 0;  // smooth weighted round robin
        std::uint64_t completed = 0, errors = 0, shadow_calls = 0, connects = 0;
        detail::histogram latency;
        std::string last_error;
        // Reconnection and ejection.
        unsigned attempts = 0;  // failed connection attempts since the last success
        std::unique_ptr<net::steady_timer> retry_timer;  // the next attempt
        std::unique_ptr<net::steady_timer> eject_timer;  // the ejection's end
        std::size_t failures_in_a_row = 0;
        std::uint64_t ejections = 0;
        std::uint64_t streak = 0;  // ejections without a long stay in between
        clock_type::time_point ejected_until{};  // set while ejected ({} otherwise)
        clock_type::time_point last_ejected_end{};
        // (The clock is read only while an ejection is on: pick() asks every replica.)
        bool ejected() const {
            return ejected_until != clock_type::time_point{} && ejected_until > clock_type::now();
        }
    };

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

    // A key's calls in flight, and where (the key-order guard).
    struct key_flight {
        replica* at = nullptr;
        std::size_t calls = 0;
    };

    struct followed {
        std::unique_ptr<replica_source> src;
        std::string name;
        std::string last_problem;
    };

    state(router& r, net::any_io_executor e, router_options opt);

    // Beyond this many replicas, least_loaded compares two drawn at random instead of all.
    static constexpr std::size_t many_replicas = 16;

    router& self;
    std::shared_ptr<state*> anchor = std::make_shared<state*>(this);  // replica::owner
    net::any_io_executor ex;
    router_options o;
    std::vector<std::shared_ptr<replica>> reps;            // in the order added
    std::vector<std::pair<std::uint64_t, replica*>> ring;  // sorted by hash
    std::unordered_map<std::string, key_flight> keys;
    detail::wait_queue queue;
    router_counters c;
    std::string name;
    std::string last_loss;  // why the last replica was lost, for "no live replica" errors
    std::function<void(const std::string&)> on_event;
    std::size_t cursor = 0;  // round robin and least-loaded ties
    // least_loaded's aperture (router_options::aperture). `order`: every replica, each put at a
    // random place as it is admitted (so that routers spread their apertures over a fleet).
    // Calls without a key go to the first `size` of those that take calls, while one of them
    // has room; trials of one fewer or one more are kept only if they make calls faster.
    std::vector<replica*> order;
    // least_loaded's aperture, and what it asks of the router.
    struct aperture_link final : detail::aperture::host {
        explicit aperture_link(state& st) : s(st) {}
        std::size_t usable() const override { return s.usable(); }
        void event(const std::string& line) override { s.event(line); }
        state& s;
    } ap_link{*this};
    detail::aperture ap{ap_link, clock_type::now()};
    bool aperture_on = false;  // least_loaded with router_options::aperture
    double shadow_credit = 0;
    bool pump_posted = false;
    // Recent time from send to response per method (a moving average): a waiting call with
    // less than twice that left of its deadline is not sent (it would time out on the
    // replica, taking the room of one that could finish: the overload collapse of EDF).
    std::unordered_map<std::string, std::chrono::microseconds> service_estimates;
    // Idempotent calls in flight (router_options::idempotent_methods): their params, for a
    // second try if their replica is lost.
    std::unordered_map<const detail::pending_call*, detail::params_buffer> saved_params;
    bool closed = false;
    net::steady_timer wait_timer;  // wait_for_replica: the oldest waiting call's limit
    std::vector<followed> sources;
    std::minstd_rand rng{std::random_device{}()};
    // Replicas and connections that left while their peer may be on the stack (lose() runs
    // inside the peer's close): owned here until the executor comes back to release them.
    std::vector<std::shared_ptr<void>> retired;

    void update() {
        c.queued = queue.size();
        c.expired_in_queue = queue.expired();
    }
    void event(const std::string& line) {
        if (on_event) on_event(line);
    }
    void rename();
    bool is_shadow(const replica& r) const {
        return !o.shadow_group.empty() && r.group == o.shadow_group;
    }
    bool takes_calls(const replica& r) const {
        return r.ph == phase::live && !r.ejected();
    }
    bool has_room(const replica& r) const {
        return takes_calls(r) && r.in_flight < o.max_concurrent;
    }
    bool any_usable() const;
    std::shared_ptr<replica> shared(replica* r) const;
    std::shared_ptr<replica> find(const std::string& url) const;

    // rpc/channels/router.cpp: calls.
    void place(replica& r);
    void rebuild_ring();
    replica* owner_of(const std::string& key) const;
    bool key_may_go(const std::string& key, const replica* to) const;
    replica* pick(const detail::pending_call& call);
    replica* least_loaded();
    std::size_t usable() const;  // replicas that take calls without a key now
    replica* peek(const detail::pending_call& call) const;
    void start_call(std::unique_ptr<detail::pending_call> call);
    std::string no_replica_reason() const;
    void send(replica& r, std::unique_ptr<detail::pending_call> call,
              std::chrono::milliseconds timeout, bool retry);
    void shadow(const detail::pending_call& call, std::chrono::milliseconds timeout);
    void finished(replica& r, std::uint64_t gen, std::unique_ptr<detail::pending_call>& call,
                  std::error_code ec, call_outcome& out);
    void schedule_pump();
    void pump();
    void arm_wait_timer();
    void notify(std::string_view method, std::string_view params);

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
    void note_outcome(replica& r, std::error_code ec);
    void eject(replica& r);
    net::awaitable<void> add(std::string url, double weight, std::string group);
    bool remove(const std::string& url);
    void apply(std::size_t source, std::vector<member> set);
    void follow(std::unique_ptr<replica_source> src);
    void close_all();
};

}  // namespace ordo
