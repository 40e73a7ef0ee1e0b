// The call context of the handler running on this thread (ordo::current_context()), how it
// follows a coroutine handler across its co_awaits, and how calls made inside a handler take
// what is left of its deadline (docs/protocol.md, "Call context"; docs/design.md 5.11).
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ordo/net.hpp"
#include "ordo/rpc/codec.hpp"
#include "ordo/rpc/context.hpp"
#include "ordo/rpc/detail/pending_call.hpp"

namespace ordo::detail {

/// Set while a handler whose call carried a context runs on this thread; null otherwise.
extern thread_local const call_context* this_thread_context;
/// What owns it (the handler's run or its executor), for work that must keep it (a run_on body).
extern thread_local const std::shared_ptr<const call_context>* this_thread_context_owner;
/// How many context_scopes are open, on all threads. Every call a peer, pool or router starts
/// reads this first, and this thread's context only when it is not 0: a plain global is one
/// load, where a thread-local in code that may live in a dlopen()ed module (the Python
/// extension) is a call into the dynamic linker.
extern std::atomic<unsigned> contexts_set;

/// Sets this thread's context for its lifetime, and restores the one before.
class context_scope {
  public:
    explicit context_scope(const std::shared_ptr<const call_context>& c) noexcept
        : before_(this_thread_context), before_owner_(this_thread_context_owner) {
        this_thread_context = c.get();
        this_thread_context_owner = &c;
        contexts_set.fetch_add(1, std::memory_order_relaxed);
    }
    ~context_scope() {
        contexts_set.fetch_sub(1, std::memory_order_relaxed);
        this_thread_context = before_;
        this_thread_context_owner = before_owner_;
    }
    context_scope(const context_scope&) = delete;
    context_scope& operator=(const context_scope&) = delete;

  private:
    const call_context* before_;
    const std::shared_ptr<const call_context>* before_owner_;
};

/// An executor that runs everything it is given with `ctx` as this thread's context, on `inner`.
/// A coroutine handler spawned on it finds its context set each time it resumes, since Asio
/// resumes a coroutine through its executor: this is the coroutine-local context.
class context_executor {
  public:
    context_executor(net::any_io_executor inner, std::shared_ptr<const call_context> ctx)
        : inner_(std::move(inner)), ctx_(std::move(ctx)) {}

    template <class Property>
    requires net::can_query<const net::any_io_executor&, Property>::value decltype(auto) query(
        const Property& p) const {
        return net::query(inner_, p);
    }
    template <class Property>
    requires net::can_require<const net::any_io_executor&, Property>::value context_executor
    require(const Property& p)
    const { return {net::require(inner_, p), ctx_}; }
    template <class Property>
    requires net::can_prefer<const net::any_io_executor&, Property>::value context_executor
    prefer(const Property& p)
    const { return {net::prefer(inner_, p), ctx_}; }
    template <class F>
    void execute(F&& f) const {
        inner_.execute(with_context<std::decay_t<F>>{ctx_, std::forward<F>(f)});
    }
    friend bool operator==(const context_executor& a, const context_executor& b) noexcept {
        return a.inner_ == b.inner_ && a.ctx_ == b.ctx_;
    }
    friend bool operator!=(const context_executor& a, const context_executor& b) noexcept {
        return !(a == b);
    }

    const net::any_io_executor& inner() const noexcept { return inner_; }

