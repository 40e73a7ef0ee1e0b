// Bounds on what ordo accepts from the network. Every incoming byte stream is checked against
// them before anything is allocated for it; a violation is a protocol error that closes the
// connection (docs/protocol.md, "Limits").
#pragma once

#include "ordo/config.hpp"

#include <cstddef>

namespace ordo {

struct limits {
    /// Largest message (one msgpack object), in bytes. A length header that announces more is
    /// refused at once, without waiting for or buffering the announced bytes.
    std::size_t max_message_bytes = std::size_t{128} << 20;
    /// Largest str, bin or ext payload, in bytes.
    std::size_t max_string_bytes = std::size_t{128} << 20;
    /// Most entries in one array, or pairs in one map.
    std::size_t max_container_length = std::size_t{1} << 20;
    /// Deepest nesting of arrays and maps (the outer array of a message is depth 1).
    std::size_t max_depth = 64;
    /// Most msgpack objects in one message. Decoding costs about 24 bytes of memory per object,
    /// so this bounds the decoded size of a message as max_message_bytes bounds its wire size.
    std::size_t max_objects = std::size_t{1} << 22;
    /// Most lanes with a message in the making (in pieces) at once on one connection
    /// (docs/protocol.md, "Lanes").
    std::size_t max_lanes = 64;
    /// Most pairs in one call's metadata (docs/protocol.md, "Call context").
    std::size_t max_metadata_entries = 64;
    /// Most bytes of one call's metadata, its keys and values together.
    std::size_t max_metadata_bytes = std::size_t{16} << 10;
};

}  // namespace ordo
