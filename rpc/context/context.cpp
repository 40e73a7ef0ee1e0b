// Call contexts: reading one from a request, the thread's current one, and passing a deadline
// on to the calls a handler makes (rpc/context/context.hpp).
#include "rpc/context/context.hpp"
#include "rpc/context/spans.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

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

namespace {
// A byte's value as a lowercase hex digit, or 0x10 for any other byte.
constexpr std::array<std::uint8_t, 256> hex_digits = [] {
    std::array<std::uint8_t, 256> t{};
    for (auto& d : t) d = 0x10;
    for (int i = 0; i < 10; ++i) t['0' + i] = static_cast<std::uint8_t>(i);
    for (int i = 0; i < 6; ++i) t['a' + i] = static_cast<std::uint8_t>(10 + i);
    return t;
}();

// Whether the 16 bytes at `p` are lowercase hex digits; `nonzero` set if one is not '0'. This
// runs for every traced call: 16 bytes at a time where SSE2 is (every x86-64).
bool hex16(const char* p, bool& nonzero) noexcept {
#if defined(__SSE2__)
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    // Signed compares: a byte of 0x80 or more is negative, below '0', and refused.
    const __m128i digit = _mm_and_si128(_mm_cmpgt_epi8(v, _mm_set1_epi8('0' - 1)),
                                        _mm_cmplt_epi8(v, _mm_set1_epi8('9' + 1)));
    const __m128i letter = _mm_and_si128(_mm_cmpgt_epi8(v, _mm_set1_epi8('a' - 1)),
                                         _mm_cmplt_epi8(v, _mm_set1_epi8('f' + 1)));
    nonzero |= _mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_set1_epi8('0'))) != 0xffff;
    return _mm_movemask_epi8(_mm_or_si128(digit, letter)) == 0xffff;
#else
    unsigned acc = 0;
    for (int i = 0; i < 16; ++i) acc |= hex_digits[static_cast<unsigned char>(p[i])];
    nonzero |= (acc & 0xf) != 0;
    return (acc & 0x10) == 0;
#endif
}
}  // namespace

bool valid_traceparent(std::string_view v) noexcept {
    // version "00" - trace id (32 hex, not all 0) - parent id (16 hex, not all 0) - flags (2).
    if (v.size() != 55 || v[0] != '0' || v[1] != '0' || v[2] != '-' || v[35] != '-' ||
        v[52] != '-')
        return false;
    bool trace = false, parent = false;
    const char* p = v.data();
    const unsigned flags = hex_digits[static_cast<unsigned char>(p[53])] |
                           hex_digits[static_cast<unsigned char>(p[54])];
    return hex16(p + 3, trace) && hex16(p + 19, trace) && hex16(p + 36, parent) && trace &&
           parent && (flags & 0x10) == 0;
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

// `s` made equal to `v`, in place when their lengths are the same (a reused context's pair
// read again: its key, and a traceparent's 55 bytes), where assign cost 70 instructions.
void overwrite(std::string& s, std::string_view v) {
    if (s.size() == v.size())
        copy_small(s.data(), v.data(), v.size());
    else
        s.assign(v);
}
}  // namespace

