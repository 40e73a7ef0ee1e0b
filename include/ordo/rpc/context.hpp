// call_context: what a call carries besides its arguments (its deadline and metadata), as its
// handler reads it (docs/protocol.md, "Call context").
#pragma once

#include "ordo/config.hpp"

#include <chrono>
#include <string>
#include <string_view>

#include "ordo/rpc/call.hpp"

namespace ordo {

/// The context of one incoming call. A handler reads its own with ordo::current_context().
struct call_context {
    using clock = std::chrono::steady_clock;
    /// When the caller stops waiting, on this process's clock: the time the call arrived plus
    /// the time the caller had left when it sent it. time_point::max(): no deadline.
    clock::time_point deadline = clock::time_point::max();
    /// The caller's call_options::metadata, in the order sent (reserved "ordo-" keys left out).
    ordo::metadata metadata;

    bool has_deadline() const noexcept { return deadline != clock::time_point::max(); }
    /// What is left until the deadline (0 once it has passed; milliseconds::max() without one).
    std::chrono::milliseconds time_left() const noexcept;
    /// The value of `key`, or null.
    const std::string* find(std::string_view key) const noexcept;
};

/// The context of the call whose handler is running on this thread: inside a plain handler while
/// it runs, and inside a coroutine handler every time it runs (it follows the coroutine across
/// its co_awaits). Null outside a handler, and for a call that carried no context (no deadline,
/// no metadata). A call made while it is set and without a timeout of its own takes what is
/// left of this deadline (docs/protocol.md, "Call context").
const call_context* current_context() noexcept;

}  // namespace ordo
