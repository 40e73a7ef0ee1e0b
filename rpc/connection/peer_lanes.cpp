// The lanes of an ordered connection (docs/protocol.md "Lanes"): what goes out as pieces and
// when, the pieces that come in put back together and dispatched on their lane, one
// dispatcher per named lane, and the end of it all with the connection. The pieces'
// bookkeeping itself is rpc/connection/lanes.cpp.
#include "rpc/connection/peer_lanes.hpp"

#include "ordo/detail/memory_budget.hpp"
#include "rpc/connection/peer_state.hpp"

namespace ordo::detail {

lane_part::lane_part(peer::state& st, std::string_view lane_name)
    : s(st),
      name(lane_name),
      disp(st.self, st.ex, st.h, st.o.max_queued_messages, st.o.max_queued_bytes,
           st.o.comm.budget.get(), *this, st.c) {}

void lane_part::send_response(const buffer& b) {
    send_response_parts(std::string_view(b.data(), b.size()), {}, nullptr);
}

// A named lane's messages go as pieces: a held body is copied into them, and let go at once.
void lane_part::send_response_parts(std::string_view head, std::string_view body,
                                                 std::unique_ptr<held_body>) {
    if (s.answers_stopped || !s.sess->is_open()) return;
    try {
        s.lanes.send(name, head, body, {});
    } catch (const std::system_error& e) {
        // As the default lane's answers (peer::state::send_response_on).
        if (e.code() == errc::overloaded) return s.sess->abort(errc::overloaded);
        s.answers_stopped = true;
    }
}

void lane_part::pause_reading(bool p) {
    s.lanes.pause(paused, p);
}

void lane_part::handler_started() {
    s.handler_started();
}
std::shared_ptr<void> lane_part::keep_alive() {
    return s.keep_alive();
}
void lane_part::remote_closing(std::error_code code, std::string reason) {
    s.remote_closing(code, std::move(reason));
}
void lane_part::remote_going_away(std::chrono::milliseconds grace, std::string reason) {
    s.remote_going_away(grace, std::move(reason));
}
void lane_part::handler_finished() {
    s.handler_finished();
    s.lanes.grant(*this);
}
void lane_part::dropped(std::string_view method, errc code, std::string reason) {
    s.dropped(method, code, std::move(reason));
}
void lane_part::remote_reads_lanes() {
    s.lanes.remote_reads();
}

peer_lanes::peer_lanes(peer::state& st)
    : s(st),
      out(st.o.piece_bytes,
          [&st](std::string_view head, std::string_view body) { st.sess->send(head, body); },
          [&st] { return st.sess->counters().buffered_bytes; }, [this] { return plain_sent(); },
          st.o.lane_window),
      close_timer(st.ex),
      piece_timer(st.ex),
      drained(st.ex, std::chrono::steady_clock::time_point::max()) {}

peer_lanes::~peer_lanes() {
    if (s.o.comm.budget) s.o.comm.budget->adjust(charged, 0);
}

bool peer_lanes::took_notification(message& m) {
    if (m.method == "ordo.piece") return on_piece(m), true;
    if (m.method == "ordo.lane_credit") return on_credit(m), true;
    if (m.method == "ordo.in_credit") return s.calls.on_in_credit(m), true;
    return false;
}

void peer_lanes::written() {
    if (!out.empty()) pump();
    if (credit_owed) {
        credit_owed = false;
        for (auto& l : parts) grant(*l);
    }
    // Told of writes while pieces or credit wait, not otherwise.
    s.sess->want_written(!out.empty() || credit_owed);
}

void peer_lanes::charge() {
    if (s.o.comm.budget) s.o.comm.budget->adjust(charged, out.bytes() + in.bytes());
}

void peer_lanes::pause(bool& flag, bool paused) {
    if (flag == paused) return;
    flag = paused;
    std::size_t n = s.disp_paused ? 1 : 0;
    for (const auto& l : parts) n += l->paused ? 1 : 0;
    const bool any = n > 0;
    if (any == s.reading_paused) return;
    s.sess->pause_reading(any);
    s.reading_paused = any;
    if (!any) s.resumed_reading = std::chrono::steady_clock::now();
}

std::size_t peer_lanes::running() const {
    std::size_t n = s.disp.running();
    for (const auto& l : parts) n += l->disp.running();
    return n;
}

std::size_t peer_lanes::queued() const {
    std::size_t n = s.disp.queued();
    for (const auto& l : parts) n += l->disp.queued();
    return n;
}

void peer_lanes::send(std::string_view name, std::string_view head, std::string_view body,
                               std::string_view notification) {
    if (!ok) {
        // Answered (ordo.features) without "lanes": the other side reads one lane, and gets
        // everything on it, in the order sent.
        if (name.empty() || s.feats.context == negotiation::support::yes ||
            s.feats.context == negotiation::support::no)
            return s.sess->send(head, body);
        if (s.feats.context == negotiation::support::unknown) s.feats.ask();
        negotiation::held_message h;
        h.lane.assign(name);
        h.bytes.reserve(head.size() + body.size());
        h.bytes.append(head).append(body);
        if (!notification.empty()) {
            h.notification.assign(notification);
            h.params.assign(body);
        }
        return s.feats.hold(std::move(h));
    }
    const std::size_t size = head.size() + body.size();
    // What waits for its pieces to go counts against the bound of the output it stands for.
    if (out.bytes() + s.sess->counters().buffered_bytes + size > s.o.comm.max_buffer_bytes)
        throw_error(errc::overloaded,
                    "ordo: send to " + s.remote + " refused: " + std::to_string(out.bytes()) +
                        " bytes wait for their pieces to go, + " + std::to_string(size) +
                        " would exceed max_buffer_bytes (" +
                        std::to_string(s.o.comm.max_buffer_bytes) + ")");
    out.push(name, head, body, notification);
    update_divert();
    pump();
    charge();
    if (!out.empty()) s.sess->want_written(true);
}

void peer_lanes::pump() {
    out.pump();
    update_divert();
    charge();
    if (drain_waiters > 0 && out.bytes() <= s.o.comm.high_water_bytes) drained.cancel();
    if (close_after && out.empty()) {
        close_after = false;
        close_session(close_code, std::move(close_reason));
    }
}

void peer_lanes::close_session(std::error_code code, std::string reason) {
    if (!out.empty() && s.sess->is_open()) {
        // The pieces still waiting go first: close() promises to send what was taken. A lane
        // the other side gives no credit for holds them close_timeout at most: then they are
        // told undelivered, and the session closes.
        if (!close_after) {
            close_timer.expires_after(s.o.comm.close_timeout);
            close_timer.async_wait([w = s.self.weak_from_this(), this](std::error_code ec) {
                auto keep = w.lock();
                if (ec || !keep || !close_after) return;
                close_after = false;
                drop_out(make_error_code(errc::closed),
                         "ordo: " + s.remote + " gave no credit for them within close_timeout (" +
                             std::to_string(s.o.comm.close_timeout.count()) + " ms)");
                close_session(close_code, std::move(close_reason));
            });
        }
        close_after = true;
        close_code = code;
        close_reason = std::move(reason);
        return;
    }
    close_timer.cancel();
    if (!s.sess->is_open()) return;
    if (code)
        s.sess->close(code, std::move(reason));
    else if (!reason.empty())
        s.sess->close(std::move(reason));
    else
        s.sess->close();
}

void peer_lanes::drop_out(std::error_code code, const std::string& why) {
    for (auto& method : out.clear()) {
        ++s.c.notifications_undelivered;
        if (!s.o.on_undelivered) continue;
        undelivered_notification u;
        u.method = std::move(method);
        u.code = code;
        u.reason = why;
        try {
            s.o.on_undelivered(u);
        } catch (...) {
            // The application's callback must not throw; one that does loses only its report.
        }
    }
    update_divert();
    charge();
}

void peer_lanes::end(std::error_code code, const std::string& why) {
    // A close that waited for the pieces closes now: they are gone.
    const bool closing = close_after;
    close_after = false;
    close_timer.cancel();
    drop_out(code, why);
    in.clear();
    piece_timer.cancel();
    drained.cancel();
    // A new session may meet another server: it says again whether it reads pieces.
    ok = false;
    update_divert();
    charge();
    if (closing) close_session(close_code, std::move(close_reason));
}

lane_part& peer_lanes::part_of(std::string_view lane) {
    for (auto& l : parts)
        if (l->name == lane) return *l;
    if (parts.size() >= s.o.comm.limits.max_lanes)
        throw_error(errc::protocol_error, "ordo: " + s.remote + " used more than max_lanes (" +
                                              std::to_string(s.o.comm.limits.max_lanes) +
                                              ") lanes on one connection");
    parts.push_back(std::make_unique<lane_part>(s, lane));
    return *parts.back();
}

void peer_lanes::grant(lane_part& l) {
    const std::uint64_t held = l.credited + l.disp.queued_bytes();
    if (l.received < held + lane_credit_step || !s.sess->is_open()) return;
    const std::uint64_t n = l.received - held;
    try {
        buffer b(small_buffer);
        encode_notification(b, "ordo.lane_credit", l.name, n);
        s.sess->send(std::string_view(b.data(), b.size()));  // ahead of every lane's pieces
        l.credited += n;
        ++credits_sent;
    } catch (const std::system_error&) {
        // Full or ending: given with the next write (or message read, or handler finished).
        credit_owed = true;
        s.sess->want_written(true);
    }
}

std::uint64_t peer_lanes::plain_sent() {
    // Each count lags behind what was handed over by what is not yet written: the difference
    // rises only when messages that are not pieces, credit or the session's own are written.
    const std::int64_t n = std::int64_t(s.sess->counters().messages_sent) -
                           std::int64_t(out.pieces_sent()) - std::int64_t(credits_sent) -
                           std::int64_t(s.sess->controls_sent());
    return n > 0 ? std::uint64_t(n) : 0;
}

void peer_lanes::on_credit(message& m) {
    const auto& a = m.params.via.array;
    if (a.size != 2 || a.ptr[0].type != msgpack::type::STR ||
        a.ptr[1].type != msgpack::type::POSITIVE_INTEGER)
        throw_error(errc::protocol_error, "ordo: malformed ordo.lane_credit from " + s.remote +
                                              " (expected [lane, bytes])");
    out.credit(std::string_view(a.ptr[0].via.str.ptr, a.ptr[0].via.str.size),
                     a.ptr[1].via.u64);
    pump();
}

void peer_lanes::on_piece(message& m) {
    const auto& a = m.params.via.array;
    std::uint64_t remaining = 0;
    if (a.size != 3 || a.ptr[0].type != msgpack::type::STR ||
        a.ptr[1].type != msgpack::type::POSITIVE_INTEGER || a.ptr[2].type != msgpack::type::BIN)
        throw_error(errc::protocol_error, "ordo: malformed ordo.piece from " + s.remote +
                                              " (expected [lane, remaining, bin])");
    remaining = a.ptr[1].via.u64;
    if (!ok) remote_reads();
    const std::string_view lane(a.ptr[0].via.str.ptr, a.ptr[0].via.str.size);
    const std::string_view bytes(a.ptr[2].via.bin.ptr, a.ptr[2].via.bin.size);
    if (lane.size() > max_lane_name_bytes)
        throw_error(errc::protocol_error, "ordo: " + s.remote + " named a lane of " +
                                              std::to_string(lane.size()) + " bytes (the most is " +
                                              std::to_string(max_lane_name_bytes) + ")");
    // A response's caller may drop the last reference to this peer.
    const auto keep = s.self.weak_from_this().lock();
    lane_part* part = lane.empty() ? nullptr : &part_of(lane);
    const std::optional<std::string_view> whole =
        in.take(lane, remaining, bytes, s.o.comm.limits);
    arm_piece_timer();
    if (part) {
        part->received += bytes.size() + piece_overhead_bytes;
        // A sender keeps within the credit it was given: beyond it (with a message's worth of
        // slack for the piece that crossed it), it ignores credit.
        if (part->received - part->credited > lane_window_bytes + s.o.comm.limits.max_message_bytes)
            throw_error(errc::protocol_error, "ordo: " + s.remote + " sent lane \"" + part->name +
                                                  "\" pieces beyond the credit it was given");
    }
    charge();
    if (!whole) {
        if (part) grant(*part);
        return;
    }
    message w = decode_message(*whole, s.o.comm.limits, area.zone);
    if (w.kind == message_kind::notification && w.method == "ordo.piece")
        throw_error(errc::protocol_error, "ordo: " + s.remote + " sent a piece inside a piece");
    if (w.kind == message_kind::response) {
        s.on_response(w);
    } else if (w.kind == message_kind::notification && w.method == "ordo.item") {
        s.calls.on_item(w, whole->size());
    } else if (w.kind == message_kind::notification && w.method == "ordo.in_credit") {
        s.calls.on_in_credit(w);
    } else {
        dispatcher& d = part ? part->disp : s.disp;
        if (w.kind == message_kind::request && w.meta.type != msgpack::type::NIL)
            d.on_context_message(w, whole->size());
        else
            d.on_message(w, whole->size());
        if (s.drain.heard_goaway) s.drain.leave_when_idle();
    }
    if (part && s.sess->is_open()) grant(*part);
}

// A message in pieces must be whole within message_timeout of its first piece, as a message
// must be within it of its first bytes.
void peer_lanes::arm_piece_timer() {
    const auto timeout = s.o.comm.message_timeout;
    if (piece_timer_armed || timeout.count() <= 0) return;
    const auto oldest = in.oldest();
    if (oldest == std::chrono::steady_clock::time_point{}) return;
    piece_timer_armed = true;
    piece_timer.expires_at(oldest + timeout);
    piece_timer.async_wait([w = s.self.weak_from_this(), this, timeout](std::error_code ec) {
        auto keep = w.lock();
        if (!keep) return;
        piece_timer_armed = false;
        if (ec || !s.sess->is_open()) return;
        if (s.reading_paused || !s.sess->connected()) {
            // This side's own pause, or no connection: not the peer's delay.
            in.restart_clocks(std::chrono::steady_clock::now());
            return arm_piece_timer();
        }
        const auto oldest = in.oldest();
        if (oldest == std::chrono::steady_clock::time_point{}) return;
        if (std::chrono::steady_clock::now() < oldest + timeout) return arm_piece_timer();
        s.sess->abort(errc::protocol_error,
                    "ordo: protocol error: a message in pieces from " + s.remote +
                        " was not complete within message_timeout (" +
                        std::to_string(timeout.count()) + " ms)");
    });
}

}  // namespace ordo::detail
