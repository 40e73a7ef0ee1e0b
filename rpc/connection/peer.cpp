// ordo::peer's operations: starting calls, notifications, closing, and what it counts. Its
// inside, the parts of the connection and their wiring, is rpc/connection/peer_state.hpp.
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

void peer::start() {
    s_->sess->start();
}

inline bool peer::state::refuse_call(std::unique_ptr<detail::pending_call>& call) {
    ++c.calls_started;
    if (left || heard_eof || close_after_lanes) [[unlikely]] {
        if (close_after_lanes && !left && !heard_eof) {
            calls.fail(std::move(call), errc::closed,
                       "ordo: the connection to " + remote + " is closing");
            return true;
        }
        calls.fail(std::move(call), sess->remote_code() ? errc::unauthenticated : errc::peer_lost,
                   heard_eof ? eof_why : goaway_why);
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
        f.options.timeout.count() != 0 || !f.options.metadata.empty() || s.context_always ||
        f.lane != 0 || f.params.size() > s.divert_above) [[unlikely]]
        return s.start_call_with_context(call.release());
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
    if (s_->close_after_lanes)
        throw rpc_error(errc::closed, {}, {},
                        "ordo: notify " + std::string(method) + " to " + s_->remote +
                            " failed: the connection is closing");
    if (s_->left)
        throw rpc_error(errc::peer_lost, {}, {},
                        "ordo: notify " + std::string(method) + " to " + s_->remote +
                            " failed: " + s_->goaway_why);
    if (!s_->sess->is_open())
        throw rpc_error(s_->sess->close_code(), {}, {},
                        "ordo: notify " + std::string(method) + " to " + s_->remote +
                            " failed: " + s_->sess->close_reason());
    if (s_->holding) [[unlikely]] {
        buffer b(small_buffer + params.size());
        detail::write_notification_head(b, method);
        b.write(params.data(), params.size());
        return s_->hold_bytes(std::string_view(b.data(), b.size()), method, params,
                              lane ? detail::lane_name(lane) : std::string());
    }
    s_->send_out(lane, detail::notification_head(method), params, method);
}

// ---- call context (docs/protocol.md, "Call context") ----

namespace {

// ordo.features, which the connection asks of the other side itself: its answer says whether
// calls may carry their context there.
class features_call final : public detail::pending_call {
  public:
    features_call(std::weak_ptr<peer> p, peer::state& s) : p_(std::move(p)), s_(s) {
        method = "ordo.features";
        own = true;
        // A peer that never answers unknown requests is not waited on for long.
        options.timeout = std::chrono::seconds(10);
    }
    void complete(std::error_code ec, call_outcome out) override {
        if (auto keep = p_.lock()) s_.features_answered(ec, out);
    }

  private:
    std::weak_ptr<peer> p_;
    peer::state& s_;
};

}  // namespace

// Nothing more will arrive: this side's calls cannot be answered and fail now, while what
// the other side sent is served to its end and answered; then this side closes. End of
// stream is also how a peer that closed altogether looks: probes (ordo.ping, now and 5, 20
// and 100 ms later) find that out, as the first write after the reset the first one drew
// fails (unix: the first fails), and its work is cancelled then: within a few ms and a
// round trip, as a plain TCP reader that takes end of stream for the end. A peer that only
// half-closed cannot answer them: liveness_timeout after its last bytes, it is lost like
// any silent peer.
bool peer::state::peer_finished_sending() {
    if (!sess->is_open() || heard_eof) return false;
    heard_eof = true;
    eof_why = "ordo: peer " + remote + " closed the connection";
    if (!sess->remote_reason().empty())
        eof_why += " (the peer said: " + sess->remote_reason() + ")";
    const std::error_code code =
        sess->remote_code() ? sess->remote_code() : make_error_code(errc::peer_lost);
    fail_all_calls(code, eof_why);
    // Nor will the items its handlers still read.
    disp.input_ended(eof_why);
    for (auto& l : lane_parts) l->disp.input_ended(eof_why);
    leave_when_idle();
    if (running_all() > 0 || queued_all() > 0) {
        send_ping();
        live.note_work();
        probe_after_eof(0);
    }
    return true;
}

void peer::state::probe_after_eof(std::size_t k) {
    if (k >= std::size(eof_probe_gaps)) return;
    eof_probe.expires_after(eof_probe_gaps[k]);
    eof_probe.async_wait([w = self.weak_from_this(), this, k](std::error_code ec) {
        auto keep = w.lock();
        if (ec || !keep || !sess->is_open()) return;
        send_ping();
        probe_after_eof(k + 1);
    });
}

