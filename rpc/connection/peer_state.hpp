// The inside of ordo::peer: the four parts of an ordered connection, each of which keeps one
// guarantee, and how the peer wires them together (it is the host each part calls back):
//   session     (rpc/session/session.*)  the bytes: order on the wire, how it ended;
//   call_table  (call_table.*, here)     this side's calls: msgids, deadlines, cancellation;
//   dispatcher  (rpc/dispatch/dispatcher.*)  the remote side's messages: order of handlers;
//   liveness    (liveness.*, here)       dead peers within a bounded time.
// rpc/connection/peer.cpp holds the peer's public operations, rpc/connection/peer_stream.cpp the
// caller's side of streaming calls (ordo.stream, ordo.credit).
#pragma once

#include <limits>
#include <optional>

#include "ordo/detail/memory_budget.hpp"
#include "ordo/rpc/detail/message_heads.hpp"
#include "ordo/rpc/peer.hpp"
#include "rpc/connection/call_table.hpp"
#include "rpc/context/context.hpp"
#include "rpc/dispatch/dispatcher.hpp"
#include "rpc/connection/lanes.hpp"
#include "rpc/connection/liveness.hpp"
#include "rpc/session/session.hpp"

namespace ordo {

struct peer::state final : detail::call_table_host,
                           detail::dispatcher_host,
                           detail::liveness_host,
                           detail::session_host {
    state(peer& p, std::unique_ptr<transport> t, peer_options opt, const handlers* h,
          detail::resume_config rc)
        : self(p),
          o(std::move(opt)),
          h(h),
          ex(t->get_executor()),
          remote(t->remote_address()),
          closed_event(ex, std::chrono::steady_clock::time_point::max()),
          eof_probe(ex),
          live(ex, o.liveness_timeout, o.heartbeat_interval, *this),
          calls(ex, {o.first_msgid, o.default_timeout, o.max_abandoned_ids}, *this, c),
          disp(p, ex, h, o.max_queued_messages, o.max_queued_bytes, o.comm.budget.get(), *this, c),
          lanes_out(o.piece_bytes,
                    [this](std::string_view head, std::string_view body) { sess->send(head, body); },
                    [this] { return sess->counters().buffered_bytes; },
                    [this] { return plain_sent(); }, o.lane_window),
          piece_timer(ex),
          lanes_event(ex, std::chrono::steady_clock::time_point::max()),
          close_timer(ex) {
        if (o.liveness_timeout.count() > 0) t->set_liveness(o.liveness_timeout);
        context_always = o.default_timeout.count() > 0;
        rc.max_unacked_bytes = o.max_unacked_bytes;
        if (!o.credentials.empty()) {
            buffer b(small_buffer);
            encode_notification(b, "ordo.auth",
                                std::map<std::string, std::string>{{"token", o.credentials.token}});
            rc.credentials_message.assign(b.data(), b.size());
        }
        sess = std::make_unique<detail::session>(std::move(t), o.comm, std::move(rc), *this, c,
                                                 [this](const close_result& r) { on_ended(r); });
    }

    ~state() override {
        if (o.comm.budget) o.comm.budget->adjust(lanes_charged, 0);
        if (sess->is_open()) {
            sess->end_locally(errc::closed, "ordo: peer " + remote + " destroyed");
            fail_all_calls(sess->close_code(), sess->close_reason());
        }
    }

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
    net::steady_timer eof_probe;  // half-close: the probes after the first (probe_after_eof)
    detail::liveness live;
    std::unique_ptr<detail::call_observer> observer;  // before `calls`: it outlives them
    detail::call_table calls;
    detail::dispatcher disp;
    std::unique_ptr<detail::session> sess;

    void on_message(std::string_view bytes) override {
        // Borrowed from read_area: what outlives this call (a queued message, an async
        // handler's params, a raw result) is own()ed on the way.
        message m = decode_message(bytes, o.comm.limits, read_area.zone);
        handle(m, bytes.size());
    }
    // A request with its context: never the dispatcher's inline path.
    [[gnu::noinline]] void on_context_message(message& m, std::size_t wire_bytes) {
        disp.on_context_message(m, wire_bytes);
        if (heard_goaway) leave_when_idle();
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
            if (m.method.starts_with("ordo.") && took_connection_notification(m)) [[unlikely]]
                return;
        } else if (m.kind == message_kind::response) {
            return on_response(m);
        } else if (m.meta.type != msgpack::type::NIL) [[unlikely]] {
            return on_context_message(m, wire_bytes);
        }
        disp.on_message(m, wire_bytes);
        if (heard_goaway) [[unlikely]]
            leave_when_idle();
    }
    [[gnu::always_inline]] void on_response(message& m) {
        if (heard_goaway) [[unlikely]] {
            // The caller's handler may drop the last reference.
            auto keep = self.shared_from_this();
            calls.on_response(m);
            return leave_when_idle();
        }
        // The caller's handler may drop the last reference to this peer: on_response touches
        // nothing of the peer once it has run it, and neither does anything on the way back.
        calls.on_response(m);
    }

