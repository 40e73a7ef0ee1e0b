// How `ordo traces` prints spans (tools/traces_command.hpp).
#include "tools/traces_command.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>

namespace ordo_tool {
namespace {

std::string millis(std::int64_t us) {
    char b[32];
    std::snprintf(b, sizeof b, "%.3f ms", static_cast<double>(us) / 1000.0);
    return b;
}

// One span on one line: what, outcome and duration first, then where and the details.
std::string describe(const fetched_span& f) {
    const ordo::span& s = f.s;
    std::string line = s.kind + " " + s.name;
    if (s.kind != "server" && !s.method.empty()) line += " " + s.method;
    line += "  " + s.status + "  " + (s.end_us >= 0 ? millis(s.end_us) : "not timed") + "  [span " +
            s.span_id + " parent " + s.parent_id + ", at " + f.where;
    if (!s.peer.empty()) line += s.kind == "server" ? ", from " + s.peer : ", replica " + s.peer;
    if (!s.subject.empty()) line += ", subject " + s.subject;
    if (s.handler_start_us >= 0) line += ", queued " + millis(s.handler_start_us);
    if (s.handler_start_us >= 0 && s.handler_end_us >= s.handler_start_us)
        line += ", handler " + millis(s.handler_end_us - s.handler_start_us);
    if (s.kind == "server")
        line +=
            ", " + std::to_string(s.bytes_in) + " B in, " + std::to_string(s.bytes_out) + " B out";
    if (!s.note.empty()) line += ", " + s.note;
    return line + ", kept: " + s.kept + "]";
}

void print_tree(const std::vector<const fetched_span*>& spans, const fetched_span& at,
                const std::string& indent, bool last, std::string& out, int depth) {
    out += indent + (last ? "└─ " : "├─ ") + describe(at) + "\n";
    std::vector<const fetched_span*> kids;
    for (const auto* s : spans)
        if (s->s.parent_id == at.s.span_id && s != &at) kids.push_back(s);
    if (depth > 64) return;  // a loop of ids (a misbehaving peer) ends here
    for (std::size_t i = 0; i < kids.size(); ++i)
        print_tree(spans, *kids[i], indent + (last ? "   " : "│  "), i + 1 == kids.size(), out,
                   depth + 1);
}

}  // namespace

std::string format_traces(std::vector<fetched_span> spans, std::size_t slowest) {
    // A span asked of two URLs of one process comes back twice.
    std::sort(spans.begin(), spans.end(), [](const fetched_span& a, const fetched_span& b) {
        return a.s.start_us != b.s.start_us ? a.s.start_us < b.s.start_us
                                            : a.s.span_id < b.s.span_id;
    });
    spans.erase(std::unique(spans.begin(), spans.end(),
                            [](const fetched_span& a, const fetched_span& b) {
                                return a.s.span_id == b.s.span_id && a.s.trace_id == b.s.trace_id;
                            }),
                spans.end());
    std::string out;
    if (slowest > 0) {
        std::stable_sort(
            spans.begin(), spans.end(),
            [](const fetched_span& a, const fetched_span& b) { return a.s.end_us > b.s.end_us; });
        if (spans.size() > slowest) spans.resize(slowest);
        for (const auto& f : spans) out += "trace " + f.s.trace_id + "  " + describe(f) + "\n";
        return out;
    }
    std::vector<std::string> traces;  // in order of their first span
    std::map<std::string, std::vector<const fetched_span*>> by_trace;
    for (const auto& f : spans) {
        auto& v = by_trace[f.s.trace_id];
        if (v.empty()) traces.push_back(f.s.trace_id);
        v.push_back(&f);
    }
    for (const auto& t : traces) {
        const auto& v = by_trace[t];
        std::set<std::string> ids;
        for (const auto* s : v) ids.insert(s->s.span_id);
        std::set<std::string> wheres;
        for (const auto* s : v) wheres.insert(s->where);
        out += "trace " + t + ": " + std::to_string(v.size()) +
               (v.size() == 1 ? " span from " : " spans from ") + std::to_string(wheres.size()) +
               (wheres.size() == 1 ? " server" : " servers") + "\n";
        // Roots: spans whose parent no server recorded, grouped under that parent's id.
        std::vector<std::string> parents;
        for (const auto* s : v)
            if (!ids.count(s->s.parent_id) &&
                std::find(parents.begin(), parents.end(), s->s.parent_id) == parents.end())
                parents.push_back(s->s.parent_id);
        for (const auto& p : parents) {
            out += p + " (not recorded here)\n";
            std::vector<const fetched_span*> roots;
            for (const auto* s : v)
                if (s->s.parent_id == p) roots.push_back(s);
            for (std::size_t i = 0; i < roots.size(); ++i)
                print_tree(v, *roots[i], "", i + 1 == roots.size(), out, 0);
        }
    }
    return out;
}

}  // namespace ordo_tool
