// The session seam of an ordered connection: the one thing the call table and the dispatcher
// send through (whole messages, or a head and a body), and the one place that knows how the
// connection ended.
//
// A plain session is one batched_comm: the order of sends is the order on the wire, and the
// session ends with the connection. A resumable session (docs/protocol.md, "Resumable
// sessions") outlives its connections: it counts the messages each way (on an ordered
// stream a message's position is its sequence number), keeps what it sent until the other side
// acknowledges it, and when a connection drops, the caller's side reconnects and both sides send
// again what the other did not receive. The parts above see one unbroken, ordered stream.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ordo/comm/batched_comm.hpp"
#include "ordo/rpc/codec.hpp"
#include "ordo/identity.hpp"
#include "rpc/session/resend_buffer.hpp"
#include "rpc/session/session_registry.hpp"

namespace ordo {

struct peer_counters;
struct undelivered_notification;

namespace detail {

/// What a session asks of the connection that owns it.
class session_host {
  public:
    virtual ~session_host() = default;
    /// A msgid for the session's own request (ordo.hello), never used by a call meanwhile.
    virtual std::uint32_t next_msgid() = 0;
    /// The owner, held while the session's timers and reconnection run.
    virtual std::weak_ptr<void> owner() = 0;
    /// Receives each incoming message, in order (valid during the call only). May throw: the
    /// connection then ends with the exception's code (protocol_error for others).
    virtual void on_message(std::string_view bytes) = 0;
    /// On a plain session, offered the unread bytes first (batched_comm::take_messages_with):
    /// takes the message at their start, decoding it in one pass, and returns its size, or 0
    /// to have it cut and passed to on_message.
    virtual std::size_t take_message(std::string_view, const limits&) { return 0; }
    /// The caller's side: the session cannot resume (`r.code` peer_lost: its window passed;
    /// session_lost: the other side no longer has it). What was in flight is lost (`r` holds
    /// the unacknowledged messages); the session opens a new one with the next message sent.
    virtual void session_lost(const close_result& r) = 0;
    /// The other side agreed to a session: a new one (`resumed` false) or this one again.
    virtual void session_opened(bool resumed) = 0;
    /// A plain connection's peer ended its sending side (half-close): nothing more will be
    /// read. True: the host serves what it read and closes the session itself; false: the
    /// connection ends as lost.
    virtual bool peer_finished_sending() { return false; }
    /// A resumable session: the other side acknowledged messages, so that more may be sent
    /// (max_unacked_bytes).
    virtual void acknowledged() {}
    /// A write completed (comm_options::on_written): more may be sent.
    virtual void written() {}
};

/// How a session resumes, and how its connections are let in.
struct resume_config {
    /// The caller's side: the window asked for (0: plain session), and how to open a new
    /// connection to the same place (given how long it may take).
    std::chrono::milliseconds window{0};
    std::function<net::awaitable<std::unique_ptr<transport>>(std::chrono::milliseconds)> reconnect;
    /// The server's side: where its sessions are found by id (null: plain sessions only).
    std::shared_ptr<session_registry> registry;
    /// Most bytes sent and not acknowledged; send() refuses beyond (errc::overloaded).
    std::size_t max_unacked_bytes = std::size_t{64} << 20;
    /// The caller's side: its ordo.auth notification, encoded, written first on every
    /// connection, before ordo.hello (empty: none). docs/protocol.md "Authentication".
    std::string credentials_message;
    /// The server's side: decides on each connection before any of its messages is served,
    /// from the identity its transport proved and the ordo.auth it sent first, if any; may set
    /// identity::may_introspect. Null: every caller is served.
    std::function<auth_verdict(identity&, const credentials&)> gate;
    /// The server's side, with a gate: what the connection's messages are held to until the
    /// gate has accepted it (a stranger's ordo.auth needs little room); then the connection's
    /// own limits. Null: its own limits throughout.
    std::optional<limits> gated_limits;
};

/// Belongs to the transport's executor.
class session {
  public:
    /// Runs once when the session has ended, after is_open() turned false; close_code()
    /// and close_reason() say how (`r` holds what was not written).
    using ended_fn = std::function<void(const close_result&)>;

    session(std::unique_ptr<transport> t, const comm_options& o, resume_config rc,
            session_host& host, peer_counters& c, ended_fn on_ended);
    ~session();
    session(const session&) = delete;
    session& operator=(const session&) = delete;

    void start();

    /// Takes one message for sending, in order. Throws std::system_error (errc::overloaded: not
    /// taken; or the close reason's code once the session is ending).
    void send(std::string_view message) { send(message, {}); }
    /// send() of `head` followed by `body`, as one message.
    /// (Always inlined: it is every call's and every answer's way out.)
    [[gnu::always_inline]] void send(std::string_view head, std::string_view body) {
        if (mode_ == mode::plain && comm_) return comm_->send(head, body);
        send_kept(head, body);
    }
    /// send() of a large body written from where it is, kept by `keep` until then
    /// (batched_comm::send); a resumable session keeps a copy for resending instead.
    void send(std::string_view head, std::string_view body, std::unique_ptr<held_body> keep) {
        if (mode_ == mode::plain && comm_) return comm_->send(head, body, std::move(keep));
        send_kept(head, body);
    }

