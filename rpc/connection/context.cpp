// Call contexts: reading one from a request, the thread's current one, and passing a deadline
// on to the calls a handler makes (rpc/connection/context.hpp).
#include "rpc/connection/context.hpp"
#include "rpc/connection/spans.hpp"

#include <algorithm>
#include <array>

#include "ordo/error.hpp"
#include "ordo/limits.hpp"

#include "ordo/rpc/detail/message_heads.hpp"

namespace ordo {

std::chrono::milliseconds call_context::time_left() const noexcept {
    if (!has_deadline()) return std::chrono::milliseconds::max();
    const auto left = deadline - clock::now();
    if (left <= clock::duration::zero()) return std::chrono::milliseconds(0);
    // Rounded up: 0 means "passed", never "less than a millisecond left".
    return std::chrono::ceil<std::chrono::milliseconds>(left);
}

const std::string* call_context::find(std::string_view key) const noexcept {
    for (const auto& [k, v] : metadata)
        if (k == key) return &v;
    return nullptr;
}

void call_context::set_trace(std::string_view trace, std::string_view parent, std::string_view span,
                             std::uint8_t flags) noexcept {
    if (trace.size() != 32 || parent.size() != 16 || span.size() != 16) return;
    std::copy(trace.begin(), trace.end(), ids_);
    std::copy(parent.begin(), parent.end(), ids_ + 32);
    std::copy(span.begin(), span.end(), ids_ + 48);
    trace_flags = flags;
    traced_ = true;
}

std::string call_context::child_traceparent() const {
    if (!traced_) return {};
    static constexpr char hex[] = "0123456789abcdef";
    std::string t(55, '-');
    t[0] = t[1] = '0';
    std::copy(ids_, ids_ + 32, t.begin() + 3);
    std::copy(ids_ + 48, ids_ + 64, t.begin() + 36);
    t[53] = hex[trace_flags >> 4];
    t[54] = hex[trace_flags & 0xf];
    return t;
}

namespace {
// The value of a lowercase hex digit, or -1.
int hex_value(char ch) noexcept {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    return -1;
}
}  // namespace

bool valid_traceparent(std::string_view v) noexcept {
    // version "00" - trace id (32 hex, not all 0) - parent id (16 hex, not all 0) - flags (2).
    // One pass: this runs for every traced call.
    if (v.size() != 55 || v[0] != '0' || v[1] != '0' || v[2] != '-' || v[35] != '-' ||
        v[52] != '-')
        return false;
    bool trace_zero = true, parent_zero = true;
    for (std::size_t i = 3; i < 55; ++i) {
        if (i == 35 || i == 52) continue;
        const int d = hex_value(v[i]);
        if (d < 0) return false;
        if (i < 35)
            trace_zero &= d == 0;
        else if (i < 52)
            parent_zero &= d == 0;
    }
    return !trace_zero && !parent_zero;
}

const call_context* current_context() noexcept {
    return detail::this_thread_context;
}

namespace detail {

thread_local const call_context* this_thread_context = nullptr;
thread_local const std::shared_ptr<const call_context>* this_thread_context_owner = nullptr;
std::atomic<unsigned> contexts_set{0};

namespace {
std::string_view bytes_of(const msgpack::object& o) {
    return o.type == msgpack::type::STR ? std::string_view(o.via.str.ptr, o.via.str.size)
                                        : std::string_view(o.via.bin.ptr, o.via.bin.size);
}
}  // namespace

std::shared_ptr<const call_context> read_context(const message& m,
                                                 std::chrono::steady_clock::time_point arrived) {
    // An empty map carries nothing: the handler sees no context, as for a plain request.
    if (m.meta.type != msgpack::type::MAP || m.meta.via.map.size == 0) return nullptr;
    auto c = std::make_shared<call_context>();
    const auto& map = m.meta.via.map;
    c->metadata.reserve(map.size);
    for (std::uint32_t i = 0; i < map.size; ++i) {
        const auto& k = map.ptr[i].key;
        const auto& v = map.ptr[i].val;
        const std::string_view key(k.via.str.ptr, k.via.str.size);
        if (key == deadline_key) {
            if (v.type != msgpack::type::POSITIVE_INTEGER) continue;
            // Clamped to a day, as every other window on the wire: no overflow, and a caller
            // that says "forever" still has a deadline.
            const auto ms = std::min<std::uint64_t>(v.via.u64, 24ull * 3600 * 1000);
            c->deadline = arrived + std::chrono::milliseconds(static_cast<std::int64_t>(ms));
        } else if (!key.starts_with("ordo-")) {
            const std::string_view value = bytes_of(v);
            if (key == "traceparent" && c->trace_id().empty() && valid_traceparent(value)) {
                const auto span = new_span_id();
                c->set_trace(
                    value.substr(3, 32), value.substr(36, 16),
                    std::string_view(span.data(), span.size()),
                    static_cast<std::uint8_t>(hex_value(value[53]) * 16 + hex_value(value[54])));
            }
            c->metadata.emplace_back(std::string(key), std::string(value));
        }
    }
    return c;
}

bool inherit_context(pending_call& call, std::chrono::milliseconds default_timeout) {
    const call_context* c = this_thread_context;
    if (!c) return true;
    // A traced handler's calls are children of its span, unless the caller set its own.
    if (!c->trace_id().empty()) {
        const auto& m = call.options.metadata;
        if (std::none_of(m.begin(), m.end(),
                         [](const auto& kv) { return kv.first == "traceparent"; })) {
            call.options.metadata.emplace_back("traceparent", c->child_traceparent());
            if (const std::string* state = c->find("tracestate"))
                call.options.metadata.emplace_back("tracestate", *state);
        }
    }
    if (!c->has_deadline() || call.options.timeout.count() > 0) return true;
    const auto left = c->time_left();
    if (left.count() == 0) return false;
    // The channel's own default, when it is the shorter, stays the bound (left unset: it is).
    if (default_timeout.count() <= 0 || left < default_timeout) call.options.timeout = left;
    return true;
}

std::string inherited_timeout_reason(const pending_call& call) {
    return "the deadline of the call whose handler made this call to \"" + call.method +
           "\" had passed";
}

void check_metadata(std::string_view method, const metadata& meta, bool timed) {
    const limits l;
    const auto fail = [&](const std::string& why) {
        throw_error(errc::bad_arguments,
                    "the metadata of a call to \"" + std::string(method) + "\" " + why);
    };
    // Counted as the receiver counts the map: the deadline is one more entry.
    const std::size_t entries = meta.size() + (timed ? 1 : 0);
    if (entries > l.max_metadata_entries)
        fail("has " + std::to_string(meta.size()) + " pairs" + (timed ? " and a deadline" : "") +
             ", over max_metadata_entries (" + std::to_string(l.max_metadata_entries) + ")");
    std::size_t bytes = timed ? deadline_key.size() : 0;
    for (const auto& [k, v] : meta) {
        if (k.empty()) fail("has an empty key");
        if (k.starts_with("ordo-")) fail("has the key \"" + k + "\": \"ordo-\" keys are reserved");
        bytes += k.size() + v.size();
    }
    if (bytes > l.max_metadata_bytes)
        fail("holds " + std::to_string(bytes) + " bytes, over max_metadata_bytes (" +
             std::to_string(l.max_metadata_bytes) + ")");
}

void write_context_request(buffer& out, std::uint32_t msgid, std::string_view method,
                           std::string_view params, const metadata& meta,
                           std::chrono::milliseconds left, bool timed) {
    out.write("\x95\x00\xce", 3);
    put_be32(out, msgid);
    put_str(out, method);
    out.write(params.data(), params.size());
    msgpack::packer<buffer> p(out);
    p.pack_map(static_cast<std::uint32_t>(meta.size() + (timed ? 1 : 0)));
    if (timed) {
        put_str(out, deadline_key);
        p.pack_uint64(static_cast<std::uint64_t>(std::max<std::int64_t>(0, left.count())));
    }
    for (const auto& [k, v] : meta) {
        put_str(out, k);
        if (k.ends_with("-bin")) {
            p.pack_bin(static_cast<std::uint32_t>(v.size()));
            p.pack_bin_body(v.data(), v.size());
        } else {
            put_str(out, v);
        }
    }
}

}  // namespace detail
}  // namespace ordo
