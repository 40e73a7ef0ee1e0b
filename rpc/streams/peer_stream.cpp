// The caller's side of a streaming call on a connection (docs/protocol.md, "Streams"): the
// ordo.stream request, and the credit its reader grants going out as ordo.credit. The reader's
// side is rpc/streams/stream_call.cpp; the items come back through the call table
// (call_table::on_item).
#include "ordo/rpc/peer.hpp"

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
    p.pack_array(4);
    p.pack(call.method);
    b.write(call.params.data(), call.params.size());
    p.pack(call.stream->window());
    p.pack(call.stream->window_bytes());
    if (call.options.timeout.count() > 0 || !call.options.metadata.empty() ||
        o.default_timeout.count() > 0 || holding)
        // With its context (docs/protocol.md, "Call context"), or held behind what waits.
        send_request(id, "ordo.stream", std::string_view(b.data() + head, b.size() - head),
                     call.options, call.lane);
    else
        send_out(call.lane, std::string_view(b.data(), b.size()), {});
    call.stream->attach([w = self.weak_from_this(), ex = ex, id, lane = call.lane](
                            std::uint32_t n, std::uint64_t bytes) {
        net::post(ex, [w, id, n, bytes, lane] {
            if (auto p = w.lock()) p->s_->send_credit(id, n, bytes, lane);
        });
    });
}

// Its request is wholly sent (items came back): past its lane's queue (send_control).
void peer::state::send_credit(std::uint32_t msgid, std::uint32_t n, std::uint64_t bytes,
                              std::uint16_t lane) {
    if (!sess->is_open() || !calls.contains(msgid)) return;
    send_control([&](buffer& b) { encode_notification(b, "ordo.credit", msgid, n, bytes); },
                 lane, true);
}

}  // namespace ordo
