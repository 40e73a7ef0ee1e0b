// zmq+tcp:// and zmq+ipc://: ZeroMQ DEALER (connecting side) and ROUTER (listening side) through
// cppzmq, driven by the Asio event loop through the sockets' ZMQ_FD descriptors.
//
// ZMQ_FD only says "ZMQ_EVENTS may have changed", edge-triggered: after every send or receive we
// re-read ZMQ_EVENTS and drain until it reports nothing, or the edge is lost and the loop stalls.
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
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <zmq.hpp>

#include <asio/posix/stream_descriptor.hpp>

#include "comm/transports.hpp"
#include "ordo/error.hpp"

namespace ordo::detail {
namespace {

using clock = std::chrono::steady_clock;

zmq::context_t& context() {
    // Never terminated: zmq_ctx_term waits for every socket, and a process must be able to exit
    // with connections open. A forked child cannot use its parent's context (its I/O thread did
    // not come along): it makes its own.
    static std::mutex m;
    static zmq::context_t* ctx = nullptr;
    static pid_t owner = 0;
    std::lock_guard lock(m);
    if (!ctx || owner != ::getpid()) {
        ctx = new zmq::context_t(1);
        owner = ::getpid();
    }
    return *ctx;
}

constexpr std::size_t max_piece_bytes = std::size_t{1} << 20;
constexpr std::size_t max_buffered_bytes = std::size_t{64} << 20;  // per socket, not yet read
constexpr std::size_t max_unaccepted = 4096;
constexpr std::size_t max_tombstones = 65536;

std::string zmq_endpoint(const address& a) {
    if (a.scheme == "zmq+ipc") return "ipc://" + a.path;
    std::string h = a.host.find(':') != std::string::npos ? "[" + a.host + "]" : a.host;
    return "tcp://" + h + ":" + (a.port == 0 ? std::string("*") : std::to_string(a.port));
}

// One connection as one socket sees it.
struct zconn {
    explicit zconn(const net::any_io_executor& ex)
        : read_wake(ex, clock::time_point::max()), write_wake(ex, clock::time_point::max()) {}
    std::string id;  // routing id (ROUTER side only)
    std::string remote;
    std::deque<zmq::message_t> in;
    std::size_t head = 0;  // bytes of in.front() already read
    bool eof = false;      // the peer ended its direction
    bool out_ended = false;
    bool closed = false;  // closed by this side
    std::error_code error;
    std::string error_detail;
    int fd = -1;
    bool heard = false;  // received something since the last probe sweep
    net::steady_timer read_wake;
    net::steady_timer write_wake;

    void lose(std::error_code ec) {
        if (!error) error = ec;
        read_wake.cancel();
        write_wake.cancel();
    }
};

// A ZeroMQ socket on an Asio executor, shared by the transports (and listener) using it.
class zsock : public std::enable_shared_from_this<zsock> {
  public:
    zsock(const net::any_io_executor& ex, zmq::socket_type type, const zmq_options& o)
        : accept_wake(ex, clock::time_point::max()),
          connect_wake(ex, clock::time_point::max()),
          ex_(ex),
          router_(type == zmq::socket_type::router),
          o_(o),
          sock_(context(), type),
          fd_(ex),
          mon_fd_(ex),
          sweep_(ex) {
        static std::atomic<unsigned> monitors{0};
        sock_.set(zmq::sockopt::linger, 1000);
        sock_.set(zmq::sockopt::sndhwm, o.high_water_mark);
        sock_.set(zmq::sockopt::rcvhwm, o.high_water_mark);
        sock_.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(2 * max_piece_bytes));
        if (o.heartbeat.count() > 0) {
            const int ivl = static_cast<int>(o.heartbeat.count());
            sock_.set(zmq::sockopt::heartbeat_ivl, ivl);
            sock_.set(zmq::sockopt::heartbeat_timeout, 3 * ivl);
            sock_.set(zmq::sockopt::heartbeat_ttl, 3 * ivl);
        }
        if (router_) {
            sock_.set(zmq::sockopt::router_mandatory, 1);
        } else {
            sock_.set(zmq::sockopt::immediate, 1);
            sock_.set(zmq::sockopt::reconnect_ivl, -1);
        }
        const std::string mon = "inproc://ordo-zmq-monitor-" + std::to_string(::getpid()) + "-" +
                                std::to_string(monitors++);
        const int events = router_ ? ZMQ_EVENT_DISCONNECTED
                                   : ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_CONNECT_RETRIED |
                                         ZMQ_EVENT_CLOSED | ZMQ_EVENT_DISCONNECTED |
                                         ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                                         ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                                         ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;
        if (::zmq_socket_monitor(sock_.handle(), mon.c_str(), events) != 0)
            throw zmq::error_t();
        mon_ = zmq::socket_t(context(), zmq::socket_type::pair);
        mon_.set(zmq::sockopt::linger, 0);
        mon_.connect(mon);
        fd_.assign(sock_.get(zmq::sockopt::fd));
        mon_fd_.assign(mon_.get(zmq::sockopt::fd));
    }