    void pause_reading(bool paused);
    /// Whether the host is told of completed writes (session_host::written), on this
    /// connection and the next ones.
    void want_written(bool on) {
        want_written_ = on;
        if (comm_) comm_->want_written(on);
    }
    /// Waits until the outgoing buffer (and the unacknowledged bytes) are below their high
    /// water marks, and, while resuming, until the session has a connection again.
    net::awaitable<void> async_drain();
    /// Flushes, says goodbye (so that the other side does not wait for a resume), then closes.
    void close();
    /// close(), reporting `reason` as how the session ended.
    void close(std::string reason) {
        local_reason_ = std::move(reason);
        close();
    }
    /// close(), reporting `code` and `reason` as how the session ended.
    void close(std::error_code code, std::string reason) {
        local_code_ = code;
        close(std::move(reason));
    }
    /// Ends the session at once, reporting `code` and `reason`.
    void abort(std::error_code code = errc::closed) { abort(code, {}); }
    void abort(std::error_code code, std::string reason);
    /// Drops the connection as lost (dead peer): a resumable session resumes, a plain one ends.
    void cut(std::string reason);

    /// False from the moment the session has ended (or is being destroyed). A resumable session
    /// between connections is open.
    bool is_open() const noexcept { return end_ != ending::ended; }
    /// Whether send() takes messages for delivery: false once the session is ending or ended,
    /// and on a plain session once its connection is closing or has failed, which a failed
    /// write inside send() makes it at once, while is_open() waits for the event loop to run
    /// the connection's end. (A resumable session keeps what it is sent between connections.)
    bool can_send() const noexcept {
        if (closing()) return false;
        if (mode_ != mode::offering && mode_ != mode::resumable)
            return comm_ && !comm_->is_closing();
        return true;
    }
    /// Whether a connection carries the session now (a resumable session between connections,
    /// or one whose connection is closing, has none).
    bool connected() const noexcept { return comm_ && attached() && !comm_->is_closing(); }
    /// Who the other side is (peer::identity()).
    const identity& who() const noexcept { return who_; }
    /// True once the other side has agreed to resume this session after drops.
    bool is_resumable() const noexcept { return mode_ == mode::resumable; }
    /// What it may hold sent and not acknowledged (resume_config::max_unacked_bytes).
    std::size_t max_unacked_bytes() const noexcept { return rc_.max_unacked_bytes; }
    /// How it ended; empty while open.
    const std::error_code& close_code() const noexcept { return close_code_; }
    const std::string& close_reason() const noexcept { return close_reason_; }
    /// What the remote side said (ordo.closing) before it closed: added to the close reason,
    /// and the session will not wait for a resume.
    void note_remote_reason(std::string reason);
    /// The same, where the other side's code says more than the connection's end: its refusal
    /// of this side (errc::unauthenticated) becomes the code the session ends with.
    void note_remote_reason(std::error_code code, std::string reason);
    /// What the other side said of its closing (empty if nothing), and its refusal's code.
    const std::string& remote_reason() const noexcept { return remote_reason_; }
    const std::error_code& remote_code() const noexcept { return remote_code_; }
    /// Marks the session ended by its owner's destruction (no callback runs).
    void end_locally(std::error_code code, std::string reason);

    /// Tells `report` (if set) about each notification among `r.undelivered` (taken for
    /// sending, never written or never acknowledged); counts them in `c`.
    void report_undelivered(const close_result& r,
                            const std::function<void(const undelivered_notification&)>& report,
                            peer_counters& c) const;

    /// The connection's counters, summed over the connections a resumable session had.
    /// Between connections (and before a resumable session's handshake is done),
    /// buffered_bytes is what the session keeps to send on the resume.
    const comm_counters& counters() const noexcept {
        if (comm_ && !dropped_ && attached()) return comm_->counters();
        return summed_counters();
    }

    /// Messages of the session's own (hello, acks, goodbye) handed to its connections.
    std::uint64_t controls_sent() const noexcept { return controls_sent_; }

  private:
    friend class session_registry;
    friend struct session_test_access;  // tests/rpc/session/resume_test.cpp
    using clock = std::chrono::steady_clock;
    enum class mode {
        plain,      ///< no resumption: the session is its one connection
        offering,   ///< caller: ordo.hello sent, no answer yet; messages are kept, not sent
        awaiting,   ///< server: the first message may still be ordo.hello
        resumable,  ///< both sides keep counts and resend buffers
        gated,      ///< server: nothing is served until resume_config::gate accepts the caller
        refused,    ///< server: the gate refused; requests read before the close are answered
                    ///< errc::unauthenticated, nothing else is served
    };
    /// How near the session is to its end. Ordered: each state keeps what the ones before it
    /// rule out (once the other side said it will not resume, a close() here still comes).
    enum class ending : std::uint8_t {
        none,         ///< open; a resumable session resumes after a drop
        told,         ///< the other side said it is closing (ordo.closing, ordo.bye): no resume
        asked,        ///< close() or abort() here: no resume, send() refuses
        after_hello,  ///< close() came during the handshake: it finishes once hello is answered
        ended,        ///< over (or its owner is being destroyed): is_open() is false
    };
    /// What carries the session now.
    enum class carrier : std::uint8_t {
        none,      ///< no connection (between connections), or one that is ending
        greeting,  ///< a connection that was sent ordo.hello, with no answer yet
        attached,  ///< a connection that carries the session
        lost,      ///< the caller's session was lost: none, and the next send opens a new one
    };
    struct link;

