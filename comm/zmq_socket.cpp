// The Asio side of the ZeroMQ transports: a zsock turns descriptor readiness into receives, sends
// without blocking, follows the socket monitor and probes routing ids that may be gone. What goes
// on the wire, and why, is said at the top of comm/zmq.cpp.
#include "comm/detail/zmq_socket.hpp"

#include <unistd.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <vector>

#include "lib/escaped.hpp"
#include "ordo/error.hpp"

namespace ordo::detail {
namespace {

constexpr std::size_t max_buffered_bytes = std::size_t{64} << 20;  // per socket, not yet read
constexpr std::size_t max_unaccepted = 4096;
constexpr std::size_t max_tombstones = 65536;

}  // namespace

zmq::context_t& zmq_context() {
    // A forked child cannot use its parent's context (its I/O thread did not come along): it
    // makes its own.
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

zsock::zsock(const net::any_io_executor& ex, zmq::socket_type type, const zmq_options& o)
    : accept_wake(ex, std::chrono::steady_clock::time_point::max()),
      connect_wake(ex, std::chrono::steady_clock::time_point::max()),
      ex_(ex),
      router_(type == zmq::socket_type::router),
      o_(o),
      sock_(zmq_context(), type),
      fd_(ex),
      mon_fd_(ex),
      sweep_(ex) {
    static std::atomic<unsigned> monitors{0};
    set_socket_options(sock_, router_, o);
    const std::string mon = "inproc://ordo-zmq-monitor-" + std::to_string(::getpid()) + "-" +
                            std::to_string(monitors++);
    if (::zmq_socket_monitor(sock_.handle(), mon.c_str(), monitor_events(router_)) != 0)
        throw zmq::error_t();
    mon_ = zmq::socket_t(zmq_context(), zmq::socket_type::pair);
    mon_.set(zmq::sockopt::linger, 0);
    mon_.connect(mon);
    fd_.assign(sock_.get(zmq::sockopt::fd));
    mon_fd_.assign(mon_.get(zmq::sockopt::fd));
}

zsock::~zsock() {
    shut();
}

void zsock::start() {
    auto self = shared_from_this();
    net::co_spawn(ex_, pump(self), detail::rethrow_escaped{});
    net::co_spawn(ex_, monitor_pump(self), detail::rethrow_escaped{});
    if (router_ && o_.heartbeat.count() > 0) schedule_sweep(o_.heartbeat);
}

void zsock::shut() {
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

bool zsock::send(zconn& c, zmq::message_t& m, bool more) {
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

bool zsock::send_control(zconn& c, std::string_view code) {
    zmq::message_t head(code.data(), code.size());
    zmq::message_t empty;
    if (!send(c, head, true)) return false;
    return send(c, empty);
}

void zsock::consumed(std::size_t n) {
    buffered_ -= n;
    if (stalled_ && buffered_ < max_buffered_bytes / 2) {
        stalled_ = false;
        kick();
    }
}

void zsock::forget(const std::shared_ptr<zconn>& c) {
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

void zsock::stop_listening() {
    listening = false;
    for (auto& c : unaccepted) {
        send_control(*c, "reset");
        forget(c);
    }
    unaccepted.clear();
    accept_wake.cancel();
    maybe_finish();
}

void zsock::kick() {
    std::error_code ignored;
    fd_.cancel(ignored);
}

// The listening socket goes away with its listener and last connection.
void zsock::maybe_finish() {
    if (router_ && !listening && conns_.empty()) shut();
}

net::awaitable<void> zsock::pump(std::shared_ptr<zsock> self) {
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
bool zsock::drain() {
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

void zsock::receive_one() {
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

std::shared_ptr<zconn> zsock::find_or_accept(const std::string& id, zmq::message_t& first,
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

void zsock::fail_all(std::error_code ec, const std::string& detail) {
    for (auto& [id, c] : conns_) {
        c->error_detail = detail;
        c->lose(ec);
    }
    if (single) {
        single->error_detail = detail;
        single->lose(ec);
    }
}

net::awaitable<void> zsock::monitor_pump(std::shared_ptr<zsock> self) {
    while (self->open_) {
        self->drain_monitor();
        if (!self->open_) break;
        co_await self->mon_fd_.async_wait(net::posix::descriptor_base::wait_read, use_tuple);
    }
}

void zsock::drain_monitor() {
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

void zsock::on_event(std::uint16_t event, std::int32_t value) {
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

void zsock::probe(int fd, bool silent_only) {
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

void zsock::schedule_sweep(std::chrono::milliseconds after, int fd) {
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
            if (after < std::chrono::milliseconds(1000)) self->schedule_sweep(after * 5, fd);
        }
    });
}

}  // namespace ordo::detail