    // Reading stopped by the dispatcher (its queue at max_queued_messages or the memory
    // budget), and when it last started again: what the watchdog's silence counts from.
    bool reading_paused = false;
    std::chrono::steady_clock::time_point resumed_reading{};

    // ---- draining (ordo.goaway, docs/protocol.md "Draining") ----

    bool told_goaway = false;   // this side said it is going away (a server draining)
    bool heard_goaway = false;  // the other side said so
    bool left = false;          // and this side closed the connection once nothing was pending
    // A response met a connection that had failed (send_response): no more are sent.
    bool answers_stopped = false;
    bool leave_posted = false;
    std::chrono::milliseconds goaway_grace{0};
    std::string goaway_reason;  // as the other side said it
    std::string goaway_why;     // "the server is going away: <reason>": how calls fail after
    std::vector<goaway_fn> goaway_fns;

    void remote_going_away(std::chrono::milliseconds grace, std::string reason) override {
        if (heard_goaway || !sess->is_open()) return;
        heard_goaway = true;
        goaway_grace = grace;
        goaway_reason = std::move(reason);
        goaway_why = "the server is going away: " + goaway_reason;
        // Added to the reason if the server closes first (its grace passed); and a resumable
        // session does not try to resume (the server's listeners are closed).
        sess->note_remote_reason(goaway_why);
        auto keep = self.shared_from_this();
        if (o.on_goaway) o.on_goaway(goaway_grace, goaway_reason);
        // Moved out: one that adds another handler has it run at once (peer::on_goaway).
        auto fns = std::move(goaway_fns);
        goaway_fns.clear();
        for (auto& f : fns) f(goaway_grace, goaway_reason);
        leave_when_idle();
    }

    // Once nothing is pending either way, this side closes the connection (the server may then
    // finish its drain early). Checked on the next turn of the executor: a caller resumed by
    // the last response may make another call at once, which is still sent and waited for.
    void leave_when_idle() {
        if (left || leave_posted) return;
        leave_posted = true;
        net::post(ex, [w = self.weak_from_this(), this] {
            auto keep = w.lock();
            if (!keep) return;
            leave_posted = false;
            if (left || !sess->is_open() || calls.waiting() > 0 || running_all() > 0 ||
                queued_all() > 0)
                return;
            left = true;
            close_session(make_error_code(errc::peer_lost), heard_eof ? eof_why : goaway_why);
        });
    }
    void handler_finished() override {
        if (heard_goaway || heard_eof) leave_when_idle();
    }

    // ---- half-close ----

    bool heard_eof = false;  // the other side ended its sending side
    std::string eof_why;

    // End of stream from the other side (rpc/connection/peer.cpp): what it sent is served to
    // its end; probes find a peer that closed altogether.
    bool peer_finished_sending() override;
    // The probes after the first, each this long after the one before.
    static constexpr std::chrono::milliseconds eof_probe_gaps[] = {
        std::chrono::milliseconds(5), std::chrono::milliseconds(15),
        std::chrono::milliseconds(80)};
    void probe_after_eof(std::size_t k);

    // close() promises that what was queued is sent: the peer (its session and connection)
    // outlives the caller's last handle until the connection has ended. A waiting coroutine
    // holds it, so that an io_context destroyed meanwhile frees it with its other handlers. The
    // end comes in bounded time: the flush, then at most comm.close_timeout for the other side's
    // end (a resumable session's ordo.bye included).
    void hold_until_ended() {
        if (ended || kept_for_close) return;
        auto p = self.weak_from_this().lock();
        if (!p) return;  // not shared: whoever owns it decides how long it lives
        kept_for_close = true;
        net::co_spawn(
            ex,
            [](std::shared_ptr<peer> p) -> net::awaitable<void> {
                co_await p->async_wait_closed();
            }(std::move(p)),
            net::detached);
    }