    bool closing() const noexcept { return end_ >= ending::asked; }
    bool attached() const noexcept { return carrier_ == carrier::attached; }

    void send_kept(std::string_view head, std::string_view body);
    std::string farewell(const std::error_code& code, const std::string& reason) const;
    void connection_ended_inline();
    bool resumes_after(const close_result& r) const noexcept;
    const comm_counters& summed_counters() const noexcept;
    void attach(std::unique_ptr<transport> t);
    void drop_comm();
    void on_comm_message(std::string_view bytes);
    std::size_t take_message(std::string_view bytes, const limits& l) {
        return mode_ == mode::plain ? host_.take_message(bytes, l) : 0;
    }
    void on_session_message(std::string_view bytes);
    void on_gated_message(std::string_view bytes);
    bool refused_credentials(std::string_view bytes);
    void refuse(std::string reason);
    void send_credentials();
    void on_comm_closed(const close_result& r);
    bool on_control(std::string_view bytes);
    bool on_hello_answer(std::string_view bytes);
    void on_welcome(const msgpack::object& result);
    void on_hello_request(message& m);
    void take_over(std::unique_ptr<batched_comm> comm, std::shared_ptr<link> l, std::uint32_t msgid,
                   std::uint64_t their_received);
    static void resume_here(session_registry& reg, const session_id& id, const std::string& key,
                            std::unique_ptr<transport> t, std::string rest, std::uint32_t msgid,
                            std::uint64_t their_received);
    static std::string no_session(const session_id& id);
    std::unique_ptr<batched_comm> make_comm(std::unique_ptr<transport> t,
                                            const std::shared_ptr<link>& l);
    void answer_welcome(std::uint32_t msgid);
    void answer_error(std::uint32_t msgid, errc code, const std::string& text);
    void send_hello();
    void send_ack();
    void arm_ack();
    void write_control(const buffer& b);
    void established(std::uint64_t their_received, bool resend);
    void become_plain(bool send_kept);
    void detach(const close_result& r);
    void give_up(const std::string& why);
    void lose(const close_result& r);
    void start_window(clock::time_point from);
    void window_passed();
    void end(const close_result& r);
    void finish_close();
    void changed();
    static net::awaitable<void> reconnect_loop(session* self, std::weak_ptr<void> owner,
                                               std::uint64_t drop);

    comm_options options_;
    resume_config rc_;
    session_host& host_;
    peer_counters& c_;
    ended_fn on_ended_;
    net::any_io_executor ex_;
    std::string remote_;
    identity who_;  // the other side; the server checks its resume_key() on resume
    std::unique_ptr<batched_comm> comm_;
    std::shared_ptr<link> link_;
    std::unique_ptr<batched_comm> dead_comm_;  // the last dropped connection, freed later
    mode mode_ = mode::plain;
    mode after_gate_ = mode::plain;  // what a gated connection becomes once let in
    std::string refusal_;            // why the gate refused
    ending end_ = ending::none;
    carrier carrier_ = carrier::none;
    // What the host asked of every connection the session has (pause_reading, want_written).
    bool paused_ = false;
    bool want_written_ = false;
    bool dropped_ = false;  // a connection was dropped: counters() sums over connections
    std::uint64_t controls_sent_ = 0;
    std::error_code close_code_;
    std::string close_reason_;
    std::string remote_reason_;
    std::string local_reason_;    // why this side closed, when it said
    std::error_code local_code_;  // and with which code, when it said
    std::error_code remote_code_;  // the other side's refusal of this one, when it said
    std::string last_error_;      // why the last connection dropped (for the window's error)

    // Resumption.
    session_id id_{};
    std::chrono::milliseconds window_{0};
    clock::time_point window_deadline_{};
    std::chrono::milliseconds backoff_{0};
    resend_buffer sent_;               // [first, end): sent, not acknowledged
    std::size_t charged_unacked_ = 0;  // of sent_, to options_.budget
    void note_unacked();
    std::uint64_t received_ = 0;        // messages received: the next one's sequence number
    std::uint64_t acked_received_ = 0;  // what this side last told the other it received
    std::size_t bytes_since_ack_ = 0;
    std::uint32_t hello_id_ = 0;
    bool ack_armed_ = false;
    std::uint64_t detaches_ = 0;  // drops so far; a reconnection loop serves one drop
    net::steady_timer ack_timer_;
    net::steady_timer window_timer_;
    net::steady_timer changed_;
    comm_counters saved_;  // summed counters of dropped connections
    mutable comm_counters sum_;
};

}  // namespace detail
}  // namespace ordo
