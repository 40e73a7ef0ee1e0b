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
    }
    return "unknown ordo error";
}

void throw_error(errc code, const std::string& what) {
    throw std::system_error(make_error_code(code), what);
}

}  // namespace ordo
