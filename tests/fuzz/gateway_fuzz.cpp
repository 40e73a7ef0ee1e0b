// Fuzz target 5: the HTTP gateway's body -> JSON -> msgpack path (json_codec::params_from_body),
// with small limits so that short inputs reach each of them. The input is a request body. It is
// refused (bad_json, over_limit) or becomes params; then the request made of them must be one a
// server with the same limits accepts (decode_message does not throw): a body the gateway lets
// through must never make the server close the connection that every HTTP client shares. Any
// other outcome (a crash, another exception, a leak, a hang, a refused request) is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>

#include "json/json_codec.hpp"
#include "ordo/rpc/codec.hpp"
#include "ordo/rpc/detail/message_heads.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string_view body(reinterpret_cast<const char*>(data), size);
    ordo::limits l;
    l.max_message_bytes = 1 << 20;
    l.max_string_bytes = 64;
    l.max_container_length = 16;
    l.max_depth = 8;
    l.max_objects = 128;
    ordo::detail::params_buffer params;
    try {
        params = ordo::json_codec::params_from_body(body, l);
    } catch (const ordo::json_codec::over_limit&) {
        return 0;
    } catch (const ordo::json_codec::bad_json&) {
        return 0;
    }
    std::string message(ordo::detail::request_head(7, "echo"));
    message.append(params.data(), params.size());
    try {
        // As a server reads it: cut from the stream (framer limits), then decoded.
        ordo::decoder d(l);
        d.feed(message);
        const auto m = d.next();
        if (!m) throw std::runtime_error("not one whole message");
        (void)ordo::decode_message(message, l);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "the gateway let through a body the server refuses: %s\n", e.what());
        std::abort();
    }
    return 0;
}