    ~zsock() { shut(); }

    void start() {
        auto self = shared_from_this();
        net::co_spawn(ex_, pump(self), net::detached);
        net::co_spawn(ex_, monitor_pump(self), net::detached);
        if (router_ && o_.heartbeat.count() > 0) schedule_sweep(o_.heartbeat);
    }

    // Stops the pumps and closes the socket (after linger, queued messages still go out).
    void shut() {
        if (!open_) return;
        open_ = false;
        std::error_code ignored;
        sweep_.cancel();
        fd_.cancel(ignored);
        mon_fd_.cancel(ignored);
        fd_.release();
        mon_fd_.release();
        ::zmq_socket_monitor(sock_.handle(), nullptr, 0);
        mon_.close();
        sock_.close();
        for (auto& [id, c] : conns_) c->lose(net::error::operation_aborted);
        if (single) single->lose(net::error::operation_aborted);
        accept_wake.cancel();
        connect_wake.cancel();
    }

    bool open() const { return open_; }
    zmq::socket_t& socket() { return sock_; }
    net::any_io_executor executor() const { return ex_; }

    // Sends one frame to `c`. True when sent; false when ZeroMQ's queue is full (try later).
    // A gone peer (or a closed socket) marks `c` lost and returns false.
    bool send(zconn& c, zmq::message_t& m, bool more = false) {
        if (!open_) {
            c.lose(net::error::operation_aborted);
            return false;
        }
        try {
            if (router_) {
                zmq::message_t id(c.id.data(), c.id.size());
                if (!sock_.send(id, zmq::send_flags::sndmore | zmq::send_flags::dontwait)) {
                    kick();
                    return false;
                }
            }
            auto r = sock_.send(m, more ? zmq::send_flags::sndmore | zmq::send_flags::dontwait
                                        : zmq::send_flags::dontwait);
            kick();  // a send can consume the descriptor's edge
            return r.has_value();
        } catch (const zmq::error_t& e) {
            kick();
            c.error_detail = e.what();
            c.lose(e.num() == EHOSTUNREACH ? net::error::connection_reset
                                           : std::error_code(e.num(), std::generic_category()));
            return false;
        }
    }

    bool send_control(zconn& c, std::string_view code) {
        zmq::message_t head(code.data(), code.size());
        zmq::message_t empty;
        if (!send(c, head, true)) return false;
        return send(c, empty);
    }

    // Called by readers after taking bytes: reading resumes below the buffer limit.
    void consumed(std::size_t n) {
        buffered_ -= n;
        if (stalled_ && buffered_ < max_buffered_bytes / 2) {
            stalled_ = false;
            kick();
        }
    }

    void forget(const std::shared_ptr<zconn>& c) {
        if (!router_) return;
        conns_.erase(c->id);
        for (auto& m : c->in) buffered_ -= m.size();
        if (c->head) buffered_ += c->head;
        c->in.clear();
        c->head = 0;
        tombstones_.push_back(c->id);
        tomb_set_.insert(c->id);
        if (tombstones_.size() > max_tombstones) {
            tomb_set_.erase(tombstones_.front());
            tombstones_.pop_front();
        }
        maybe_finish();
    }

    // Listener side.
    std::deque<std::shared_ptr<zconn>> unaccepted;
    net::steady_timer accept_wake;
    bool listening = false;
    std::string local;
    void stop_listening() {
        listening = false;
        for (auto& c : unaccepted) {
            send_control(*c, "reset");
            forget(c);
        }
        unaccepted.clear();
        accept_wake.cancel();
        maybe_finish();
    }

