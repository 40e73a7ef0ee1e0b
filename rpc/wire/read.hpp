// Private to rpc/wire/codec.cpp and rpc/wire/read.cpp: reading msgpack-rpc from untrusted bytes.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "ordo/rpc/codec.hpp"
#include "ordo/error.hpp"

namespace ordo::detail {

/// Throws errc::protocol_error reading "ordo: protocol error: <what>".
[[noreturn]] inline void bad(const std::string& what) {
    throw_error(errc::protocol_error, "ordo: protocol error: " + what);
}

/// One msgpack object from `bytes` (all of them), within every limit, its arrays and maps in
/// `zone`; str, bin and ext payloads copied there, or, with `borrow`, pointing into `bytes`.
msgpack::object unpack_checked(std::string_view bytes, const limits& l, msgpack::zone& zone,
                               bool borrow);

/// Checks a request's context (message::meta, a map) against docs/protocol.md "Call context"
/// and `l`: str keys, str or bin values (unsigned for reserved "ordo-" keys), within
/// max_metadata_entries and max_metadata_bytes. Throws errc::protocol_error saying what is wrong.
/// (rpc/wire/codec.cpp)
void check_context(const message& m, const limits& l);

/// The envelope read by hand (wire_read.cpp says which); 0 when the general way must decode it.
/// `whole`: `bytes` is one message; else a message starts at `bytes` (decode_prefix).
std::size_t decode_envelope(std::string_view bytes, const limits& l, msgpack::zone& z,
                            message& m, bool whole);

}  // namespace ordo::detail
