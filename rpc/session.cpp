#include "rpc/session.hpp"

#include <sys/random.h>

#include <algorithm>
#include <random>

#include "lib/escaped.hpp"
#include "ordo/detail/memory_budget.hpp"
#include "ordo/detail/message_heads.hpp"
#include "ordo/peer.hpp"
#include "rpc/detail/wire_errors.hpp"

namespace ordo::detail {

// ordo writes notification heads as fixarray 3, kind 2: every other message is told apart
// without being decoded.
static bool is_notification_head(std::string_view m) {
    return m.size() >= 2 && m[0] == '\x93' && m[1] == '\x02';
}

namespace {

// Acknowledgements: after this many messages or bytes, or this long after the first message
// not yet acknowledged, whichever comes first. They bound the resend buffer at the other side.
constexpr std::uint64_t ack_every_messages = 1024;
constexpr std::size_t ack_every_bytes = 256 * 1024;
constexpr std::chrono::milliseconds ack_delay{20};
// Reconnection: the first try within 10 ms, then exponential backoff up to a second, jittered.
constexpr std::chrono::milliseconds first_backoff{10};
constexpr std::chrono::milliseconds max_backoff{1000};

constexpr int hello_version = 1;
// Windows are clamped to a day: a window is a time to wait for a network, not a storage period
// (and a huge one would overflow the clock arithmetic).
constexpr std::chrono::milliseconds longest_window = std::chrono::hours(24);

std::chrono::milliseconds window_of(std::uint64_t ms) {
    return std::chrono::milliseconds(static_cast<std::int64_t>(
        std::min<std::uint64_t>(ms, static_cast<std::uint64_t>(longest_window.count()))));
}

session_id random_session_id() {
    session_id id;
    std::size_t got = 0;
    while (got < id.size()) {
        const ssize_t n = ::getrandom(id.data() + got, id.size() - got, 0);
        if (n < 0) {
            if (errno == EINTR) continue;
            throw std::system_error(errno, std::generic_category(),
                                    "ordo: no random bytes for a session id");
        }
        got += static_cast<std::size_t>(n);
    }
    return id;
}

std::string hex(const session_id& id) {
    static const char digits[] = "0123456789abcdef";
    std::string s;
    for (unsigned char b : id) {
        s += digits[b >> 4];
        s += digits[b & 15];
    }
    return s;
}

bool read_u64(const msgpack::object& o, std::uint64_t& v) {
    if (o.type != msgpack::type::POSITIVE_INTEGER) return false;
    v = o.via.u64;
    return true;
}

bool read_id(const msgpack::object& o, session_id& id) {
    if (o.type != msgpack::type::BIN || o.via.bin.size != id.size()) return false;
    std::memcpy(id.data(), o.via.bin.ptr, id.size());
    return true;
}

// A notification written by ordo with an 8-character method: [2, "ordo.ack", ...].
bool is_control_notification(std::string_view b, std::string_view name) {
    return b.size() > 11 && b[0] == '\x93' && b[1] == '\x02' && b[2] == '\xa8' &&
           b.substr(3, 8) == name;
}

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

// ---- session_registry ----

session* session_registry::find(const session_id& id) const {
    auto it = by_id_.find(key(id));
    if (it == by_id_.end()) return nullptr;
    for (const auto& e : it->second)
        if (e.id == id) return e.s;
    return nullptr;
}

void session_registry::remove(const session_id& id, session* s) {
    waiting_.remove(s);
    auto it = by_id_.find(key(id));
    if (it == by_id_.end()) return;
    std::erase_if(it->second, [&](const entry& e) { return e.s == s; });
    if (it->second.empty()) by_id_.erase(it);
}

void session_registry::detached(session* s) {
    waiting_.remove(s);
    waiting_.push_back(s);
    while (waiting_.size() > max_detached_) {
        session* oldest = waiting_.front();
        waiting_.pop_front();
        oldest->give_up("ordo: session given up: more than " + std::to_string(max_detached_) +
                        " sessions were waiting to resume (max_detached_sessions)");
    }
}

// ---- session ----

// Routes one connection's callbacks to the session that owns the connection now: cleared when
// the connection is dropped, retargeted when another session takes it over (a resume).
struct session::link {
    session* s;
};

session::session(std::unique_ptr<transport> t, const comm_options& o, resume_config rc,
                 session_host& host, peer_counters& c, ended_fn on_ended)
    : options_(o),
      rc_(std::move(rc)),
      host_(host),
      c_(c),
      on_ended_(std::move(on_ended)),
      ex_(t->get_executor()),
      remote_(t->remote_address()),
      identity_(t->peer_identity()),
      ack_timer_(ex_),
      window_timer_(ex_),
      changed_(ex_, std::chrono::steady_clock::time_point::max()) {
    // Closing for the peer's fault (protocol error, message_timeout), the comm tells it why
    // with an ordo.closing notification, which an ordo peer adds to its close reason. Not on a
    // resumable session: an unnumbered message there would break its count.
    options_.farewell = [this](const std::error_code& code, const std::string& reason) {
        if (mode_ == mode::resumable || mode_ == mode::offering) return std::string();
        const int wire = code.category() == error_category()
                             ? code.value()
                             : static_cast<int>(errc::protocol_error);
        buffer b(small_buffer);
        encode_notification(b, "ordo.closing", wire, reason);
        return std::string(b.data(), b.size());
    };
    // Of what a connection could not write, only notifications are reported (report_undelivered);
    // the rest is never copied.
    options_.keep_undelivered = [](std::string_view m) { return is_notification_head(m); };
    attach(std::move(t));
    rc_.window = std::min(rc_.window, longest_window);
    if (rc_.window.count() > 0 && rc_.reconnect) {
        mode_ = mode::offering;
        window_ = rc_.window;
        send_hello();
    } else if (rc_.registry && rc_.registry->max_window().count() > 0) {
        mode_ = mode::awaiting;  // its first message says whether the caller wants a session
        attached_ = true;
    } else {
        attached_ = true;
    }
}

session::~session() {
    if (options_.budget) options_.budget->adjust(charged_unacked_, 0);
    if (link_) link_->s = nullptr;
    if (rc_.registry) rc_.registry->remove(id_, this);
}

// The resend buffer is charged to the server's memory budget in 64 KiB steps (its chunks' size),
// so that a steady stream touches the shared counter once per chunk, not once per message.
void session::note_unacked() {
    c_.unacked_bytes = sent_.bytes();
    if (!options_.budget) return;
    constexpr std::size_t step = 64 * 1024;
    const std::size_t want = (c_.unacked_bytes + step - 1) / step * step;
    if (want != charged_unacked_) options_.budget->adjust(charged_unacked_, want);
}

void session::start() {
    comm_->start();
}

void session::attach(std::unique_ptr<transport> t) {
    auto l = std::make_shared<link>(link{this});
    comm_ = std::make_unique<batched_comm>(
        std::move(t), options_,
        [l](std::string_view bytes) {
            if (l->s) l->s->on_comm_message(bytes);
        },
        [l](const close_result& r) {
            if (l->s) l->s->on_comm_closed(r);
        });
    link_ = std::move(l);
    if (paused_) comm_->pause_reading(true);
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

// ---- sending ----

void session::send_kept(std::string_view head, std::string_view body) {
    if (!open_ || ending_ || (!comm_ && mode_ == mode::plain))
        throw rpc_error(
            close_code_ ? close_code_ : make_error_code(errc::closed), {}, {},
            close_reason_.empty() ? "ordo: session to " + remote_ + " closed" : close_reason_);
    if (lost_) {
        // The first message after a lost session opens a new one (ordo.hello with no id).
        lost_ = false;
        start_window();
        net::co_spawn(ex_, reconnect_loop(this, host_.owner(), detaches_), rethrow_escaped{});
    }
    const std::size_t n = head.size() + body.size();
    if (sent_.bytes() + n > rc_.max_unacked_bytes)
        throw_error(errc::overloaded, "ordo: " + std::to_string(sent_.bytes()) + " bytes sent to " +
                                          remote_ +
                                          " are not yet acknowledged (max_unacked_bytes)");
    // Between connections (or before the handshake is done), only kept: sent on resume.
    if (attached_) {
        try {
            comm_->send(head, body);
        } catch (const std::system_error& e) {
            if (e.code() == errc::overloaded) throw;  // not taken
            // The connection is ending: the message goes out again after the resume.
        }
    }
    sent_.push(head, body);
    note_unacked();
}

void session::write_control(const buffer& b) {
    if (!comm_ || comm_->is_closing()) return;
    try {
        comm_->send(std::string_view(b.data(), b.size()));
    } catch (const std::system_error&) {
        // Full: an ack is sent again later, a hello answer's absence ends the handshake.
    }
}

void session::send_hello() {
    hello_id_ = host_.next_msgid();
    hello_pending_ = true;
    buffer b(small_buffer);
    write_request_head(b, hello_id_, "ordo.hello");
    msgpack::packer<buffer> p(b);
    p.pack_array(4);
    p.pack(hello_version);
    if (mode_ == mode::resumable) {
        p.pack_bin(static_cast<std::uint32_t>(id_.size()));
        p.pack_bin_body(reinterpret_cast<const char*>(id_.data()),
                        static_cast<std::uint32_t>(id_.size()));
    } else {
        p.pack_nil();
    }
    p.pack(received_);
    p.pack(static_cast<std::uint64_t>(window_.count()));
    write_control(b);
}

void session::send_ack() {
    if (!attached_) return;
    buffer b(small_buffer);
    encode_notification(b, "ordo.ack", received_);
    write_control(b);
    acked_received_ = received_;
    bytes_since_ack_ = 0;
}

// ---- receiving ----

void session::on_comm_message(std::string_view bytes) {
    if (mode_ == mode::plain) [[likely]]
        return host_.on_message(bytes);
    on_session_message(bytes);
}

// Kept apart from on_comm_message, so that a plain session's path stays a few instructions.
[[gnu::noinline]] void session::on_session_message(std::string_view bytes) {
    if (mode_ == mode::awaiting) {
        // The caller's first message: ordo.hello asks for a session, anything else means none.
        if (bytes.size() > 2 && bytes[0] == '\x94' && bytes[1] == '\x00') {
            message m = decode_message(bytes, options_.limits);
            if (m.method == "ordo.hello") return on_hello_request(m);
        }
        become_plain(false);
        return host_.on_message(bytes);
    }
    if (on_control(bytes)) return;
    if (hello_pending_ && mode_ == mode::resumable) {
        // On a resume the server answers ordo.hello before anything else: this message is not
        // the session's (a server over max_connections saying why it refuses, say). Drop the
        // connection and try again.
        return cut("ordo: " + remote_ + " sent a message before answering the resume");
    }
    ++received_;
    bytes_since_ack_ += bytes.size();
    if (received_ - acked_received_ >= ack_every_messages || bytes_since_ack_ >= ack_every_bytes)
        send_ack();
    else if (!ack_armed_)
        arm_ack();
    host_.on_message(bytes);
}

void session::arm_ack() {
    ack_armed_ = true;
    ack_timer_.expires_after(ack_delay);
    ack_timer_.async_wait([this, owner = host_.owner()](std::error_code ec) {
        auto keep = owner.lock();
        if (!keep) return;
        ack_armed_ = false;
        if (ec) return;
        if (received_ != acked_received_) send_ack();
    });
}

bool session::on_control(std::string_view bytes) {
    if (is_control_notification(bytes, "ordo.ack")) {
        message m = decode_message(bytes, options_.limits);
        std::uint64_t n = 0;
        if (m.params.via.array.size != 1 || !read_u64(m.params.via.array.ptr[0], n) ||
            n < sent_.first() || n > sent_.end())
            throw_error(errc::protocol_error, "ordo: protocol error: ordo.ack from " + remote_ +
                                                  " acknowledges messages never sent (" +
                                                  std::to_string(sent_.end()) + " sent)");
        sent_.drop_until(n);
        note_unacked();
        changed();
        return true;
    }
    if (is_control_notification(bytes, "ordo.bye")) {
        // [received]: what the other side got before it closed is not reported undelivered.
        message m = decode_message(bytes, options_.limits);
        std::uint64_t n = 0;
        if (m.params.via.array.size == 1 && read_u64(m.params.via.array.ptr[0], n) &&
            n >= sent_.first() && n <= sent_.end())
            sent_.drop_until(n);
        note_unacked();
        said_goodbye_ = true;
        return true;
    }
    if (hello_pending_ && bytes.size() > 2 && bytes[0] == '\x94' && bytes[1] == '\x01') {
        message m = decode_message(bytes, options_.limits);
        if (m.msgid != hello_id_) return false;
        hello_pending_ = false;
        if (m.error.is_nil()) {
            on_welcome(m.result);
        } else {
            std::string detail;
            const std::error_code code = error_from_wire(m.error, detail);
            if (mode_ == mode::resumable) {
                // The other side no longer knows the session (it restarted, or the session
                // expired or was given up): what was in flight cannot be completed.
                lose({code == errc::session_lost ? code : make_error_code(errc::session_lost),
                      "ordo: session with " + remote_ + " cannot resume: " + detail,
                      {}});
            } else {
                become_plain(true);  // a peer that does not resume sessions (any msgpack-rpc peer)
            }
        }
        return true;
    }
    return false;
}

// The caller's side: the other side agreed to a session (or to resume it).
void session::on_welcome(const msgpack::object& result) {
    session_id id{};
    std::uint64_t their_received = 0, granted = 0;
    const auto& a = result.via.array;
    if (result.type != msgpack::type::ARRAY || a.size < 4 || !read_id(a.ptr[1], id) ||
        !read_u64(a.ptr[2], their_received) || !read_u64(a.ptr[3], granted) ||
        (mode_ == mode::resumable && id != id_))
        throw_error(errc::protocol_error,
                    "ordo: protocol error: malformed answer to ordo.hello from " + remote_);
    const bool resumed = mode_ == mode::resumable;
    id_ = id;
    if (granted > 0) window_ = std::min(window_, window_of(granted));
    mode_ = mode::resumable;
    if (resumed) ++c_.resumes;
    established(their_received, resumed);
    host_.session_opened(resumed);
    if (close_pending_) finish_close();
}

// The server's side: the caller's first message on a connection is ordo.hello.
void session::on_hello_request(message& m) {
    const auto& a = m.params.via.array;
    session_id id{};
    std::uint64_t their_received = 0, asked = 0;
    const bool fresh = a.size >= 4 && a.ptr[1].is_nil();
    std::uint64_t version = 0;
    std::string wrong;
    if (a.size < 4 || !read_u64(a.ptr[0], version) || (!fresh && !read_id(a.ptr[1], id)) ||
        !read_u64(a.ptr[2], their_received) || !read_u64(a.ptr[3], asked))
        wrong = "ordo.hello expects [version, session id or nil, received, window_ms]";
    else if (version != hello_version)
        wrong = "ordo.hello version " + std::to_string(version) + " is not supported (1 is)";
    else if (asked == 0)
        wrong = "ordo.hello with window_ms 0 asks for no session";
    else if (fresh && their_received > sent_.end())
        wrong = "ordo.hello counts " + std::to_string(their_received) + " messages received; " +
                std::to_string(sent_.end()) + " were sent";
    if (!wrong.empty()) {
        become_plain(false);
        return answer_error(m.msgid, errc::bad_arguments, wrong);
    }
    if (fresh) {
        id_ = random_session_id();
        window_ = std::min(rc_.registry->max_window(), window_of(asked));
        rc_.registry->add(id_, this);
        mode_ = mode::resumable;
        // This connection carried everything sent so far: nothing to send again.
        if (their_received <= sent_.end() && their_received >= sent_.first())
            sent_.drop_until(their_received);
        note_unacked();
        return answer_welcome(m.msgid);
    }
    session* old = rc_.registry->find(id);
    // Over tls, only the client that opened a session may resume it.
    if (old && old->identity_ != identity_) old = nullptr;
    if (!old || old == this || !old->open_ || old->ending_) {
        become_plain(false);
        return answer_error(
            m.msgid, errc::session_lost,
            "no session " + hex(id) + " here (the server restarted, or the session expired)");
    }
    // The caller is back: its session takes this connection over, and this one ends.
    auto comm = std::move(comm_);
    auto l = std::move(link_);
    mode_ = mode::plain;
    old->take_over(std::move(comm), std::move(l), m.msgid, their_received);
    end({errc::closed, "ordo: connection from " + remote_ + " resumed an earlier session", {}});
}

void session::take_over(std::unique_ptr<batched_comm> comm, std::shared_ptr<link> l,
                        std::uint32_t msgid, std::uint64_t their_received) {
    drop_comm();  // the earlier connection, if this side has not yet seen it die
    comm_ = std::move(comm);
    link_ = std::move(l);
    link_->s = this;
    remote_ = comm_->remote_address();
    if (paused_) comm_->pause_reading(true);
    if (their_received < sent_.first() || their_received > sent_.end()) {
        answer_error(msgid, errc::session_lost,
                     "the caller's count of messages received (" + std::to_string(their_received) +
                         ") does not match this session's");
        return abort(errc::session_lost,
                     "ordo: session with " + remote_ + " cannot resume: message counts disagree");
    }
    ++c_.resumes;
    answer_welcome(msgid);
    established(their_received, true);
}

void session::answer_welcome(std::uint32_t msgid) {
    buffer b(small_buffer);
    write_response_head(b, msgid);
    msgpack::packer<buffer> p(b);
    p.pack_array(4);
    p.pack(hello_version);
    p.pack_bin(static_cast<std::uint32_t>(id_.size()));
    p.pack_bin_body(reinterpret_cast<const char*>(id_.data()),
                    static_cast<std::uint32_t>(id_.size()));
    p.pack(received_);
    p.pack(static_cast<std::uint64_t>(window_.count()));
    write_control(b);
    acked_received_ = received_;
    bytes_since_ack_ = 0;
}

void session::answer_error(std::uint32_t msgid, errc code, const std::string& text) {
    buffer b(small_buffer);
    encode_error_response(b, msgid, code, text);
    write_control(b);
}

// A connection carries the session again: send what the other side has not received.
void session::established(std::uint64_t their_received, bool resend) {
    if (their_received < sent_.first() || their_received > sent_.end())
        throw_error(errc::protocol_error, "ordo: protocol error: " + remote_ +
                                              " says it received " +
                                              std::to_string(their_received) + " messages; " +
                                              std::to_string(sent_.first()) + " to " +
                                              std::to_string(sent_.end()) + " are possible");
    sent_.drop_until(their_received);
    std::uint64_t n = 0;
    sent_.for_each_from(their_received, [&](std::string_view m) {
        comm_->send(m);
        ++n;
    });
    if (resend) c_.messages_resent += n;
    note_unacked();
    attached_ = true;
    backoff_ = std::chrono::milliseconds(0);
    window_timer_.cancel();
    if (rc_.registry) rc_.registry->attached(this);
    changed();
}

// Kept messages go out now if they were only kept (the caller's side during its hello), not if
// they went out already (the server's side, before the caller's first message).
void session::become_plain(bool send_kept) {
    mode_ = mode::plain;
    attached_ = true;
    if (send_kept) sent_.for_each_from(sent_.first(), [&](std::string_view m) { comm_->send(m); });
    sent_.reset(0);
    note_unacked();
    changed();
    if (close_pending_) comm_->close();
}

// ---- connections ending ----

void session::on_comm_closed(const close_result& r) {
    const bool resumes = (mode_ == mode::resumable || mode_ == mode::offering) && !ending_ &&
                         !said_goodbye_ && r.code == errc::peer_lost;
    if (!resumes) return end(r);
    detach(r);
}

void session::detach(const close_result& r) {
    last_error_ = r.reason;
    const bool was_attached = attached_ || window_deadline_ == clock::time_point{};
    attached_ = false;
    hello_pending_ = false;
    drop_comm();
    ++detaches_;
    // The window counts from the drop of a working connection, not from each failed retry.
    if (was_attached) start_window();
    if (rc_.registry) rc_.registry->detached(this);  // may give up this one at once
    if (open_ && rc_.reconnect)
        net::co_spawn(ex_, reconnect_loop(this, host_.owner(), detaches_), rethrow_escaped{});
    changed();
}

void session::start_window() {
    window_deadline_ = clock::now() + window_;
    window_timer_.expires_at(window_deadline_);
    window_timer_.async_wait([this, owner = host_.owner()](std::error_code ec) {
        auto keep = owner.lock();
        if (ec || !keep || attached_ || !open_) return;
        window_passed();
    });
}

void session::window_passed() {
    close_result r{errc::peer_lost,
                   "ordo: session with " + remote_ + " not resumed within " +
                       std::to_string(window_.count()) + " ms; last error: " + last_error_,
                   {}};
    // A caller opens a new session on demand; a server's session ends for good.
    if (rc_.reconnect)
        lose(r);
    else
        end(r);
}

// The caller's session cannot resume: everything in flight fails (the host is told), and the
// session starts over, opening a new one with the next message sent. Never silently: the calls
// that were pending fail, and the host hears of the loss and of the new session.
void session::lose(const close_result& r) {
    window_timer_.cancel();
    ack_timer_.cancel();
    ack_armed_ = false;
    drop_comm();
    close_result out{r.code, r.reason, {}};
    sent_.for_each_from(sent_.first(),
                        [&](std::string_view m) { out.undelivered.emplace_back(m); });
    sent_.reset(0);
    note_unacked();
    received_ = acked_received_ = 0;
    bytes_since_ack_ = 0;
    id_ = {};
    window_ = rc_.window;
    mode_ = mode::offering;
    attached_ = false;
    hello_pending_ = false;
    window_deadline_ = {};
    backoff_ = std::chrono::milliseconds(0);
    lost_ = true;
    ++detaches_;  // ends reconnection loops still running
    last_error_.clear();
    changed();
    host_.session_lost(out);
}

net::awaitable<void> session::reconnect_loop(session* self, std::weak_ptr<void> owner,
                                             std::uint64_t drop) {
    net::steady_timer pause(self->ex_);
    std::minstd_rand jitter(
        static_cast<unsigned>(drop * 7919 + clock::now().time_since_epoch().count()));
    // Whether this drop is still the one being served (the session may have ended, resumed
    // or dropped again meanwhile; the owner may be gone).
    auto current = [&]() -> std::shared_ptr<void> {
        auto keep = owner.lock();
        if (!keep || !self->open_ || self->detaches_ != drop || self->comm_) return nullptr;
        return keep;
    };
    for (;;) {
        // Backoff: uniform in [b/2, b], b doubling from 10 ms to 1 s; the very first try
        // after a working connection dropped waits 0-10 ms.
        const auto b = self->backoff_.count() == 0 ? first_backoff : self->backoff_;
        const auto low = self->backoff_.count() == 0 ? 0 : b.count() / 2;
        pause.expires_after(std::chrono::milliseconds(
            std::uniform_int_distribution<std::int64_t>(low, b.count())(jitter)));
        self->backoff_ = std::min(max_backoff, b * 2);
        co_await pause.async_wait(use_tuple);
        if (!current()) co_return;
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
            self->window_deadline_ - clock::now());
        if (left.count() <= 0) co_return;  // the window timer ends the session
        auto reconnect = self->rc_.reconnect;
        std::unique_ptr<transport> t;
        std::string error;
        try {
            t = co_await reconnect(left);
        } catch (const std::exception& e) {
            error = e.what();
        }
        auto keep = current();
        if (!keep) {
            if (t) t->close();
            co_return;
        }
        if (!t) {
            self->last_error_ = error;
            continue;
        }
        self->attach(std::move(t));
        self->comm_->start();
        self->send_hello();
        co_return;
    }
}

void session::give_up(const std::string& why) {
    end({errc::peer_lost, why, {}});
}

void session::end(const close_result& r) {
    if (!open_) return;
    open_ = false;
    attached_ = false;
    close_code_ = r.code;
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
    open_ = false;
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
        if (!open_) throw rpc_error(close_code_, {}, {}, close_reason_);
        if (mode_ == mode::plain) {
            if (comm_) co_await comm_->async_drain();
            co_return;
        }
        if (!attached_ || sent_.bytes() > rc_.max_unacked_bytes / 2) {
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
    if (ending_ || !open_) return;
    ending_ = true;
    if (!comm_) {
        return end({errc::closed, "ordo: session to " + remote_ + " closed while resuming", {}});
    }
    if (hello_pending_) {
        close_pending_ = true;  // what is kept goes out once the handshake is done
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
    ending_ = true;
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
    said_goodbye_ = true;
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
    // Between connections, silence is the window's business, not the dead-peer watchdog's.
    if (open_ && !attached_ && mode_ != mode::plain) sum_.last_receive = clock::now();
    return sum_;
}

void session::report_undelivered(const close_result& r,
                                 const std::function<void(const undelivered_notification&)>& report,
                                 peer_counters& c) const {
    for (const auto& bytes : r.undelivered) {
        // Only notifications are reported (calls fail on their own).
        if (!is_notification_head(bytes)) continue;
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
