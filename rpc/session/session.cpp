// detail::session: the one seam the call table and the dispatcher send through, and the one
// place that knows how the connection ended. This file holds the session itself and the whole
// of a plain one (a batched_comm); a resumable one adds rpc/session/session_resume.cpp (acks,
// resend buffer, windows, reconnection) and rpc/session/session_handshake.cpp (ordo.hello); the
// server's registry of sessions is rpc/session/session_registry.cpp.
#include "rpc/session/session.hpp"

#include <algorithm>

#include "ordo/detail/memory_budget.hpp"
#include "ordo/rpc/detail/message_heads.hpp"
#include "ordo/rpc/peer.hpp"
#include "rpc/session/session_parts.hpp"

namespace ordo::detail {

// ordo writes notification heads as fixarray 3, kind 2: every other message is told apart
// without being decoded.
static bool is_notification_head(std::string_view m) {
    return m.size() >= 2 && m[0] == '\x93' && m[1] == '\x02';
}

namespace {

void add(comm_counters& sum, const comm_counters& c) {
    sum.messages_sent += c.messages_sent;
    sum.bytes_sent += c.bytes_sent;
    sum.messages_received += c.messages_received;
    sum.bytes_received += c.bytes_received;
    sum.writes += c.writes;
    sum.peak_buffered_bytes = std::max(sum.peak_buffered_bytes, c.peak_buffered_bytes);
    sum.last_receive = std::max(sum.last_receive, c.last_receive);
}

}  // namespace

session::session(std::unique_ptr<transport> t, const comm_options& o, resume_config rc,
                 session_host& host, peer_counters& c, ended_fn on_ended)
    : options_(o),
      rc_(std::move(rc)),
      host_(host),
      c_(c),
      on_ended_(std::move(on_ended)),
      ex_(t->get_executor()),
      remote_(t->remote_address()),
      ack_timer_(ex_),
      window_timer_(ex_),
      changed_(ex_, std::chrono::steady_clock::time_point::max()) {
    // Closing for the peer's fault (protocol error, message_timeout), the comm tells it why
    // with an ordo.closing notification, which an ordo peer adds to its close reason. Not on a
    // resumable session: an unnumbered message there would break its count.

    // Of what a connection could not write, only notifications are reported (report_undelivered);
    // the rest is never copied.
    options_.keep_undelivered = [](std::string_view m) { return is_notification_head(m); };
    who_.address = remote_;
    t->describe(who_);
    attach(std::move(t));
    send_credentials();
    rc_.window = std::min(rc_.window, longest_window);
    if (rc_.window.count() > 0 && rc_.reconnect) {
        mode_ = mode::offering;
        window_ = rc_.window;
        send_hello();
    } else if (rc_.registry && rc_.registry->max_window().count() > 0) {
        mode_ = mode::awaiting;  // its first message says whether the caller wants a session
        carrier_ = carrier::attached;
    } else {
        carrier_ = carrier::attached;
    }
    if (rc_.gate) {
        // Nothing is served before the gate has decided (on the first message, ordo.auth or
        // not); the take-message fast path is off meanwhile, as in every mode but plain.
        after_gate_ = mode_;
        mode_ = mode::gated;
        who_.may_introspect = false;
        if (rc_.gated_limits) comm_->set_limits(*rc_.gated_limits);
    }
}

session::~session() {
    if (options_.budget) options_.budget->adjust(charged_unacked_, 0);
    if (link_) link_->s = nullptr;
    if (rc_.registry) rc_.registry->remove(id_, this);
}

void session::start() {
    comm_->start();
}

std::unique_ptr<batched_comm> session::make_comm(std::unique_ptr<transport> t,
                                                const std::shared_ptr<link>& l) {
    // Through the link, as the messages: a connection may move to another session (a resume
    // taken over), whose host it then tells.
    comm_options o = options_;
    o.on_written = [l] {
        if (l->s) l->s->host_.written();
    };
    o.farewell = [l](const std::error_code& code, const std::string& reason) {
        return l->s ? l->s->farewell(code, reason) : std::string();
    };
    return std::make_unique<batched_comm>(
        std::move(t), std::move(o),
        [l](std::string_view bytes) {
            if (l->s) l->s->on_comm_message(bytes);
        },
        [l](const close_result& r) {
            if (l->s) l->s->on_comm_closed(r);
        });
}

// Closing for the peer's fault (protocol error, message_timeout), the comm tells it why with an
// ordo.closing notification, which an ordo peer adds to its close reason. Not on a resumable
// session: an unnumbered message there would break its count.
std::string session::farewell(const std::error_code& code, const std::string& reason) const {
    if (mode_ == mode::resumable || mode_ == mode::offering) return std::string();
    const int wire = code.category() == error_category() ? code.value()
                                                          : static_cast<int>(errc::protocol_error);
    buffer b(small_buffer);
    encode_notification(b, "ordo.closing", wire, reason);
    return std::string(b.data(), b.size());
}

void session::attach(std::unique_ptr<transport> t) {
    auto l = std::make_shared<link>(link{this});
    comm_ = make_comm(std::move(t), l);
    comm_->take_messages_with([l](std::string_view bytes, const limits& lim) -> std::size_t {
        return l->s ? l->s->take_message(bytes, lim) : 0;
    });
    // A resumable session's end of stream is a drop to resume from, not a half-close.
    comm_->on_end_of_stream([l] {
        session* s = l->s;
        return s && s->mode_ != mode::offering && s->mode_ != mode::resumable &&
               s->host_.peer_finished_sending();
    });
    link_ = std::move(l);
    if (paused_) comm_->pause_reading(true);
    if (want_written_) comm_->want_written(true);
}

void session::drop_comm() {
    if (!comm_) return;
    link_->s = nullptr;
    link_.reset();
    add(saved_, comm_->counters());
    dropped_ = true;
    comm_->abort(errc::closed);
    dead_comm_ = std::move(comm_);  // maybe inside its own callback: freed at the next drop
}

// ---- receiving ----

void session::on_comm_message(std::string_view bytes) {
    if (mode_ == mode::plain) [[likely]]
        return host_.on_message(bytes);
    if (mode_ == mode::gated || mode_ == mode::refused) return on_gated_message(bytes);
    on_session_message(bytes);
}

// ---- authentication (docs/protocol.md "Authentication") ----

void session::send_credentials() {
    if (rc_.credentials_message.empty()) return;
    buffer b(small_buffer);
    b.write(rc_.credentials_message.data(), rc_.credentials_message.size());
    write_control(b);
}

namespace {

// ordo.auth [{"token": string}]: what the caller presented. False if it is not of that shape.
bool read_credentials(const message& m, credentials& c) {
    const auto& p = m.params;
    if (p.type != msgpack::type::ARRAY || p.via.array.size != 1) return false;
    const auto& map = p.via.array.ptr[0];
    if (map.type != msgpack::type::MAP) return false;
    for (std::uint32_t i = 0; i < map.via.map.size; ++i) {
        const auto& kv = map.via.map.ptr[i];
        if (kv.key.type != msgpack::type::STR) return false;
        const std::string_view key(kv.key.via.str.ptr, kv.key.via.str.size);
        if (key != "token") continue;  // room for other kinds of credentials
        if (kv.val.type != msgpack::type::STR) return false;
        c.token.assign(kv.val.via.str.ptr, kv.val.via.str.size);
    }
    return true;
}

}  // namespace

void session::on_gated_message(std::string_view bytes) {
    message m = decode_message(bytes, options_.limits);
    const bool request = m.kind == message_kind::request;
    if (mode_ == mode::refused) {
        if (request) answer_error(m.msgid, errc::unauthenticated, refusal_);
        return;
    }
    credentials presented;
    const bool auth = m.kind == message_kind::notification && m.method == "ordo.auth";
    auth_verdict v;
    if (auth && !read_credentials(m, presented)) {
        v = auth_verdict::refuse("ordo.auth expects [{\"token\": string}]");
    } else {
        try {
            v = rc_.gate(who_, presented);
        } catch (const std::exception& e) {
            v = auth_verdict::refuse(std::string("the server could not decide: ") + e.what());
        }
    }
    if (!v.accepted) {
        refuse(v.reason.empty() ? "refused" : v.reason);
        if (request) answer_error(m.msgid, errc::unauthenticated, refusal_);
        return;
    }
    who_.subject = v.subject;
    if (!presented.empty()) who_.token_subject = v.subject;
    mode_ = after_gate_;
    // Known now: the messages after this one may be as large as the connection allows.
    if (rc_.gated_limits && comm_) comm_->set_limits(options_.limits);
    if (!auth) on_comm_message(bytes);  // the first message, served as any other
}

// The caller's side, before a resume's answer: ordo.closing [14, reason] says the server
// refused this side's credentials. The session ends with errc::unauthenticated (true).
bool session::refused_credentials(std::string_view bytes) {
    if (bytes.size() < 3 || bytes[0] != '\x93' || bytes[1] != '\x02') return false;
    message m = decode_message(bytes, options_.limits);
    if (m.method != "ordo.closing") return false;
    const auto& a = m.params.via.array;
    if (m.params.type != msgpack::type::ARRAY || a.size != 2 ||
        a.ptr[0].type != msgpack::type::POSITIVE_INTEGER ||
        a.ptr[0].via.u64 != static_cast<std::uint64_t>(errc::unauthenticated) ||
        a.ptr[1].type != msgpack::type::STR)
        return false;
    abort(errc::unauthenticated,
          "ordo: " + remote_ + " refused this side: " +
              std::string(a.ptr[1].via.str.ptr, a.ptr[1].via.str.size));
    return true;
}

// The caller is told why (ordo.closing, and each request read before the close), and the
// connection closes once this turn's messages are answered.
void session::refuse(std::string reason) {
    refusal_ = std::move(reason);
    mode_ = mode::refused;
    buffer b(small_buffer);
    encode_notification(b, "ordo.closing", static_cast<int>(errc::unauthenticated), refusal_);
    write_control(b);
    net::post(ex_, [l = link_] {
        if (!l->s) return;
        session& s = *l->s;
        s.local_code_ = errc::unauthenticated;
        s.local_reason_ = "ordo: refused " + s.remote_ + ": " + s.refusal_;
        if (s.comm_) s.comm_->close();
    });
}

// ---- connections ending ----

bool session::resumes_after(const close_result& r) const noexcept {
    return (mode_ == mode::resumable || mode_ == mode::offering) && end_ == ending::none &&
           r.code == errc::peer_lost;
}

void session::on_comm_closed(const close_result& r) {
    if (!resumes_after(r)) return end(r);
    detach(r);
}

void session::end(const close_result& r) {
    if (!is_open()) return;
    end_ = ending::ended;
    carrier_ = carrier::none;
    close_code_ = remote_code_ ? remote_code_ : local_code_ ? local_code_ : r.code;
    close_reason_ = local_reason_.empty() ? r.reason : local_reason_;
    if (!remote_reason_.empty() && close_reason_.find(remote_reason_) == std::string::npos)
        close_reason_ += " (the peer said: " + remote_reason_ + ")";
    window_timer_.cancel();
    ack_timer_.cancel();
    drop_comm();
    if (rc_.registry) rc_.registry->remove(id_, this);
    close_result out{close_code_, close_reason_, {}};
    if (mode_ == mode::plain) {
        out.undelivered = r.undelivered;
    } else {
        // Sent and never acknowledged: the other side may or may not have them.
        sent_.for_each_from(sent_.first(),
                            [&](std::string_view m) { out.undelivered.emplace_back(m); });
        sent_.reset(0);
        note_unacked();
    }
    changed();
    if (on_ended_) on_ended_(out);
}

void session::end_locally(std::error_code code, std::string reason) {
    end_ = ending::ended;
    close_code_ = code;
    close_reason_ = std::move(reason);
    if (link_) link_->s = nullptr;
    if (rc_.registry) rc_.registry->remove(id_, this);
}

// ---- the owner's controls ----


void session::pause_reading(bool paused) {
    paused_ = paused;
    if (comm_) comm_->pause_reading(paused);
}

net::awaitable<void> session::async_drain() {
    for (;;) {
        if (!is_open()) throw rpc_error(close_code_, {}, {}, close_reason_);
        if (mode_ == mode::plain) {
            if (comm_) co_await comm_->async_drain();
            co_return;
        }
        // A connection that failed inside a send() or earlier in this turn (detach() and end()
        // both wake this wait).
        if (!attached() || comm_->is_closing() || sent_.bytes() > rc_.max_unacked_bytes / 2) {
            co_await changed_.async_wait(use_tuple);
            continue;
        }
        if (comm_->counters().buffered_bytes <= options_.high_water_bytes) co_return;
        try {
            co_await comm_->async_drain();
        } catch (const std::system_error&) {
            // The connection dropped: wait for the resume (or the session's end).
        }
    }
}

void session::changed() {
    changed_.cancel();
}

void session::close() {
    if (mode_ == mode::plain) {
        if (comm_) comm_->close();
        return;
    }
    if (closing()) return;
    end_ = ending::asked;
    if (!comm_) {
        return end({errc::closed, "ordo: session to " + remote_ + " closed while resuming", {}});
    }
    if (carrier_ == carrier::greeting) {
        end_ = ending::after_hello;  // what is kept goes out once the handshake is done
        return;
    }
    finish_close();
}

void session::finish_close() {
    if (mode_ == mode::resumable) {
        buffer b(small_buffer);
        encode_notification(b, "ordo.bye", received_);
        write_control(b);
    }
    comm_->close();
}

void session::abort(std::error_code code, std::string reason) {
    end_ = std::max(end_, ending::asked);
    if (comm_) {
        if (reason.empty())
            comm_->abort(code);
        else
            comm_->abort(code, std::move(reason));
        return;
    }
    end({code, reason.empty() ? "ordo: session to " + remote_ + " aborted" : reason, {}});
}

void session::cut(std::string reason) {
    if (comm_) comm_->abort(errc::peer_lost, std::move(reason));
}

void session::note_remote_reason(std::string reason) {
    remote_reason_ = std::move(reason);
    end_ = std::max(end_, ending::told);
}

void session::note_remote_reason(std::error_code code, std::string reason) {
    if (code == errc::unauthenticated) remote_code_ = code;
    note_remote_reason(std::move(reason));
}

const comm_counters& session::summed_counters() const noexcept {
    sum_ = saved_;
    if (comm_) {
        add(sum_, comm_->counters());
        sum_.buffered_bytes = comm_->counters().buffered_bytes;
        sum_.read_buffer_bytes = comm_->counters().read_buffer_bytes;
    } else {
        sum_.buffered_bytes = sum_.read_buffer_bytes = 0;
    }
    // Between connections (and during the handshake), what waits to be sent is the resend
    // buffer: all of it goes out on the resume. After a drop, silence is the window's business,
    // not the dead-peer watchdog's; during the first handshake no window runs, and the
    // watchdog still hears the connection.
    if (is_open() && !attached() && mode_ != mode::plain) {
        if (dropped_) sum_.last_receive = clock::now();
        sum_.buffered_bytes = sent_.bytes();
    }
    return sum_;
}

void session::report_undelivered(const close_result& r,
                                 const std::function<void(const undelivered_notification&)>& report,
                                 peer_counters& c) const {
    for (const auto& bytes : r.undelivered) {
        // Only notifications are reported (calls fail on their own); pieces (ordo.piece) are
        // the lanes' to report (peer_lanes::end), by the message they were part of.
        if (!is_notification_head(bytes) || bytes.substr(2, 11) == "\xaaordo.piece") continue;
        try {
            message m = decode_message(bytes, options_.limits);
            if (m.kind != message_kind::notification) continue;
            ++c.notifications_undelivered;
            if (!report) continue;
            buffer params;
            msgpack::pack(params, m.params);
            report({std::string(m.method), std::string(params.data(), params.size()), r.code,
                    r.reason});
        } catch (const std::exception&) {
            // Only this side's own encodings get here; nothing else to report.
        }
    }
}

}  // namespace ordo::detail