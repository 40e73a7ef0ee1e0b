// JSON <-> msgpack for the HTTP gateway and the ordo command (tools/ordo.cpp), on nlohmann-json.
//
// JSON to msgpack: null, bool, integers (non-negative ones as unsigned, so the whole uint64 range
// survives), doubles, strings (str), arrays, objects (maps with str keys), binary (bin).
// msgpack to JSON: bin is a string when it is valid UTF-8, else an array of byte values; ext is
// {"ext": type, "data": [bytes]}; a map key that is not a string becomes its JSON text.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "ordo/rpc/detail/params_buffer.hpp"
#include "ordo/rpc/detail/msgpack_core.hpp"
#include "ordo/limits.hpp"

namespace ordo::json_codec {

using json = nlohmann::json;

/// A value that `limits` refuses: its what() names the limit and the value found.
struct over_limit : std::length_error {
    using std::length_error::length_error;
};

/// Appends `j` to `out` as one msgpack value, without recursion, within `l` (what a server
/// with those limits accepts): nesting `depth` deep already (the containers around it), it may
/// nest at most l.max_depth in all, no container may hold more than l.max_container_length,
/// no string more than l.max_string_bytes, and it may hold at most l.max_objects msgpack
/// objects (map keys count, and pack_params counts the message's own four).
/// Throws over_limit, with `out` then holding part of the value.
void pack(detail::params_buffer& out, const json& j, const limits& l = {}, std::size_t depth = 0);
/// `params` (a JSON array) as a msgpack params array, to travel inside a message (one more
/// level), within `l`: throws over_limit.
detail::params_buffer pack_params(const json& params, const limits& l = {});
/// How deep JSON text nests ([ and { outside strings), read without parsing, so that a body
/// too deep for the parser and the tree it builds is refused first. Stops counting past
/// `limit` (and returns limit + 1). Text that is not JSON gives some count; the parser
/// refuses it later.
std::size_t nesting_depth(std::string_view text, std::size_t limit);
/// A body that is not JSON: what() says where and what.
struct bad_json : std::invalid_argument {
    using std::invalid_argument::invalid_argument;
};

/// An HTTP body as the params of a request: a JSON array is the params, any other value the
/// only param, blank text none. Refused before anything reaches a server that has limits `l`:
/// over_limit (too deep, read before parsing, so that neither the parser nor the tree pays
/// for a body nested a hundred thousand deep; a container, string or value count over `l`),
/// bad_json. Whatever it returns, sent as a request's params, that server accepts.
detail::params_buffer params_from_body(std::string_view body, const limits& l);
/// `o` as JSON (see the header's comment for bin, ext and map keys).
json to_json(const msgpack::object& o);
/// to_json(o) as compact text; bytes of a str that are not UTF-8 are replaced (U+FFFD).
std::string dump(const msgpack::object& o);

}  // namespace ordo::json_codec
