// The handshake of a resumable session (docs/protocol.md "Resumable sessions"): the caller's
// ordo.hello and the answer to it (welcome, or a peer that does not resume: plain), the
// server's side of ordo.hello (a new session, or a caller back whose session takes the new
// connection over), and the session ids.
#include "rpc/session/session.hpp"

#include <sys/random.h>

#include <algorithm>

#include "ordo/rpc/detail/message_heads.hpp"
#include "ordo/rpc/peer.hpp"
#include "rpc/session/session_parts.hpp"
#include "rpc/wire/errors.hpp"

namespace ordo::detail {

namespace {

constexpr int hello_version = 1;

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

bool read_id(const msgpack::object& o, session_id& id) {
    if (o.type != msgpack::type::BIN || o.via.bin.size != id.size()) return false;
    std::memcpy(id.data(), o.via.bin.ptr, id.size());
    return true;
}

}  // namespace

void session::send_hello() {
    hello_id_ = host_.next_msgid();
    carrier_ = carrier::greeting;
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

// The caller's side: a response (on_control checked) that may answer ordo.hello. False if it
// answers something else.
bool session::on_hello_answer(std::string_view bytes) {
    message m = decode_message(bytes, options_.limits);
    if (m.msgid != hello_id_) return false;
    carrier_ = carrier::none;
    if (m.error.is_nil()) {
        on_welcome(m.result);
    } else {
        std::string detail;
        const std::error_code code = error_from_wire(m.error, detail);
        if (code == errc::unauthenticated) {
            // The server refused this side's credentials (it closes the connection next).
            abort(code, "ordo: " + remote_ + " refused this side: " + detail);
        } else if (mode_ == mode::resumable) {
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
    if (end_ == ending::after_hello) finish_close();
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
        rc_.registry->add(id_, this, ex_, who_.resume_key());
        mode_ = mode::resumable;
        // This connection carried everything sent so far: nothing to send again.
        if (their_received <= sent_.end() && their_received >= sent_.first())
            sent_.drop_until(their_received);
        note_unacked();
        return answer_welcome(m.msgid);
    }
    auto at = rc_.registry->find(id);
    // Only a caller that proves the identity that opened a session may resume it: the same
    // client certificate, the same token subject.
    if (at.s && at.identity != who_.resume_key()) at.s = nullptr;
    const bool here = at.s && at.ex == ex_;
    if (!at.s || at.s == this || (here && at.s->closing())) {
        become_plain(false);
        return answer_error(m.msgid, errc::session_lost, no_session(id));
    }
    // The caller is back: its session takes this connection over, and this one ends.
    auto comm = std::move(comm_);
    auto l = std::move(link_);
    mode_ = mode::plain;
    if (here) {
        at.s->take_over(std::move(comm), std::move(l), m.msgid, their_received);
    } else {
        // The session lives on another loop: once what this side queued is written, the
        // connection moves there (with what the caller sent after its hello, if anything).
        l->s = nullptr;
        comm->hand_over([reg = rc_.registry, ex = at.ex, id, msgid = m.msgid, their_received,
                         key = who_.resume_key()](std::unique_ptr<transport> t, std::string rest) {
            if (!t) return;  // it failed meanwhile: the caller comes back again
            auto moved = t->rehome(ex);
            if (!moved) {
                // tls with bytes still inside its buffers: the caller comes back again.
                t->reset();
                return;
            }
            net::post(ex, [reg, id, msgid, their_received, key, rest = std::move(rest),
                           t = std::move(moved)]() mutable {
                resume_here(*reg, id, key, std::move(t), std::move(rest), msgid, their_received);
            });
        });
        dead_comm_ = std::move(comm);
    }
    end({errc::closed, "ordo: connection from " + remote_ + " resumed an earlier session", {}});
}

std::string session::no_session(const session_id& id) {
    return "no session " + hex(id) + " here (the server restarted, or the session expired)";
}

// On the loop of session `id`, with a connection that claimed it on another loop.
void session::resume_here(session_registry& reg, const session_id& id, const std::string& key,
                          std::unique_ptr<transport> t, std::string rest, std::uint32_t msgid,
                          std::uint64_t their_received) {
    auto at = reg.find(id);
    session* s = at.s;
    if (s && (s->closing() || s->who_.resume_key() != key)) s = nullptr;
    if (!s) {
        // It ended while the connection was on its way: say so, and close the connection. The
        // connection is held by a wait on its loop, which its end cancels (as
        // peer::state::hold_until_ended): it goes as that wait's handler runs, or with the
        // io_context if the loop stops first.
        auto held = std::make_unique<net::steady_timer>(t->get_executor(),
                                                        net::steady_timer::time_point::max());
        auto comm = std::make_unique<batched_comm>(
            std::move(t), comm_options{}, [](std::string_view) {},
            [h = held.get()](const close_result&) { h->cancel(); });
        batched_comm& c = *comm;
        // Members go in reverse order: the connection before the timer it refers to.
        struct farewell {
            std::unique_ptr<net::steady_timer> held;
            std::unique_ptr<batched_comm> comm;
            void operator()(std::error_code) {}
        };
        auto& wait = *held;
        wait.async_wait(farewell{std::move(held), std::move(comm)});
        buffer b(small_buffer);
        encode_error_response(b, msgid, errc::session_lost, no_session(id));
        c.send(std::string_view(b.data(), b.size()));
        c.start();
        c.close();
        return;
    }
    auto l = std::make_shared<link>(link{s});
    auto comm = s->make_comm(std::move(t), l);
    comm->preload(rest);
    reg.note_moved();
    s->take_over(std::move(comm), std::move(l), msgid, their_received);
    if (s->comm_) s->comm_->start();
}

void session::take_over(std::unique_ptr<batched_comm> comm, std::shared_ptr<link> l,
                        std::uint32_t msgid, std::uint64_t their_received) {
    drop_comm();  // the earlier connection, if this side has not yet seen it die
    comm_ = std::move(comm);
    link_ = std::move(l);
    link_->s = this;
    remote_ = comm_->remote_address();
    who_.address = remote_;
    if (paused_) comm_->pause_reading(true);
    if (want_written_) comm_->want_written(true);
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

// Kept messages go out now if they were only kept (the caller's side during its hello), not if
// they went out already (the server's side, before the caller's first message).
void session::become_plain(bool send_kept) {
    mode_ = mode::plain;
    carrier_ = carrier::attached;
    if (send_kept) sent_.for_each_from(sent_.first(), [&](std::string_view m) { comm_->send(m); });
    sent_.reset(0);
    note_unacked();
    changed();
    if (end_ == ending::after_hello) comm_->close();
}

}  // namespace ordo::detail