void peer::state::ask_features() {
    auto call = std::make_unique<features_call>(self.weak_from_this(), *this);
    buffer b(small_buffer);
    const std::uint32_t id = calls.next_id();
    detail::write_request_head(b, id, "ordo.features");
    msgpack::packer<buffer> p(b);
    p.pack_array(1);
    p.pack_array(2);
    p.pack(std::string_view("meta"));
    p.pack(std::string_view("lanes"));
    sess->send(std::string_view(b.data(), b.size()));  // throws as a call's send does
    ++c.calls_started;
    calls.add(id, std::move(call));
    ctx_support = context_support::asking;  // only once the answer is sure to come
}

void peer::state::ask_if_context(const call_options& opts) {
    if (opts.timeout.count() > 0 || o.default_timeout.count() > 0 || !opts.metadata.empty())
        ask_features();
}

void peer::state::hold(held_message h) {
    // Held bytes count against the same bound as the output they stand in for.
    // (A notification's params are also in its bytes: counted once.)
    const std::size_t size = h.bytes.empty() ? h.method.size() + h.params.size() : h.bytes.size();
    if (held_bytes + size > o.comm.max_buffer_bytes)
        throw_error(errc::overloaded,
                    "ordo: " + remote + ": " + std::to_string(held_bytes + size) +
                        " bytes held while ordo.features is answered, over max_buffer_bytes (" +
                        std::to_string(o.comm.max_buffer_bytes) + ")");
    held_bytes += size;
    held.push_back(std::move(h));
    set_holding(true);
}

void peer::state::hold_bytes(std::string_view bytes, std::string_view notification,
                             std::string_view params, std::string_view lane) {
    held_message h;
    h.lane.assign(lane);
    h.bytes.assign(bytes);
    h.notification.assign(notification);
    h.params.assign(params);
    hold(std::move(h));
}

void peer::state::start_call_with_context(detail::pending_call* taken) {
    std::unique_ptr<detail::pending_call> call(taken);
    auto& f = *call;
    if (!detail::take_context(f, o.default_timeout))
        return calls.fail(std::move(call), errc::timed_out, detail::inherited_timeout_reason(f));
    std::uint32_t id = 0;
    try {
        // Asked before this call takes its msgid: ordo.features goes first, with the lower one.
        // (A call on a named lane asks too: whether the other side reads pieces.)
        if (ctx_support == context_support::unknown) {
            if (f.lane != 0)
                ask_features();
            else
                ask_if_context(f.options);
        }
        id = calls.next_id();
        if (f.stream)
            send_stream_request(id, f);
        else
            send_request(id, f.method, std::string_view(f.params.data(), f.params.size()),
                         f.options, f.lane);
    } catch (const std::system_error& e) {
        return calls.fail(std::move(call), e.code(), e.what());
    }
    if (!f.keep_params) f.params.clear();
    calls.add(id, std::move(call));
    live.note_work();
}

void peer::state::send_request(std::uint32_t id, std::string_view method, std::string_view params,
                               const call_options& opts, std::uint16_t lane) {
    const auto timeout = opts.timeout.count() > 0 ? opts.timeout : o.default_timeout;
    const bool has_context = timeout.count() > 0 || !opts.metadata.empty();
    // Checked here, whether it is sent now, held or sent plain; encoded once for the calls
    // that carry the same pairs.
    std::string_view pairs;
    if (!opts.metadata.empty()) pairs = ctx_pairs.pack(method, opts.metadata, timeout.count() > 0);
    if (!has_context || ctx_support == context_support::no) {
        // Plain: held behind what waits for the answer, if anything does.
        if (!holding) {
            // Its head in a buffer of its own: request_head() stays start_call's alone, inlined.
            buffer head(small_buffer);
            detail::write_request_head(head, id, method);
            return send_out(lane, std::string_view(head.data(), head.size()), params);
        }
        buffer b(small_buffer + params.size());
        detail::write_request_head(b, id, method);
        b.write(params.data(), params.size());
        held_message h;
        if (lane) h.lane = detail::lane_name(lane);
        h.bytes.assign(b.data(), b.size());
        h.request = true;
        h.msgid = id;
        return hold(std::move(h));
    }
    if (ctx_support == context_support::yes) {
        // Its head on the stack, and its pairs as they were encoded for the first call that
        // carried them: two pieces of one message. A larger head goes in a buffer the
        // connection keeps (no allocation per call).
        char small[detail::small_context_head];
        if (const std::size_t n = detail::write_small_context_head(
                small, id, method, params, opts.metadata.size(), timeout, timeout.count() > 0);
            n > 0)
            return send_out(lane, std::string_view(small, n), pairs);
        ctx_scratch.clear();
        detail::write_context_request_head(ctx_scratch, id, method, params, opts.metadata.size(),
                                           timeout, timeout.count() > 0);
        return send_out(lane, std::string_view(ctx_scratch.data(), ctx_scratch.size()), pairs);
    }
    held_message h;
    if (lane) h.lane = detail::lane_name(lane);
    h.request = true;
    h.msgid = id;
    h.method.assign(method);
    h.params.assign(params);
    h.meta = opts.metadata;
    if (timeout.count() > 0) h.deadline = std::chrono::steady_clock::now() + timeout;
    hold(std::move(h));
}

