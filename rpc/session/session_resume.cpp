// A resumable session's life between and across connections (docs/protocol.md "Resumable
// sessions"): the unacknowledged messages it keeps (rpc/session/resend_buffer.hpp) and their
// charge to the memory budget, the count of messages received and the acks (ordo.ack) both
// ways, ordo.bye, sending again what the other side missed, and after a drop the window, the
// reconnection loop, and losing the session when the window passes.
#include "rpc/session/session.hpp"

#include <algorithm>
#include <random>

#include "lib/escaped.hpp"
#include "ordo/detail/memory_budget.hpp"
#include "ordo/rpc/peer.hpp"
#include "rpc/session/session_parts.hpp"

namespace ordo::detail {

namespace {

// Acknowledgements: after this many messages or bytes, or this long after the first message
// not yet acknowledged, whichever comes first. They bound the resend buffer at the other side.
constexpr std::uint64_t ack_every_messages = 1024;
constexpr std::size_t ack_every_bytes = 256 * 1024;
constexpr std::chrono::milliseconds ack_delay{20};
// Reconnection: the first try within 10 ms, then exponential backoff up to a second, jittered.
constexpr std::chrono::milliseconds first_backoff{10};
constexpr std::chrono::milliseconds max_backoff{1000};

// A notification written by ordo with an 8-character method: [2, "ordo.ack", ...].
bool is_control_notification(std::string_view b, std::string_view name) {
    return b.size() > 11 && b[0] == '\x93' && b[1] == '\x02' && b[2] == '\xa8' &&
           b.substr(3, 8) == name;
}

}  // namespace

// The resend buffer is charged to the server's memory budget in 64 KiB steps (its chunks' size),
// so that a steady stream touches the shared counter once per chunk, not once per message.
void session::note_unacked() {
    c_.unacked_bytes = sent_.bytes();
    if (!options_.budget) return;
    constexpr std::size_t step = 64 * 1024;
    const std::size_t want = (c_.unacked_bytes + step - 1) / step * step;
    if (want != charged_unacked_) options_.budget->adjust(charged_unacked_, want);
}

void session::send_kept(std::string_view head, std::string_view body) {
    if ((mode_ == mode::refused || (mode_ == mode::gated && after_gate_ == mode::plain)) &&
        comm_)
        return comm_->send(head, body);  // a plain connection not yet (or never) let in
    if (closing() || (!comm_ && mode_ == mode::plain))
        throw rpc_error(
            close_code_ ? close_code_ : make_error_code(errc::closed), {}, {},
            close_reason_.empty() ? "ordo: session to " + remote_ + " closed" : close_reason_);
    if (carrier_ == carrier::lost) {
        // The first message after a lost session opens a new one (ordo.hello with no id).
        carrier_ = carrier::none;
        start_window(clock::now());
        net::co_spawn(ex_, reconnect_loop(this, host_.owner(), detaches_), rethrow_escaped{});
    }
    const std::size_t n = head.size() + body.size();
    if (sent_.bytes() + n > rc_.max_unacked_bytes)
        throw_error(errc::overloaded, "ordo: " + std::to_string(sent_.bytes()) + " bytes sent to " +
                                          remote_ +
                                          " are not yet acknowledged (max_unacked_bytes)");
    // Between connections (or before the handshake is done), only kept: sent on resume.
    if (attached()) {
        try {
            comm_->send(head, body);
        } catch (const std::system_error& e) {
            if (e.code() == errc::overloaded) throw;  // not taken
            // The connection ended earlier in this turn: the message goes out after the resume.
        }
        sent_.push(head, body);
        note_unacked();
        if (comm_->is_closing()) [[unlikely]]
            connection_ended_inline();
        return;
    }
    sent_.push(head, body);
    note_unacked();
}

// A write inside send() failed, or the reader met an error earlier in this turn: the comm has
// ended, but its on_closed waits for the event loop, which a caller sending in a loop does not
// give back. Detach now, so that what follows is only kept (no work for the dead comm, and
// counters() reports the resend buffer, which a sender's backpressure sees), and the window
// counts from the failure.
void session::connection_ended_inline() {
    const close_result* r = comm_->ended();
    if (!r) return;  // a close under way: on_comm_closed says how it ends
    if (!resumes_after(*r)) {
        // The session ends with on_comm_closed; what follows is kept meanwhile.
        carrier_ = carrier::none;
        return;
    }
    detach({r->code, r->reason, {}, r->at});
}

void session::write_control(const buffer& b) {
    if (!comm_ || comm_->is_closing()) return;
    try {
        comm_->send(std::string_view(b.data(), b.size()));
        ++controls_sent_;
    } catch (const std::system_error&) {
        // Full: an ack is sent again later, a hello answer's absence ends the handshake.
    }
}

void session::send_ack() {
    if (!attached()) return;
    buffer b(small_buffer);
    encode_notification(b, "ordo.ack", received_);
    write_control(b);
    acked_received_ = received_;
    bytes_since_ack_ = 0;
}

// Kept apart from on_comm_message, so that a plain session's path stays a few instructions.
[[gnu::noinline]] void session::on_session_message(std::string_view bytes) {
    if (mode_ == mode::awaiting) {
        // The caller's first message: ordo.hello asks for a session, anything else means none.
        if (bytes.size() > 2 && bytes[0] == '\x94' && bytes[1] == '\x00') {
            message m = decode_message(bytes, options_.limits);
            if (m.method == "ordo.hello") return on_hello_request(m);
        }
        // A caller's credentials to a server that does not ask for them: dropped, and its
        // ordo.hello, next, still opens a session.
        if (bytes.size() > 2 && bytes[0] == '\x93' && bytes[1] == '\x02') {
            message m = decode_message(bytes, options_.limits);
            if (m.method == "ordo.auth") return;
        }
        become_plain(false);
        return host_.on_message(bytes);
    }
    if (on_control(bytes)) return;
    if (carrier_ == carrier::greeting && mode_ == mode::resumable) {
        // On a resume the server answers ordo.hello before anything else: this message is not
        // the session's (a server over max_connections saying why it refuses, say). Drop the
        // connection and try again; unless the server refused this side's credentials, which
        // another try would not change.
        if (refused_credentials(bytes)) return;
        return cut("ordo: " + remote_ + " sent a message before answering the resume");
    }
    ++received_;
    bytes_since_ack_ += bytes.size();
    if (received_ - acked_received_ >= ack_every_messages || bytes_since_ack_ >= ack_every_bytes)
        send_ack();
    else if (!ack_armed_)
        arm_ack();
    host_.on_message(bytes);
}

void session::arm_ack() {
    ack_armed_ = true;
    ack_timer_.expires_after(ack_delay);
    ack_timer_.async_wait([this, owner = host_.owner()](std::error_code ec) {
        auto keep = owner.lock();
        if (!keep) return;
        ack_armed_ = false;
        if (ec) return;
        if (received_ != acked_received_) send_ack();
    });
}

bool session::on_control(std::string_view bytes) {
    if (is_control_notification(bytes, "ordo.ack")) {
        message m = decode_message(bytes, options_.limits);
        std::uint64_t n = 0;
        if (m.params.via.array.size != 1 || !read_u64(m.params.via.array.ptr[0], n) ||
            n < sent_.first() || n > sent_.end())
            throw_error(errc::protocol_error, "ordo: protocol error: ordo.ack from " + remote_ +
                                                  " acknowledges messages never sent (" +
                                                  std::to_string(sent_.end()) + " sent)");
        sent_.drop_until(n);
        note_unacked();
        changed();
        host_.acknowledged();
        return true;
    }
    if (is_control_notification(bytes, "ordo.bye")) {
        // [received]: what the other side got before it closed is not reported undelivered.
        message m = decode_message(bytes, options_.limits);
        std::uint64_t n = 0;
        if (m.params.via.array.size == 1 && read_u64(m.params.via.array.ptr[0], n) &&
            n >= sent_.first() && n <= sent_.end())
            sent_.drop_until(n);
        note_unacked();
        end_ = std::max(end_, ending::told);
        return true;
    }
    if (carrier_ == carrier::greeting && bytes.size() > 2 && bytes[0] == '\x94' &&
        bytes[1] == '\x01')
        return on_hello_answer(bytes);
    return false;
}

// A connection carries the session again: send what the other side has not received.
void session::established(std::uint64_t their_received, bool resend) {
    if (their_received < sent_.first() || their_received > sent_.end())
        throw_error(errc::protocol_error, "ordo: protocol error: " + remote_ +
                                              " says it received " +
                                              std::to_string(their_received) + " messages; " +
                                              std::to_string(sent_.first()) + " to " +
                                              std::to_string(sent_.end()) + " are possible");
    sent_.drop_until(their_received);
    std::uint64_t n = 0;
    sent_.for_each_from(their_received, [&](std::string_view m) {
        comm_->send(m);
        ++n;
    });
    if (resend) c_.messages_resent += n;
    note_unacked();
    carrier_ = carrier::attached;
    backoff_ = std::chrono::milliseconds(0);
    window_timer_.cancel();
    if (rc_.registry) rc_.registry->attached(this);
    changed();
}

void session::detach(const close_result& r) {
    last_error_ = r.reason;
    const bool was_attached = attached() || window_deadline_ == clock::time_point{};
    carrier_ = carrier::none;
    drop_comm();
    ++detaches_;
    // The window counts from the drop of a working connection (when it failed, not when this
    // side heard of it), not from each failed retry.
    if (was_attached) start_window(r.at == clock::time_point{} ? clock::now() : r.at);
    if (rc_.registry) rc_.registry->detached(this, id_, ex_);  // may give up this one at once
    if (is_open() && rc_.reconnect)
        net::co_spawn(ex_, reconnect_loop(this, host_.owner(), detaches_), rethrow_escaped{});
    changed();
}

void session::start_window(clock::time_point from) {
    // The caller gives up at the end of its window; the server keeps the session a margin longer,
    // so that a caller that comes back just inside its window, or heard of the drop later than
    // the server, still finds it (docs/protocol.md "Resumable sessions").
    const auto margin = rc_.reconnect ? clock::duration{} : server_margin(window_);
    window_deadline_ = from + window_ + margin;
    window_timer_.expires_at(window_deadline_);
    window_timer_.async_wait([this, owner = host_.owner()](std::error_code ec) {
        auto keep = owner.lock();
        if (ec || !keep || attached() || !is_open()) return;
        window_passed();
    });
}

void session::window_passed() {
    close_result r{errc::peer_lost,
                   "ordo: session with " + remote_ + " not resumed within " +
                       std::to_string(window_.count()) + " ms; last error: " + last_error_,
                   {}};
    // A caller opens a new session on demand; a server's session ends for good.
    if (rc_.reconnect)
        lose(r);
    else
        end(r);
}

// The caller's session cannot resume: everything in flight fails (the host is told), and the
// session starts over, opening a new one with the next message sent. Never silently: the calls
// that were pending fail, and the host hears of the loss and of the new session.
void session::lose(const close_result& r) {
    window_timer_.cancel();
    ack_timer_.cancel();
    ack_armed_ = false;
    drop_comm();
    close_result out{r.code, r.reason, {}};
    sent_.for_each_from(sent_.first(),
                        [&](std::string_view m) { out.undelivered.emplace_back(m); });
    sent_.reset(0);
    note_unacked();
    received_ = acked_received_ = 0;
    bytes_since_ack_ = 0;
    id_ = {};
    window_ = rc_.window;
    mode_ = mode::offering;
    carrier_ = carrier::lost;  // the next send opens a new session
    window_deadline_ = {};
    backoff_ = std::chrono::milliseconds(0);
    ++detaches_;  // ends reconnection loops still running
    last_error_.clear();
    changed();
    host_.session_lost(out);
}

net::awaitable<void> session::reconnect_loop(session* self, std::weak_ptr<void> owner,
                                             std::uint64_t drop) {
    net::steady_timer pause(self->ex_);
    std::minstd_rand jitter(
        static_cast<unsigned>(drop * 7919 + clock::now().time_since_epoch().count()));
    // Whether this drop is still the one being served (the session may have ended, resumed
    // or dropped again meanwhile; the owner may be gone).
    auto current = [&]() -> std::shared_ptr<void> {
        auto keep = owner.lock();
        if (!keep || !self->is_open() || self->detaches_ != drop || self->comm_) return nullptr;
        return keep;
    };
    for (;;) {
        // Backoff: uniform in [b/2, b], b doubling from 10 ms to 1 s; the very first try
        // after a working connection dropped waits 0-10 ms.
        const auto b = self->backoff_.count() == 0 ? first_backoff : self->backoff_;
        const auto low = self->backoff_.count() == 0 ? 0 : b.count() / 2;
        pause.expires_after(std::chrono::milliseconds(
            std::uniform_int_distribution<std::int64_t>(low, b.count())(jitter)));
        self->backoff_ = std::min(max_backoff, b * 2);
        co_await pause.async_wait(use_tuple);
        if (!current()) co_return;
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
            self->window_deadline_ - clock::now());
        if (left.count() <= 0) co_return;  // the window timer ends the session
        auto reconnect = self->rc_.reconnect;
        std::unique_ptr<transport> t;
        std::string error;
        try {
            t = co_await reconnect(left);
        } catch (const std::exception& e) {
            error = e.what();
        }
        auto keep = current();
        if (!keep) {
            if (t) t->close();
            co_return;
        }
        if (!t) {
            self->last_error_ = error;
            continue;
        }
        self->attach(std::move(t));
        self->comm_->start();
        self->send_credentials();
        self->send_hello();
        co_return;
    }
}

void session::give_up(const std::string& why) {
    end({errc::peer_lost, why, {}});
}

}  // namespace ordo::detail
