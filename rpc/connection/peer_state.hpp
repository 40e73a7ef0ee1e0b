// The inside of ordo::peer: the four parts of an ordered connection, each of which keeps one
// guarantee, and how the peer wires them together (it is the host each part calls back):
//   session     (rpc/session/session.*)  the bytes: order on the wire, how it ended;
//   call_table  (call_table.*, here)     this side's calls: msgids, deadlines, cancellation;
//   dispatcher  (rpc/dispatch/dispatcher.*)  the remote side's messages: order of handlers;
//   liveness    (liveness.*, here)       dead peers within a bounded time.
// Beside them, three parts of the connection's own, each with a reference back to it:
//   draining    (draining.hpp)           why calls stop: ordo.goaway, a half-close;
//   negotiation (negotiation.*)          ordo.features, and what waits for its answer;
//   peer_lanes  (peer_lanes.*)           messages as pieces, a dispatcher per named lane.
// rpc/connection/peer.cpp holds the peer's public operations, rpc/connection/peer_stream.cpp the
// caller's side of streaming calls (ordo.stream, ordo.credit).
#pragma once

#include <optional>

#include "ordo/detail/memory_budget.hpp"
#include "ordo/rpc/detail/message_heads.hpp"
#include "ordo/rpc/peer.hpp"
#include "rpc/connection/call_table.hpp"
#include "rpc/connection/draining.hpp"
#include "rpc/connection/liveness.hpp"
#include "rpc/connection/negotiation.hpp"
#include "rpc/connection/peer_lanes.hpp"
#include "rpc/context/context.hpp"
#include "rpc/dispatch/dispatcher.hpp"
#include "rpc/session/session.hpp"

