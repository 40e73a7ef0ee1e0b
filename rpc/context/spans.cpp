// The span recorder (rpc/context/spans.hpp): one per process, behind one mutex that only
// kept spans take (sampled, failed, or among the slowest so far).
#include "rpc/context/spans.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <random>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "ordo/error.hpp"
#include "ordo/rpc/detail/message_heads.hpp"

namespace ordo {
namespace detail {

std::atomic<bool> spans_on{false};

std::array<char, 16> new_span_id() {
    // A per-thread splitmix64 seeded from the OS: ids must not repeat across processes, and
    // need not be secret.
    thread_local std::uint64_t state =
        (std::uint64_t{std::random_device{}()} << 32) ^ std::random_device{}();
    std::uint64_t v = 0;
    while (v == 0) {
        std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        v = z ^ (z >> 31);
    }
    std::array<char, 16> id{};
#if defined(__SSE2__)
    // The 16 nibbles, most significant first, each to '0'-'9' or 'a'-'f', at once.
    const __m128i bytes = _mm_cvtsi64_si128(static_cast<long long>(__builtin_bswap64(v)));
    const __m128i mask = _mm_set1_epi8(0x0f);
    const __m128i nibbles = _mm_unpacklo_epi8(_mm_and_si128(_mm_srli_epi16(bytes, 4), mask),
                                              _mm_and_si128(bytes, mask));
    const __m128i letters =
        _mm_and_si128(_mm_cmpgt_epi8(nibbles, _mm_set1_epi8(9)), _mm_set1_epi8('a' - '0' - 10));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(id.data()),
                     _mm_add_epi8(_mm_add_epi8(nibbles, _mm_set1_epi8('0')), letters));
#else
    static constexpr char hex[] = "0123456789abcdef";
    for (int i = 15; i >= 0; --i, v >>= 4) id[static_cast<std::size_t>(i)] = hex[v & 0xf];
#endif
    return id;
}

namespace {

struct recorder {
    std::mutex mu;
    span_options o;
    // Sampled and failed spans: a circle of slots, reused (their strings keep their memory), the
    // oldest at `next` once it is full.
    std::vector<span> ring;
    std::size_t next = 0;
    std::vector<span> slowest;  // slowest first, at most o.slowest
    // A trace is sampled when the last 16 hex digits of its id are below this (max: all).
    std::atomic<std::uint64_t> sample_below{0};
    // The shortest span among the slowest once they are full (-1 until then): a span that is
    // not sampled and did not fail is kept only above it, and this is read without the lock.
    std::atomic<std::int64_t> slow_floor{-1};