void peer::state::report_held(std::vector<held_message>& waiting, std::size_t from,
                              std::error_code ec, const std::string& why) {
    for (std::size_t i = from; i < waiting.size(); ++i) {
        auto& h = waiting[i];
        if (h.notification.empty()) continue;
        ++c.notifications_undelivered;
        if (!o.on_undelivered) continue;
        undelivered_notification u;
        u.method = h.notification;
        u.params = std::move(h.params);
        u.code = ec;
        u.reason = why;
        try {
            o.on_undelivered(u);
        } catch (...) {
            // The application's callback must not throw; one that does loses only its report.
        }
    }
}

void peer::state::features_answered(std::error_code ec, const call_outcome& out) {
    auto waiting = std::move(held);
    held.clear();
    held_bytes = 0;
    set_holding(false);
    if (failing_calls || !sess->can_send()) {
        // The connection (or the session) ended before the answer: the held calls fail with
        // it (they are in the call table); the held notifications are told undelivered.
        ctx_support = context_support::unknown;
        report_held(waiting, 0, ec ? ec : make_error_code(errc::closed), out.detail);
        return;
    }
    // Any error answer is a peer that does not know ordo.features (method_not_found from a
    // plain msgpack-rpc peer) or does not answer it in time: it gets plain calls.
    bool yes = false, lanes = false;
    if (!ec && out.result.type == msgpack::type::ARRAY) {
        const auto& a = out.result.via.array;
        for (std::uint32_t i = 0; i < a.size; ++i) {
            if (a.ptr[i].type != msgpack::type::STR) continue;
            const std::string_view name(a.ptr[i].via.str.ptr, a.ptr[i].via.str.size);
            yes = yes || name == "meta";
            lanes = lanes || name == "lanes";
        }
    }
    ctx_support = yes ? context_support::yes : context_support::no;
    lanes_ok = lanes_ok || lanes;
    update_divert();
    const auto now = std::chrono::steady_clock::now();
    for (std::size_t i = 0; i < waiting.size(); ++i) {
        auto& h = waiting[i];
        if (!sess->can_send())  // the calls fail with the connection
            return report_held(waiting, i, sess->close_code(), sess->close_reason());
        // A call withdrawn while held (its deadline, a cancel) is not sent at all.
        if (h.request && !calls.contains(h.msgid)) continue;
        try {
            if (!h.bytes.empty()) {
                send_named(h.lane, h.bytes, {}, h.notification);
                continue;
            }
            buffer b(small_buffer + h.params.size());
            if (yes) {
                const bool timed = h.deadline != std::chrono::steady_clock::time_point{};
                const auto left =
                    timed ? std::max(std::chrono::ceil<std::chrono::milliseconds>(h.deadline - now),
                                     std::chrono::milliseconds(0))
                          : std::chrono::milliseconds(0);
                detail::write_context_request(b, h.msgid, h.method, h.params, h.meta, left, timed);
            } else {
                detail::write_request_head(b, h.msgid, h.method);
                b.write(h.params.data(), h.params.size());
            }
            send_named(h.lane, std::string_view(b.data(), b.size()), {});
        } catch (const std::system_error& e) {
            // Taken, and now it cannot be sent (its output is full): the connection ends,
            // loudly, and what was held fails with it or is told undelivered.
            if (e.code() == errc::overloaded)
                sess->abort(errc::overloaded,
                            std::string("ordo: held calls could not be sent: ") + e.what());
            return report_held(waiting, i, e.code(), e.what());
        }
    }
}

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
    s_->close_session({}, {});
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
    s_->close_session({}, std::move(reason));
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
    while (s_->lanes_out.bytes() > s_->o.comm.high_water_bytes && s_->sess->is_open()) {
        ++s_->lanes_waiters;
        co_await s_->lanes_event.async_wait(use_tuple);
        --s_->lanes_waiters;
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
    if (s_->heard_goaway) return f(s_->goaway_grace, s_->goaway_reason);  // it comes once
    s_->goaway_fns.push_back(std::move(f));
}
bool peer::going_away() const noexcept {
    return s_->heard_goaway;
}

void detail::send_goaway(peer& p, std::chrono::milliseconds grace, const std::string& reason) {
    auto& s = *p.s_;
    if (s.told_goaway || !s.sess->is_open()) return;
    s.told_goaway = true;
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
    return s_->sess->can_send() && !s_->close_after_lanes;
}
bool peer::takes_calls() const noexcept {
    return s_->sess->can_send() && !s_->close_after_lanes && !s_->left && !s_->heard_eof;
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