  private:
    template <class F>
    struct with_context {
        std::shared_ptr<const call_context> ctx;
        F f;
        void operator()() {
            context_scope scope(ctx);
            std::move(f)();
        }
    };
    net::any_io_executor inner_;
    std::shared_ptr<const call_context> ctx_;
};

/// `ex` without a handler's context: what a long-lived object (a connection, a pool, a router, a
/// server, a batch) made inside a handler from `co_await this_coro::executor` must run on, or
/// everything it ever does would run as part of that one call (docs/design.md 5.11).
inline net::any_io_executor without_context(net::any_io_executor ex) {
    if (const auto* c = ex.target<context_executor>()) return c->inner();
    return ex;
}

/// The context a request carries (m.meta, checked by the decoder), as its handler sees it:
/// `arrived` plus the time the caller had left is its deadline. Null for a plain request.
/// `arrived` is read from the clock here, if it is not set, only when the request has a deadline.
/// `spare`: a context no one holds any more (or null), whose storage is reused.
std::shared_ptr<const call_context> read_context(const message& m,
                                                 std::chrono::steady_clock::time_point& arrived,
                                                 std::shared_ptr<call_context> spare = nullptr);

/// A call made inside a handler with a deadline takes what is left of it when it has no timeout
/// of its own; inside a traced handler, it carries a traceparent naming the handler's span as
/// its parent (and the tracestate), unless it has one. False when that deadline has passed: the
/// call must fail with errc::timed_out (inherited_timeout_reason() says why) without being sent.
/// A channel's default timeout (`default_timeout`, 0: none) still bounds it when shorter.
[[gnu::cold]] bool inherit_context(pending_call& call, std::chrono::milliseconds default_timeout);
std::string inherited_timeout_reason(const pending_call& call);

/// inherit_context() when a handler with a context may be running on this thread; true
/// otherwise (the common case: one load of contexts_set).
[[gnu::always_inline]] inline bool take_context(pending_call& call,
                                                std::chrono::milliseconds default_timeout) {
    if (contexts_set.load(std::memory_order_relaxed) == 0) [[likely]]
        return true;
    return inherit_context(call, default_timeout);
}

/// Throws errc::bad_arguments naming `method` when `meta` cannot be sent: an empty or reserved
/// ("ordo-") key, or more than the default ordo::limits allow a receiver to take.
/// `timed`: the deadline goes with it, and counts as the receiver counts it (one entry more).
void check_metadata(std::string_view method, const metadata& meta, bool timed);

/// The reserved metadata key that carries the time a caller has left, in milliseconds.
inline constexpr std::string_view deadline_key = "ordo-deadline-ms";

/// Appends `[0, msgid, method, params, meta]` to `out`: `params` an encoded array, meta the
/// call's metadata plus, when `timed`, the time `left` (0: the deadline has passed).
void write_context_request(buffer& out, std::uint32_t msgid, std::string_view method,
                           std::string_view params, const metadata& meta,
                           std::chrono::milliseconds left, bool timed);
/// All of it but the metadata's `pairs`, which follow it already encoded as map entries
/// (packed_metadata): the request is `out` followed by those.
void write_context_request_head(buffer& out, std::uint32_t msgid, std::string_view method,
                                std::string_view params, std::size_t pairs,
                                std::chrono::milliseconds left, bool timed);

/// The room of write_small_context_head's buffer (on the caller's stack).
inline constexpr std::size_t small_context_head = 256;
/// What write_context_request_head writes, for the common request (a fixstr method, fewer than
/// 15 pairs, all of it in `out`), written in one pass without a buffer; 0 when it does not fit
/// (or its method is 32 bytes or more, or it has 15 pairs or more), for
/// write_context_request_head to do. Its length otherwise. The pairs' encoding follows it.
std::size_t write_small_context_head(std::span<char, small_context_head> out, std::uint32_t msgid,
                                     std::string_view method, std::string_view params,
                                     std::size_t pairs, std::chrono::milliseconds left,
                                     bool timed) noexcept;

/// What a connection reaches inside metadata and call_context to reuse their storage.
struct context_reuse {
    static std::vector<metadata::pair>& pairs(metadata& m) { return m.own(); }
    static bool same(const metadata& a, const metadata& b) noexcept { return a.p_ == b.p_; }
    static void clear(call_context& c) noexcept {
        c.deadline = call_context::clock::time_point::max();
        c.trace_flags = 0;
        c.traced_ = false;
    }
};

/// The metadata a connection sent last, checked and encoded as map entries: calls that carry
/// the same pairs (one metadata object copied into each call, as callers do) reuse both.
class packed_metadata {
  public:
    /// `meta`'s pairs encoded as map entries, after check_metadata(method, meta, timed) (which
    /// throws, naming `method`).
    std::string_view pack(std::string_view method, const metadata& meta, bool timed) {
        // Inline, the common call: the very pairs of the call before, and no deadline to check
        // their size with.
        if (valid_ && !timed && context_reuse::same(meta, meta_)) [[likely]]
            return {encoded_.data(), encoded_.size()};
        return pack_other(method, meta, timed);
    }

  private:
    std::string_view pack_other(std::string_view method, const metadata& meta, bool timed);
    metadata meta_;  // held: while it is, the pairs cannot change under the cache
    std::size_t bytes_ = 0;
    buffer encoded_{small_buffer};
    bool valid_ = false;
};

}  // namespace ordo::detail
