// ordo::server: listeners, a handler table, and one peer per accepted connection.
#pragma once

#include "ordo/config.hpp"

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "ordo/rpc/handlers.hpp"
#include "ordo/rpc/peer.hpp"

namespace ordo {

class router;

/// What a server tells its application about its connections (server_options::on_event).
struct server_event {
    enum class kind {
        opened,         ///< a connection was accepted and is served (a connection that
                        ///< resumes a session shows as opened, then closed with the reason
                        ///< "resumed an earlier session": the session goes on over it)
        closed,         ///< a served connection ended; `code` and `reason` say how
        refused,        ///< accepted beyond max_connections or stranger_limits, or with no
                        ///< descriptors left (a spare one is kept for this): told why, then
                        ///< closed
        accept_failed,  ///< accepting failed (e.g. out of descriptors); the server retries
        over_budget,    ///< the memory budget was found used up (again); `reason` has figures
        dropped,        ///< a notification was dropped: no such method, or its handler threw
                        ///< (`reason` names the method; peer_options::on_dropped)
        draining,       ///< async_drain began: `reason` has the grace, the reason and how
                        ///< many connections were told
        drained,        ///< async_drain ended (the server is stopped): `reason` says how many
                        ///< connections were still open when the grace passed and were closed
                        ///< by the server (server_stats::connections_closed_by_grace)
    };
    kind what = kind::opened;
    std::string peer;  ///< the remote address (empty for accept_failed)
    std::error_code code;
    std::string reason;
};

/// What a server spends on a connection before it knows who is calling (docs/security.md,
/// "Strangers"). A connection is a *stranger* from its accept until its first message is
/// served; on a server that authenticates, until server_options::authenticate accepted it.
/// Without these bounds, callers nobody knows could fill max_connections with silent
/// connections, or the memory budget with unfinished messages, and lock out the callers the
/// server knows. Addresses count together by IPv4 address or IPv6 /64 (one host holds a whole
/// /64); unix:// and inproc:// callers count only in max_strangers. Refusals, evictions,
/// strangers closed and failed authentications are reported through on_event at most once a
/// second per address, with how many were left unsaid.
struct stranger_limits {
    /// With authenticate set: a connection the gate has not accepted within this (no
    /// ordo.auth, no first message, or an unfinished one) is told why and closed. 0: none.
    std::chrono::milliseconds auth_timeout{10'000};
    /// Without authenticate: a connection that has not sent a whole first message within this
    /// is told why and closed (so does a client that connects and calls only minutes later:
    /// raise it, or set 0, for such callers). 0: none.
    std::chrono::milliseconds first_message_timeout{60'000};
    /// Connections from one address at once, known or not; one beyond it is refused, told
    /// why. 0: no cap.
    std::size_t max_per_address = 1024;
    /// Strangers at once, in all and from one address. A new connection beyond either cap
    /// closes the oldest stranger (of its address, else of all) at once: a flood of silent
    /// connections never fills max_connections, and a caller that authenticates when it
    /// connects is never the oldest. 0: no cap.
    std::size_t max_strangers = 1024;
    std::size_t max_strangers_per_address = 64;
    /// With authenticate set: the largest message (and str/bin) a stranger may send, ordo.auth
    /// included; a larger one is refused at its header, before it is buffered. With
    /// max_strangers this bounds what strangers hold of the memory budget (1,024 x 64 KiB is
    /// a sixteenth of the default 1 GiB), whatever they send.
    std::size_t max_message_bytes = std::size_t{64} << 10;
    /// With authenticate set: after this many refused authentications from one address within
    /// auth_failure_window, its new connections are refused until the window ends. 0: no limit.
    std::size_t max_auth_failures = 20;
    std::chrono::milliseconds auth_failure_window{10'000};
};

struct server_options {
    peer_options peer;  ///< for every accepted connection
    /// Event loops serving connections. 1: all on the executor given at construction. N > 1:
    /// that executor is loop 0 and the server runs N - 1 more loops, each on a thread of its
    /// own (stopped and joined when the server is destroyed). Each accepted tcp://, unix:// or
    /// tls:// connection is placed on the loop with the fewest connections and stays there: its
    /// peer, its handlers' coroutines and timers run on that loop only, so an ordered connection
    /// never spreads over threads (inproc:// and zmq+ connections stay on loop 0). The same
    /// handler may then run on several threads at once: state it shares across connections
    /// needs a lock or handler_options::run_on (a strand). Listeners, max_connections and the
    /// memory budget stay server-wide; on_event still runs on the server's executor.
    /// Resumable sessions work on every loop: a caller that comes back on another loop than
    /// its session's has its connection moved to the session's loop at its ordo.hello
    /// (server_stats::sessions_moved counts these).
    std::size_t threads = 1;
    /// Connections served at once. One accepted beyond it gets an ordo.closing notification
    /// saying why and is closed at once, instead of waiting in the kernel's backlog.
    std::size_t max_connections = 10'000;
    /// Bounds on connections the server does not know yet (see stranger_limits).
    stranger_limits strangers{};
    /// The one place a server reports what it drops or refuses: told of connections opened,
    /// closed (with the reason: end of stream, protocol error, message_timeout, dead peer...),
    /// refused, of accept failures, of the memory budget running out and of notifications
    /// dropped. Silent when unset. Runs on the server's executor (whichever loop the connection
    /// is on); must not throw. ordo::to_string(event) (below) gives each as one line.
    std::function<void(const server_event&)> on_event;
    /// A connection with no bytes either way for this long, and nothing pending (no calls
    /// waiting, no handlers running, nothing queued), is told why (ordo.closing) and closed.
    /// Checked every quarter of it. A resumable session waiting for its caller counts as
    /// idle too: keep this longer than resume_window. 0: off.
    std::chrono::milliseconds idle_timeout{0};
    /// Resumable sessions (peer_options::resume, asked for by callers): the longest window this
    /// server grants; a session whose caller has not come back within it ends. 0: sessions are
    /// not resumed (callers that ask are served as plain connections).
    std::chrono::milliseconds resume_window{30'000};
    /// Sessions waiting for their caller to come back, at most; beyond it the one that has
    /// waited longest among those of the address (port aside) with the most waiting is given
    /// up (its caller gets errc::session_lost when it returns): one address's flood does not
    /// push out another caller's session.
    std::size_t max_detached_sessions = 1024;
    /// Memory all connections together may hold for their peers: read buffers (incomplete
    /// messages included), queued incoming messages, output not yet written, resend buffers.
    /// While it is used up, small messages are still read and served on every connection, but
    /// no connection grows its read buffer beyond 32 KiB, a connection with queued messages
    /// stops reading until its queue drains, and one with more than 32 KiB of unwritten output
    /// stops reading (see comm_options::budget). Each connection also costs ~15 KiB that is
    /// not counted here. 0: no budget.
    std::size_t memory_budget = std::size_t{1} << 30;
    /// While the budget is used up, a connection whose output (over 32 KiB) has not been
    /// written for this long (its peer does not read) is closed with errc::overloaded and the
    /// reason. Checked every quarter of it.
    std::chrono::milliseconds output_grace{10'000};
    /// How many calls run at once, over every connection, loop and method: none (default), a
    /// fixed number, or `ordo::adaptive` (ordo/rpc/concurrency.hpp; docs/protocol.md
    /// "Overload"). A call over it is answered errc::overloaded at once, before anything of it
    /// runs, with a retry-after hint (`retry_after_ms` in the error); a notification over it is
    /// dropped (on_event: `dropped`). Whole calls only: the connection and the order of what
    /// it does run are untouched. It counts what a handler holds while it is suspended (a
    /// coroutine, a body on run_on, a stream, a batch); a plain function on the loop runs to
    /// its end before the loop reads on, and is not counted. Methods may have their own
    /// (handler_options::concurrency); a call must pass both. server_stats::concurrency and
    /// ordo.stats show where it stands.
    concurrency_limit concurrency;
    /// How `concurrency` is shared among callers (caller_shares: a queue per caller, weights
    /// by subject). Default: not shared, a call over the limit is refused at once.
    caller_shares shares;
    /// Authentication (docs/security.md): decides on each connection, before any of its
    /// messages is served, from what its transport proved and the credentials the caller sent
    /// first (ordo.auth), and names the caller (identity::subject, peer::identity()). A refused
    /// caller's requests are answered errc::unauthenticated with the reason, and its connection
    /// closes. Once accepted, a connection costs nothing more per call. A resumed session must
    /// present the same certificate and token subject. ordo::authenticate_tokens(
    /// ordo::read_token_file(path)) is a ready one. Null: every caller is served.
    authenticate_fn authenticate;
    /// With authenticate set: the callers that ordo.stats and ordo.methods answer (null: none;
    /// they get errc::permission_denied).
    allow_fn allow_introspection;
    /// One record per request answered (access_record: trace id, method, peer, subject, status,
    /// duration, bytes), on the connection's loop. Null: none (`ordo-inc-server --access-log
    /// FILE` writes them as JSON lines).
    access_log_fn access_log;
};

/// One line for a server event, e.g. `ordo: closed tcp://127.0.0.1:50412: protocol error
/// (...)`, as the examples and tools print them.
std::string to_string(const server_event& e);

/// Serves the registered handlers on every listener. Each accepted connection becomes an
/// ordo::peer (so handlers can call back through their peer&). Belongs to the executor given at
/// construction. Stop it with async_stop() before destroying it.
class server {
  public:
    server(net::any_io_executor ex, server_options o);
    explicit server(net::any_io_executor ex);
    ~server();
    server(const server&) = delete;
    server& operator=(const server&) = delete;

    /// Registers a handler (see ordo::handlers::on).
    template <class F>
    server& on(std::string name, F f, handler_options o = {}) {
        handlers_.on(std::move(name), std::move(f), o);
        return *this;
    }
    template <class Sig, class F>
    server& on(const method<Sig>& m, F f, handler_options o = {}) {
        handlers_.on(m, std::move(f), o);
        return *this;
    }

    /// Registers a batch handler (see ordo::handlers::on_batch).
    template <class F>
    batch_handle on_batch(std::string name, batch_options o, F f) {
        return handlers_.on_batch(std::move(name), o, std::move(f));
    }
    /// Registers a streaming batch handler (see ordo::handlers::on_batch_stream).
    template <class F>
    batch_handle on_batch_stream(std::string name, batch_options o, F f) {
        return handlers_.on_batch_stream(std::move(name), o, std::move(f));
    }

    /// Binds `url` and starts accepting. Returns the bound address (with the real port for
    /// tcp port 0). Throws std::system_error naming the address on failure.
    std::string listen(std::string_view url);

    /// Stops accepting now: every listener closes (its address is free for another bind when
    /// this returns; a caller that connects is refused), and the connections already accepted
    /// go on being served until they end or async_stop()/async_drain() closes them. listen()
    /// may be called again. On the server's executor.
    void stop_listening();

    /// Stops accepting, fails calls waiting in batch handlers with errc::shutting_down, closes
    /// every connection (flushing responses already queued; handlers still running are
    /// cancelled) and completes when all of them have ended.
    net::awaitable<void> async_stop();

    /// Stops gracefully (docs/protocol.md "Draining"). At once: stops accepting (the
    /// listeners close: new connections are refused), ends detached resumable sessions (their
    /// callers cannot come back), and sends every connection, on every loop, the reserved
    /// notification ordo.goaway [grace_ms, reason]. Then it keeps serving: running handlers,
    /// queued calls, batches, streams, and requests that arrive after the goaway (sent before
    /// the peer read it) all run and are answered as usual. An ordo peer closes its connection
    /// once nothing is pending on it; a foreign peer does not know the notification. When every
    /// connection has closed, or when `grace` has passed, whatever is left is closed as
    /// async_stop() does (told why with ordo.closing; running handlers are cancelled; a peer
    /// that does not close its side then is cut after comm_options::close_timeout), and the
    /// drain completes: the server is then stopped, as after async_stop(). on_event hears
    /// `draining` and `drained`. Called again while a drain or a stop runs: waits for it.
    net::awaitable<void> async_drain(std::chrono::milliseconds grace,
                                     std::string reason = "draining");

    /// What the reserved method ordo.health answers of `service` ("": the whole server, which
    /// starts serving), and ordo.health_watch streams (docs/protocol.md, "Health"): handlers
    /// set their own service's state here; `ordo health URL [SERVICE]` exits 0 only while it
    /// is serving. async_drain() sets every service to draining before it tells any
    /// connection. Any thread.
    void set_health(std::string_view service, health_state s);
    /// What ordo.health answers of `service` now; nothing for a name never set.
    std::optional<health_state> health(std::string_view service = {}) const;

    /// Shows `r` in ordo.stats (server.routers, under `name`): its counts and each replica's
    /// state, read on the router's executor when asked. For a server that fronts a fleet (a
    /// gateway, a proxy). stats() leaves routers out (it would have to block on their
    /// executors); read r->view() there. Holds the router weakly; any thread.
    void show_router(std::shared_ptr<router> r, std::string name);

    /// Connections currently open.
    std::size_t peer_count() const noexcept;
    /// Connections accepted since construction.
    std::uint64_t connections_accepted() const noexcept;
    /// Resumable sessions whose connection dropped, waiting for their caller to come back.
    std::size_t detached_sessions() const noexcept;
    /// Bytes charged to the memory budget now (0 without one).
    std::size_t memory_used() const noexcept;
    /// Everything the server counts (also answered to the reserved method ordo.stats). Call on
    /// the server's executor. With threads > 1 it asks each other loop for its connections'
    /// figures and waits for them (up to 1 s; a loop that does not answer in time is left out):
    /// do not call it from a handler.
    server_stats stats() const;
    /// stats() as a function that may outlive the server (it then returns nothing); call it on
    /// the server's executor. The Prometheus exporter reads servers through it.
    std::function<std::optional<server_stats>()> stats_reader() const;
    net::any_io_executor get_executor() const;
    ordo::handlers& handlers() noexcept { return handlers_; }

    struct state;
    struct loops;

  private:
    ordo::handlers handlers_;
    std::shared_ptr<state> s_;
    std::unique_ptr<loops> loops_;  // threads > 1: the loops the server runs itself
};

}  // namespace ordo
