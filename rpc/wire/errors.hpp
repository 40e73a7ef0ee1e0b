// The one place where errors cross the wire: what an error object received in a response means
// as an ordo::errc, and what a handler's exception answers. (The encoding of ordo's own error
// object is encode_error_response in codec.hpp.) Both live in rpc/wire/errors.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include <msgpack.hpp>

#include "ordo/error.hpp"
#include "ordo/rpc/codec.hpp"

namespace ordo::detail {

/// The error object of a response as a code, its text in `detail`. ordo's own {code, message}
/// map keeps its code; anything else from a foreign peer is errc::remote_error with its text:
/// neovim's [type, message] arrays give their message, other values their msgpack text form.
/// `over_share`: set from an overloaded answer's over_share key (a caller refused for being over
/// its share, server_options::shares).
std::error_code error_from_wire(const msgpack::object& e, std::string& detail,
                                std::uint32_t* retry_after_ms = nullptr,
                                bool* over_share = nullptr);

/// An errc::overloaded answer that says how long to wait before trying again: ordo's error map
/// with a third key, {"code": 8, "message": text, "retry_after_ms": n}, and a fourth,
/// "over_share": true, for a caller refused because it was over its share of the server
/// (docs/protocol.md, "Overload").
void encode_overloaded_response(buffer& out, std::uint32_t msgid, std::string_view text,
                                std::uint64_t retry_after_ms, bool over_share = false);

/// What the exception in flight answers (call inside a catch block): ordo's codes keep their
/// code; a cancelled operation is errc::cancelled; anything else is errc::remote_error with the
/// exception's message.
std::pair<errc, std::string> describe_current_exception();

}  // namespace ordo::detail
