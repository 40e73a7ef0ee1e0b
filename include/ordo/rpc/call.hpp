// What one call takes and yields: call_options (deadline, affinity key, metadata), ordo::value
// and call_outcome, the untyped result a channel_impl completes a call with.
#pragma once

#include "ordo/config.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

#include "ordo/rpc/detail/msgpack_core.hpp"

namespace ordo {

/// Items a streaming call lets the server send ahead of the reader when call_options::window
/// is 0, and the most it may ask for.
inline constexpr std::uint32_t default_stream_window = 8192;
inline constexpr std::uint32_t max_stream_window = 65536;
/// Bytes (of ordo.item messages, as on the wire) a streaming call lets the server send ahead of
/// the reader when call_options::window_bytes is 0. One item is always allowed, however large.
inline constexpr std::uint64_t default_stream_window_bytes = std::uint64_t{1} << 20;

namespace detail {
struct context_reuse;  // a connection reusing a received context's storage
}  // namespace detail

/// Per-call metadata: key -> value pairs a call carries to its handler (docs/protocol.md, "Call
/// context"), in the order given, repeated keys kept. Values are strings of bytes; a key ending
/// in "-bin" is sent as msgpack bin, any other as str. Keys starting with "ordo-" are reserved.
/// Empty, it is one null pointer: a call without metadata pays nothing for it. Copies share the
/// pairs (a count, thread-safe) until one of them is changed: giving many calls the same
/// metadata copies no strings.
class metadata {
  public:
    using pair = std::pair<std::string, std::string>;
    metadata() noexcept = default;
    metadata(std::initializer_list<pair> pairs)
        : p_(pairs.size() ? new rep(std::vector<pair>(pairs)) : nullptr) {}
    metadata(const metadata& o) noexcept : p_(o.p_) {
        if (p_) p_->refs.fetch_add(1, std::memory_order_relaxed);
    }
    metadata& operator=(const metadata& o) noexcept {
        if (o.p_) o.p_->refs.fetch_add(1, std::memory_order_relaxed);
        clear();
        p_ = o.p_;
        return *this;
    }
    metadata(metadata&& o) noexcept : p_(o.p_) { o.p_ = nullptr; }
    metadata& operator=(metadata&& o) noexcept {
        if (this != &o) {
            clear();
            p_ = o.p_;
            o.p_ = nullptr;
        }
        return *this;
    }
    // Inline, it is a test of a pointer: every call destroys a few call_options.
    ~metadata() { clear(); }
    void clear() noexcept {
        if (p_) [[unlikely]]
            release(p_);
        p_ = nullptr;
    }

    bool empty() const noexcept { return !p_ || p_->pairs.empty(); }
    std::size_t size() const noexcept { return p_ ? p_->pairs.size() : 0; }
    const pair* begin() const noexcept { return p_ ? p_->pairs.data() : nullptr; }
    const pair* end() const noexcept { return p_ ? p_->pairs.data() + p_->pairs.size() : nullptr; }
    template <class K, class V>
    void emplace_back(K&& key, V&& value) {
        own().emplace_back(std::forward<K>(key), std::forward<V>(value));
    }
    void reserve(std::size_t n) { own().reserve(n); }
    /// The pairs, as a vector.
    std::vector<pair> pairs() const { return p_ ? p_->pairs : std::vector<pair>{}; }
    friend bool operator==(const metadata& a, const metadata& b) {
        return a.p_ == b.p_ || (a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin()));
    }

