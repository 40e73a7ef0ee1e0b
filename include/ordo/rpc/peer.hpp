// ordo::peer: ordered request/response calls over one batched_comm (docs/protocol.md, "Calls").
#pragma once

#include "ordo/config.hpp"

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "ordo/comm/batched_comm.hpp"
#include "ordo/rpc/channel.hpp"
#include "ordo/identity.hpp"
#include "ordo/comm/transport.hpp"

namespace ordo {

class handlers;
class peer;
struct peer_options;

namespace detail {
struct resume_config;
/// A peer whose session resumes as `rc` says (connect.cpp, server.cpp, router.cpp).
std::shared_ptr<peer> make_peer(std::unique_ptr<transport> t, peer_options o, const handlers* h,
                                resume_config rc);
/// The server's side of a drain (server::async_drain): sends the other side the reserved
/// notification ordo.goaway [grace_ms, reason] (docs/protocol.md "Draining"), once; later calls
/// do nothing. The peer goes on serving and calling as before. On the peer's executor.
void send_goaway(peer& p, std::chrono::milliseconds grace, const std::string& reason);
}  // namespace detail

/// A notification taken for sending but not written when its connection ended.
struct undelivered_notification {
    std::string method;
    std::string params;  ///< the encoded params array
    std::error_code code;
    std::string reason;  ///< why the connection ended
};

/// An incoming message dropped with nobody to answer (peer_options::on_dropped): a notification
/// for a method with no handler, or whose handler threw. (A request is answered with the error
/// instead.)
struct dropped_message {
    std::string peer;  ///< the remote address
    std::string method;
    std::error_code code;  ///< errc::method_not_found, or the handler's error
    std::string reason;
};

/// What happened to a resumable session (peer_options::on_session).
struct session_event {
    enum class kind {
        opened,   ///< the other side agreed to a new session
        resumed,  ///< a dropped connection was replaced; nothing was lost
        lost,     ///< the session could not resume: what was in flight failed (`code`, `reason`)
    };
    kind what = kind::opened;
    std::error_code code;  ///< lost: errc::peer_lost (the window passed) or errc::session_lost
    std::string reason;
};

/// Told that the other side of a connection is going away (peer_options::on_goaway,
/// peer::on_goaway): the grace it gives, and its reason.
using goaway_fn = std::function<void(std::chrono::milliseconds grace, const std::string& reason)>;

struct peer_options {
    comm_options comm;
    /// TLS and ZeroMQ settings, for connections this side opens (async_connect, pools) or
    /// accepts (server::listen).
    transport_options transport;
    /// Dead-peer detection (docs/protocol.md, "Liveness"). While this side waits for the remote one
    /// (calls pending or handlers running) and nothing has arrived for heartbeat_interval, it
    /// sends ordo.ping; when nothing at all has arrived for liveness_timeout, the peer is lost:
    /// pending calls fail with errc::peer_lost, handlers are cancelled. Works down to ~100 ms.
    /// Also sets TCP keepalive and TCP_USER_TIMEOUT from it (transport::set_liveness). 0: off.
    std::chrono::milliseconds liveness_timeout{10'000};
    /// 0: a quarter of liveness_timeout.
    std::chrono::milliseconds heartbeat_interval{0};
    /// Told about every notification taken for sending and not written when the connection
    /// ended (requests need no such report: their calls fail).
    std::function<void(const undelivered_notification&)> on_undelivered;
    /// Told of every incoming notification dropped (dropped_message). Silent by default; a
    /// server passes them to server_options::on_event. Runs on the peer's executor; must not
    /// throw.
    std::function<void(const dropped_message&)> on_dropped;
    /// Deadline of calls that set none. 0: none.
    std::chrono::milliseconds default_timeout{0};
    /// The first msgid used (tests start near 2^32 to exercise the wrap).
    std::uint32_t first_msgid = 0;
    /// Incoming requests and notifications waiting for a serial handler; at this many the peer
    /// stops reading until the queue halves (TCP flow control pushes back on the sender).
    std::size_t max_queued_messages = 65536;
    /// The same bound in bytes (as received): at this many bytes of queued messages the peer
    /// stops reading until they halve. A few large messages queued behind a slow handler then
    /// hold this much, not max_queued_messages x max_message_bytes.
    std::size_t max_queued_bytes = std::size_t{64} << 20;
    /// Resumable session (docs/protocol.md, "Resumable sessions"; URL parameter resume_ms): when
    /// the connection drops, this side reconnects (backoff from 10 ms to 1 s, jittered) and both
    /// sides send again what the other did not receive, so that every request, notification and
    /// response arrives once and in order; pending calls stay pending meanwhile. Asked for by the
    /// side that connects (async_connect, router replicas); the server grants at most its own
    /// server_options::resume_window. Not resumed within this window: the session ends with
    /// errc::peer_lost; the other side no longer has it (restarted): errc::session_lost, at
    /// once. A peer that does not resume sessions (any other msgpack-rpc peer) is served as
    /// without it (peer::is_resumable() stays false). 0: off.
    std::chrono::milliseconds resume{0};
    /// Resumable sessions: most bytes sent and not yet acknowledged by the other side (they are
    /// kept to be sent again). Beyond it send() refuses with errc::overloaded; async_drain()
    /// waits while more than half of it is held.
    std::size_t max_unacked_bytes = std::size_t{64} << 20;
    /// Resumable sessions: told when a session opens, resumes, or is lost. After a loss the
    /// pending calls have failed (and unacknowledged notifications gone to on_undelivered); the
    /// peer stays open, and the next call or notification opens a new session, in order after
    /// everything before it. Runs on the peer's executor; must not throw.
    std::function<void(const session_event&)> on_session;
    /// Told when the other side says it is going away (ordo.goaway: a server that drains,
    /// server::async_drain), with the grace it gives and its reason; see peer::on_goaway for
    /// what the peer does then. Runs on the peer's executor, before the handlers given to
    /// peer::on_goaway; must not throw.
    goaway_fn on_goaway;
    /// What this side presents to the server on every connection it opens (ordo.auth, before
    /// any call; docs/protocol.md "Authentication"); the URL parameter token_file=PATH reads
    /// the token from a file. Pools and routers present it on each of their connections.
    ordo::credentials credentials;
    /// Lanes (docs/protocol.md "Lanes"; channel::lane): toward a peer that reads them, a
    /// message larger than this goes on the wire in pieces of this size, which the writer
    /// interleaves with other lanes' messages (a message on a named lane always goes as
    /// pieces). Small messages then wait for about one piece, not for a whole large message.
    /// URL parameter piece_bytes. 0: 64 KiB.
    std::size_t piece_bytes = 64 * 1024;
    /// Lanes: bytes of a named lane's pieces that may be on their way, not yet taken by the
    /// receiver, while this side also sends other messages (plain ones, another lane's): what
    /// a small message of another lane waits behind. Larger moves a lane's large messages
    /// faster beside small ones (a long path needs its bandwidth times its round trip), smaller
    /// lets the small ones pass sooner. A lane alone on the connection may have 4 MiB on their
    /// way. URL parameter lane_window. 0: 256 KiB; kept within 64 KiB and 4 MiB.
    std::size_t lane_window = 256 * 1024;
    /// msgids of cancelled or timed-out calls remembered so that their late responses are
    /// dropped quietly (a response to an id never used is a protocol error).
    std::size_t max_abandoned_ids = 65536;
};

/// Counters, always on. "Pending" are this side's calls waiting for a response; "queued" and
/// "running" are incoming messages waiting for or inside a handler.
struct peer_counters {
    std::size_t pending_calls = 0;
    std::size_t queued_messages = 0;
    std::size_t running_handlers = 0;
    std::uint64_t calls_started = 0;
    std::uint64_t calls_completed = 0;
    std::uint64_t requests_served = 0;
    std::uint64_t notifications_served = 0;
    std::uint64_t unknown_notifications = 0;  ///< notifications for methods with no handler
    std::uint64_t notification_errors = 0;    ///< notification handlers that threw
    std::uint64_t handlers_cancelled = 0;     ///< by ordo.cancel or by the connection ending
    std::uint64_t pings_sent = 0;
    std::uint64_t notifications_undelivered = 0;
    std::uint64_t resumes = 0;          ///< resumable sessions: connections taken over after drops
    std::uint64_t messages_resent = 0;  ///< sent again on a resume
    std::size_t unacked_bytes = 0;      ///< sent and not yet acknowledged (kept for resending)
};

/// One ordered connection, symmetric: both ends call (through ordo::channel) and both serve
/// (with the handlers given at creation).
///
/// Ordering: requests and notifications sent through one peer reach the remote handlers in the
/// order sent. Incoming messages are dispatched in arrival order; a serial handler runs to
/// completion before the next message is dispatched; a concurrent one lets the next start while
/// it is suspended. Responses to this side's calls are matched by msgid as they arrive and are
/// never held behind a running handler. A serial handler that awaits a call back to a peer whose
/// serial handler awaits it deadlocks until a deadline fires: give such calls deadlines.
///
/// When the connection ends, every pending call fails with its reason (errc::peer_lost for an
/// end of stream or a reset, errc::protocol_error for bad input, errc::closed after a local
/// close), running handlers are cancelled, queued messages are dropped, and later calls fail at
/// once with the same error. A peer never reconnects, unless its session is resumable
/// (peer_options::resume): then a dropped connection is replaced within the window, and nothing
/// above notices but the delay.
///
/// Belongs to one executor (a strand, if the io_context runs on several threads). Created
/// shared (make_peer); handlers and channels keep it alive.
class peer final : public channel_impl, public std::enable_shared_from_this<peer> {
  public:
    struct private_tag {};
    peer(private_tag, std::unique_ptr<transport> t, peer_options o, const handlers* h);
    peer(private_tag, std::unique_ptr<transport> t, peer_options o, const handlers* h,
         detail::resume_config rc);
    ~peer() override;
    peer(const peer&) = delete;
    peer& operator=(const peer&) = delete;