    void on_ended(const close_result& r) {
        const auto& code = sess->close_code();
        const auto& why = sess->close_reason();
        live.stop();
        eof_probe.cancel();
        fail_all_calls(code, why);
        sess->report_undelivered(r, o.on_undelivered, c);
        end_lanes(code, why);
        disp.stop();
        for (auto& l : lane_parts) l->disp.stop();
        ended = true;
        closed_event.cancel();
        auto fns = std::move(closed_fns);
        for (auto& f : fns) f(code, why);
    }

    // ---- call context (docs/protocol.md, "Call context") ----

    // Whether the other side reads a request's context: asked with ordo.features by the first
    // call that carries one. Until the answer, that call and everything sent after it on this
    // connection is held here, in order, and then sent in the form the answer allows.
    enum class context_support : std::uint8_t { unknown, asking, yes, no };
    context_support ctx_support = context_support::unknown;
    struct held_message {
        std::string lane;          // the lane it goes on (docs/protocol.md "Lanes")
        std::string bytes;         // as it goes out; empty for a call with a context
        std::string notification;  // a notification's method (told undelivered if dropped)
        bool request = false;      // a call (msgid): not sent if withdrawn meanwhile
        std::uint32_t msgid = 0;
        // A call with a context, encoded once the answer says how; a notification's params.
        std::string method;
        std::string params;
        metadata meta;
        std::chrono::steady_clock::time_point deadline{};  // {}: none
    };
    std::vector<held_message> held;
    std::size_t held_bytes = 0;  // bounded by comm_options::max_buffer_bytes, as output is
    // Set while calls.fail_all() runs (the connection or the session ended): the features
    // call's end then means "gone", whatever its code.
    bool failing_calls = false;
    void fail_all_calls(std::error_code code, const std::string& why) {
        const bool was = failing_calls;
        failing_calls = true;
        calls.fail_all(code, why);
        failing_calls = was;
    }
    buffer ctx_scratch{small_buffer};  // a request with its context, encoded (send_request)
    detail::packed_metadata ctx_pairs;  // the metadata sent last, checked and encoded
    bool holding = false;  // !held.empty(), read by every notification
    // Every call takes the way with a context: one is held (holding), or the peer has a default
    // timeout (every call has a deadline). One byte for peer::start_call to read.
    bool context_always = false;
    void set_holding(bool on) {
        holding = on;
        context_always = on || o.default_timeout.count() > 0;
    }

    // The connection's way out for what keeps order with calls (rpc/connection/peer.cpp).
    void send_ordered(std::string_view bytes, std::uint16_t lane = 0) {
        if (holding) [[unlikely]]
            return hold_bytes(bytes, {}, {}, lane ? detail::lane_name(lane) : std::string());
        send_out(lane, bytes, {});
    }
    // Holds a message (throws errc::overloaded over the bound).
    void hold(held_message h);
    void hold_bytes(std::string_view bytes, std::string_view notification, std::string_view params,
                    std::string_view lane = {});
    // Tells on_undelivered of the held notifications from `from` on (counted, guarded).
    void report_held(std::vector<held_message>& waiting, std::size_t from, std::error_code ec,
                     const std::string& why);
    // peer::start_call's way for a call with a context; takes `call` (released by the caller:
    // no unique_ptr to destroy there on the common path).
    [[gnu::cold]] void start_call_with_context(detail::pending_call* call);
    // Fails `call` (true) if the connection takes no more calls; counts it either way.
    [[gnu::always_inline]] bool refuse_call(std::unique_ptr<detail::pending_call>& call);
    // A request with its context (or held behind what waits): `params` the encoded array.
    void send_request(std::uint32_t id, std::string_view method, std::string_view params,
                      const call_options& opts, std::uint16_t lane = 0);
    void ask_features();
    // Asks (ordo.features) if a call with `opts` has a context to send; the answer is unknown.
    void ask_if_context(const call_options& opts);
    void features_answered(std::error_code ec, const call_outcome& out);

    // ---- lanes (docs/protocol.md "Lanes"; rpc/connection/peer_lanes.cpp) ----