  private:
    friend struct detail::context_reuse;
    struct rep {
        rep() = default;
        explicit rep(std::vector<pair> v) : pairs(std::move(v)) {}
        std::atomic<int> refs{1};  // the copies that share it
        std::vector<pair> pairs;
    };
    // The pairs, this copy's own (copied first if shared), to change.
    std::vector<pair>& own() {
        if (!p_) {
            p_ = new rep;
        } else if (p_->refs.load(std::memory_order_acquire) != 1) {
            rep* mine = new rep(p_->pairs);
            release(p_);
            p_ = mine;
        }
        return p_->pairs;
    }
    [[gnu::noinline]] static void release(rep* p) noexcept {
        if (p->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete p;
    }
    rep* p_ = nullptr;
};

/// Per-call options; pass as the last argument before the completion token (if any).
struct call_options {
    /// Deadline for the whole call. 0: the channel's default (none unless configured). On
    /// expiry the call fails with errc::timed_out, its pending entry is removed and ordo.cancel
    /// tells the remote side to cancel the handler.
    std::chrono::milliseconds timeout{0};
    /// Affinity key, read by routers (ordo::router): calls with one key go to one replica, in
    /// the order made, while its replica lives. Ordered peers and pools ignore it.
    std::string key{};
    /// Whom the call is made for, to a router that shares its queue among callers
    /// (router_options::caller_weights; docs/protocol.md "Router guarantees"): a server that
    /// calls on through a router sets it to its own caller's identity (peer::identity().name()).
    /// Not sent. Empty: the router's own calls, one caller among the others.
    std::string caller{};
    /// Streaming calls (ordo::stream): items the server may send ahead of the reader; more are
    /// granted as the reader takes them. 0: default_stream_window (8192); at most 65,536.
    std::uint32_t window = 0;
    /// The same in bytes of items as sent (the server always may send one item). 0:
    /// default_stream_window_bytes (1 MiB).
    std::uint64_t window_bytes = 0;
    /// Pairs the handler reads from its call context (ordo::current_context()). Sent only to
    /// peers that announced they read them (ordo.features); a plain msgpack-rpc peer gets the
    /// call without them. Unlike the deadline, they are not passed on to calls a handler makes.
    ordo::metadata metadata{};
    /// Streams: the window grows toward what the path needs (its bandwidth times its round
    /// trip, measured while the stream runs with ordo.ping), up to this many bytes (and 65,536
    /// items), so that a long, fast path is not held to window_bytes a round trip. What a
    /// reader that stops holds is then the grown window. 0: the window stays as set. For a
    /// caller that writes (upload, two_way), an ordo server also grows the credit it grants
    /// (doubling it while the caller waits for credit and the handler keeps up), up to this,
    /// 64 MiB, and half of max_unacked_bytes on a resumable session (docs/protocol.md,
    /// "Streams both ways"). A server older than that answers bad_arguments to such a call.
    std::uint64_t max_window_bytes = 0;
};

/// call_options with a timeout: `co_await c.inc(41, ordo::timeout(50ms))`.
inline call_options timeout(std::chrono::milliseconds t) {
    return call_options{.timeout = t};
}

/// call_options with an affinity key: `co_await c.inc(1, ordo::key("user-42"))`. Both:
/// `call_options{.timeout = 50ms, .key = "user-42"}`.
inline call_options key(std::string k) {
    return call_options{.key = std::move(k)};
}

/// A msgpack value that owns its memory: the result type of untyped calls.
using value = msgpack::object_handle;

/// What a channel completes a call with, before conversion to the caller's type.
struct call_outcome {
    msgpack::object_handle message;  ///< owns the response's memory
    msgpack::object result;          ///< the result, on success
    std::string detail;              ///< on failure: the remote message or the local reason
    /// `result` lives in the connection's read zone (`message` is empty): valid during
    /// complete*() only. Given only to calls whose takes_borrowed() is true.
    bool borrowed = false;
    /// On errc::overloaded: how long the server asked its caller to wait before trying again
    /// (the error map's retry_after_ms, docs/protocol.md "Error objects"); 0 when it gave none.
    std::uint32_t retry_after_ms = 0;
    /// On errc::overloaded: the server refused this caller for being over its share of it
    /// (server_options::shares), not for being full as a whole.
    bool over_share = false;
};

namespace detail {

/// Throws ordo::rpc_error(errc::bad_result) naming both types: `result does not convert:
/// expected int, got str "abc"` (the received value shortened). Out of line: the message needs
/// no template.
[[noreturn]] void throw_bad_result(const std::type_info& expected, const msgpack::object& got);

}  // namespace detail

}  // namespace ordo
