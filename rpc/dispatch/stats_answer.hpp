// The answer to ordo.stats (docs/protocol.md, "Reserved methods").
#pragma once

#include "ordo/rpc/codec.hpp"

namespace ordo {
class handlers;
struct server_stats;
namespace detail {

/// Packs the result of ordo.stats: {"server": {...} (when the handlers belong to a server),
/// "unknown_requests": n, "unknown_notifications": n, "methods": {...}, "batches": {...}}.
/// `server`: the server's figures, or null.
void pack_stats(buffer& out, const handlers& h, const server_stats* server);

/// Packs the whole response to ordo.methods: {name: "(parameter types)"} for every method
/// served, in name order.
void pack_methods_answer(buffer& out, std::uint32_t msgid, const handlers& h);

}  // namespace detail
}  // namespace ordo