    detail::lane_writer lanes_out;
    detail::lane_reader lanes_in;
    detail::read_area lane_area{256};  // a whole message from pieces is decoded into it
    bool lanes_ok = false;             // the other side reads ordo.piece
    // A default-lane message larger than this goes as pieces: SIZE_MAX while the other side
    // does not read pieces, 0 while the default lane has pieces waiting (what follows them on
    // that lane waits behind them), else the piece size.
    std::size_t divert_above = std::numeric_limits<std::size_t>::max();
    // close() came while pieces waited: the session closes once they have all gone.
    bool close_after_lanes = false;
    std::error_code lanes_close_code;
    std::string lanes_close_reason;
    net::steady_timer piece_timer;  // message_timeout for a message in the making
    bool piece_timer_armed = false;
    // Woken (cancelled) when what waits for its pieces falls to high_water_bytes: async_drain.
    net::steady_timer lanes_event;
    std::size_t lanes_waiters = 0;
    net::steady_timer close_timer;  // a close that waits for pieces waits close_timeout at most
    // A named lane's dispatcher: the lane's messages in order, independent of other lanes.
    struct lane_part final : detail::dispatcher_host {
        lane_part(state& s, std::string_view lane_name);
        state& s;
        std::string name;
        bool paused = false;
        // Bytes of this lane's pieces read, and given back as credit (ordo.lane_credit).
        std::uint64_t received = 0, credited = 0;
        detail::dispatcher disp;
        void send_response(const buffer& b) override {
            send_response_parts(std::string_view(b.data(), b.size()), {}, nullptr);
        }
        void send_response_parts(std::string_view head, std::string_view body,
                                 std::unique_ptr<held_body> keep) override;
        void pause_reading(bool p) override;
        void handler_started() override { s.handler_started(); }
        std::shared_ptr<void> keep_alive() override { return s.keep_alive(); }
        void remote_closing(std::error_code code, std::string reason) override {
            s.remote_closing(code, std::move(reason));
        }
        void remote_going_away(std::chrono::milliseconds grace, std::string reason) override {
            s.remote_going_away(grace, std::move(reason));
        }
        void handler_finished() override {
            s.handler_finished();
            s.grant(*this);
        }
        void dropped(std::string_view method, errc code, std::string reason) override {
            s.dropped(method, code, std::move(reason));
        }
        void remote_reads_lanes() override { s.remote_reads_lanes(); }
    };
    std::vector<std::unique_ptr<lane_part>> lane_parts;
    // A credit or cancel on the default lane for a named lane's call (send_control).
    void not_mine(const message& m, std::size_t bytes) override {
        for (auto& l : lane_parts) l->disp.offered(m, bytes);
    }
    bool credit_owed = false;  // a grant could not be sent: the next write retries
    std::uint64_t credits_sent = 0;
    // Messages this side wrote that are not pieces, credit or the session's own (acks): while
    // they flow, named lanes keep to the shared window (lane_writer::pump).
    std::uint64_t plain_sent();

