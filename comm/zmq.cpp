// zmq+tcp:// and zmq+ipc://: ZeroMQ DEALER (connecting side) and ROUTER (listening side) through
// cppzmq, driven by the Asio event loop through the sockets' ZMQ_FD descriptors (the zsock of
// comm/detail/zmq_socket.hpp). This file is ordo's protocol over ZeroMQ: socket options, URL
// parameters, the transport and the listener.
//
// On the wire a data message is one frame (after the ROUTER's routing id) holding one batch of
// msgpack-rpc messages, or a piece of one when the batch is larger than max_piece_bytes; the
// receiver concatenates them into a byte stream. ZeroMQ hides connects and disconnects, so ordo
// adds two-frame control messages: ["hello", ""] opens a connection (the ROUTER accepts it),
// ["eof", ""] ends a direction, ["reset", ""] aborts it and ["probe", ""] is dropped by the
// receiver (a ROUTER sends it to learn whether a routing id is
// still connected: with ZMQ_ROUTER_MANDATORY a gone peer fails the send at once). A foreign
// msgpack-rpc DEALER that sends plain one-frame messages works; it just never says eof.
//
// Dead peers: the connecting side disables ZeroMQ's reconnection (a new connection would break
// ordering) and watches its socket monitor: a disconnect fails the transport. Both sides send ZMTP
// heartbeats, so a hung or vanished peer is disconnected after 3 silent intervals. The listening
// side learns of disconnects from its monitor (which names a file descriptor, not a routing id)
// and probes the routing ids that might be gone, and probes ids silent for a heartbeat interval.
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "comm/detail/zmq_socket.hpp"
#include "comm/transports.hpp"
#include "lib/url_number.hpp"
#include "ordo/error.hpp"

namespace ordo::detail {
namespace {

std::string zmq_endpoint(const address& a) {
    if (a.scheme == "zmq+ipc") return "ipc://" + a.path;
    std::string h = a.host.find(':') != std::string::npos ? "[" + a.host + "]" : a.host;
    return "tcp://" + h + ":" + (a.port == 0 ? std::string("*") : std::to_string(a.port));
}

class zmq_transport final : public transport {
  public:
    zmq_transport(std::shared_ptr<zsock> s, std::shared_ptr<zconn> c)
        : transport(c->remote), s_(std::move(s)), c_(std::move(c)) {}

    ~zmq_transport() override { close(); }

    net::awaitable<std::size_t> async_read_some(net::mutable_buffer b,
                                                std::error_code& ec) override {
        auto s = s_;
        auto c = c_;
        for (;;) {
            if (c->closed) {
                ec = net::error::operation_aborted;
                co_return 0;
            }
            if (!c->in.empty()) {
                std::size_t n = 0;
                while (n < b.size() && !c->in.empty()) {
                    auto& m = c->in.front();
                    const std::size_t k = std::min(b.size() - n, m.size() - c->head);
                    std::memcpy(static_cast<char*>(b.data()) + n,
                                static_cast<const char*>(m.data()) + c->head, k);
                    n += k;
                    c->head += k;
                    if (c->head == m.size()) {
                        c->in.pop_front();
                        c->head = 0;
                    }
                }
                s->consumed(n);
                co_return n;
            }
            // A disconnect after the peer's eof is the normal end of the connection.
            if (c->eof) {
                ec = net::error::eof;
                co_return 0;
            }
            if (c->error) {
                ec = c->error;
                co_return 0;
            }
            co_await c->read_wake.async_wait(use_tuple);
        }
    }

    net::awaitable<std::size_t> async_write(net::const_buffer b, std::error_code& ec) override {
        auto s = s_;
        auto c = c_;
        std::size_t done = 0;
        auto backoff = std::chrono::milliseconds(1);
        while (done < b.size()) {
            if (c->closed) {
                ec = net::error::operation_aborted;
                co_return done;
            }
            if (c->error || c->out_ended) {
                ec = c->error ? c->error : std::error_code(net::error::broken_pipe);
                co_return done;
            }
            const std::size_t n = std::min(max_piece_bytes, b.size() - done);
            zmq::message_t m(static_cast<const char*>(b.data()) + done, n);
            if (s->send(*c, m)) {
                done += n;
                backoff = std::chrono::milliseconds(1);
                continue;
            }
            if (c->error) continue;
            // ZeroMQ's queue for this peer is full: wait for room (the pump wakes a DEALER's
            // writer; a ROUTER does not say which peer has room, so retry with backoff).
            c->write_wake.expires_after(backoff);
            co_await c->write_wake.async_wait(use_tuple);
            backoff = std::min(backoff * 2, std::chrono::milliseconds(16));
        }
        co_return done;
    }

    void shutdown_send() noexcept override {
        if (c_->out_ended || c_->closed || c_->error) return;
        c_->out_ended = true;
        try {
            s_->send_control(*c_, "eof");
        } catch (...) {
        }
    }

    void close() noexcept override { end("eof"); }
    void reset() noexcept override { end("reset"); }

    net::any_io_executor get_executor() override { return s_->executor(); }

  private:
    void end(std::string_view how) noexcept {
        if (c_->closed) return;
        try {
            if (!c_->error && (how == "reset" || !c_->out_ended)) s_->send_control(*c_, how);
        } catch (...) {
        }
        c_->closed = true;
        c_->read_wake.cancel();
        c_->write_wake.cancel();
        s_->forget(c_);
        if (s_->single == c_) s_->shut();
    }

