// ordo::peer's operations: starting calls, notifications, closing, and what it counts; and the
// wiring of its inside (rpc/connection/peer_state.hpp): what the parts are told and how the
// connection leaves (rpc/connection/draining.hpp).
#include "ordo/rpc/peer.hpp"

#include "ordo/error.hpp"
#include "rpc/context/context.hpp"
#include "rpc/connection/peer_state.hpp"

namespace ordo {

peer::peer(private_tag, std::unique_ptr<transport> t, peer_options o, const handlers* h)
    : peer(private_tag{}, std::move(t), std::move(o), h, detail::resume_config{}) {}

peer::peer(private_tag, std::unique_ptr<transport> t, peer_options o, const handlers* h,
           detail::resume_config rc)
    : s_(std::make_unique<state>(*this, std::move(t), std::move(o), h, std::move(rc))) {}

peer::~peer() = default;

peer::state::state(peer& p, std::unique_ptr<transport> t, peer_options opt, const handlers* h,
                  detail::resume_config rc)
    : self(p),
      o(std::move(opt)),
      h(h),
      ex(t->get_executor()),
      remote(t->remote_address()),
      closed_event(ex, std::chrono::steady_clock::time_point::max()),
      live(ex, o.liveness_timeout, o.heartbeat_interval, *this),
      calls(ex, {o.first_msgid, o.default_timeout, o.max_abandoned_ids}, *this, c),
      disp(p, ex, h, o.max_queued_messages, o.max_queued_bytes, o.comm.budget.get(), *this, c),
      drain(*this, ex),
      feats(*this, o.default_timeout.count() > 0),
      lanes(*this) {
    if (o.liveness_timeout.count() > 0) t->set_liveness(o.liveness_timeout);
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

peer::state::~state() {
    if (sess->is_open()) {
        sess->end_locally(errc::closed, "ordo: peer " + remote + " destroyed");
        fail_all_calls(sess->close_code(), sess->close_reason());
    }
}

void peer::state::hold_until_ended() {
    if (ended || kept_for_close) return;
    auto p = self.weak_from_this().lock();
    if (!p) return;  // not shared: whoever owns it decides how long it lives
    kept_for_close = true;
    // The wait holds the peer: on_ended cancels it, and the peer goes as its handler does (run
    // on the loop, or destroyed unrun with the io_context).
    closed_event.async_wait([p = std::move(p)](std::error_code) {});
}

void peer::state::on_ended(const close_result& r) {
    const auto& code = sess->close_code();
    const auto& why = sess->close_reason();
    live.stop();
    drain.eof_probe.cancel();
    fail_all_calls(code, why);
    sess->report_undelivered(r, o.on_undelivered, c);
    lanes.end(code, why);
    disp.stop();
    for (auto& l : lanes.parts) l->disp.stop();
    ended = true;
    closed_event.cancel();
    drain.goaway_fns.clear();  // no goaway comes after the end (nor are its watchers kept)
    auto fns = std::move(closed_fns);
    for (auto& f : fns) f(code, why);
}

void peer::state::send_response_on(std::uint16_t lane, const buffer& b) {
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

void peer::state::session_lost(const close_result& r) {
    fail_all_calls(r.code, r.reason);
    // The next session may meet a restarted server: ask again.
    feats.context = detail::negotiation::support::unknown;
    sess->report_undelivered(r, o.on_undelivered, c);
    lanes.end(r.code, r.reason);
    disp.restart();
    for (auto& l : lanes.parts) {
        l->disp.restart();
        l->received = l->credited = 0;  // the next session's credit counts from nothing
    }
    if (o.on_session) o.on_session({session_event::kind::lost, r.code, r.reason});
}

void peer::state::session_opened(bool resumed) {
    if (o.on_session)
        o.on_session(
            {resumed ? session_event::kind::resumed : session_event::kind::opened, {}, {}});
}

void peer::state::send_response(const buffer& b) { send_response_on(0, b); }

void peer::state::pause_reading(bool paused) {
    if (!lanes.parts.empty()) return lanes.pause(disp_paused, paused);
    disp_paused = paused;
    sess->pause_reading(paused);
    reading_paused = paused;
    if (!paused) resumed_reading = std::chrono::steady_clock::now();
}

void peer::state::dropped(std::string_view method, errc code, std::string reason) {
    if (o.on_dropped)
        o.on_dropped({remote, std::string(method), make_error_code(code), std::move(reason)});
}

std::chrono::steady_clock::time_point peer::state::last_receive() const {
    if (reading_paused) return std::chrono::steady_clock::now();
    return std::max(sess->counters().last_receive, resumed_reading);
}

bool peer::state::send_ping() {
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

void peer::state::send_control(const buffer& b, std::uint16_t lane, bool ahead) {
    try {
        const std::string_view bytes(b.data(), b.size());
        // On a named lane, past its queue and window once the call's request is wholly
        // sent: the handler they are for may hold, queued and so uncredited, what fills the
        // lane's window (docs/protocol.md "Lanes").
        if (lane != 0 && lanes.ok && !feats.holding && ahead)
            sess->send(bytes);
        else
            send_ordered(bytes, lane);
    } catch (const std::system_error& e) {
        if (e.code() == errc::overloaded) sess->abort(errc::overloaded);
    }
}

void peer::state::send_cancel(std::uint32_t msgid, std::uint16_t lane) {
    if (sess->is_open()) {
        buffer b(small_buffer);
        encode_notification(b, "ordo.cancel", msgid);
        const bool ahead =
            lane != 0 && !lanes.out.holds_request(detail::lane_name(lane), msgid);
        send_control(b, lane, ahead);
    }
    // A call withdrawn: maybe nothing is pending now.
    if (drain.heard_goaway) drain.leave_when_idle();
}

void peer::start() {
    s_->sess->start();
}

inline bool peer::state::refuse_call(std::unique_ptr<detail::pending_call>& call) {
    ++c.calls_started;
    if (drain.refuses_calls() || lanes.close_after) [[unlikely]] {
        if (!drain.refuses_calls()) {
            calls.fail(std::move(call), errc::closed,
                       "ordo: the connection to " + remote + " is closing");
            return true;
        }
        calls.fail(std::move(call), sess->remote_code() ? errc::unauthenticated : errc::peer_lost,
                   drain.why());
        return true;
    }
    if (!sess->is_open()) {
        calls.fail(std::move(call), sess->close_code(), sess->close_reason());
        return true;
    }
    return false;
}

void peer::start_call(std::unique_ptr<detail::pending_call> call) {
    auto& s = *s_;
    if (s.refuse_call(call)) [[unlikely]]
        return;
    auto& f = *call;
    // A context to send or to inherit, or calls held ahead of this one: the other way
    // (docs/protocol.md, "Call context"). Checked in one go: a plain call pays only this.
    // A call on a named lane, or one the default lane sends as pieces, takes that way too.
    if (detail::contexts_set.load(std::memory_order_relaxed) != 0 ||
        f.options.timeout.count() != 0 || !f.options.metadata.empty() || s.feats.context_always ||
        f.lane != 0 || f.params.size() > s.lanes.divert_above) [[unlikely]]
        return s.feats.start_call(call.release());
    const std::uint32_t id = s.calls.next_id();
    try {
        if (f.stream) {
            s.send_stream_request(id, f);
        } else {
            s.sess->send(detail::request_head(id, f.method),
                         std::string_view(f.params.data(), f.params.size()));
        }
    } catch (const std::system_error& e) {
        return s.calls.fail(std::move(call), e.code(), e.what());
    }
    if (!f.keep_params) f.params.clear();  // sent: the copy in the batch is enough
    s.calls.add(id, std::move(call));
    s.live.note_work();
}

void peer::notify_raw(std::string_view method, std::string_view params) {
    notify_raw_on(0, method, params);
}

void peer::notify_raw_on(std::uint16_t lane, std::string_view method, std::string_view params) {
    if (s_->lanes.close_after)
        throw rpc_error(errc::closed, {}, {},
                        "ordo: notify " + std::string(method) + " to " + s_->remote +
                            " failed: the connection is closing");
    if (s_->drain.left)
        throw rpc_error(errc::peer_lost, {}, {},
                        "ordo: notify " + std::string(method) + " to " + s_->remote +
                            " failed: " + s_->drain.goaway_why);
    if (!s_->sess->is_open())
        throw rpc_error(s_->sess->close_code(), {}, {},
                        "ordo: notify " + std::string(method) + " to " + s_->remote +
                            " failed: " + s_->sess->close_reason());
    if (s_->feats.holding) [[unlikely]] {
        buffer b(small_buffer + params.size());
        detail::write_notification_head(b, method);
        b.write(params.data(), params.size());
        return s_->feats.hold_bytes(std::string_view(b.data(), b.size()), method, params,
                              lane ? detail::lane_name(lane) : std::string());
    }
    s_->send_out(lane, detail::notification_head(method), params, method);
}


// ---- draining (docs/protocol.md "Draining") ----

namespace detail {

void draining::remote_going_away(std::chrono::milliseconds grace, std::string reason) {
    if (heard_goaway || !s.sess->is_open()) return;
    heard_goaway = true;
    goaway_grace = grace;
    goaway_reason = std::move(reason);
    goaway_why = "the server is going away: " + goaway_reason;
    // Added to the reason if the server closes first (its grace passed); and a resumable
    // session does not try to resume (the server's listeners are closed).
    s.sess->note_remote_reason(goaway_why);
    auto keep = s.self.shared_from_this();
    if (s.o.on_goaway) s.o.on_goaway(goaway_grace, goaway_reason);
    // Moved out: one that adds another handler has it run at once (peer::on_goaway).
    auto fns = std::move(goaway_fns);
    goaway_fns.clear();
    for (auto& f : fns) f(goaway_grace, goaway_reason);
    leave_when_idle();
}

void draining::leave_when_idle() {
    if (left || leave_posted) return;
    leave_posted = true;
    net::post(s.ex, [w = s.self.weak_from_this(), this] {
        auto keep = w.lock();
        if (!keep) return;
        leave_posted = false;
        if (left || !s.sess->is_open() || s.calls.waiting() > 0 || s.lanes.running() > 0 ||
            s.lanes.queued() > 0)
            return;
        left = true;
        s.lanes.close_session(make_error_code(errc::peer_lost), why());
    });
}

// Nothing more will arrive: this side's calls cannot be answered and fail now, while what
// the other side sent is served to its end and answered; then this side closes. End of
// stream is also how a peer that closed altogether looks: probes (ordo.ping, now and 5, 20
// and 100 ms later) find that out, as the first write after the reset the first one drew
// fails (unix: the first fails), and its work is cancelled then: within a few ms and a
// round trip, as a plain TCP reader that takes end of stream for the end. A peer that only
// half-closed cannot answer them: liveness_timeout after its last bytes, it is lost like
// any silent peer.
bool draining::finished_sending() {
    if (!s.sess->is_open() || heard_eof) return false;
    heard_eof = true;
    eof_why = "ordo: peer " + s.remote + " closed the connection";
    if (!s.sess->remote_reason().empty())
        eof_why += " (the peer said: " + s.sess->remote_reason() + ")";
    const std::error_code code =
        s.sess->remote_code() ? s.sess->remote_code() : make_error_code(errc::peer_lost);
    s.fail_all_calls(code, eof_why);
    // Nor will the items its handlers still read.
    s.disp.input_ended(eof_why);
    for (auto& l : s.lanes.parts) l->disp.input_ended(eof_why);
    leave_when_idle();
    if (s.lanes.running() > 0 || s.lanes.queued() > 0) {
        s.send_ping();
        s.live.note_work();
        probe_after_eof(0);
    }
    return true;
}

void draining::probe_after_eof(std::size_t k) {
    if (k >= std::size(eof_probe_gaps)) return;
    eof_probe.expires_after(eof_probe_gaps[k]);
    eof_probe.async_wait([w = s.self.weak_from_this(), this, k](std::error_code ec) {
        auto keep = w.lock();
        if (ec || !keep || !s.sess->is_open()) return;
        s.send_ping();
        probe_after_eof(k + 1);
    });
}


}  // namespace detail

const std::string& peer::remote_address() const noexcept {
    return s_->remote;
}
const identity& peer::identity() const noexcept {
    return s_->sess->who();
}
net::any_io_executor peer::get_executor() const {
    return s_->ex;
}

void peer::close() {
    s_->lanes.close_session({}, {});
    s_->hold_until_ended();
}
void peer::close(errc code, std::string reason) {
    if (s_->sess->is_open()) {
        try {
            buffer b(small_buffer);
            encode_notification(b, "ordo.closing", static_cast<int>(code), reason);
            s_->sess->send(std::string_view(b.data(), b.size()));
        } catch (const std::system_error&) {
            // Full or ending: it closes without a word.
        }
    }
    s_->lanes.close_session({}, std::move(reason));
    s_->hold_until_ended();
}
void peer::abort() {
    s_->sess->abort();
}
void peer::abort(errc code, std::string reason) {
    s_->sess->abort(code, std::move(reason));
}

net::awaitable<void> peer::async_close() {
    close();
    co_await async_wait_closed();
}

net::awaitable<void> peer::async_drain() {
    auto keep = shared_from_this();
    // What waits for its pieces to go (lanes) counts as output too.
    while (s_->lanes.out.bytes() > s_->o.comm.high_water_bytes && s_->sess->is_open()) {
        ++s_->lanes.drain_waiters;
        co_await s_->lanes.drained.async_wait(use_tuple);
        --s_->lanes.drain_waiters;
    }
    co_await s_->sess->async_drain();
}

net::awaitable<std::pair<std::error_code, std::string>> peer::async_wait_closed() {
    auto keep = shared_from_this();
    while (!s_->ended) co_await s_->closed_event.async_wait(use_tuple);
    co_return std::make_pair(s_->sess->close_code(), s_->sess->close_reason());
}

void peer::on_closed(std::function<void(const std::error_code&, const std::string&)> f) {
    if (s_->ended)
        f(s_->sess->close_code(), s_->sess->close_reason());
    else
        s_->closed_fns.push_back(std::move(f));
}

void peer::observe_calls(std::unique_ptr<detail::call_observer> o) {
    s_->observer = std::move(o);
    s_->calls.observe(s_->observer.get());
}

void peer::on_goaway(goaway_fn f) {
    const auto& d = s_->drain;
    if (d.heard_goaway) return f(d.goaway_grace, d.goaway_reason);  // it comes once
    if (s_->ended) return;                                          // it never comes
    s_->drain.goaway_fns.push_back(std::move(f));
}
bool peer::going_away() const noexcept {
    return s_->drain.heard_goaway;
}

void detail::send_goaway(peer& p, std::chrono::milliseconds grace, const std::string& reason) {
    auto& s = *p.s_;
    if (s.drain.told_goaway || !s.sess->is_open()) return;
    s.drain.told_goaway = true;
    try {
        buffer b(small_buffer);
        encode_notification(b, "ordo.goaway",
                            static_cast<std::uint64_t>(std::max<std::int64_t>(0, grace.count())),
                            reason);
        s.sess->send(std::string_view(b.data(), b.size()));
    } catch (const std::system_error&) {
        // Full, or ending: the grace closes the connection without the word.
    }
}

bool peer::is_open() const noexcept {
    return s_->sess->can_send() && !s_->lanes.close_after;
}
bool peer::takes_calls() const noexcept {
    return s_->sess->can_send() && !s_->lanes.close_after && !s_->drain.refuses_calls();
}
bool peer::is_resumable() const noexcept {
    return s_->sess->is_resumable();
}
const peer_counters& peer::counters() const noexcept {
    return s_->c;
}
const comm_counters& peer::comm() const noexcept {
    return s_->sess->counters();
}

std::shared_ptr<peer> make_peer(std::unique_ptr<transport> t) {
    return make_peer(std::move(t), peer_options{}, nullptr);
}

std::shared_ptr<peer> make_peer(std::unique_ptr<transport> t, peer_options o, const handlers* h) {
    return std::make_shared<peer>(peer::private_tag{}, std::move(t), std::move(o), h);
}

std::shared_ptr<peer> detail::make_peer(std::unique_ptr<transport> t, peer_options o,
                                        const handlers* h, resume_config rc) {
    return std::make_shared<peer>(peer::private_tag{}, std::move(t), std::move(o), h,
                                  std::move(rc));
}

}  // namespace ordo