// Reuses a context's storage: its pairs' strings keep their memory.
std::shared_ptr<const call_context> read_context(const message& m,
                                                 std::chrono::steady_clock::time_point& arrived,
                                                 std::shared_ptr<call_context> spare) {
    // An empty map carries nothing: the handler sees no context, as for a plain request.
    if (m.meta.type != msgpack::type::MAP || m.meta.via.map.size == 0) return nullptr;
    std::shared_ptr<call_context> c;
    if (spare && spare.use_count() == 1) {
        c = std::move(spare);
        context_reuse::clear(*c);
    } else {
        c = std::make_shared<call_context>();
    }
    const auto& map = m.meta.via.map;
    // Overwritten in place: a reused context's strings keep their capacity (no allocation for a
    // traceparent, the common pair, once one has been read on the connection).
    auto& pairs = context_reuse::pairs(c->metadata);
    std::size_t kept = 0;
    for (std::uint32_t i = 0; i < map.size; ++i) {
        const auto& k = map.ptr[i].key;
        const auto& v = map.ptr[i].val;
        const std::string_view key(k.via.str.ptr, k.via.str.size);
        if (key == deadline_key) {
            if (v.type != msgpack::type::POSITIVE_INTEGER) continue;
            // Clamped to a day, as every other window on the wire: no overflow, and a caller
            // that says "forever" still has a deadline.
            if (arrived == std::chrono::steady_clock::time_point{})
                arrived = std::chrono::steady_clock::now();
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
            if (kept < pairs.size()) {
                overwrite(pairs[kept].first, key);
                overwrite(pairs[kept].second, value);
            } else {
                pairs.emplace_back(std::string(key), std::string(value));
            }
            ++kept;
        }
    }
    pairs.resize(kept);
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

namespace {
// The pairs as map entries (a key ending in -bin with a bin value).
void encode_pairs(buffer& out, const metadata& meta) {
    msgpack::packer<buffer> p(out);
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
}  // namespace

namespace {
// Writes to memory known to be large enough: no check per piece.
struct unchecked_out {
    char* at;
    void write(const char* p, std::size_t n) noexcept {
        copy_small(at, p, n);  // most pieces are a few bytes: no call to memcpy for them
        at += n;
    }
};

template <class Out>
void write_head(Out& out, std::uint32_t msgid, std::string_view method, std::string_view params,
                std::size_t pairs, std::chrono::milliseconds left, bool timed) {
    out.write("\x95\x00\xce", 3);
    put_be32(out, msgid);
    put_str(out, method);
    out.write(params.data(), params.size());
    msgpack::packer<Out> p(out);
    p.pack_map(static_cast<std::uint32_t>(pairs + (timed ? 1 : 0)));
    if (timed) {
        put_str(out, deadline_key);
        p.pack_uint64(static_cast<std::uint64_t>(std::max<std::int64_t>(0, left.count())));
    }
}
}  // namespace

void write_context_request_head(buffer& out, std::uint32_t msgid, std::string_view method,
                                std::string_view params, std::size_t pairs,
                                std::chrono::milliseconds left, bool timed) {
    // At most 7 bytes before the method, 5 + 5 around the params, 17 + 9 for the deadline.
    constexpr std::size_t fixed = 7 + 5 + 5 + 17 + 9;
    if (method.size() + params.size() <= 256 - fixed) {
        char b[256];
        unchecked_out o{b};
        write_head(o, msgid, method, params, pairs, left, timed);
        out.write(b, static_cast<std::size_t>(o.at - b));
        return;
    }
    write_head(out, msgid, method, params, pairs, left, timed);
}

std::size_t write_small_context_head(std::span<char, small_context_head> out, std::uint32_t msgid,
                                     std::string_view method, std::string_view params,
                                     std::size_t pairs, std::chrono::milliseconds left,
                                     bool timed) noexcept {
    constexpr std::size_t fixed = 7 + 1 + 1 + (1 + deadline_key.size() + 9);
    if (method.size() >= 32 || pairs >= 15 || method.size() + params.size() > out.size() - fixed)
        return 0;
    // The plain request's head, its array five elements long.
    char* p = put_short_request_head(out.data(), '\x95', msgid, method);
    copy_small(p, params.data(), params.size());
    p += params.size();
    *p++ = char(0x80 | (pairs + (timed ? 1 : 0)));
    if (timed) {
        unchecked_out o{p};
        put_str(o, deadline_key);
        msgpack::packer<unchecked_out>(o).pack_uint64(
            static_cast<std::uint64_t>(std::max<std::int64_t>(0, left.count())));
        p = o.at;
    }
    return static_cast<std::size_t>(p - out.data());
}

void write_context_request(buffer& out, std::uint32_t msgid, std::string_view method,
                           std::string_view params, const metadata& meta,
                           std::chrono::milliseconds left, bool timed) {
    write_context_request_head(out, msgid, method, params, meta.size(), left, timed);
    encode_pairs(out, meta);
}

std::string_view packed_metadata::pack_other(std::string_view method, const metadata& meta,
                                             bool timed) {
    if (!valid_ || !(meta == meta_)) {
        valid_ = false;
        check_metadata(method, meta, timed);
        encoded_.clear();
        encode_pairs(encoded_, meta);
        bytes_ = 0;
        for (const auto& [k, v] : meta) bytes_ += k.size() + v.size();
        meta_ = meta;
        valid_ = true;
    } else {
        // Equal pairs of another copy: hold that one, so that its next calls match at once.
        if (!context_reuse::same(meta, meta_)) meta_ = meta;
        if (timed) {
            // Checked without a deadline before: with one, the map has one entry and its key
            // more.
            const limits l;
            if (meta.size() + 1 > l.max_metadata_entries ||
                bytes_ + deadline_key.size() > l.max_metadata_bytes)
                check_metadata(method, meta, true);
        }
    }
    return {encoded_.data(), encoded_.size()};
}

}  // namespace detail
}  // namespace ordo
