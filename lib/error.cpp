#include "ordo/error.hpp"

namespace ordo {
namespace {

class category final : public std::error_category {
  public:
    const char* name() const noexcept override { return "ordo"; }
    std::string message(int value) const override { return to_string(static_cast<errc>(value)); }
};

}  // namespace

const std::error_category& error_category() noexcept {
    static const category instance;
    return instance;
}

const char* to_string(errc e) noexcept {
    switch (e) {
        case errc::peer_lost: return "peer lost";
        case errc::timed_out: return "timed out";
        case errc::cancelled: return "cancelled";
        case errc::protocol_error: return "protocol error";
        case errc::method_not_found: return "method not found";
        case errc::bad_arguments: return "bad arguments";
        case errc::remote_error: return "remote error";
        case errc::overloaded: return "overloaded";
        case errc::shutting_down: return "shutting down";
        case errc::closed: return "closed";
        case errc::bad_address: return "bad address";
        case errc::bad_result: return "bad result";
        case errc::session_lost: return "session lost";
        case errc::unauthenticated: return "unauthenticated";
        case errc::permission_denied: return "permission denied";
    }
    return "unknown ordo error";
}

void throw_error(errc code, const std::string& what) {
    throw rpc_error(make_error_code(code), {}, {}, what);
}

namespace {
std::string describe(const std::error_code& code, const std::string& method,
                     const std::string& peer, const std::string& detail) {
    // No method: opening a connection failed. The detail (the OS's or ordo's reason) says it
    // better than the code's words: "connect to tcp://127.0.0.1:1 failed: connection refused".
    // Neither: a local failure (throw_error); it reads as std::system_error's would.
    if (method.empty() && peer.empty()) return detail + ": " + code.message();
    if (method.empty())
        return "ordo: connect to " + peer +
               " failed: " + (detail.empty() ? code.message() : detail);
    std::string s = "ordo: call " + method + " to " + peer + " failed: " + code.message();
    if (!detail.empty() && detail != code.message()) s += " (" + detail + ")";
    return s;
}
}  // namespace

rpc_error::rpc_error(std::error_code code, std::string method, std::string peer, std::string detail,
                     std::chrono::milliseconds retry_after)
    : std::system_error(code),
      method_(std::move(method)),
      peer_(std::move(peer)),
      detail_(std::move(detail)),
      text_(describe(code, method_, peer_, detail_)),
      retry_after_(retry_after) {}

}  // namespace ordo
