// Spans: what this process recorded of the traced calls it served and routed, kept in a bounded
// ring (sampled by trace, plus every error and the slowest), as the reserved method ordo.traces
// and `ordo traces URL...` read them (docs/protocol.md, "Call context").
#pragma once

#include "ordo/config.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <msgpack.hpp>

namespace ordo {

/// How this process records spans (ordo::record_spans). Only calls that carry a W3C traceparent
/// (call_options::metadata, or one made inside a traced handler) have spans.
struct span_options {
    /// The fraction of traces kept, 0 to 1. The choice is made from a hash of the trace id, so
    /// every process with the same rate keeps the same traces, whole.
    double sample_rate = 0.0;
    /// The ring: the most recent sampled and failed spans (0: recording is off).
    std::size_t capacity = 1024;
    /// The slowest spans since recording started, kept apart from the ring, sampled or not.
    std::size_t slowest = 16;
};

/// Starts recording spans in this process with `o` (again: with the new options, keeping what
/// is recorded that still fits); capacity 0 stops it and forgets what it held. Thread-safe. Off
/// until called.
void record_spans(const span_options& o);

/// One span: a traced call this process answered ("server"), or what a router did with one
/// ("router": "wait" for a replica, "retry" on another). Times are microseconds: `start_us`
/// on the wall clock (since the Unix epoch), the others counted from it (-1: not known).
struct span {
    std::string trace_id;       ///< 32 hex digits
    std::string span_id;        ///< 16 hex digits: this span
    std::string parent_id;      ///< 16 hex digits: the caller's span (the traceparent's parent id)
    std::string kind;           ///< "server" or "router"
    std::string name;           ///< the method; for a router span, "wait" or "retry"
    std::string method;         ///< the method called
    std::string peer;           ///< server: the caller's address; router: the replica's URL
    std::string subject;        ///< server: the caller's identity::subject, where one is known
    std::string status;         ///< "ok", or the error's words ("timed out")
    std::string note;           ///< what else is known (a router's reason to retry)
    std::string kept;           ///< why it was kept: "sampled", "error" or "slowest"
    std::int64_t start_us = 0;  ///< received by the server; queued in the router
    std::int64_t handler_start_us = -1;  ///< server: its handler started
    std::int64_t handler_end_us = -1;    ///< server: its handler ended
    /// Server: answered; router: sent (or gave up). -1: not timed (a failed call of a trace not
    /// sampled, whose handler did not suspend).
    std::int64_t end_us = 0;
    std::uint64_t bytes_in = 0;          ///< the request, as on the wire
    std::uint64_t bytes_out = 0;         ///< the answer, as on the wire
    // As ordo.traces answers it: a map of these names (docs/protocol.md, "Reserved methods").
    MSGPACK_DEFINE_MAP(trace_id, span_id, parent_id, kind, name, method, peer, subject, status,
                       note, kept, start_us, handler_start_us, handler_end_us, end_us, bytes_in,
                       bytes_out)
};

/// What the process holds: every span of trace `trace_id` (empty: of every trace), oldest first;
/// or, with `slowest` > 0, only the `slowest` slowest of those, slowest first.
std::vector<span> recorded_spans(std::string_view trace_id = {}, std::size_t slowest = 0);

}  // namespace ordo