    /// Starts reading and writing.
    void start();

    void start_call(std::unique_ptr<detail::pending_call> call) override;
    void notify_raw(std::string_view method, std::string_view params) override;
    void notify_raw_on(std::uint16_t lane, std::string_view method,
                       std::string_view params) override;
    const std::string& remote_address() const noexcept override;
    /// Who the other side is: its address, what its transport proved (certificate, unix
    /// credentials) and, on a server that authenticates (server_options::authenticate), the
    /// subject it was accepted as. After a resume, the address is the new connection's.
    const ordo::identity& identity() const noexcept;
    net::any_io_executor get_executor() const override;

    /// Flushes what is queued and closes; pending calls fail with errc::closed. Completes when
    /// the connection has ended.
    net::awaitable<void> async_close();
    /// close() without waiting: the connection outlives the last handle until it has ended.
    void close() override;
    /// close(), after telling the remote side why: an ordo.closing [code, reason] notification,
    /// which an ordo peer adds to the reason its connection ended with (foreign peers ignore it).
    void close(errc code, std::string reason);
    /// Closes at once.
    void abort();
    /// Closes at once, with `code` and `reason` as how the connection ended (nothing is sent:
    /// what is queued may never leave, e.g. for a peer that does not read).
    void abort(errc code, std::string reason);
    /// Waits until this side's outgoing buffer is at or below comm.high_water_bytes: what a
    /// producer of notifications awaits now and then so that notify() (which never blocks) does
    /// not run into errc::overloaded. Throws std::system_error with the close reason if the
    /// connection ends first.
    net::awaitable<void> async_drain();
    /// Completes when the connection has ended; yields its code and reason.
    net::awaitable<std::pair<std::error_code, std::string>> async_wait_closed();
    /// Called once when the connection has ended (after pending calls have failed).
    void on_closed(std::function<void(const std::error_code&, const std::string&)> f);

