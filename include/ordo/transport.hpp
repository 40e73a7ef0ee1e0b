// One interface over the byte transports, selected by URL scheme (DESIGN.md section 8).
// So far: tcp://host:port and unix:///path. Nothing here knows about msgpack-rpc.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>

#include "ordo/address.hpp"
#include "ordo/net.hpp"

namespace ordo {

/// One connected, bidirectional byte stream. Belongs to the executor it was made on; every
/// member is called from that executor. At most one read and one write may be pending at a time.
class transport {
  public:
    virtual ~transport();
    transport(const transport&) = delete;
    transport& operator=(const transport&) = delete;

    /// Reads at least one byte into `b`. On failure sets `ec` (net::error::eof at end of stream)
    /// and returns 0.
    virtual net::awaitable<std::size_t> async_read_some(net::mutable_buffer b,
                                                        std::error_code& ec) = 0;
    /// Writes all of `b` in one gather write. On failure sets `ec` and returns how many bytes
    /// were handed to the kernel before it: those may reach the peer, the rest will not.
    virtual net::awaitable<std::size_t> async_write(net::const_buffer b, std::error_code& ec) = 0;
    /// Ends the sending direction after what was written (the peer reads end of stream).
    virtual void shutdown_send() noexcept = 0;
    /// Closes at once; pending operations complete with net::error::operation_aborted.
    virtual void close() noexcept = 0;
    /// Closes at once and, for tcp, makes the peer see a reset rather than an end of stream.
    virtual void reset() noexcept { close(); }
    /// The second line of dead-peer detection, below ordo's own probing: for tcp, keepalive
    /// probes after `liveness` of silence (at least 1 s) and TCP_USER_TIMEOUT, so that data
    /// left unacknowledged for 2 x liveness (at least 2 s) ends the connection. No-op elsewhere.
    virtual void set_liveness(std::chrono::milliseconds liveness) noexcept { (void)liveness; }

    /// The peer's address as a URL ("tcp://127.0.0.1:41234", "unix:///run/app.sock").
    const std::string& remote_address() const noexcept { return remote_; }
    virtual net::any_io_executor get_executor() = 0;

  protected:
    explicit transport(std::string remote) : remote_(std::move(remote)) {}

  private:
    std::string remote_;
};

/// A bound, listening endpoint.
class listener {
  public:
    virtual ~listener();
    listener(const listener&) = delete;
    listener& operator=(const listener&) = delete;

    /// Waits for the next connection. Throws std::system_error when the listener is closed
    /// (net::error::operation_aborted) or accepting fails.
    virtual net::awaitable<std::unique_ptr<transport>> async_accept() = 0;
    /// Stops listening; a pending async_accept fails with operation_aborted. A unix listener
    /// removes its socket file.
    virtual void close() noexcept = 0;
    /// The bound address as a URL; for tcp with port 0 it holds the port the system chose.
    const std::string& local_address() const noexcept { return local_; }

  protected:
    listener() = default;
    std::string local_;
};

/// Connects to `url` (tcp:// or unix://). TCP connections get TCP_NODELAY. Throws
/// std::system_error naming the address and the reason (errc::bad_address for a bad URL).
net::awaitable<std::unique_ptr<transport>> async_connect_transport(std::string_view url);

/// Binds and listens on `url` with the executor `ex`. tcp:// reuses the address; unix:// removes
/// a stale socket file first (one that refuses connections). Throws std::system_error naming
/// the address and the reason.
std::unique_ptr<listener> listen(const net::any_io_executor& ex, std::string_view url);

}  // namespace ordo