    // The ring's spans, oldest first.
    std::vector<span> in_order() const {
        std::vector<span> v(ring.begin() + static_cast<std::ptrdiff_t>(next), ring.end());
        v.insert(v.end(), ring.begin(), ring.begin() + static_cast<std::ptrdiff_t>(next));
        return v;
    }
};

recorder& the_recorder() {
    static recorder r;
    return r;
}

// A trace is sampled when a hash of its id's last 16 digits is below `below`: the same choice
// in every process, at the price of two loads and a few multiplications (no digit is parsed;
// this runs for every traced call while spans are recorded).
bool sampled(std::string_view trace_id, std::uint64_t below) noexcept {
    if (below == std::numeric_limits<std::uint64_t>::max()) return true;
    if (below == 0 || trace_id.size() != 32) return false;
    std::uint64_t a = 0, b = 0;
    std::memcpy(&a, trace_id.data() + 16, 8);
    std::memcpy(&b, trace_id.data() + 24, 8);
    std::uint64_t h = a * 0x9e3779b97f4a7c15ull ^ b * 0xc2b2ae3d27d4eb4full;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 32;
    return h < below;
}

}  // namespace

bool span_sampled(std::string_view trace_id) noexcept {
    return sampled(trace_id, the_recorder().sample_below.load(std::memory_order_relaxed));
}

namespace {

std::int64_t micros(std::chrono::steady_clock::duration d) {
    return std::chrono::duration_cast<std::chrono::microseconds>(d).count();
}

// Keeps a copy of `s`: in the ring when `in_ring`, among the slowest when it is one of them.
// Copied into a slot whose strings have room: no allocation once the ring has gone round.
void keep(const span& s, bool in_ring) {
    auto& r = the_recorder();
    std::lock_guard lock(r.mu);
    if (r.o.capacity == 0) return;
    if (in_ring) {
        if (r.ring.size() < r.o.capacity) {
            r.ring.push_back(s);
        } else {
            r.ring[r.next] = s;
            r.next = (r.next + 1) % r.ring.size();
        }
    }
    if (r.o.slowest == 0 || s.end_us < 0) return;  // not timed: not among the slowest
    auto& v = r.slowest;
    if (v.size() >= r.o.slowest && s.end_us <= v.back().end_us) return;
    v.insert(std::upper_bound(v.begin(), v.end(), s,
                              [](const span& a, const span& b) { return a.end_us > b.end_us; }),
             s);
    if (v.size() > r.o.slowest) v.pop_back();
    r.slow_floor.store(v.size() >= r.o.slowest ? v.back().end_us : -1, std::memory_order_relaxed);
}

// The span being filled on this thread (its strings keep their memory from one to the next).
span& scratch_span() {
    thread_local span s;
    return s;
}

// Whether a span of `trace_id` that took `total_us` is kept at all, and if so whether in the
// ring; fills `kept`.
bool worth_keeping(std::string_view trace_id, bool failed, std::int64_t total_us, bool& in_ring,
                   std::string& kept) {
    auto& r = the_recorder();
    const bool s = sampled(trace_id, r.sample_below.load(std::memory_order_relaxed));
    in_ring = s || failed;
    kept = s ? "sampled" : failed ? "error" : "slowest";
    return in_ring || total_us > r.slow_floor.load(std::memory_order_relaxed);
}

std::string status_words(std::error_code status) {
    if (!status) return "ok";
    if (status.category() == error_category()) return to_string(static_cast<errc>(status.value()));
    return status.message();
}

}  // namespace

void record_server_span(const call_context& ctx, std::string_view method, std::string_view peer,
                        std::string_view subject, std::error_code status, const span_times& t,
                        std::size_t bytes_in, std::size_t bytes_out) {
    const std::int64_t total = micros(t.end - t.start);
    bool in_ring = false;
    std::string kept;
    if (!worth_keeping(ctx.trace_id(), static_cast<bool>(status), total, in_ring, kept)) return;
    span* s = &scratch_span();
    s->trace_id = ctx.trace_id();
    s->span_id = ctx.span_id();
    s->parent_id = ctx.parent_id();
    s->kind = "server";
    s->name = method;
    s->method = method;
    s->peer = peer;
    s->subject = subject;
    s->status = status_words(status);
    s->note.clear();
    s->kept = kept;
    const auto wall =
        std::chrono::system_clock::now() - (std::chrono::steady_clock::now() - t.start);
    s->start_us =
        std::chrono::duration_cast<std::chrono::microseconds>(wall.time_since_epoch()).count();
    const auto offset = [&](span_times::time_point p) -> std::int64_t {
        return p == span_times::time_point{} ? -1 : micros(p - t.start);
    };
    s->handler_start_us = offset(t.handler_start);
    s->handler_end_us = offset(t.handler_end);
    s->end_us = t.timed ? total : -1;
    s->bytes_in = bytes_in;
    s->bytes_out = bytes_out;
    keep(*s, in_ring);
}

void record_router_span(const metadata& meta, std::string_view name, std::string_view method,
                        std::string_view replica, std::error_code status, std::string note,
                        const span_times& t) {
    std::string_view tp;
    for (const auto& [k, v] : meta)
        if (k == "traceparent") tp = v;
    if (!valid_traceparent(tp)) return;
    const std::int64_t total = micros(t.end - t.start);
    bool in_ring = false;
    std::string kept;
    if (!worth_keeping(tp.substr(3, 32), static_cast<bool>(status), total, in_ring, kept)) return;
    span* s = &scratch_span();
    s->trace_id = tp.substr(3, 32);
    const auto id = new_span_id();
    s->span_id.assign(id.data(), id.size());
    s->parent_id = tp.substr(36, 16);
    s->kind = "router";
    s->name = name;
    s->method = method;
    s->peer = replica;
    s->subject.clear();
    s->status = status_words(status);
    s->note = std::move(note);
    s->kept = kept;
    s->handler_start_us = s->handler_end_us = -1;
    s->bytes_in = s->bytes_out = 0;
    const auto wall =
        std::chrono::system_clock::now() - (std::chrono::steady_clock::now() - t.start);
    s->start_us =
        std::chrono::duration_cast<std::chrono::microseconds>(wall.time_since_epoch()).count();
    s->end_us = total;
    keep(*s, in_ring);
}

void pack_traces_answer(buffer& out, std::uint32_t msgid, const msgpack::object& params) {
    std::string trace;
    std::size_t slowest = 0;
    const auto& a = params.via.array;
    if (a.size >= 1 && a.ptr[0].type == msgpack::type::STR)
        trace.assign(a.ptr[0].via.str.ptr, a.ptr[0].via.str.size);
    if (a.size >= 2 && a.ptr[1].type == msgpack::type::POSITIVE_INTEGER)
        slowest = static_cast<std::size_t>(std::min<std::uint64_t>(a.ptr[1].via.u64, 1u << 20));
    const auto spans = recorded_spans(trace, slowest);
    write_response_head(out, msgid);
    msgpack::packer<buffer> p(out);
    p.pack(spans);
}

}  // namespace detail

