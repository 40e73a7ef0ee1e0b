// `ordo traces URL... [--trace ID] [--slowest N]`: the spans that servers recorded
// (ordo.traces, ordo/rpc/spans.hpp), merged and printed as one tree per trace across processes.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <ordo/rpc/spans.hpp>

namespace ordo_tool {

/// A span, and the URL of the server that answered it.
struct fetched_span {
    ordo::span s;
    std::string where;
};

/// The text `ordo traces` prints. `slowest` > 0: the slowest spans, one line each, slowest
/// first. Otherwise one tree per trace (oldest trace first): each span under its parent,
/// a parent not recorded by any server asked shown as its id alone.
std::string format_traces(std::vector<fetched_span> spans, std::size_t slowest);

}  // namespace ordo_tool
