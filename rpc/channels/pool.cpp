#include "ordo/rpc/pool.hpp"

#include <algorithm>
#include <map>
#include <vector>

#include "lib/task_scope.hpp"
#include "rpc/channels/connecting.hpp"
#include "rpc/channels/wait_queue.hpp"
#include "rpc/connection/when_closed.hpp"
#include "rpc/context/context.hpp"

namespace ordo {

struct pool::state {
    using clock = std::chrono::steady_clock;

    // The call as lent to one connection, a child of the pool (it holds a ticket of `tasks`):
    // forwards the outcome to the caller and gives the connection back to the pool. Posted:
    // never from inside the peer's own code, where this may hold the connection's last
    // reference (a closed pool only lets it go there).
    class pooled_call final : public detail::pending_call {
      public:
        pooled_call(state& s, std::shared_ptr<peer> conn,
                    std::unique_ptr<detail::pending_call> inner)
            : s_(s), t_(s.tasks.hold()), conn_(std::move(conn)), inner_(std::move(inner)) {}
        void wrap(std::unique_ptr<detail::pending_call> inner) { inner_ = std::move(inner); }

        void complete(std::error_code ec, call_outcome out) override {
            net::post(s_.ex, [&s = s_, t = std::move(t_), conn = std::move(conn_), ok = !ec] {
                s.release(conn, ok);
            });
            inner_->complete(ec, std::move(out));
        }
        // The outcome goes straight to the caller's call, which may read it where it lies (a
        // large result then is not copied first).
        bool takes_borrowed() const noexcept override { return inner_ && inner_->takes_borrowed(); }

      private:
        state& s_;
        detail::task_scope::ticket t_;
        std::shared_ptr<peer> conn_;
        std::unique_ptr<detail::pending_call> inner_;
    };

    struct idle_entry {
        std::shared_ptr<peer> conn;
        clock::time_point since;
    };

    state(net::any_io_executor e, std::string u, pool_options opt)
        : ex(std::move(e)),
          url(std::move(u)),
          o(std::move(opt)),
          queue(
              ex,
              [this](std::chrono::milliseconds t) {
                  return "no connection to " + url + " became free within " +
                         std::to_string(t.count()) + " ms";
              },
              "cancelled by the caller while waiting for a connection", [this] { update(); }),
          sweeper(ex) {
        parse_address(url);  // a bad URL fails here, not at the first call
    }

    net::any_io_executor ex;
    std::string url;
    pool_options o;
    std::vector<std::shared_ptr<peer>> open;                 // idle and busy
    std::vector<idle_entry> idle;                            // most recently used last
    detail::wait_queue queue;                                // calls waiting for a connection
    std::vector<std::pair<std::string, std::string>> notes;  // waiting for a connection
    std::size_t connecting = 0;
    bool closed = false;
    bool sweeping = false;
    net::steady_timer sweeper;
    pool_counters c;
    // Its children (connection attempts, calls lent out, waits and posts): cancelled by
    // close_all(); the state goes once they have ended (~pool).
    detail::task_scope tasks{ex};

    void update() {
        c.open = open.size();
        c.idle = idle.size();
        c.connecting = connecting;
        c.queued_calls = queue.size();
        c.expired_in_queue = queue.expired();
    }

    void start_call(std::unique_ptr<detail::pending_call> call) {
        if (closed)
            return detail::fail_call(*call, errc::closed, "ordo: pool for " + url + " is closed");
        if (!detail::take_context(*call, o.peer.default_timeout)) [[unlikely]]
            return detail::fail_call(*call, errc::timed_out,
                                     detail::inherited_timeout_reason(*call));
        const auto timeout =
            call->options.timeout.count() > 0 ? call->options.timeout : o.peer.default_timeout;
        if (auto conn = take_idle()) return lend(conn, std::move(call), timeout);
        if (queue.size() >= o.max_queued_calls)
            return detail::fail_call(*call, errc::overloaded,
                                     "ordo: " + std::to_string(queue.size()) +
                                         " calls already wait for a " + "connection to " + url +
                                         " (max_queued_calls)");
        queue.push(std::move(call), timeout);
        update();
        maybe_connect();
    }

    std::shared_ptr<peer> take_idle() {
        while (!idle.empty()) {
            auto conn = std::move(idle.back().conn);
            idle.pop_back();
            if (conn->takes_calls() && !conn->going_away()) return conn;
            retire(conn);
        }
        return nullptr;
    }