    // Connecting side.
    std::shared_ptr<zconn> single;
    net::steady_timer connect_wake;
    bool connected = false;
    std::error_code connect_error;
    std::string connect_detail;

  private:
    void kick() {
        std::error_code ignored;
        fd_.cancel(ignored);
    }

    // The listening socket goes away with its listener and last connection.
    void maybe_finish() {
        if (router_ && !listening && conns_.empty()) shut();
    }

    static net::awaitable<void> pump(std::shared_ptr<zsock> self) {
        while (self->open_) {
            if (!self->drain()) {
                // Gave others a turn; the socket still has messages.
                co_await net::post(self->ex_, net::use_awaitable);
                continue;
            }
            if (!self->open_) break;
            co_await self->fd_.async_wait(net::posix::descriptor_base::wait_read, use_tuple);
        }
    }

    // Receives until ZMQ_EVENTS shows nothing pending (true), or until a turn's budget is spent
    // (false: call again soon).
    bool drain() {
        try {
            for (int budget = 0; open_; ++budget) {
                const int ev = sock_.get(zmq::sockopt::events);
                if ((ev & ZMQ_POLLOUT) && single) single->write_wake.cancel();
                if (!(ev & ZMQ_POLLIN)) return true;
                if (buffered_ >= max_buffered_bytes) {
                    stalled_ = true;  // readers resume us through consumed()
                    return true;
                }
                if (budget == 256) return false;
                receive_one();
            }
        } catch (const zmq::error_t& e) {
            fail_all(std::error_code(e.num(), std::generic_category()), e.what());
        }
        return true;
    }

    void receive_one() {
        std::string id;
        if (router_) {
            zmq::message_t idm;
            if (!sock_.recv(idm, zmq::recv_flags::dontwait)) return;
            id = idm.to_string();
        }
        zmq::message_t first;
        if (!sock_.recv(first, zmq::recv_flags::dontwait)) return;
        std::string control;
        if (first.more()) {
            control = first.to_string();
            zmq::message_t rest;
            do {
                if (!sock_.recv(rest, zmq::recv_flags::dontwait)) break;
            } while (rest.more());
        }
        std::shared_ptr<zconn> c = router_ ? find_or_accept(id, first, control) : single;
        if (!c || c->closed) return;
        c->heard = true;
        if (!control.empty() || first.more()) {
            if (control == "hello") return;
            if (control == "eof") c->eof = true;
            else if (control == "reset") c->lose(net::error::connection_reset);
            else return;  // probe, or a control message from a newer ordo
            c->read_wake.cancel();
            return;
        }
        if (first.size() == 0) return;
        if (c->fd < 0) c->fd = ::zmq_msg_get(first.handle(), ZMQ_SRCFD);
        buffered_ += first.size();
        c->in.push_back(std::move(first));
        c->read_wake.cancel();
    }

    std::shared_ptr<zconn> find_or_accept(const std::string& id, zmq::message_t& first,
                                          const std::string& control) {
        if (auto it = conns_.find(id); it != conns_.end()) return it->second;
        if (tomb_set_.count(id) || (!control.empty() && control != "hello")) return nullptr;
        auto c = std::make_shared<zconn>(ex_);
        c->id = id;
        c->fd = ::zmq_msg_get(first.handle(), ZMQ_SRCFD);
        const char* peer = ::zmq_msg_gets(first.handle(), "Peer-Address");
        c->remote = local + "#" + std::to_string(++accepted_) +
                    (peer && *peer ? std::string(" (") + peer + ")" : std::string());
        if (!listening || unaccepted.size() >= max_unaccepted) {
            send_control(*c, "reset");
            tomb_set_.insert(id);
            tombstones_.push_back(id);
            return nullptr;
        }
        conns_.emplace(id, c);
        unaccepted.push_back(c);
        accept_wake.cancel();
        return c;
    }

    void fail_all(std::error_code ec, const std::string& detail) {
        for (auto& [id, c] : conns_) {
            c->error_detail = detail;
            c->lose(ec);
        }
        if (single) {
            single->error_detail = detail;
            single->lose(ec);
        }
    }

    static net::awaitable<void> monitor_pump(std::shared_ptr<zsock> self) {
        while (self->open_) {
            self->drain_monitor();
            if (!self->open_) break;
            co_await self->mon_fd_.async_wait(net::posix::descriptor_base::wait_read, use_tuple);
        }
    }