    std::shared_ptr<zsock> s_;
    std::shared_ptr<zconn> c_;
};

class zmq_listener final : public listener {
  public:
    zmq_listener(const net::any_io_executor& ex, const address& a, const zmq_options& o)
        : s_(std::make_shared<zsock>(ex, zmq::socket_type::router, o)) {
        try {
            s_->socket().bind(zmq_endpoint(a));
        } catch (const zmq::error_t& e) {
            s_->shut();
            transport_fail("cannot listen on", a.to_string(),
                           std::error_code(e.num(), std::generic_category()));
        }
        address bound = a;
        bound.params.clear();
        if (a.scheme == "zmq+tcp") {
            // tcp://127.0.0.1:41234 (the port ZeroMQ picked for "*"), read as any tcp URL.
            const std::string ep = s_->socket().get(zmq::sockopt::last_endpoint);
            bound.port = parse_address("zmq+" + ep).port;
        }
        local_ = bound.to_string();
        s_->local = local_;
        s_->listening = true;
        s_->start();
    }

    ~zmq_listener() override { close(); }

    net::awaitable<std::unique_ptr<transport>> async_accept() override {
        auto s = s_;
        while (s->unaccepted.empty() && s->listening) co_await s->accept_wake.async_wait(use_tuple);
        if (!s->listening)
            transport_fail("accept failed on", local_, net::error::operation_aborted);
        auto c = std::move(s->unaccepted.front());
        s->unaccepted.pop_front();
        co_return std::make_unique<zmq_transport>(s, std::move(c));
    }

    void close() noexcept override {
        if (s_->listening) s_->stop_listening();
    }

  private:
    std::shared_ptr<zsock> s_;
};

// A unix socket file that accepts connections belongs to a live server; ZeroMQ would unlink it.
bool socket_file_in_use(const std::string& path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode)) return false;
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    if (path.size() >= sizeof sa.sun_path) return false;
    std::memcpy(sa.sun_path, path.c_str(), path.size() + 1);
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return false;
    const bool live = ::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0;
    ::close(fd);
    return live;
}

zmq_options zmq_settings(const address& a, zmq_options o) {
    if (auto v = a.param("zmq_heartbeat_ms")) {
        o.heartbeat =
            std::chrono::milliseconds(number_parameter(a.to_string(), "zmq_heartbeat_ms", *v));
    }
    return o;
}

}  // namespace

void set_socket_options(zmq::socket_t& s, bool router, const zmq_options& o) {
    s.set(zmq::sockopt::linger, 1000);
    s.set(zmq::sockopt::sndhwm, o.high_water_mark);
    s.set(zmq::sockopt::rcvhwm, o.high_water_mark);
    s.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(2 * max_piece_bytes));
    if (o.heartbeat.count() > 0) {
        const int ivl = static_cast<int>(o.heartbeat.count());
        s.set(zmq::sockopt::heartbeat_ivl, ivl);
        s.set(zmq::sockopt::heartbeat_timeout, 3 * ivl);
        s.set(zmq::sockopt::heartbeat_ttl, 3 * ivl);
    }
    if (router) {
        // A send to a gone routing id fails at once: how probes find dead peers.
        s.set(zmq::sockopt::router_mandatory, 1);
    } else {
        // A new connection after a lost one would break ordering: the transport fails instead.
        s.set(zmq::sockopt::immediate, 1);
        s.set(zmq::sockopt::reconnect_ivl, -1);
    }
}

int monitor_events(bool router) {
    return router ? ZMQ_EVENT_DISCONNECTED
                  : ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_CONNECT_RETRIED | ZMQ_EVENT_CLOSED |
                        ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                        ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;
}

net::awaitable<std::unique_ptr<transport>> connect_zmq(const address& a,
                                                       const transport_options& o) {
    auto ex = co_await net::this_coro::executor;
    auto s = std::make_shared<zsock>(ex, zmq::socket_type::dealer, zmq_settings(a, o.zmq));
    s->single = std::make_shared<zconn>(ex);
    s->single->remote = a.to_string();
    s->start();
    try {
        s->socket().connect(zmq_endpoint(a));
    } catch (const zmq::error_t& e) {
        s->shut();
        transport_fail("cannot connect to", a.to_string(),
                       std::error_code(e.num(), std::generic_category()));
    }
    // ZeroMQ connects in the background: wait for the handshake, or its first failure.
    net::steady_timer deadline(ex);
    deadline.expires_after(std::chrono::seconds(10));
    auto expired = std::make_shared<bool>(false);
    deadline.async_wait([expired, w = std::weak_ptr<zsock>(s)](std::error_code ec) {
        if (ec) return;
        *expired = true;
        if (auto s = w.lock()) s->connect_wake.cancel();
    });
    while (!s->connected && !s->connect_error && !*expired && s->open())
        co_await s->connect_wake.async_wait(use_tuple);
    deadline.cancel();
    if (!s->connected) {
        const std::error_code ec = s->connect_error   ? s->connect_error
                                   : *expired         ? std::error_code(net::error::timed_out)
                                                      : std::error_code(net::error::operation_aborted);
        s->shut();
        transport_fail("cannot connect to", a.to_string(), ec);
    }
    // The listening side learns of a connection from its first message: say hello at once, so
    // that it accepts this connection now, as a tcp server would.
    s->send_control(*s->single, "hello");
    co_return std::make_unique<zmq_transport>(s, s->single);
}

std::unique_ptr<listener> listen_zmq(const net::any_io_executor& ex, const address& a,
                                     const transport_options& o) {
    if (a.scheme == "zmq+ipc") {
        if (socket_file_in_use(a.path))
            transport_fail("cannot listen on", a.to_string(), net::error::address_in_use);
    }
    return std::make_unique<zmq_listener>(ex, a, zmq_settings(a, o.zmq));
}

}  // namespace ordo::detail
