// The answer to ordo.stats (docs/protocol.md, "Reserved methods").
#pragma once

#include "ordo/codec.hpp"

namespace ordo {
class handlers;
namespace detail {

/// Packs the result of ordo.stats: {"server": {...} (when the handlers belong to a server),
/// "unknown_requests": n, "unknown_notifications": n, "methods": {...}, "batches": {...}}.
void pack_stats(buffer& out, const handlers& h);

}  // namespace detail
}  // namespace ordo