    void lend(const std::shared_ptr<peer>& conn, std::unique_ptr<detail::pending_call> call,
              std::chrono::milliseconds timeout) {
        auto lent = std::make_unique<pooled_call>(*this, conn, nullptr);
        detail::move_call_fields(*call, *lent, timeout);
        lent->wrap(std::move(call));
        update();
        conn->start_call(std::move(lent));
    }

    // Lends `conn` to the first waiting call (earliest deadline first); false if none was
    // left (those found past their deadline fail instead of being sent).
    bool lend_waiting(const std::shared_ptr<peer>& conn) {
        auto w = queue.take_first();
        if (!w) return false;
        lend(conn, std::move(w->call), w->timeout);
        return true;
    }

    void release(const std::shared_ptr<peer>& conn, bool ok) {
        if (!ok || closed || !conn->takes_calls()) {
            discard(conn);
            maybe_connect();
            return;
        }
        if (conn->going_away()) {
            // Its server drains: no new call goes there; waiting ones get a new connection.
            retire(conn);
            maybe_connect();
            return;
        }
        if (!queue.empty() && lend_waiting(conn)) return;
        if (idle.size() >= o.max_idle) {
            discard(conn);
            return;
        }
        idle.push_back({conn, clock::now()});
        update();
        arm_sweeper();
    }

    void discard(const std::shared_ptr<peer>& conn) {
        auto it = std::find(open.begin(), open.end(), conn);
        if (it == open.end()) return;
        open.erase(it);
        ++c.connections_discarded;
        conn->abort();
        update();
    }

    // A connection whose server said it is going away (ordo.goaway): out of the pool at once,
    // closed gracefully (the peer closes it by itself once its call is done; this only makes
    // sure). A call still on it completes (pooled_call holds the connection).
    void retire(const std::shared_ptr<peer>& conn) {
        auto it = std::find(open.begin(), open.end(), conn);
        if (it == open.end()) return;
        open.erase(it);
        ++c.connections_discarded;
        if (conn->counters().pending_calls == 0) conn->close();
        update();
    }

    void maybe_connect() {
        const std::size_t wanted = queue.size() + (notes.empty() ? 0 : 1);
        while (!closed && wanted > connecting && open.size() + connecting < o.max_connections) {
            ++connecting;
            update();
            tasks.spawn([this] { return connect_one(*this); });
        }
    }

    static net::awaitable<void> connect_one(state& s) {
        std::unique_ptr<transport> t;
        std::error_code ec;
        std::string why;
        try {
            t = co_await detail::open_transport_within(s.url, s.o.connect_timeout,
                                                       s.o.peer.transport);
        } catch (const std::system_error&) {
            // The code an ordered channel reports for a server that is gone (peer_lost, or
            // timed_out...), with the OS's reason as the detail.
            const rpc_error r = detail::connect_error(s.url);
            ec = r.code();
            why = r.detail();
        }
        --s.connecting;
        if (t)
            s.adopt(std::move(t));
        else
            s.connect_failed(ec, why);
    }

    // A new connection: it serves waiting notifications and the oldest waiting call.
    std::shared_ptr<peer> adopt(std::unique_ptr<transport> t) {
        auto conn = make_peer(std::move(t), o.peer, nullptr);
        conn->start();
        ++c.connections_opened;
        auto forget = [this, raw = conn.get()](const std::error_code&, const std::string&) {
            forget_idle(raw);
        };
        detail::when_closed(*conn, ex, tasks.hold(), forget);
        // Its server drains: an idle connection leaves the pool now; a busy one when its call
        // is done (release).
        conn->on_goaway([this, t = tasks.hold(), raw = conn.get()](std::chrono::milliseconds,
                                                                   const std::string&) {
            net::post(ex, [this, t, raw] { retire_idle(raw); });
        });
        open.push_back(conn);
        if (closed) {
            discard(conn);
            return conn;
        }
        auto waiting_notes = std::move(notes);
        notes.clear();
        for (auto& [method, params] : waiting_notes) send_note(*conn, method, params);
        if (queue.empty() || !lend_waiting(conn)) release(conn, true);
        update();
        return conn;
    }