    void drain_monitor() {
        try {
            while (open_ && (mon_.get(zmq::sockopt::events) & ZMQ_POLLIN)) {
                zmq::message_t ev, where;
                if (!mon_.recv(ev, zmq::recv_flags::dontwait)) break;
                if (ev.more()) (void)mon_.recv(where, zmq::recv_flags::dontwait);
                if (ev.size() < 6) continue;
                std::uint16_t event = 0;
                std::int32_t value = 0;
                std::memcpy(&event, ev.data(), 2);
                std::memcpy(&value, static_cast<const char*>(ev.data()) + 2, 4);
                on_event(event, value);
            }
        } catch (const zmq::error_t&) {
        }
    }

    void on_event(std::uint16_t event, std::int32_t value) {
        // Messages that arrived before the disconnect are delivered before it.
        while (!drain()) {
        }
        if (!router_) {
            if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
                connected = true;
            } else if (!connected) {
                if (!connect_error) {
                    connect_error = event == ZMQ_EVENT_CONNECT_RETRIED || event == ZMQ_EVENT_CLOSED
                                        ? net::error::connection_refused
                                        : std::error_code(errc::protocol_error);
                    connect_detail = event == ZMQ_EVENT_CONNECT_RETRIED || event == ZMQ_EVENT_CLOSED
                                         ? "Connection refused"
                                         : "ZeroMQ handshake failed";
                }
            } else if (event == ZMQ_EVENT_DISCONNECTED && single) {
                single->error_detail = "ZeroMQ reports the connection lost";
                single->lose(net::error::connection_reset);
            }
            connect_wake.cancel();
            return;
        }
        // A file descriptor closed: probe the routing ids that came through it (it may already
        // serve a newer connection, which the probe finds alive), now and once ZeroMQ has had
        // time to drop the pipe.
        probe(value, false);
        schedule_sweep(std::chrono::milliseconds(20), value);
    }

    void probe(int fd, bool silent_only) {
        std::vector<std::shared_ptr<zconn>> gone;
        std::vector<std::shared_ptr<zconn>> candidates;
        for (auto& [id, c] : conns_) {
            if (c->closed || c->error) continue;
            if (silent_only ? !c->heard : (c->fd == fd || c->fd < 0)) candidates.push_back(c);
            c->heard = false;
        }
        for (auto& c : candidates) {
            // A full queue is not a gone peer; only an unroutable id is.
            send_control(*c, "probe");
            if (c->error) c->error_detail = "ZeroMQ reports the peer disconnected";
        }
    }

    void schedule_sweep(std::chrono::milliseconds after, int fd = -2) {
        auto w = weak_from_this();
        auto t = std::make_shared<net::steady_timer>(ex_, after);
        t->async_wait([w, t, fd, after](std::error_code ec) {
            auto self = w.lock();
            if (ec || !self || !self->open_) return;
            if (fd == -2) {
                self->probe(-1, true);
                self->schedule_sweep(after);
            } else {
                self->probe(fd, false);
                if (after < std::chrono::milliseconds(1000))
                    self->schedule_sweep(after * 5, fd);
            }
        });
    }

    net::any_io_executor ex_;
    const bool router_;
    zmq_options o_;
    zmq::socket_t sock_;
    zmq::socket_t mon_;
    net::posix::stream_descriptor fd_;
    net::posix::stream_descriptor mon_fd_;
    net::steady_timer sweep_;
    std::map<std::string, std::shared_ptr<zconn>> conns_;
    std::deque<std::string> tombstones_;
    std::set<std::string> tomb_set_;
    std::size_t buffered_ = 0;
    bool stalled_ = false;
    bool open_ = true;
    std::uint64_t accepted_ = 0;
};

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
            // tcp://127.0.0.1:41234 (the port ZeroMQ picked for "*")
            const std::string ep = s_->socket().get(zmq::sockopt::last_endpoint);
            bound.port = static_cast<std::uint16_t>(std::stoi(ep.substr(ep.rfind(':') + 1)));
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
        try {
            o.heartbeat = std::chrono::milliseconds(std::stoul(*v));
        } catch (const std::exception&) {
            throw_error(errc::bad_address, "ordo: invalid address \"" + a.to_string() +
                                               "\": zmq_heartbeat_ms must be a number");
        }
    }
    return o;
}

}  // namespace

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
