// ordo::peer's operations: starting calls, notifications, closing, and what it counts. Its
// inside, the parts of the connection and their wiring, is rpc/connection/peer_state.hpp.
#include "ordo/rpc/peer.hpp"

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

void peer::start_call(std::unique_ptr<detail::pending_call> call) {
    auto& s = *s_;
    ++s.c.calls_started;
    if (s.left || s.heard_eof) [[unlikely]]
        return s.calls.fail(std::move(call),
                            s.sess->remote_code() ? errc::unauthenticated : errc::peer_lost,
                            s.heard_eof ? s.eof_why : s.goaway_why);
    if (!s.sess->is_open())
        return s.calls.fail(std::move(call), s.sess->close_code(), s.sess->close_reason());
    const std::uint32_t id = s.calls.next_id();
    auto& f = *call;
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
    f.params.clear();  // sent: the copy in the batch is enough
    s.calls.add(id, std::move(call));
    s.live.note_work();
}

void peer::notify_raw(std::string_view method, std::string_view params) {
    if (s_->left)
        throw rpc_error(errc::peer_lost, {}, {},
                        "ordo: notify " + std::string(method) + " to " + s_->remote +
                            " failed: " + s_->goaway_why);
    if (!s_->sess->is_open())
        throw rpc_error(s_->sess->close_code(), {}, {},
                        "ordo: notify " + std::string(method) + " to " + s_->remote +
                            " failed: " + s_->sess->close_reason());
    s_->sess->send(detail::notification_head(method), params);
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
    s_->sess->close();
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
    s_->sess->close(std::move(reason));
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
    return s_->sess->can_send();
}
bool peer::takes_calls() const noexcept {
    return s_->sess->can_send() && !s_->left && !s_->heard_eof;
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