    // The connection `raw` taken out of the idle ones (null if it is not idle).
    std::shared_ptr<peer> take_from_idle(peer* raw) {
        auto it = std::find_if(idle.begin(), idle.end(),
                               [raw](const idle_entry& e) { return e.conn.get() == raw; });
        if (it == idle.end()) return nullptr;
        auto conn = it->conn;
        idle.erase(it);
        return conn;
    }
    // An idle connection whose server went away: drop it now rather than at the next call.
    void forget_idle(peer* raw) {
        if (auto conn = take_from_idle(raw)) discard(conn);
    }
    void retire_idle(peer* raw) {
        if (auto conn = take_from_idle(raw)) retire(conn);
    }

    void connect_failed(std::error_code ec, const std::string& why) {
        update();
        if (closed || !open.empty() || connecting > 0) return;  // others will serve the queue
        queue.fail_all(ec, why);
        update();
        drop_notes(ec, why);
    }

    void drop_notes(std::error_code ec, const std::string& why) {
        auto lost = std::move(notes);
        notes.clear();
        if (o.peer.on_undelivered)
            for (auto& [method, params] : lost) o.peer.on_undelivered({method, params, ec, why});
    }

    void send_note(peer& conn, const std::string& method, const std::string& params) {
        try {
            conn.notify_raw(method, params);
        } catch (const std::system_error& e) {
            if (o.peer.on_undelivered) o.peer.on_undelivered({method, params, e.code(), e.what()});
        }
    }

    void notify(std::string_view method, std::string_view params) {
        if (closed) throw_error(errc::closed, "ordo: pool for " + url + " is closed");
        for (auto it = open.rbegin(); it != open.rend(); ++it)
            if ((*it)->is_open() && !(*it)->going_away()) return (*it)->notify_raw(method, params);
        notes.emplace_back(std::string(method), std::string(params));
        maybe_connect();
    }

    void arm_sweeper() {
        if (sweeping || idle.empty()) return;
        sweeping = true;
        sweeper.expires_at(idle.front().since + o.idle_timeout);
        sweeper.async_wait([this, t = tasks.hold()](std::error_code ec) {
            sweeping = false;
            if (!ec && !closed) sweep();
        });
    }

    void sweep() {
        const auto now = clock::now();
        // idle is ordered by since: the oldest first.
        while (!idle.empty() && idle.front().since + o.idle_timeout <= now) {
            auto conn = idle.front().conn;
            idle.erase(idle.begin());
            discard(conn);
        }
        arm_sweeper();
    }

    void close_all() {
        if (closed) return;
        closed = true;
        tasks.close();  // connection attempts end now
        queue.fail_all(errc::closed, "ordo: pool for " + url + " closed");
        drop_notes(errc::closed, "ordo: pool for " + url + " closed");
        idle.clear();
        auto conns = std::move(open);
        open.clear();
        for (auto& conn : conns) conn->abort();
        sweeper.cancel();
        update();
    }
};

pool::pool(private_tag, net::any_io_executor ex, std::string url, pool_options o)
    : s_(std::make_unique<state>(detail::without_context(std::move(ex)), std::move(url),
                                 std::move(o))) {}

pool::~pool() {
    detail::close_and_join(std::move(s_), [](state& s) { s.close_all(); });
}

void pool::start_call(std::unique_ptr<detail::pending_call> call) {
    // Each call has a connection to itself: a lane would only cost the connection a question
    // (ordo.features) and pieces.
    call->lane = 0;
    s_->start_call(std::move(call));
}

void pool::notify_raw(std::string_view method, std::string_view params) {
    s_->notify(method, params);
}

const std::string& pool::remote_address() const noexcept {
    return s_->url;
}
net::any_io_executor pool::get_executor() const {
    return s_->ex;
}

net::awaitable<void> pool::async_warm_up() {
    auto keep = shared_from_this();
    std::unique_ptr<transport> t;
    try {
        t = co_await detail::open_transport_within(s_->url, s_->o.connect_timeout,
                                                   s_->o.peer.transport);
    } catch (const std::system_error&) {
        throw detail::connect_error(s_->url);
    }
    s_->adopt(std::move(t));
}

void pool::close() {
    s_->close_all();
}
const pool_counters& pool::counters() const noexcept {
    return s_->c;
}

std::shared_ptr<pool> make_pool(net::any_io_executor ex, std::string url) {
    return make_pool(std::move(ex), std::move(url), pool_options{});
}

std::shared_ptr<pool> make_pool(net::any_io_executor ex, std::string url, pool_options o) {
    return std::make_shared<pool>(pool::private_tag{}, std::move(ex), std::move(url), std::move(o));
}

}  // namespace ordo
