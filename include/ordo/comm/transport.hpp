// One interface over the byte transports, selected by URL scheme (docs/calls-and-channels.md,
// "Transports"): tcp://host:port, unix:///path, inproc://name, tls://host:port, zmq+tcp://host:port
// and zmq+ipc:///path. Nothing here knows about msgpack-rpc.
#pragma once

#include "ordo/config.hpp"

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <tuple>

#include "ordo/address.hpp"
#include "ordo/identity.hpp"
#include "ordo/net.hpp"

namespace ordo {

/// TLS settings (tls:// addresses). Each can also be given as a URL parameter, which wins:
/// cert=, key=, ca=, verify=none, server_name=, handshake_timeout_ms=.
struct tls_options {
    /// PEM certificate chain and private key. A server needs both; a client gives them for
    /// mutual TLS.
    std::string cert_file;
    std::string key_file;
    /// PEM file of the certificate authorities to trust. A client without one trusts the
    /// system's store. A server with one asks every client for a certificate signed by them
    /// and refuses clients without (mutual TLS).
    std::string ca_file;
    /// Client: verify the server's certificate and that it names the host (server_name, or the
    /// URL's host). Turning it off (verify=none) accepts any server: for tests only.
    bool verify_peer = true;
    std::string server_name;
    /// A connection that has not finished its handshake by then is closed.
    std::chrono::milliseconds handshake_timeout{10'000};
};

/// ZeroMQ settings (zmq+tcp:// and zmq+ipc:// addresses). URL parameter: zmq_heartbeat_ms=.
struct zmq_options {
    /// ZMTP heartbeats: a PING every interval; a connection silent for 3 intervals is dropped
    /// and its transport fails. 0 turns them off (ordo's own liveness still applies).
    std::chrono::milliseconds heartbeat{1000};
    /// ZeroMQ's send and receive high water marks, in messages (one message per batch).
    int high_water_mark = 1000;
};

/// Options for every transport; each part applies to its own schemes.
struct transport_options {
    tls_options tls;
    zmq_options zmq;
    /// inproc: bytes one direction holds before the writer waits (like a socket buffer).
    std::size_t inproc_buffer_bytes = 4 << 20;
    /// Called with a message for connections that fail before they become transports (a TLS
    /// handshake that fails or times out, a plaintext client on a TLS port). Listener side.
    std::function<void(const std::string&)> on_refused;
};

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
    /// Writes what the kernel takes of `b` at once, without waiting: returns the bytes written,
    /// 0 when it takes none now. On failure sets `ec`. A transport that cannot write without
    /// waiting (this default) sets `ec` to net::error::operation_not_supported and returns 0:
    /// batched_comm then writes with async_write alone. Not called while a write is pending.
    virtual std::size_t try_write(net::const_buffer b, std::error_code& ec) noexcept;
    /// Waits until try_write would take bytes again (after it took only part). A transport
    /// without try_write (this default) gives net::error::operation_not_supported:
    /// batched_comm then finishes the write with async_write. Not called while a write is
    /// pending; try_write may be called while this waits.
    virtual net::awaitable<std::tuple<std::error_code>> async_wait_writable();
    /// Ends the sending direction after what was written (the peer reads end of stream).
    virtual void shutdown_send() noexcept = 0;
    /// Closes at once; pending operations complete with net::error::operation_aborted.
    virtual void close() noexcept = 0;
    /// Closes at once and, for tcp, makes the peer see a reset rather than an end of stream.
    virtual void reset() noexcept { close(); }
    /// The second line of dead-peer detection, for connections with nothing pending (ordo's
    /// own probing covers the others within `liveness`): for tcp, keepalive probes after 6 x
    /// `liveness` of silence plus up to half as much again (spread over the sockets, so that
    /// connections opened together do not probe together), then every `liveness` (whole
    /// seconds, at least 1); three unanswered probes, or data left unacknowledged for as long
    /// (TCP_USER_TIMEOUT), end the connection: after 90-120 s with the default 10 s. No-op
    /// elsewhere.
    virtual void set_liveness(std::chrono::milliseconds liveness) noexcept { (void)liveness; }

    /// Fills in what the transport proves about the other side (identity): for tls:// with a
    /// peer certificate, its subject, subject alternative names and SHA-256; for unix://, the
    /// peer process's uid, gid and pid (SO_PEERCRED). Nothing elsewhere. A resumable session
    /// resumes only over a connection whose peer proves the same certificate.
    virtual void describe(identity& who) const { (void)who; }

    /// The peer's address as a URL ("tcp://127.0.0.1:41234", "unix:///run/app.sock").
    const std::string& remote_address() const noexcept { return remote_; }
    virtual net::any_io_executor get_executor() = 0;

    /// Moves the connection to the executor `ex` (a resumed session's loop, on a server with
    /// several): returns a transport for the same connection that belongs to `ex`, and leaves
    /// this one without it. Called on this transport's executor with no operation pending.
    /// tcp:// and unix:// move their socket; tls:// moves its socket and TLS state, and refuses
    /// (null) while bytes the peer sent are still buffered inside the TLS layer. Null, and this
    /// transport unchanged: it cannot move (inproc://, zmq+: they live on their listener's
    /// executor).
    virtual std::unique_ptr<transport> rehome(const net::any_io_executor& ex);

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
    /// Where later connections live (a server over several event loops sets it): called once
    /// per connection, on the listener's executor, before it is accepted; the transport handed
    /// out belongs to the executor returned (its get_executor()). tcp://, unix:// and tls://
    /// follow it (a TLS handshake runs on the chosen executor); inproc:// and zmq+ connections
    /// stay on the listener's executor.
    virtual void set_placement(std::function<net::any_io_executor()> choose) {
        choose_ = std::move(choose);
    }

  protected:
    listener() = default;
    /// The executor for the next connection: the placement's choice, else `own`.
    net::any_io_executor place(const net::any_io_executor& own) const {
        return choose_ ? choose_() : own;
    }
    std::string local_;

  private:
    std::function<net::any_io_executor()> choose_;
};

/// Connects to `url` with the coroutine's executor. TCP connections get TCP_NODELAY; tls://
/// completes the handshake (with peer verification unless turned off) before returning; inproc://
/// needs a listener of that name in this process. Throws std::system_error naming the address
/// and the reason (errc::bad_address for a bad URL or bad TLS files).
net::awaitable<std::unique_ptr<transport>> async_connect_transport(std::string_view url,
                                                                   transport_options o);
/// The same with default options (an overload, not a default argument: docs/calls-and-channels.md,
/// "GCC 12 note").
net::awaitable<std::unique_ptr<transport>> async_connect_transport(std::string_view url);

/// Binds and listens on `url` with the executor `ex`. tcp:// reuses the address; unix:// and
/// zmq+ipc:// remove a stale socket file first (one that refuses connections); inproc:// names
/// must be unique in the process. Throws std::system_error naming the address and the reason.
std::unique_ptr<listener> listen(const net::any_io_executor& ex, std::string_view url,
                                 const transport_options& o);
std::unique_ptr<listener> listen(const net::any_io_executor& ex, std::string_view url);

/// The URL parameters the transports read (tls and zmq settings), for callers that check
/// parameter names.
bool is_transport_parameter(std::string_view name) noexcept;

}  // namespace ordo
