// JSON <-> msgpack for the HTTP gateway and the ordo command (tools/ordo.cpp), on nlohmann-json.
//
// JSON to msgpack: null, bool, integers (non-negative ones as unsigned, so the whole uint64 range
// survives), doubles, strings (str), arrays, objects (maps with str keys), binary (bin).
// msgpack to JSON: bin is a string when it is valid UTF-8, else an array of byte values; ext is
// {"ext": type, "data": [bytes]}; a map key that is not a string becomes its JSON text.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "ordo/detail/params_buffer.hpp"
#include "ordo/detail/msgpack_core.hpp"

namespace ordo::json_codec {

using json = nlohmann::json;

/// Appends `j` to `out` as one msgpack value.
void pack(detail::params_buffer& out, const json& j);
/// `params` (a JSON array) as a msgpack params array.
detail::params_buffer pack_params(const json& params);
/// `o` as JSON (see the header's comment for bin, ext and map keys).
json to_json(const msgpack::object& o);
/// to_json(o) as compact text; bytes of a str that are not UTF-8 are replaced (U+FFFD).
std::string dump(const msgpack::object& o);

}  // namespace ordo::json_codec
