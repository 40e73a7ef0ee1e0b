// Recording spans (ordo/rpc/spans.hpp): the ring and the slowest, and what the dispatcher and the
// router hand them. Nothing here runs unless record_spans() turned it on and the call is traced.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <string>
#include <string_view>
#include <system_error>

#include "ordo/rpc/call.hpp"
#include "ordo/rpc/codec.hpp"
#include "ordo/rpc/context.hpp"
#include "ordo/rpc/spans.hpp"

namespace ordo::detail {

/// record_spans() with a capacity: one load on the paths that may record.
extern std::atomic<bool> spans_on;
inline bool recording_spans() noexcept {
    return spans_on.load(std::memory_order_relaxed);
}

/// A new span id: 16 lowercase hex digits, never all zeros.
std::array<char, 16> new_span_id();

/// When a call's parts happened, on the steady clock (a default time_point: not known).
/// `timed` false: a call of a trace not sampled, recorded for its error, was not timed.
struct span_times {
    using time_point = std::chrono::steady_clock::time_point;
    time_point start, handler_start, handler_end, end;
    bool timed = true;
};

/// Whether the trace is one of the sampled fraction (span_options::sample_rate). A server times
/// the calls of sampled traces, and of the others only those whose handler suspends: reading the
/// clock for each plain call would cost more than the sampling saves.
bool span_sampled(std::string_view trace_id) noexcept;

/// A traced call this server answered (or refused) with `status`.
void record_server_span(const call_context& ctx, std::string_view method, std::string_view peer,
                        std::string_view subject, std::error_code status, const span_times& t,
                        std::size_t bytes_in, std::size_t bytes_out);

/// What a router did with a call whose metadata holds a traceparent ("wait", "retry"): a span
/// of that trace, a sibling of the replica's (its parent is the traceparent's parent). Nothing
/// for an untraced call.
void record_router_span(const metadata& meta, std::string_view name, std::string_view method,
                        std::string_view replica, std::error_code status, std::string note,
                        const span_times& t);

/// Packs ordo.traces' answer: [trace id] or [trace id, slowest] (an empty id: every trace).
void pack_traces_answer(buffer& out, std::uint32_t msgid, const msgpack::object& params);

}  // namespace ordo::detail
