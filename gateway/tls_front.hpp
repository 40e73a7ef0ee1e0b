// The gateway's HTTPS: ordo's own tls:// listener in front of civetweb, which serves plain HTTP
// on a loopback port of its own. (Debian 12's civetweb loads OpenSSL by name at run time and
// looks for functions OpenSSL 3 no longer exports, so its own HTTPS cannot start.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace ordo::gw {

class tls_front {
  public:
    /// Listens on `tls_url` (tls://HOST:PORT?cert=..&key=..[&ca=..]) on a thread of its own,
    /// and relays each connection, once its handshake is done, to 127.0.0.1:`plain_port`, at
    /// most `max_relays` at once (one more is closed, and said so on `on_event`). Throws
    /// std::system_error (errc::bad_address) naming what is wrong with `tls_url`.
    tls_front(const std::string& tls_url, std::uint16_t plain_port, std::size_t max_relays,
              std::function<void(const std::string&)> on_event);
    /// stop().
    ~tls_front();
    tls_front(const tls_front&) = delete;
    tls_front& operator=(const tls_front&) = delete;
    /// The port bound.
    std::uint16_t port() const noexcept;
    /// Whether a connection to civetweb from 127.0.0.1:`loopback_port` is one of this front's
    /// (any thread). civetweb must serve no other: its port is reachable by local processes.
    bool relays(std::uint16_t loopback_port) const;
    /// Stops listening, closes every relayed connection, ends the thread. Idempotent.
    void stop();

  private:
    struct state;
    std::unique_ptr<state> s_;
};

}  // namespace ordo::gw
