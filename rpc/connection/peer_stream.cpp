// The caller's side of a streaming call on a connection (docs/protocol.md, "Streams"): the
// ordo.stream request, and the credit its reader grants going out as ordo.credit. The reader's
// side is rpc/streams/stream_call.cpp; the items come back through the call table
// (call_table::on_item).
#include "ordo/rpc/peer.hpp"

#include <cstring>

#include "ordo/rpc/detail/async_call.hpp"
#include "ordo/rpc/detail/message_heads.hpp"
#include "ordo/rpc/stream_call.hpp"
#include "rpc/connection/peer_state.hpp"

namespace ordo {

// A streaming call: [0, msgid, "ordo.stream", [method, params, window, window_bytes]]
// (docs/protocol.md, "Streams"); its items come back as ordo.item, and credit goes out as
// ordo.credit.
void peer::state::send_stream_request(std::uint32_t id, detail::pending_call& call) {
    buffer b(small_buffer + call.params.size());
    detail::write_request_head(b, id, "ordo.stream");
    const std::size_t head = b.size();
    msgpack::packer<buffer> p(b);
    const bool writes = call.stream->writes();
    // The credit for the caller's items may grow (max_window_bytes); on a resumable session,
    // within half of what it may hold unacknowledged, so that a grown window never fills it.
    std::uint64_t grow_to = writes ? call.options.max_window_bytes : 0;
    if (sess->is_resumable())
        grow_to = std::min<std::uint64_t>(grow_to, sess->max_unacked_bytes() / 2);
    if (grow_to <= default_stream_window_bytes) grow_to = 0;
    p.pack_array(writes ? (grow_to ? 6 : 5) : 4);
    p.pack(call.method);
    b.write(call.params.data(), call.params.size());
    p.pack(call.stream->window());
    p.pack(call.stream->window_bytes());
    if (writes) p.pack(true);  // the caller writes items too (docs/protocol.md, "Streams both ways")
    if (grow_to) p.pack(grow_to);
    if (call.options.timeout.count() > 0 || !call.options.metadata.empty() ||
        o.default_timeout.count() > 0 || feats.holding)
        // With its context (docs/protocol.md, "Call context"), or held behind what waits.
        feats.send_request(id, "ordo.stream", std::string_view(b.data() + head, b.size() - head),
                     call.options, call.lane);
    else
        send_out(call.lane, std::string_view(b.data(), b.size()), {});
    call.stream->attach([w = self.weak_from_this(), ex = ex, id, lane = call.lane](
                            std::uint32_t n, std::uint64_t bytes) {
        net::post(ex, [w, id, n, bytes, lane] {
            if (auto p = w.lock()) p->s_->send_credit(id, n, bytes, lane);
        });
    });
    // Its window's probes ping this connection, not another of a pool's or a router's.
    if (call.stream->grows()) call.stream->probe_through(self.weak_from_this());
    if (!writes) return;
    // Items go out from the writer's coroutine when it runs here (as a handler's do), else in
    // the order they were posted; always behind the request, whose handler grants the credit.
    const auto closed = call.stream->attach_writer(
        [w = self.weak_from_this(), ex = ex, id, lane = call.lane](
            std::string_view front, std::string_view item, bool last,
            std::unique_ptr<held_body>* keep) {
            if (detail::running_in(ex)) {
                if (auto p = w.lock()) p->s_->send_in(id, front, item, last, lane, keep);
                return;
            }
            std::string whole(front);
            whole.append(item);
            net::post(ex, [w, id, lane, last, item = std::move(whole)] {
                if (auto p = w.lock()) p->s_->send_in(id, {}, item, last, lane);
            });
        });
    if (closed)  // posted: the call is in the table once this returns
        net::post(ex, [w = self.weak_from_this(), id, lane = call.lane, n = *closed] {
            buffer count;
            msgpack::pack(count, n);
            if (auto p = w.lock())
                p->s_->send_in(id, {}, std::string_view(count.data(), count.size()), true, lane);
        });
}

// [2, "ordo.in", [msgid, item]] or [2, "ordo.in_end", [msgid, count]] on the call's lane,
// behind its request. One the output cannot take (errc::overloaded) ends the connection: the
// call then fails, so no item is lost unseen.
void peer::state::send_in(std::uint32_t msgid, std::string_view front, std::string_view body,
                          bool last, std::uint16_t lane, std::unique_ptr<held_body>* keep) {
    if (!sess->is_open() || !calls.contains(msgid)) return;
    struct {  // at most 2 + 12 + 1 + 5 bytes
        char bytes[24];
        std::size_t size = 0;
        void write(const char* p, std::size_t n) {
            std::memcpy(bytes + size, p, n);
            size += n;
        }
    } head;
    detail::write_notification_head(head, last ? "ordo.in_end" : "ordo.in");
    msgpack::packer<decltype(head)> p(head);
    p.pack_array(2);
    p.pack(msgid);
    try {
        if (last) {
            // The end may come before the request has gone (a caller that wrote nothing):
            // behind it, held as it may be.
            std::string whole(head.bytes, head.size);
            whole.append(body);
            send_ordered(whole, lane);
        } else {
            // An item follows credit, which follows the request: nothing is held ahead. A
            // large one whose bytes come with their owner is written from where it is, behind
            // the head and the item's front.
            std::string_view h(head.bytes, head.size);
            std::string joined;
            if (!front.empty()) {
                joined.assign(h);
                joined.append(front);
                h = joined;
            }
            if (keep && *keep) send_out_held(lane, h, body, std::move(*keep));
            else send_out(lane, h, body);
        }
    } catch (const std::system_error& e) {
        if (e.code() == errc::overloaded) sess->abort(errc::overloaded);
        else throw;
    }
}

// Its request is wholly sent (items came back): past its lane's queue (send_control).
void peer::state::send_credit(std::uint32_t msgid, std::uint32_t n, std::uint64_t bytes,
                              std::uint16_t lane) {
    if (!sess->is_open() || !calls.contains(msgid)) return;
    buffer b(small_buffer);
    encode_notification(b, "ordo.credit", msgid, n, bytes);
    send_control(b, lane, true);
}

}  // namespace ordo