    // The way out for a message on `lane`: a default-lane message that needs no pieces goes
    // straight to the session, as without lanes.
    [[gnu::always_inline]] void send_out(std::uint16_t lane, std::string_view head,
                                         std::string_view body,
                                         std::string_view notification = {}) {
        if (lane == 0 && head.size() + body.size() <= divert_above) [[likely]]
            return sess->send(head, body);
        send_on_lane(lane == 0 ? std::string_view() : std::string_view(detail::lane_name(lane)),
                     head, body, notification);
    }
    // send_out() of a large body written from where it is, kept by `keep` until then (the
    // default lane's, when it needs no pieces; else it is copied as any message).
    void send_out_held(std::uint16_t lane, std::string_view head, std::string_view body,
                       std::unique_ptr<held_body> keep) {
        if (lane == 0 && head.size() + body.size() <= divert_above)
            return sess->send(head, body, std::move(keep));
        send_out(lane, head, body);
    }
    // The same for a lane by name (a named lane's answers, what was held).
    void send_named(std::string_view lane, std::string_view head, std::string_view body,
                    std::string_view notification = {}) {
        if (lane.empty() && head.size() + body.size() <= divert_above)
            return sess->send(head, body);
        send_on_lane(lane, head, body, notification);
    }
    // A message on a named lane, or one the default lane sends as pieces (or holds behind
    // them); toward a peer that has not said it reads pieces, held until ordo.features is
    // answered, or sent plain once it said it does not.
    [[gnu::cold]] void send_on_lane(std::string_view name, std::string_view head,
                                    std::string_view body, std::string_view notification);
    void update_divert() {
        divert_above = !lanes_ok                  ? std::numeric_limits<std::size_t>::max()
                       : lanes_out.busy({})       ? 0
                                                  : lanes_out.piece_bytes();
    }
    void remote_reads_lanes() override {
        lanes_ok = true;
        update_divert();
    }
    // The connection's own notifications (pieces, a lane's credit, credit for a stream this
    // side writes): taken here, true; any other goes to the dispatcher. Out of line: the read
    // path's inline code stays as small as without them.
    [[gnu::cold, gnu::noinline]] bool took_connection_notification(message& m) {
        if (m.method == "ordo.piece") return on_piece(m), true;
        if (m.method == "ordo.lane_credit") return on_lane_credit(m), true;
        if (m.method == "ordo.in_credit") return calls.on_in_credit(m), true;
        return false;
    }
    // A piece arrived: a whole message, once its last piece is in, goes where it would have
    // gone, on its lane.
    [[gnu::cold]] void on_piece(message& m);
    void arm_piece_timer();
    // A write completed: the next pieces go.
    void lanes_written();
    // Connection or session ended: pieces waiting are dropped (the notifications among them
    // told undelivered), messages in the making too.
    void end_lanes(std::error_code code, const std::string& why);
    // The pieces waiting are dropped, their notifications told undelivered.
    void drop_lanes_out(std::error_code code, const std::string& why);
    // What lanes hold (pieces waiting, messages in the making), charged to the memory budget.
    std::size_t lanes_charged = 0;
    void charge_lanes() {
        if (o.comm.budget)
            o.comm.budget->adjust(lanes_charged, lanes_out.bytes() + lanes_in.bytes());
    }
    // Closes the session, or once the pieces waiting have gone.
    void close_session(std::error_code code, std::string reason);
    // A named lane's part, made at its first piece (at most limits::max_lanes of them).
    lane_part& part_of(std::string_view lane);
    // Gives the other side credit for what `l` read and does not hold queued, in steps of a
    // quarter of the window (docs/protocol.md "Lanes").
    void grant(lane_part& l);
    [[gnu::cold]] void on_lane_credit(message& m);
    std::size_t running_all() const {
        std::size_t n = disp.running();
        for (const auto& l : lane_parts) n += l->disp.running();
        return n;
    }
    std::size_t queued_all() const {
        std::size_t n = disp.queued();
        for (const auto& l : lane_parts) n += l->disp.queued();
        return n;
    }

    // ---- the parts' view of the connection ----

    std::weak_ptr<void> owner() override { return self.weak_from_this(); }

    void session_lost(const close_result& r) override {
        fail_all_calls(r.code, r.reason);
        // The next session may meet a restarted server: ask again.
        ctx_support = context_support::unknown;
        sess->report_undelivered(r, o.on_undelivered, c);
        end_lanes(r.code, r.reason);
        disp.restart();
        for (auto& l : lane_parts) {
            l->disp.restart();
            l->received = l->credited = 0;  // the next session's credit counts from nothing
        }
        if (o.on_session) o.on_session({session_event::kind::lost, r.code, r.reason});
    }
    void session_opened(bool resumed) override {
        if (o.on_session)
            o.on_session(
                {resumed ? session_event::kind::resumed : session_event::kind::opened, {}, {}});
    }
    std::uint32_t next_msgid() override { return calls.next_id(); }

    // rpc/connection/peer_stream.cpp.
    void send_stream_request(std::uint32_t id, detail::pending_call& call);
    void send_credit(std::uint32_t msgid, std::uint32_t n, std::uint64_t bytes,
                     std::uint16_t lane);
    // An item of a call whose caller writes (ordo.in), or their end (ordo.in_end, `last`).
    void send_in(std::uint32_t msgid, std::string_view front, std::string_view body, bool last,
                 std::uint16_t lane, std::unique_ptr<held_body>* keep = nullptr);

    // Credit and cancels must arrive: a lost one would leave a stream's handler waiting, and
    // a serial one the whole connection. One that cannot be taken (errc::overloaded: the
    // output is full) ends the connection instead, as a response that cannot be sent does.
    // `ahead`: the call's request is wholly sent (a stream's credit: items came back; a
    // cancel whose request its lane no longer holds).
    template <class Encode>
    void send_control(Encode encode, std::uint16_t lane, bool ahead) {
        try {
            buffer b(small_buffer);
            encode(b);
            const std::string_view bytes(b.data(), b.size());
            // On a named lane, past its queue and window once the call's request is wholly
            // sent: the handler they are for may hold, queued and so uncredited, what fills the
            // lane's window (docs/protocol.md "Lanes").
            if (lane != 0 && lanes_ok && !holding && ahead)
                sess->send(bytes);
            else
                send_ordered(bytes, lane);
        } catch (const std::system_error& e) {
            if (e.code() == errc::overloaded) sess->abort(errc::overloaded);
        }
    }

