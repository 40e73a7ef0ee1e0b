// Private: a ZeroMQ socket driven by the Asio event loop through its ZMQ_FD descriptor, and the
// connections it carries. comm/zmq.cpp builds the transports and the listener on it and makes
// the protocol's choices (socket options, which monitor events matter); comm/zmq_socket.cpp is
// the Asio side: descriptor readiness, the receive and monitor pumps, probing for gone peers.
//
// ZMQ_FD only says "ZMQ_EVENTS may have changed", edge-triggered: after every send or receive we
// re-read ZMQ_EVENTS and drain until it reports nothing, or the edge is lost and the loop stalls.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <zmq.hpp>

#include <asio/posix/stream_descriptor.hpp>

#include "ordo/comm/transport.hpp"

namespace ordo::detail {

/// The largest data frame: a batch larger than this is sent as several frames (pieces).
inline constexpr std::size_t max_piece_bytes = std::size_t{1} << 20;

/// The process's ZeroMQ context. Never terminated (zmq_ctx_term waits for every socket, and a
/// process must be able to exit with connections open); a forked child gets its own.
zmq::context_t& zmq_context();

/// Sets the options ordo relies on (high water marks, frame size limit, heartbeats; ROUTER:
/// mandatory routing; DEALER: no reconnection) on a fresh socket. Defined in comm/zmq.cpp.
void set_socket_options(zmq::socket_t& s, bool router, const zmq_options& o);

/// The socket monitor events ordo acts on (ZMQ_EVENT_* bits). Defined in comm/zmq.cpp.
int monitor_events(bool router);

/// One connection as one socket sees it. Belongs to the socket's executor.
struct zconn {
    explicit zconn(const net::any_io_executor& ex)
        : read_wake(ex, std::chrono::steady_clock::time_point::max()),
          write_wake(ex, std::chrono::steady_clock::time_point::max()) {}
    std::string id;  ///< routing id (ROUTER side only)
    std::string remote;
    std::deque<zmq::message_t> in;
    std::size_t head = 0;  ///< bytes of in.front() already read
    bool eof = false;      ///< the peer ended its direction
    bool out_ended = false;
    bool closed = false;  ///< closed by this side
    std::error_code error;
    std::string error_detail;
    int fd = -1;
    bool heard = false;  ///< received something since the last probe sweep
    net::steady_timer read_wake;
    net::steady_timer write_wake;

    /// Records the first error and wakes the reader and the writer.
    void lose(std::error_code ec) {
        if (!error) error = ec;
        read_wake.cancel();
        write_wake.cancel();
    }
};

/// A ZeroMQ socket on an Asio executor, shared by the transports (and listener) using it. A
/// ROUTER (listening side) carries many connections, a DEALER (connecting side) one: `single`.
/// Every member is called from the executor it was made with.
class zsock : public std::enable_shared_from_this<zsock> {
  public:
    /// Opens the socket with its options and its monitor. Throws zmq::error_t.
    zsock(const net::any_io_executor& ex, zmq::socket_type type, const zmq_options& o);
    ~zsock();

    /// Starts the receive and monitor pumps (and, on a ROUTER with heartbeats, the probe sweeps).
    /// They hold the socket alive until shut().
    void start();

    /// Stops the pumps and closes the socket (after linger, queued messages still go out).
    void shut();

    bool open() const { return open_; }
    zmq::socket_t& socket() { return sock_; }
    net::any_io_executor executor() const { return ex_; }

    /// Sends one frame to `c`. True when sent; false when ZeroMQ's queue is full (try later).
    /// A gone peer (or a closed socket) marks `c` lost and returns false.
    bool send(zconn& c, zmq::message_t& m, bool more = false);

    /// Sends the two-frame control message [code, ""] to `c`; false as for send().
    bool send_control(zconn& c, std::string_view code);

    /// Called by readers after taking bytes: reading resumes below the buffer limit.
    void consumed(std::size_t n);

    /// Drops a closed connection; its routing id is not accepted again.
    void forget(const std::shared_ptr<zconn>& c);

    // Listener side.
    std::deque<std::shared_ptr<zconn>> unaccepted;
    net::steady_timer accept_wake;
    bool listening = false;
    std::string local;
    /// Resets the connections not yet accepted; the socket closes with its last connection.
    void stop_listening();

    // Connecting side.
    std::shared_ptr<zconn> single;
    net::steady_timer connect_wake;
    bool connected = false;
    std::error_code connect_error;
    std::string connect_detail;

  private:
    void kick();
    void maybe_finish();
    static net::awaitable<void> pump(std::shared_ptr<zsock> self);
    bool drain();
    void receive_one();
    std::shared_ptr<zconn> find_or_accept(const std::string& id, zmq::message_t& first,
                                          const std::string& control);
    void fail_all(std::error_code ec, const std::string& detail);
    static net::awaitable<void> monitor_pump(std::shared_ptr<zsock> self);
    void drain_monitor();
    void on_event(std::uint16_t event, std::int32_t value);
    void probe(int fd, bool silent_only);
    void schedule_sweep(std::chrono::milliseconds after, int fd = -2);

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

}  // namespace ordo::detail