    /// Called when the other side says it is going away (ordo.goaway [grace_ms, reason], sent
    /// by a server that drains; the first one counts, repeats are ignored). The peer then keeps
    /// what it has running: its pending calls and open streams complete, calls made meanwhile
    /// are still sent (the server serves them within its grace), handlers keep running. Once
    /// nothing is pending either way (no call or stream waiting, no handler running or queued)
    /// it closes the connection itself, so that the server can finish early; calls made after
    /// that fail at once with errc::peer_lost, detail "the server is going away: <reason>". If
    /// the grace passes first, the server closes the connection: calls still pending fail with
    /// peer_lost and the server's reason. A resumable session that heard it does not resume.
    /// `f` runs on the peer's executor, after peer_options::on_goaway, and at once if the peer
    /// has already heard it; it must not throw.
    void on_goaway(goaway_fn f);
    /// True once the other side said it is going away (ordo.goaway): send it no new work.
    bool going_away() const noexcept;
    /// `o` is told of each of this side's calls as it ends, before its caller hears (how a
    /// router books the calls it sent here). Kept until the peer is destroyed.
    void observe_calls(std::unique_ptr<detail::call_observer> o);

    /// True while the connection takes calls and messages: false from close() or abort() on,
    /// and once the connection has failed, at once (a write that failed inside a send()
    /// included), before on_closed() hears how it ended. A resumable session between
    /// connections is open: it keeps what it is sent for the resume.
    bool is_open() const noexcept;
    /// True while a call started here can be answered: is_open(), and the other side has not
    /// ended its sending side (a half-close; or a peer that closed altogether, before the
    /// probes find that out) nor has this side begun to leave. A call started otherwise fails
    /// at once with errc::peer_lost.
    bool takes_calls() const noexcept;
    /// True once the other side agreed to a resumable session (peer_options::resume).
    bool is_resumable() const noexcept;
    const peer_counters& counters() const noexcept;
    const comm_counters& comm() const noexcept;

    struct state;

  private:
    friend void detail::send_goaway(peer& p, std::chrono::milliseconds grace,
                                    const std::string& reason);
    std::unique_ptr<state> s_;
};

/// Creates a peer over a connected transport. `h` (optional) must outlive the peer.
std::shared_ptr<peer> make_peer(std::unique_ptr<transport> t, peer_options o,
                                const handlers* h = nullptr);
/// The same with default options (an overload, not a default argument: docs/calls-and-channels.md,
/// "GCC 12 note").
std::shared_ptr<peer> make_peer(std::unique_ptr<transport> t);

}  // namespace ordo