void record_spans(const span_options& o) {
    auto& r = detail::the_recorder();
    std::lock_guard lock(r.mu);
    // The newest that still fit, oldest first (or none, when recording stops).
    auto kept = o.capacity == 0 ? std::vector<span>{} : r.in_order();
    if (kept.size() > o.capacity)
        kept.erase(kept.begin(), kept.end() - static_cast<std::ptrdiff_t>(o.capacity));
    r.ring = std::move(kept);
    r.next = 0;
    if (o.capacity == 0) r.slowest.clear();
    r.o = o;
    r.o.sample_rate = std::clamp(o.sample_rate, 0.0, 1.0);
    const auto below = r.o.sample_rate >= 1.0
                           ? std::numeric_limits<std::uint64_t>::max()
                           : static_cast<std::uint64_t>(r.o.sample_rate * 18446744073709551616.0);
    r.sample_below.store(below, std::memory_order_relaxed);
    if (r.slowest.size() > r.o.slowest) r.slowest.resize(r.o.slowest);
    r.slow_floor.store(r.o.slowest && r.slowest.size() >= r.o.slowest
                           ? r.slowest.back().end_us
                           : (r.o.slowest ? -1 : std::numeric_limits<std::int64_t>::max()),
                       std::memory_order_relaxed);
    detail::spans_on.store(r.o.capacity > 0, std::memory_order_relaxed);
}

std::vector<span> recorded_spans(std::string_view trace_id, std::size_t slowest) {
    auto& r = detail::the_recorder();
    std::vector<span> all;
    {
        std::lock_guard lock(r.mu);
        all = r.in_order();
        // The slowest that are not in the ring too (a span is one trace's one span id).
        for (const auto& s : r.slowest)
            if (std::none_of(all.begin(), all.end(), [&](const span& x) {
                    return x.span_id == s.span_id && x.trace_id == s.trace_id;
                }))
                all.push_back(s);
    }
    std::erase_if(all, [&](const span& s) { return !trace_id.empty() && s.trace_id != trace_id; });
    if (slowest > 0) {
        std::sort(all.begin(), all.end(),
                  [](const span& a, const span& b) { return a.end_us > b.end_us; });
        if (all.size() > slowest) all.resize(slowest);
    } else {
        std::stable_sort(all.begin(), all.end(),
                         [](const span& a, const span& b) { return a.start_us < b.start_us; });
    }
    return all;
}

}  // namespace ordo
