// The session seam of an ordered connection: the one thing the call table and the dispatcher
// send through (whole messages, or a head and a body), and the one place that knows how the
// connection ended. Today a session is one batched_comm, and the order of sends is the order on
// the wire; resumable sessions (DESIGN.md section 11) put sequence numbers, acks and resending
// here, behind the same members.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "ordo/batched_comm.hpp"

namespace ordo {

struct peer_counters;
struct undelivered_notification;

namespace detail {

/// Belongs to the transport's executor.
class session {
  public:
    /// Receives each incoming message (valid during the call only).
    using message_fn = batched_comm::message_fn;
    /// Runs once when the connection has ended, after is_open() turned false; close_code()
    /// and close_reason() say how (`r` holds what was not written).
    using ended_fn = std::function<void(const close_result&)>;

    session(std::unique_ptr<transport> t, const comm_options& o, message_fn on_message,
            ended_fn on_ended);
    ~session();
    session(const session&) = delete;
    session& operator=(const session&) = delete;

    void start() { comm_->start(); }

    /// Takes one message for sending, in order. Throws std::system_error (errc::overloaded: not
    /// taken; or the close reason's code once the connection is ending).
    void send(std::string_view message) { comm_->send(message); }
    /// send() of `head` followed by `body`, as one message.
    void send(std::string_view head, std::string_view body) { comm_->send(head, body); }

    void pause_reading(bool paused) { comm_->pause_reading(paused); }
    net::awaitable<void> async_drain() { return comm_->async_drain(); }
    /// Flushes, then closes.
    void close() { comm_->close(); }
    /// Closes at once, reporting `code` and `reason`.
    void abort(std::error_code code = errc::closed) { comm_->abort(code); }
    void abort(std::error_code code, std::string reason) { comm_->abort(code, std::move(reason)); }

    /// False from the moment the connection has ended (or the session is being destroyed).
    bool is_open() const noexcept { return open_; }
    /// How it ended; empty while open.
    const std::error_code& close_code() const noexcept { return close_code_; }
    const std::string& close_reason() const noexcept { return close_reason_; }
    /// What the remote side said (ordo.closing) before it closed: added to the close reason.
    void note_remote_reason(std::string reason) { remote_reason_ = std::move(reason); }
    /// Marks the session ended by its owner's destruction (no callback runs).
    void end_locally(std::error_code code, std::string reason);

    /// Tells `report` (if set) about each notification among `r.undelivered` (taken for
    /// sending, never written); counts them in `c`.
    void report_undelivered(const close_result& r,
                            const std::function<void(const undelivered_notification&)>& report,
                            peer_counters& c) const;

    const comm_counters& counters() const noexcept { return comm_->counters(); }

  private:
    void on_comm_closed(const close_result& r);

    std::unique_ptr<batched_comm> comm_;
    limits limits_;
    ended_fn on_ended_;
    bool open_ = true;
    std::error_code close_code_;
    std::string close_reason_;
    std::string remote_reason_;
};

}  // namespace detail
}  // namespace ordo