    // On the call's lane, behind its request. Before the connection may leave: a goaway's
    // leave_when_idle() must find the cancel already queued.
    void send_cancel(std::uint32_t msgid, std::uint16_t lane) override {
        if (sess->is_open())
            send_control([&](buffer& b) { encode_notification(b, "ordo.cancel", msgid); }, lane,
                         lane != 0 && !lanes_out.holds_request(detail::lane_name(lane), msgid));
        if (heard_goaway) leave_when_idle();  // a call withdrawn: maybe nothing is pending now
    }

    void send_response(const buffer& b) override { send_response_on(0, b); }
    void send_response_parts(std::string_view head, std::string_view body,
                             std::unique_ptr<held_body> keep) override;
    void send_response_on(std::uint16_t lane, const buffer& b) {
        if (answers_stopped || !sess->is_open()) return;
        try {
            send_out(lane, std::string_view(b.data(), b.size()), {});
        } catch (const std::system_error& e) {
            // Refusing a response would leave its caller waiting: end the connection loudly.
            if (e.code() == errc::overloaded) return sess->abort(errc::overloaded);
            // The connection failed (a write inside a send, maybe this one) and the loop has
            // not yet ended it: answers and stream items stop here, rather than each paying
            // for a thrown error until it does.
            answers_stopped = true;
        }
    }
    void pause_reading(bool paused) override {
        if (!lane_parts.empty()) return pause_lane(disp_paused, paused);
        disp_paused = paused;
        sess->pause_reading(paused);
        reading_paused = paused;
        if (!paused) resumed_reading = std::chrono::steady_clock::now();
    }
    bool disp_paused = false;
    // Reading stops while any lane's dispatcher asks (its queue is full).
    void pause_lane(bool& flag, bool paused) {
        if (flag == paused) return;
        flag = paused;
        std::size_t n = disp_paused ? 1 : 0;
        for (const auto& l : lane_parts) n += l->paused ? 1 : 0;
        const bool any = n > 0;
        if (any == reading_paused) return;
        sess->pause_reading(any);
        reading_paused = any;
        if (!any) resumed_reading = std::chrono::steady_clock::now();
    }
    void handler_started() override { live.note_work(); }
    // Room to send again: the next pieces, when some wait, and credit that could not be sent.
    void acknowledged() override { written(); }
    void written() override {
        if (!lanes_out.empty()) lanes_written();
        if (credit_owed) {
            credit_owed = false;
            for (auto& l : lane_parts) grant(*l);
        }
        // Told of writes while pieces or credit wait, not otherwise.
        sess->want_written(!lanes_out.empty() || credit_owed);
    }
    std::shared_ptr<void> keep_alive() override { return self.shared_from_this(); }
    void remote_closing(std::error_code code, std::string reason) override {
        sess->note_remote_reason(code, std::move(reason));
    }
    void dropped(std::string_view method, errc code, std::string reason) override {
        if (o.on_dropped)
            o.on_dropped({remote, std::string(method), make_error_code(code), std::move(reason)});
    }

    std::size_t calls_waiting() const override { return calls.waiting(); }
    std::size_t handlers_running() const override { return running_all(); }
    // While this side does not read (its queue is full), the peer's silence is this side's
    // own doing: the watchdog counts it from when reading resumed, not from the last bytes
    // read before the pause (a server busy with a long queue took a live caller for dead).
    std::chrono::steady_clock::time_point last_receive() const override {
        if (reading_paused) return std::chrono::steady_clock::now();
        return std::max(sess->counters().last_receive, resumed_reading);
    }
    bool send_ping() override {
        const std::uint32_t id = calls.next_id();
        try {
            sess->send(detail::request_head(id, "ordo.ping"), std::string_view("\x90", 1));
        } catch (const std::system_error&) {
            return false;
        }
        calls.add_ping(id);
        ++c.pings_sent;
        return true;
    }
    void lost(std::string reason) override { sess->cut("no bytes from " + remote + " " + reason); }
    bool is_open() const override { return sess->is_open(); }
};

}  // namespace ordo