namespace ordo {

struct peer::state final : detail::call_table_host,
                           detail::dispatcher_host,
                           detail::liveness_host,
                           detail::session_host {
    // Its operations, but for the lanes' and streams' own, are rpc/connection/peer.cpp.
    state(peer& p, std::unique_ptr<transport> t, peer_options opt, const handlers* h,
          detail::resume_config rc);
    ~state() override;

    peer& self;
    peer_options o;
    const handlers* h;
    net::any_io_executor ex;
    std::string remote;
    peer_counters c;
    // Every incoming message is decoded into it (reused). Its zone's first chunk is what an
    // idle connection keeps: 2 KiB holds the objects of messages with a few dozen values.
    detail::read_area read_area{2048};
    bool ended = false;
    bool kept_for_close = false;  // close() keeps the peer until its connection has ended
    std::vector<std::function<void(const std::error_code&, const std::string&)>> closed_fns;
    net::steady_timer closed_event;
    detail::liveness live;
    std::unique_ptr<detail::call_observer> observer;  // before `calls`: it outlives them
    detail::call_table calls;
    detail::dispatcher disp;
    std::unique_ptr<detail::session> sess;
    detail::draining drain;
    detail::negotiation feats;
    detail::peer_lanes lanes;

    void on_message(std::string_view bytes) override {
        // Borrowed from read_area: what outlives this call (a queued message, an async
        // handler's params, a raw result) is own()ed on the way.
        message m = decode_message(bytes, o.comm.limits, read_area.zone);
        handle(m, bytes.size());
    }
    // A request with its context: never the dispatcher's inline path.
    [[gnu::noinline]] void on_context_message(message& m, std::size_t wire_bytes) {
        disp.on_context_message(m, wire_bytes);
        if (drain.heard_goaway) drain.leave_when_idle();
    }
    std::size_t take_message(std::string_view bytes, const limits& l) override {
        message m;
        const std::size_t n = detail::decode_prefix(bytes, l, read_area, m);
        if (n > 0) handle(m, n);
        return n;
    }
    [[gnu::always_inline]] void handle(message& m, std::size_t wire_bytes) {
        // Tested in this order, so that a notification pays for one test, and only a request
        // for its context (the only kind that carries one).
        if (m.kind == message_kind::notification) {
            if (m.method == "ordo.item")  // an item of one of this side's streams
                return calls.on_item(m, wire_bytes);
            if (m.method.starts_with("ordo.") && lanes.took_notification(m)) [[unlikely]]
                return;
        } else if (m.kind == message_kind::response) {
            return on_response(m);
        } else if (m.meta.type != msgpack::type::NIL) [[unlikely]] {
            return on_context_message(m, wire_bytes);
        }
        disp.on_message(m, wire_bytes);
        if (drain.heard_goaway) [[unlikely]]
            drain.leave_when_idle();
    }
    [[gnu::always_inline]] void on_response(message& m) {
        if (drain.heard_goaway) [[unlikely]] {
            // The caller's handler may drop the last reference.
            auto keep = self.shared_from_this();
            calls.on_response(m);
            return drain.leave_when_idle();
        }
        // The caller's handler may drop the last reference to this peer: on_response touches
        // nothing of the peer once it has run it, and neither does anything on the way back.
        calls.on_response(m);
    }

    // Reading stopped by the dispatcher (its queue at max_queued_messages or the memory
    // budget), and when it last started again: what the watchdog's silence counts from.
    bool reading_paused = false;
    bool disp_paused = false;  // the default lane's dispatcher asks for the pause
    std::chrono::steady_clock::time_point resumed_reading{};
    // A response met a connection that had failed (send_response): no more are sent.
    bool answers_stopped = false;

    // close() promises that what was queued is sent: the peer (its session and connection)
    // outlives the caller's last handle until the connection has ended. A waiting coroutine
    // holds it, so that an io_context destroyed meanwhile frees it with its other handlers. The
    // end comes in bounded time: the flush, then at most comm.close_timeout for the other side's
    // end (a resumable session's ordo.bye included).
    void hold_until_ended();

    // The session ended: every part hears how.
    void on_ended(const close_result& r);

    // Set while calls.fail_all() runs (the connection or the session ended): the features
    // call's end then means "gone", whatever its code.
    bool failing_calls = false;
    void fail_all_calls(std::error_code code, const std::string& why) override {
        const bool was = failing_calls;
        failing_calls = true;
        calls.fail_all(code, why);
        failing_calls = was;
    }
    // Fails `call` (true) if the connection takes no more calls; counts it either way.
    [[gnu::always_inline]] bool refuse_call(std::unique_ptr<detail::pending_call>& call);

    // ---- the way out ----

    // What keeps order with calls (held behind what waits for ordo.features).
    void send_ordered(std::string_view bytes, std::uint16_t lane = 0) {
        if (feats.holding) [[unlikely]]
            return feats.hold_bytes(bytes, {}, {}, lane ? detail::lane_name(lane) : std::string());
        send_out(lane, bytes, {});
    }
    // A message on `lane`: a default-lane message that needs no pieces goes straight to the
    // session, as without lanes.
    [[gnu::always_inline]] void send_out(std::uint16_t lane, std::string_view head,
                                         std::string_view body,
                                         std::string_view notification = {}) {
        if (lane == 0 && head.size() + body.size() <= lanes.divert_above) [[likely]]
            return sess->send(head, body);
        lanes.send(lane == 0 ? std::string_view() : std::string_view(detail::lane_name(lane)),
                   head, body, notification);
    }
    // send_out() of a large body written from where it is, kept by `keep` until then (the
    // default lane's, when it needs no pieces; else it is copied as any message).
    void send_out_held(std::uint16_t lane, std::string_view head, std::string_view body,
                       std::unique_ptr<held_body> keep) {
        if (lane == 0 && head.size() + body.size() <= lanes.divert_above)
            return sess->send(head, body, std::move(keep));
        send_out(lane, head, body);
    }
    // The same for a lane by name (a named lane's answers, what was held).
    void send_named(std::string_view lane, std::string_view head, std::string_view body,
                    std::string_view notification = {}) {
        if (lane.empty() && head.size() + body.size() <= lanes.divert_above)
            return sess->send(head, body);
        lanes.send(lane, head, body, notification);
    }
    // Credit and cancels must arrive: a lost one would leave a stream's handler waiting, and
    // a serial one the whole connection. One that cannot be taken (errc::overloaded: the
    // output is full) ends the connection instead, as a response that cannot be sent does.
    // `ahead`: the call's request is wholly sent (a stream's credit: items came back; a
    // cancel whose request its lane no longer holds). rpc/connection/peer_stream.cpp.
    void send_control(const buffer& b, std::uint16_t lane, bool ahead);
    // A response on `lane`; one that cannot be taken ends the connection loudly.
    void send_response_on(std::uint16_t lane, const buffer& b);

    // rpc/connection/peer_stream.cpp.
    void send_stream_request(std::uint32_t id, detail::pending_call& call);
    void send_credit(std::uint32_t msgid, std::uint32_t n, std::uint64_t bytes,
                     std::uint16_t lane);
    // An item of a call whose caller writes (ordo.in), or their end (ordo.in_end, `last`).
    void send_in(std::uint32_t msgid, std::string_view front, std::string_view body, bool last,
                 std::uint16_t lane, std::unique_ptr<held_body>* keep = nullptr);

    // ---- the parts' view of the connection ----

    std::weak_ptr<void> owner() override { return self.weak_from_this(); }
    void session_lost(const close_result& r) override;
    void session_opened(bool resumed) override;
    std::uint32_t next_msgid() override { return calls.next_id(); }
    bool peer_finished_sending() override { return drain.finished_sending(); }
    // On the call's lane, behind its request. Before the connection may leave: a goaway's
    // leave_when_idle() must find the cancel already queued.
    void send_cancel(std::uint32_t msgid, std::uint16_t lane) override;
    void send_response(const buffer& b) override;
    void send_response_parts(std::string_view head, std::string_view body,
                             std::unique_ptr<held_body> keep) override;
    void pause_reading(bool paused) override;
    void handler_started() override { live.note_work(); }
    void handler_finished() override {
        if (drain.heard_goaway || drain.heard_eof) drain.leave_when_idle();
    }
    void remote_going_away(std::chrono::milliseconds grace, std::string reason) override {
        drain.remote_going_away(grace, std::move(reason));
    }
    void remote_reads_lanes() override { lanes.remote_reads(); }
    // A credit or cancel on the default lane for a named lane's call (send_control).
    void not_mine(const message& m, std::size_t bytes) override {
        for (auto& l : lanes.parts) l->disp.offered(m, bytes);
    }
    // Room to send again: the next pieces, when some wait, and credit that could not be sent.
    void acknowledged() override { lanes.written(); }
    void written() override { lanes.written(); }
    std::shared_ptr<void> keep_alive() override { return self.shared_from_this(); }
    void remote_closing(std::error_code code, std::string reason) override {
        sess->note_remote_reason(code, std::move(reason));
    }
    void dropped(std::string_view method, errc code, std::string reason) override;
    std::size_t calls_waiting() const override { return calls.waiting(); }
    std::size_t handlers_running() const override { return lanes.running(); }
    // While this side does not read (its queue is full), the peer's silence is this side's
    // own doing: the watchdog counts it from when reading resumed, not from the last bytes
    // read before the pause (a server busy with a long queue took a live caller for dead).
    std::chrono::steady_clock::time_point last_receive() const override;
    bool send_ping() override;
    void lost(std::string reason) override { sess->cut("no bytes from " + remote + " " + reason); }
    bool is_open() const override { return sess->is_open(); }
};

}  // namespace ordo
