// ordo's one error vocabulary: ordo::errc values with their error_category. The numeric values are
// also the "code" field of error maps on the wire (docs/protocol.md), so they never change.
#pragma once

#include "ordo/config.hpp"

#include <chrono>
#include <string>
#include <system_error>

namespace ordo {

enum class errc {
    peer_lost = 1,         ///< connection ended (EOF, reset), could not be opened, or the peer
                           ///< stopped answering
    timed_out = 2,         ///< a deadline passed
    cancelled = 3,         ///< the operation was cancelled (locally, or by ordo.cancel remotely)
    protocol_error = 4,    ///< malformed input or a broken limit: the connection is closed
    method_not_found = 5,  ///< no handler for that method name
    bad_arguments = 6,     ///< the arguments do not convert to the handler's signature
    remote_error = 7,      ///< the remote handler failed (threw); the message says why
    overloaded = 8,        ///< a buffer or queue limit was reached; nothing was taken
    shutting_down = 9,     ///< the server or connection is stopping
    closed = 10,           ///< used after a local close()/abort()
    bad_address = 11,      ///< an address (URL) that cannot be parsed or used
    bad_result = 12,       ///< a response's result does not convert to the caller's type
    session_lost = 13,     ///< a resumable session cannot resume: the other side no longer has it
    unauthenticated = 14,  ///< the server refused the caller (server_options::authenticate): no
                           ///< credentials, or ones it does not accept; the connection closes
    permission_denied = 15,  ///< the caller may not call that method (handler_options::allow)
};

/// The category of ordo::errc; its name is "ordo".
const std::error_category& error_category() noexcept;

inline std::error_code make_error_code(errc e) noexcept {
    return {static_cast<int>(e), error_category()};
}

/// Short lowercase words for a code ("peer lost", "protocol error"), as used in messages.
const char* to_string(errc e) noexcept;

/// Throws ordo::rpc_error(code) with no method or peer; what() is `what` followed by ": " and
/// the code's words, as std::system_error(code, what) would read. Out of line so that throw
/// sites stay small.
[[noreturn]] void throw_error(errc code, const std::string& what);

/// A failed call, as coroutine APIs throw it: the code (an ordo::errc where ordo knows it), the
/// method, the peer's address and the detail (the remote error message, or what went wrong
/// locally). what() reads like
/// `ordo: call inc to tcp://127.0.0.1:7000 failed: peer lost (connection reset by peer)`.
/// A failed connect (async_connect, a pool opening a connection) has an empty method and reads
/// `ordo: connect to tcp://127.0.0.1:1 failed: connection refused`.
class rpc_error : public std::system_error {
  public:
    rpc_error(std::error_code code, std::string method, std::string peer, std::string detail,
              std::chrono::milliseconds retry_after = {});

    const std::string& method() const noexcept { return method_; }
    const std::string& peer() const noexcept { return peer_; }
    const std::string& detail() const noexcept { return detail_; }
    /// For errc::overloaded: how long the server asked its callers to wait before trying
    /// again (its error map's retry_after_ms, docs/protocol.md "Error objects"); 0 when it gave
    /// no hint (a router's full queue, or a server that is not ordo).
    std::chrono::milliseconds retry_after() const noexcept { return retry_after_; }
    const char* what() const noexcept override { return text_.c_str(); }

  private:
    std::string method_, peer_, detail_, text_;
    std::chrono::milliseconds retry_after_{0};
};

}  // namespace ordo

template <>
struct std::is_error_code_enum<ordo::errc> : std::true_type {};
