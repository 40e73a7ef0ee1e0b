// call_context: what a call carries besides its arguments (its deadline and metadata), as its
// handler reads it (docs/protocol.md, "Call context").
#pragma once

#include "ordo/config.hpp"

#include <chrono>
#include <cstdint>
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
    /// W3C Trace Context, when the metadata held a well-formed traceparent: the trace id (32
    /// lowercase hex digits), the caller's span (parent_id(), 16) and the trace flags (bit 0:
    /// sampled); span_id() (16) is this handler's own span, drawn as the call arrived. Empty
    /// trace_id(): the call is not traced. (Kept inline: a traced call allocates nothing for
    /// them.)
    std::string_view trace_id() const noexcept { return {ids_, traced_ ? 32u : 0u}; }
    std::string_view parent_id() const noexcept { return {ids_ + 32, traced_ ? 16u : 0u}; }
    std::string_view span_id() const noexcept { return {ids_ + 48, traced_ ? 16u : 0u}; }
    std::uint8_t trace_flags = 0;
    /// Makes the call traced (ordo does, as it reads a traceparent): ids of 32, 16 and 16
    /// lowercase hex digits.
    void set_trace(std::string_view trace, std::string_view parent, std::string_view span,
                   std::uint8_t flags) noexcept;

    bool has_deadline() const noexcept { return deadline != clock::time_point::max(); }
    /// What is left until the deadline (0 once it has passed; milliseconds::max() without one).
    std::chrono::milliseconds time_left() const noexcept;
    /// The value of `key`, or null.
    const std::string* find(std::string_view key) const noexcept;
    /// The traceparent of a call made inside this handler: this trace, with this handler's span
    /// as the parent. Empty when the call is not traced.
    std::string child_traceparent() const;

  private:
    friend struct detail::context_reuse;
    char ids_[64] = {};
    bool traced_ = false;
};

/// True for a W3C traceparent ordo reads: version 00, lowercase hex, trace and parent ids not all
/// zeros ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").
bool valid_traceparent(std::string_view v) noexcept;

/// The context of the call whose handler is running on this thread: inside a plain handler while
/// it runs, and inside a coroutine handler every time it runs (it follows the coroutine across
/// its co_awaits). Null outside a handler, and for a call that carried no context (no deadline,
/// no metadata). A call made while it is set and without a timeout of its own takes what is
/// left of this deadline, and, when traced, a traceparent naming this handler's span as its parent
/// (docs/protocol.md, "Call context").
const call_context* current_context() noexcept;

}  // namespace ordo
