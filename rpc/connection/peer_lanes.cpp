// The lanes of an ordered connection (docs/protocol.md "Lanes"): what goes out as pieces and
// when, the pieces that come in put back together and dispatched on their lane, one
// dispatcher per named lane, and the end of it all with the connection. The pieces'
// bookkeeping itself is rpc/connection/lanes.cpp.
#include "ordo/rpc/peer.hpp"

#include "ordo/detail/memory_budget.hpp"
#include "rpc/connection/peer_state.hpp"

namespace ordo {

peer::state::lane_part::lane_part(state& st, std::string_view lane_name)
    : s(st),
      name(lane_name),
      disp(st.self, st.ex, st.h, st.o.max_queued_messages, st.o.max_queued_bytes,
           st.o.comm.budget.get(), *this, st.c) {}

// A stream item with its owner (held_body): written from where it is, or failing as
// send_response_on()'s answers do.
void peer::state::send_response_parts(std::string_view head, std::string_view body,
                                      std::unique_ptr<held_body> keep) {
    if (answers_stopped || !sess->is_open()) return;
    try {
        send_out_held(0, head, body, std::move(keep));
    } catch (const std::system_error& e) {
        if (e.code() == errc::overloaded) return sess->abort(errc::overloaded);
        answers_stopped = true;
    }
}

// A named lane's messages go as pieces: a held body is copied into them, and let go at once.
void peer::state::lane_part::send_response_parts(std::string_view head, std::string_view body,
                                                 std::unique_ptr<held_body>) {
    if (s.answers_stopped || !s.sess->is_open()) return;
    try {
        s.send_on_lane(name, head, body, {});
    } catch (const std::system_error& e) {
        // As the default lane's answers (peer::state::send_response_on).
        if (e.code() == errc::overloaded) return s.sess->abort(errc::overloaded);
        s.answers_stopped = true;
    }
}

void peer::state::lane_part::pause_reading(bool p) {
    s.pause_lane(paused, p);
}

void peer::state::send_on_lane(std::string_view name, std::string_view head, std::string_view body,
                               std::string_view notification) {
    if (!lanes_ok) {
        // Answered (ordo.features) without "lanes": the other side reads one lane, and gets
        // everything on it, in the order sent.
        if (name.empty() || ctx_support == context_support::yes ||
            ctx_support == context_support::no)
            return sess->send(head, body);
        if (ctx_support == context_support::unknown) ask_features();
        held_message h;
        h.lane.assign(name);
        h.bytes.reserve(head.size() + body.size());
        h.bytes.append(head).append(body);
        if (!notification.empty()) {
            h.notification.assign(notification);
            h.params.assign(body);
        }
        return hold(std::move(h));
    }
    const std::size_t size = head.size() + body.size();
    // What waits for its pieces to go counts against the bound of the output it stands for.
    if (lanes_out.bytes() + sess->counters().buffered_bytes + size > o.comm.max_buffer_bytes)
        throw_error(errc::overloaded,
                    "ordo: send to " + remote + " refused: " + std::to_string(lanes_out.bytes()) +
                        " bytes wait for their pieces to go, + " + std::to_string(size) +
                        " would exceed max_buffer_bytes (" +
                        std::to_string(o.comm.max_buffer_bytes) + ")");
    lanes_out.push(name, head, body, notification);
    update_divert();
    lanes_written();
    charge_lanes();
    if (!lanes_out.empty()) sess->want_written(true);
}

void peer::state::lanes_written() {
    lanes_out.pump();
    update_divert();
    charge_lanes();
    if (lanes_waiters > 0 && lanes_out.bytes() <= o.comm.high_water_bytes) lanes_event.cancel();
    if (close_after_lanes && lanes_out.empty()) {
        close_after_lanes = false;
        close_session(lanes_close_code, std::move(lanes_close_reason));
    }
}

void peer::state::close_session(std::error_code code, std::string reason) {
    if (!lanes_out.empty() && sess->is_open()) {
        // The pieces still waiting go first: close() promises to send what was taken. A lane
        // the other side gives no credit for holds them close_timeout at most: then they are
        // told undelivered, and the session closes.
        if (!close_after_lanes) {
            close_timer.expires_after(o.comm.close_timeout);
            close_timer.async_wait([w = self.weak_from_this(), this](std::error_code ec) {
                auto keep = w.lock();
                if (ec || !keep || !close_after_lanes) return;
                close_after_lanes = false;
                drop_lanes_out(make_error_code(errc::closed),
                               "ordo: " + remote + " gave no credit for them within close_timeout (" +
                                   std::to_string(o.comm.close_timeout.count()) + " ms)");
                close_session(lanes_close_code, std::move(lanes_close_reason));
            });
        }
        close_after_lanes = true;
        lanes_close_code = code;
        lanes_close_reason = std::move(reason);
        return;
    }
    close_timer.cancel();
    if (!sess->is_open()) return;
    if (code)
        sess->close(code, std::move(reason));
    else if (!reason.empty())
        sess->close(std::move(reason));
    else
        sess->close();
}

void peer::state::drop_lanes_out(std::error_code code, const std::string& why) {
    for (auto& method : lanes_out.clear()) {
        ++c.notifications_undelivered;
        if (!o.on_undelivered) continue;
        undelivered_notification u;
        u.method = std::move(method);
        u.code = code;
        u.reason = why;
        try {
            o.on_undelivered(u);
        } catch (...) {
            // The application's callback must not throw; one that does loses only its report.
        }
    }
    update_divert();
    charge_lanes();
}

void peer::state::end_lanes(std::error_code code, const std::string& why) {
    // A close that waited for the pieces closes now: they are gone.
    const bool closing = close_after_lanes;
    close_after_lanes = false;
    close_timer.cancel();
    drop_lanes_out(code, why);
    lanes_in.clear();
    piece_timer.cancel();
    lanes_event.cancel();
    // A new session may meet another server: it says again whether it reads pieces.
    lanes_ok = false;
    update_divert();
    charge_lanes();
    if (closing) close_session(lanes_close_code, std::move(lanes_close_reason));
}

peer::state::lane_part& peer::state::part_of(std::string_view lane) {
    for (auto& l : lane_parts)
        if (l->name == lane) return *l;
    if (lane_parts.size() >= o.comm.limits.max_lanes)
        throw_error(errc::protocol_error, "ordo: " + remote + " used more than max_lanes (" +
                                              std::to_string(o.comm.limits.max_lanes) +
                                              ") lanes on one connection");
    lane_parts.push_back(std::make_unique<lane_part>(*this, lane));
    return *lane_parts.back();
}

void peer::state::grant(lane_part& l) {
    const std::uint64_t held = l.credited + l.disp.queued_bytes();
    if (l.received < held + detail::lane_credit_step || !sess->is_open()) return;
    const std::uint64_t n = l.received - held;
    try {
        buffer b(small_buffer);
        encode_notification(b, "ordo.lane_credit", l.name, n);
        sess->send(std::string_view(b.data(), b.size()));  // ahead of every lane's pieces
        l.credited += n;
        ++credits_sent;
    } catch (const std::system_error&) {
        // Full or ending: given with the next write (or message read, or handler finished).
        credit_owed = true;
        sess->want_written(true);
    }
}

std::uint64_t peer::state::plain_sent() {
    // Each count lags behind what was handed over by what is not yet written: the difference
    // rises only when messages that are not pieces, credit or the session's own are written.
    const std::int64_t n = std::int64_t(sess->counters().messages_sent) -
                           std::int64_t(lanes_out.pieces_sent()) - std::int64_t(credits_sent) -
                           std::int64_t(sess->controls_sent());
    return n > 0 ? std::uint64_t(n) : 0;
}

void peer::state::on_lane_credit(message& m) {
    const auto& a = m.params.via.array;
    if (a.size != 2 || a.ptr[0].type != msgpack::type::STR ||
        a.ptr[1].type != msgpack::type::POSITIVE_INTEGER)
        throw_error(errc::protocol_error, "ordo: malformed ordo.lane_credit from " + remote +
                                              " (expected [lane, bytes])");
    lanes_out.credit(std::string_view(a.ptr[0].via.str.ptr, a.ptr[0].via.str.size),
                     a.ptr[1].via.u64);
    lanes_written();
}

void peer::state::on_piece(message& m) {
    const auto& a = m.params.via.array;
    std::uint64_t remaining = 0;
    if (a.size != 3 || a.ptr[0].type != msgpack::type::STR ||
        a.ptr[1].type != msgpack::type::POSITIVE_INTEGER || a.ptr[2].type != msgpack::type::BIN)
        throw_error(errc::protocol_error, "ordo: malformed ordo.piece from " + remote +
                                              " (expected [lane, remaining, bin])");
    remaining = a.ptr[1].via.u64;
    if (!lanes_ok) remote_reads_lanes();
    const std::string_view lane(a.ptr[0].via.str.ptr, a.ptr[0].via.str.size);
    const std::string_view bytes(a.ptr[2].via.bin.ptr, a.ptr[2].via.bin.size);
    if (lane.size() > detail::max_lane_name_bytes)
        throw_error(errc::protocol_error, "ordo: " + remote + " named a lane of " +
                                              std::to_string(lane.size()) + " bytes (the most is " +
                                              std::to_string(detail::max_lane_name_bytes) + ")");
    // A response's caller may drop the last reference to this peer.
    const auto keep = self.weak_from_this().lock();
    lane_part* part = lane.empty() ? nullptr : &part_of(lane);
    const std::optional<std::string_view> whole =
        lanes_in.take(lane, remaining, bytes, o.comm.limits);
    arm_piece_timer();
    if (part) {
        part->received += bytes.size() + detail::piece_overhead_bytes;
        // A sender keeps within the credit it was given: beyond it (with a message's worth of
        // slack for the piece that crossed it), it ignores credit.
        if (part->received - part->credited > detail::lane_window_bytes + o.comm.limits.max_message_bytes)
            throw_error(errc::protocol_error, "ordo: " + remote + " sent lane \"" + part->name +
                                                  "\" pieces beyond the credit it was given");
    }
    charge_lanes();
    if (!whole) {
        if (part) grant(*part);
        return;
    }
    message w = decode_message(*whole, o.comm.limits, lane_area.zone);
    if (w.kind == message_kind::notification && w.method == "ordo.piece")
        throw_error(errc::protocol_error, "ordo: " + remote + " sent a piece inside a piece");
    if (w.kind == message_kind::response) {
        on_response(w);
    } else if (w.kind == message_kind::notification && w.method == "ordo.item") {
        calls.on_item(w, whole->size());
    } else if (w.kind == message_kind::notification && w.method == "ordo.in_credit") {
        calls.on_in_credit(w);
    } else {
        detail::dispatcher& d = part ? part->disp : disp;
        if (w.kind == message_kind::request && w.meta.type != msgpack::type::NIL)
            d.on_context_message(w, whole->size());
        else
            d.on_message(w, whole->size());
        if (heard_goaway) leave_when_idle();
    }
    if (part && sess->is_open()) grant(*part);
}

// A message in pieces must be whole within message_timeout of its first piece, as a message
// must be within it of its first bytes.
void peer::state::arm_piece_timer() {
    const auto timeout = o.comm.message_timeout;
    if (piece_timer_armed || timeout.count() <= 0) return;
    const auto oldest = lanes_in.oldest();
    if (oldest == std::chrono::steady_clock::time_point{}) return;
    piece_timer_armed = true;
    piece_timer.expires_at(oldest + timeout);
    piece_timer.async_wait([w = self.weak_from_this(), this, timeout](std::error_code ec) {
        auto keep = w.lock();
        if (!keep) return;
        piece_timer_armed = false;
        if (ec || !sess->is_open()) return;
        if (reading_paused || !sess->connected()) {
            // This side's own pause, or no connection: not the peer's delay.
            lanes_in.restart_clocks(std::chrono::steady_clock::now());
            return arm_piece_timer();
        }
        const auto oldest = lanes_in.oldest();
        if (oldest == std::chrono::steady_clock::time_point{}) return;
        if (std::chrono::steady_clock::now() < oldest + timeout) return arm_piece_timer();
        sess->abort(errc::protocol_error,
                    "ordo: protocol error: a message in pieces from " + remote +
                        " was not complete within message_timeout (" +
                        std::to_string(timeout.count()) + " ms)");
    });
}

}  // namespace ordo
