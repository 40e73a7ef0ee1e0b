// What the other side reads, asked with ordo.features, and what waits for the answer
// (rpc/connection/negotiation.hpp; docs/protocol.md "Call context").
#include "rpc/connection/negotiation.hpp"

#include "rpc/connection/peer_state.hpp"

namespace ordo::detail {

namespace {

// ordo.features, which the connection asks of the other side itself: its answer says whether
// calls may carry their context there.
class features_call final : public pending_call {
  public:
    features_call(std::weak_ptr<peer> p, negotiation& n) : p_(std::move(p)), n_(n) {
        method = "ordo.features";
        own = true;
        // A peer that never answers unknown requests is not waited on for long.
        options.timeout = std::chrono::seconds(10);
    }
    void complete(std::error_code ec, call_outcome out) override {
        if (auto keep = p_.lock()) n_.answered(ec, out);
    }

  private:
    std::weak_ptr<peer> p_;
    negotiation& n_;
};

}  // namespace

void negotiation::ask() {
    auto call = std::make_unique<features_call>(s.self.weak_from_this(), *this);
    buffer b(small_buffer);
    const std::uint32_t id = s.calls.next_id();
    write_request_head(b, id, "ordo.features");
    msgpack::packer<buffer> p(b);
    p.pack_array(1);
    p.pack_array(2);
    p.pack(std::string_view("meta"));
    p.pack(std::string_view("lanes"));
    s.sess->send(std::string_view(b.data(), b.size()));  // throws as a call's send does
    ++s.c.calls_started;
    s.calls.add(id, std::move(call));
    context = support::asking;  // only once the answer is sure to come
}

void negotiation::ask_if_context(const call_options& opts) {
    if (opts.timeout.count() > 0 || s.o.default_timeout.count() > 0 || !opts.metadata.empty())
        ask();
}

void negotiation::hold(held_message h) {
    // Held bytes count against the same bound as the output they stand in for.
    // (A notification's params are also in its bytes: counted once.)
    const std::size_t size = h.bytes.empty() ? h.method.size() + h.params.size() : h.bytes.size();
    if (held_bytes + size > s.o.comm.max_buffer_bytes)
        throw_error(errc::overloaded,
                    "ordo: " + s.remote + ": " + std::to_string(held_bytes + size) +
                        " bytes held while ordo.features is answered, over max_buffer_bytes (" +
                        std::to_string(s.o.comm.max_buffer_bytes) + ")");
    held_bytes += size;
    held.push_back(std::move(h));
    set_holding(true);
}

void negotiation::hold_bytes(std::string_view bytes, std::string_view notification,
                             std::string_view params, std::string_view lane) {
    held_message h;
    h.lane.assign(lane);
    h.bytes.assign(bytes);
    h.notification.assign(notification);
    h.params.assign(params);
    hold(std::move(h));
}

void negotiation::start_call(pending_call* taken) {
    std::unique_ptr<pending_call> call(taken);
    auto& f = *call;
    if (!take_context(f, s.o.default_timeout))
        return s.calls.fail(std::move(call), errc::timed_out, inherited_timeout_reason(f));
    std::uint32_t id = 0;
    try {
        // Asked before this call takes its msgid: ordo.features goes first, with the lower one.
        // (A call on a named lane asks too: whether the other side reads pieces.)
        if (context == support::unknown) {
            if (f.lane != 0)
                ask();
            else
                ask_if_context(f.options);
        }
        id = s.calls.next_id();
        if (f.stream)
            s.send_stream_request(id, f);
        else
            send_request(id, f.method, std::string_view(f.params.data(), f.params.size()),
                         f.options, f.lane);
    } catch (const std::system_error& e) {
        return s.calls.fail(std::move(call), e.code(), e.what());
    }
    if (!f.keep_params) f.params.clear();
    s.calls.add(id, std::move(call));
    s.live.note_work();
}

void negotiation::send_request(std::uint32_t id, std::string_view method, std::string_view params,
                               const call_options& opts, std::uint16_t lane) {
    const auto timeout = opts.timeout.count() > 0 ? opts.timeout : s.o.default_timeout;
    const bool has_context = timeout.count() > 0 || !opts.metadata.empty();
    // Checked here, whether it is sent now, held or sent plain; encoded once for the calls
    // that carry the same pairs.
    std::string_view pairs;
    if (!opts.metadata.empty())
        pairs = meta_pairs.pack(method, opts.metadata, timeout.count() > 0);
    if (!has_context || context == support::no) {
        // Plain: held behind what waits for the answer, if anything does.
        if (!holding) {
            // Its head in a buffer of its own: request_head() stays start_call's alone, inlined.
            buffer head(small_buffer);
            write_request_head(head, id, method);
            return s.send_out(lane, std::string_view(head.data(), head.size()), params);
        }
        buffer b(small_buffer + params.size());
        write_request_head(b, id, method);
        b.write(params.data(), params.size());
        held_message h;
        if (lane) h.lane = lane_name(lane);
        h.bytes.assign(b.data(), b.size());
        h.request = true;
        h.msgid = id;
        return hold(std::move(h));
    }
    if (context == support::yes) {
        // Its head on the stack, and its pairs as they were encoded for the first call that
        // carried them: two pieces of one message. A larger head goes in a buffer the
        // connection keeps (no allocation per call).
        char small[small_context_head];
        if (const std::size_t n = write_small_context_head(
                small, id, method, params, opts.metadata.size(), timeout, timeout.count() > 0);
            n > 0)
            return s.send_out(lane, std::string_view(small, n), pairs);
        scratch.clear();
        write_context_request_head(scratch, id, method, params, opts.metadata.size(),
                                           timeout, timeout.count() > 0);
        return s.send_out(lane, std::string_view(scratch.data(), scratch.size()), pairs);
    }
    held_message h;
    if (lane) h.lane = lane_name(lane);
    h.request = true;
    h.msgid = id;
    h.method.assign(method);
    h.params.assign(params);
    h.meta = opts.metadata;
    if (timeout.count() > 0) h.deadline = std::chrono::steady_clock::now() + timeout;
    hold(std::move(h));
}

void negotiation::report_held(std::vector<held_message>& waiting, std::size_t from,
                              std::error_code ec, const std::string& why) {
    for (std::size_t i = from; i < waiting.size(); ++i) {
        auto& h = waiting[i];
        if (h.notification.empty()) continue;
        ++s.c.notifications_undelivered;
        if (!s.o.on_undelivered) continue;
        undelivered_notification u;
        u.method = h.notification;
        u.params = std::move(h.params);
        u.code = ec;
        u.reason = why;
        try {
            s.o.on_undelivered(u);
        } catch (...) {
            // The application's callback must not throw; one that does loses only its report.
        }
    }
}

void negotiation::answered(std::error_code ec, const call_outcome& out) {
    auto waiting = std::move(held);
    held.clear();
    held_bytes = 0;
    set_holding(false);
    if (s.failing_calls || !s.sess->can_send()) {
        // The connection (or the session) ended before the answer: the held calls fail with
        // it (they are in the call table); the held notifications are told undelivered.
        context = support::unknown;
        report_held(waiting, 0, ec ? ec : make_error_code(errc::closed), out.detail);
        return;
    }
    // Any error answer is a peer that does not know ordo.features (method_not_found from a
    // plain msgpack-rpc peer) or does not answer it in time: it gets plain calls.
    bool yes = false, reads_pieces = false;
    if (!ec && out.result.type == msgpack::type::ARRAY) {
        const auto& a = out.result.via.array;
        for (std::uint32_t i = 0; i < a.size; ++i) {
            if (a.ptr[i].type != msgpack::type::STR) continue;
            const std::string_view name(a.ptr[i].via.str.ptr, a.ptr[i].via.str.size);
            yes = yes || name == "meta";
            reads_pieces = reads_pieces || name == "lanes";
        }
    }
    context = yes ? support::yes : support::no;
    s.lanes.ok = s.lanes.ok || reads_pieces;
    s.lanes.update_divert();
    const auto now = std::chrono::steady_clock::now();
    for (std::size_t i = 0; i < waiting.size(); ++i) {
        auto& h = waiting[i];
        if (!s.sess->can_send())  // the calls fail with the connection
            return report_held(waiting, i, s.sess->close_code(), s.sess->close_reason());
        // A call withdrawn while held (its deadline, a cancel) is not sent at all.
        if (h.request && !s.calls.contains(h.msgid)) continue;
        try {
            if (!h.bytes.empty()) {
                s.send_named(h.lane, h.bytes, {}, h.notification);
                continue;
            }
            buffer b(small_buffer + h.params.size());
            if (yes) {
                const bool timed = h.deadline != std::chrono::steady_clock::time_point{};
                const auto left =
                    timed ? std::max(std::chrono::ceil<std::chrono::milliseconds>(h.deadline - now),
                                     std::chrono::milliseconds(0))
                          : std::chrono::milliseconds(0);
                write_context_request(b, h.msgid, h.method, h.params, h.meta, left, timed);
            } else {
                write_request_head(b, h.msgid, h.method);
                b.write(h.params.data(), h.params.size());
            }
            s.send_named(h.lane, std::string_view(b.data(), b.size()), {});
        } catch (const std::system_error& e) {
            // Taken, and now it cannot be sent (its output is full): the connection ends,
            // loudly, and what was held fails with it or is told undelivered.
            if (e.code() == errc::overloaded)
                s.sess->abort(errc::overloaded,
                            std::string("ordo: held calls could not be sent: ") + e.what());
            return report_held(waiting, i, e.code(), e.what());
        }
    }
}


}  // namespace ordo::detail
