// The one place where errors cross the wire: what an error object received in a response means
// as an ordo::errc, and what a handler's exception answers. (The encoding of ordo's own error
// object is encode_error_response in codec.hpp.) Both live in rpc/wire/errors.cpp.
#pragma once

#include <string>
#include <system_error>
#include <utility>

#include <msgpack.hpp>

#include "ordo/error.hpp"

namespace ordo::detail {

/// The error object of a response as a code, its text in `detail`. ordo's own {code, message}
/// map keeps its code; anything else from a foreign peer is errc::remote_error with its text:
/// neovim's [type, message] arrays give their message, other values their msgpack text form.
std::error_code error_from_wire(const msgpack::object& e, std::string& detail);

/// What the exception in flight answers (call inside a catch block): ordo's codes keep their
/// code; a cancelled operation is errc::cancelled; anything else is errc::remote_error with the
/// exception's message.
std::pair<errc, std::string> describe_current_exception();

}  // namespace ordo::detail
