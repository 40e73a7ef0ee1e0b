// detail::dispatcher and the reserved ordo.* methods (docs/protocol.md, "Reserved methods"):
// answered at once, ahead of the queue, never by a user's handler.
#include "rpc/dispatch/dispatcher.hpp"

#include "lib/escaped.hpp"
#include "ordo/rpc/handlers.hpp"
#include "ordo/rpc/peer.hpp"
#include "rpc/context/spans.hpp"
#include "rpc/dispatch/stats_answer.hpp"
#include "rpc/dispatch/stream_run.hpp"
#include "rpc/wire/errors.hpp"

namespace ordo::detail {

// Reserved methods are answered at once, never queued behind a handler: a ping must prove the
// connection alive while a long serial handler runs, and a cancel must reach that handler.
void dispatcher::on_reserved(const message& m, std::size_t bytes) {
    const bool req = m.kind == message_kind::request;
    if (req && (m.method == "ordo.cancel" || m.method == "ordo.credit" ||
                m.method == "ordo.closing" || m.method == "ordo.goaway" ||
                m.method == "ordo.in" || m.method == "ordo.in_end")) {
        // Notifications only: a request is answered (its caller would wait forever) and
        // does nothing.
        return respond_error(m.msgid, errc::method_not_found,
                             "\"" + std::string(m.method) +
                                 "\" is a reserved notification, not a method: send it as a "
                                 "notification (docs/protocol.md, \"Reserved methods\")");
    }
    if (m.method == "ordo.in" || m.method == "ordo.in_end") {
        on_in(m, bytes);
    } else if (m.method == "ordo.ping") {
        if (req) {
            buffer b(small_buffer);
            encode_response(b, m.msgid, msgpack::type::nil_t());
            host_.send_response(b);
        }
    } else if (m.method == "ordo.features" && req) {
        // [[feature, ...]] asked: answered with those this side reads ("meta": a request's
        // context, docs/protocol.md "Call context"; "lanes": pieces, "Lanes"), whatever else
        // was asked.
        bool meta = false, lanes = false;
        const auto& a = m.params.via.array;
        if (a.size >= 1 && a.ptr[0].type == msgpack::type::ARRAY)
            for (std::uint32_t i = 0; i < a.ptr[0].via.array.size; ++i) {
                const auto& f = a.ptr[0].via.array.ptr[i];
                if (f.type != msgpack::type::STR) continue;
                const std::string_view name(f.via.str.ptr, f.via.str.size);
                meta = meta || name == "meta";
                lanes = lanes || name == "lanes";
            }
        buffer b(small_buffer);
        write_response_head(b, m.msgid);
        msgpack::packer<buffer> p(b);
        p.pack_array((meta ? 1 : 0) + (lanes ? 1 : 0));
        if (meta) p.pack(std::string_view("meta"));
        if (lanes) p.pack(std::string_view("lanes"));
        host_.send_response(b);
        if (lanes) host_.remote_reads_lanes();
    } else if (m.method == "ordo.health" && req) {
        answer_health(m);
    } else if (m.method == "ordo.cancel") {
        if (m.params.via.array.size == 1 &&
            m.params.via.array.ptr[0].type == msgpack::type::POSITIVE_INTEGER)
            if (!cancel_handler(static_cast<std::uint32_t>(m.params.via.array.ptr[0].via.u64)))
                host_.not_mine(m, bytes);
    } else if (m.method == "ordo.credit") {
        // [msgid, n] or [msgid, n, bytes]: the caller of a stream read n more items (of that
        // many bytes).
        const auto& a = m.params.via.array;
        if ((a.size == 2 || a.size == 3) && a.ptr[0].type == msgpack::type::POSITIVE_INTEGER &&
            a.ptr[1].type == msgpack::type::POSITIVE_INTEGER && a.ptr[0].via.u64 <= 0xffffffffu &&
            (a.size == 2 || a.ptr[2].type == msgpack::type::POSITIVE_INTEGER)) {
            auto it = streams_.find(static_cast<std::uint32_t>(a.ptr[0].via.u64));
            if (it != streams_.end())
                it->second->grant(a.ptr[1].via.u64, a.size == 3 ? a.ptr[2].via.u64 : 0);
            else
                host_.not_mine(m, bytes);
        }
    } else if ((m.method == "ordo.methods" || m.method == "ordo.stats" ||
                m.method == "ordo.traces") &&
               req && h_ && h_->introspection() && !self_.identity().may_introspect) {
        respond_error(m.msgid, errc::permission_denied,
                      "permission denied: " + std::string(m.method) + " is not open to " +
                          self_.identity().name() + " (server_options::allow_introspection)");
    } else if (m.method == "ordo.methods" && req && h_ && h_->introspection()) {
        buffer b(small_buffer);
        pack_methods_answer(b, m.msgid, *h_);
        host_.send_response(b);
    } else if (m.method == "ordo.traces" && req && h_ && h_->introspection()) {
        // [trace id?, slowest?]: the spans this process recorded (ordo/rpc/spans.hpp).
        buffer b(small_buffer);
        pack_traces_answer(b, m.msgid, m.params);
        host_.send_response(b);
    } else if (m.method == "ordo.stats" && req && h_ && h_->introspection()) {
        if (!h_->stats_source()) {
            buffer b(small_buffer);
            write_response_head(b, m.msgid);
            pack_stats(b, *h_, nullptr);
            host_.send_response(b);
        } else {
            // A server's figures are gathered (from each of its loops) without blocking this
            // one; the answer follows when they are in.
            net::co_spawn(ex_, answer_stats(this, host_.keep_alive(), m.msgid),
                          detail::rethrow_escaped{});
        }
    } else if (m.method == "ordo.closing") {
        // [code, reason]: the remote side closes the connection next, and says why.
        const auto& a = m.params.via.array;
        if (a.size == 2 && a.ptr[1].type == msgpack::type::STR) {
            std::error_code code;
            if (a.ptr[0].type == msgpack::type::POSITIVE_INTEGER && a.ptr[0].via.u64 >= 1 &&
                a.ptr[0].via.u64 <= static_cast<std::uint64_t>(errc::permission_denied))
                code = static_cast<errc>(a.ptr[0].via.u64);
            host_.remote_closing(code,
                                 std::string(a.ptr[1].via.str.ptr, a.ptr[1].via.str.size));
        }
    } else if (m.method == "ordo.goaway") {
        // [grace_ms, reason]: the remote side is draining (docs/protocol.md "Draining"). One
        // that does not have this shape is ignored, like any reserved notification.
        const auto& a = m.params.via.array;
        if (!req && a.size == 2 && a.ptr[0].type == msgpack::type::POSITIVE_INTEGER &&
            a.ptr[1].type == msgpack::type::STR) {
            const auto ms = std::min<std::uint64_t>(a.ptr[0].via.u64, 24ull * 3600 * 1000);
            host_.remote_going_away(std::chrono::milliseconds(static_cast<std::int64_t>(ms)),
                                    std::string(a.ptr[1].via.str.ptr, a.ptr[1].via.str.size));
        }
    } else if (req) {
        respond_error(m.msgid, errc::method_not_found,
                      "no method \"" + std::string(m.method) + "\" (reserved name)");
    }
}

}  // namespace ordo::detail
