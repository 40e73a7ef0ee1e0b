// Dispatch of the messages an ordered connection receives (docs/protocol.md, "Dispatch order"; the
// ordering guarantee): requests and notifications start their handlers in arrival order; a serial
// handler runs to completion before the next message starts, a concurrent one lets it start while
// suspended; what cannot start yet waits in a bounded queue (reading pauses when it is full);
// ordo.cancel cancels a running handler or answers a queued request; ordo.ping is answered;
// ordo.closing and ordo.goaway are passed on; when the connection ends every handler is
// cancelled and the queue dropped.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>

#include "ordo/comm/held_body.hpp"
#include "ordo/rpc/codec.hpp"
#include "ordo/rpc/context.hpp"
#include "ordo/rpc/detail/handler_entry.hpp"
#include "ordo/net.hpp"
#include "rpc/dispatch/admission.hpp"

namespace ordo {

class peer;
class handlers;
struct peer_counters;

namespace detail {

class memory_budget;
class admission;
struct span_times;

/// What a dispatcher needs from its connection.
class dispatcher_host {
  public:
    virtual ~dispatcher_host() = default;
    /// Sends one encoded response (or nothing, once the connection has ended).
    virtual void send_response(const buffer& b) = 0;
    /// send_response() of one response made of `head` then `body`: a big stream item goes out
    /// from where it is, not copied behind its head first, and `keep` (when given) keeps it
    /// there until it is written (batched_comm::send).
    virtual void send_response_parts(std::string_view head, std::string_view body,
                                     std::unique_ptr<held_body> keep) {
        (void)keep;  // copied: let go on return
        buffer b;
        b.write(head.data(), head.size());
        b.write(body.data(), body.size());
        send_response(b);
    }
    /// Stops (true) or resumes (false) reading from the remote side.
    virtual void pause_reading(bool paused) = 0;
    /// A handler started: the remote side now waits on this one (liveness).
    virtual void handler_started() = 0;
    /// The connection, kept alive by each handler coroutine until it ends.
    virtual std::shared_ptr<void> keep_alive() = 0;
    /// The remote side said (ordo.closing) that it is closing the connection, and why.
    virtual void remote_closing(std::error_code code, std::string reason) = 0;
    /// The remote side said (ordo.goaway) that it is going away: it serves what it has and
    /// what still comes for `grace`, then closes. Each time it says so (the host keeps the
    /// first).
    virtual void remote_going_away(std::chrono::milliseconds grace, std::string reason) {
        (void)grace;
        (void)reason;
    }
    /// A handler that ran asynchronously has finished (its answer, if any, is sent).
    virtual void handler_finished() {}
    /// The remote side asked whether this one reads pieces (ordo.features "lanes") and was
    /// told it does: it reads them too (docs/protocol.md, "Lanes").
    virtual void remote_reads_lanes() {}
    /// A message was dropped with nobody to answer: a notification for a method with no
    /// handler, or whose handler threw.
    virtual void dropped(std::string_view method, errc code, std::string reason) = 0;
    /// ordo.credit, ordo.cancel or ordo.in `m` (`bytes` on the wire) names a call this
    /// dispatcher does not have: a named lane's dispatcher may (docs/protocol.md "Lanes": they
    /// may travel on the default lane).
    virtual void not_mine(const message& m, std::size_t bytes) {
        (void)m;
        (void)bytes;
    }
};

/// Belongs to the connection's executor. Counts into the peer_counters given (queued_messages,
/// running_handlers, requests_served, notifications_served, unknown_notifications,
/// notification_errors, handlers_cancelled).
class dispatcher {
  public:
    /// `self` is what handlers that take `ordo::peer&` receive; `h` (may be null: every request
    /// answers method-not-found) must outlive the dispatcher.
    dispatcher(peer& self, net::any_io_executor ex, const handlers* h,
               std::size_t max_queued_messages, std::size_t max_queued_bytes, memory_budget* budget,
               dispatcher_host& host, peer_counters& c);
    ~dispatcher();
    dispatcher(const dispatcher&) = delete;
    dispatcher& operator=(const dispatcher&) = delete;

    /// A request or a notification, as received (possibly borrowed from the read zone: what
    /// is kept is own()ed, and `m` may be moved from); `bytes`: its size on the wire.
    [[gnu::always_inline]] void on_message(message& m, std::size_t bytes) {
        // Inline: a message for a method of the application's, with nothing queued ahead of
        // it, goes straight to its handler.
        if (stopped_ || serial_busy_ || !queue_.empty() || m.method.starts_with("ordo."))
            [[unlikely]]
            return on_message_slow(m, bytes);
        // A synchronous handler open to every caller runs from here; anything else (an unknown
        // method, a handler that suspends, streams or checks its caller) takes the one
        // dispatch path, with what was found.
        const handler_entry* e = find(m.method);
        if (e && e->direct) [[likely]]
            return run_sync<false>(*e, m, nullptr);
        dispatch_plain(e, m, bytes);
    }
    /// A request that carries a context (message::meta). Never on_message's inline path: a
    /// synchronous handler open to every caller, with nothing queued ahead and no access log,
    /// runs from here with its context; anything else takes the one dispatch path.
    void on_context_message(message& m, std::size_t bytes);
    /// The connection ended: cancel every running handler (Asio terminal cancellation), drop
    /// the queue; later messages are not dispatched.
    void stop();
    /// The remote side's session was lost and a new one will follow on the same connection:
    /// cancel every running handler (their answers are dropped), drop the queue, and go on
    /// dispatching what arrives next.
    void restart();

    std::size_t running() const noexcept { return runs_.size(); }
    std::size_t queued() const noexcept { return queue_.size(); }
    std::size_t queued_bytes() const noexcept { return queued_bytes_; }

    /// Streaming handlers running for callers that stream (ordo.stream), by msgid.
    std::size_t streams() const noexcept { return streams_.size(); }

    /// Nothing more will arrive from the remote side (it closed its end, `why`): a reading
    /// handler whose caller had not closed its stream fails its read with errc::peer_lost.
    void input_ended(const std::string& why);
    /// Why input_ended() was called (empty: it was not).
    const std::string& input_end() const noexcept { return input_end_; }
    /// Handlers reading their caller's items (two-way and client streams), by msgid.
    std::size_t inboxes() const noexcept { return inboxes_.size(); }

    /// ordo.credit, ordo.cancel, ordo.in or ordo.in_end that another dispatcher of the
    /// connection did not have the call for (dispatcher_host::not_mine).
    void offered(const message& m, std::size_t bytes) { on_reserved(m, bytes); }

  private:
    struct run;
    class stream_run;
    class inbox;

    // How the caller of an ordo.stream streams: `window` > 0, it reads items (window and
    // window_bytes its credit); `writes`, it writes items too (docs/protocol.md, "Streams
    // both ways").
    // What reading handlers' windows have grown by, together (inbox::grow).
    std::uint64_t grown_bytes_ = 0;
    struct stream_shape {
        std::uint32_t window = 0;
        std::uint64_t window_bytes = 0;
        bool writes = false;
        std::uint64_t grow_to = 0;  // a writing caller's: how far the credit it gets may grow
    };

    void on_message_slow(message& m, std::size_t bytes);
    // `bytes`: its size on the wire (0: not known).
    void on_reserved(const message& m, std::size_t bytes);
    // ordo.in [msgid, item] and ordo.in_end [msgid, count] (rpc/dispatch/dispatcher_stream.cpp).
    void on_in(const message& m, std::size_t bytes);
    // ordo.health [service?]: the state's word, or method_not_found for a name never set
    // (rpc/dispatch/refusals.cpp).
    void answer_health(const message& m);
    /// Whether it had the call `msgid` (running or queued) to cancel.
    bool cancel_handler(std::uint32_t msgid);
    void respond_error(std::uint32_t msgid, errc code, const std::string& text);
    void report_dropped(std::string_view method, errc code, std::string_view failure) noexcept;
    // How a message came: the call's context, if it carried one (its handler runs with it,
    // and not at all once its deadline has passed); its size on the wire; when it was read
    // (set when its context or the access log needs it; else the handler's start stands in).
    struct arrival {
        std::shared_ptr<const call_context> ctx;
        std::size_t bytes = 0;
        std::chrono::steady_clock::time_point at{};
        bool observed = false;  // observes(ctx), asked once
    };
    // How `m` came: its context read (reusing spare_ctx_), and the clock read if its deadline,
    // the access log or a span needs it.
    [[gnu::always_inline]] inline arrival arrive(message& m, std::size_t bytes);
    // Whether its deadline had passed by now.
    [[gnu::always_inline]] static inline bool expired_already(const arrival& a);
    // A plain handler run with its arrival; its context kept for reuse if no one else did.
    [[gnu::always_inline]] inline void run_plain(const handler_entry& e, const message& m,
                                                 arrival& a);
    // Finds m's handler (ordo.stream: the one it wraps) and dispatches to it.
    void dispatch(message& m, arrival a);
    // dispatch_to for a message that came plain (no context, no stream), out of line: the
    // read path's inline code stays small.
    [[gnu::noinline]] void dispatch_plain(const handler_entry* e, message& m, std::size_t bytes);
    // The one dispatch path: `e` is m's handler or null; `how`: how its caller streams.
    void dispatch_to(const handler_entry* e, message& m, stream_shape how, arrival a);
    // A plain handler, run now. Full: the way for anything but on_message's inline path, with
    // the call's context and the access log; not Full: neither is looked at.
    template <bool Full>
    void run_sync(const handler_entry& e, const message& m, const arrival* a);
    void deny(const handler_entry& e, const message& m, const arrival& a);
    // Takes a slot of e's limit and of the server's (handler_options::concurrency,
    // server_options::concurrency), or refuses m (errc::overloaded, a notification dropped) and
    // says no. Only asked when one of them is set (rpc/dispatch/refusals.cpp). A server's
    // limit shared among callers (server_options::shares) may make the call wait: `wait` is
    // set, and the handler starts once it is granted (run_handler).
    [[gnu::cold]] bool admit(const handler_entry& e, const message& m, const arrival& a,
                             std::shared_ptr<admission::ticket>& wait);
    void expired(const handler_entry& e, const message& m, const arrival& a);
    void start_async(const handler_entry& e, message& m, stream_shape how, arrival a);
    // Answers a request with an error and records it (log_access), if it is observed;
    // `retry_after_ms` > 0: an overloaded answer's hint.
    void refuse(const message& m, const arrival& a, errc code, const std::string& text,
                std::uint64_t retry_after_ms = 0, bool over_share = false);
    // Whether a request with `ctx` is recorded as it is answered: in the access log
    // (server_options::access_log), or as a span (a traced call while spans are recorded).
    bool observes(const call_context* ctx) const noexcept;
    // Whether `ctx` is traced while spans are recorded: its call's span is kept if it fails,
    // timed or not.
    static bool spans_of(const call_context* ctx) noexcept;
    // One request answered: its access-log record and its span. `t.start` is its arrival.
    [[gnu::cold]] void log_access(std::string_view method, const call_context* ctx,
                                  std::error_code status, const span_times& t, std::size_t bytes_in,
                                  std::size_t bytes_out);
    bool unwrap_stream(message& m, stream_shape& how);
    static net::awaitable<void> stream_body(std::unique_ptr<stream_run> s,
                                            net::awaitable<void> body, buffer& out);
    // The body of a handler that reads, holding its inbox until it ends.
    static net::awaitable<void> inbox_body(std::unique_ptr<inbox> in, net::awaitable<void> body);
    static net::awaitable<void> answer_stats(dispatcher* d, std::shared_ptr<void> keep,
                                             std::uint32_t msgid);
    static net::awaitable<void> run_handler(dispatcher* d, std::shared_ptr<void> keep,
                                            std::list<run>::iterator it, message m,
                                            std::unique_ptr<buffer> out, net::awaitable<void> body,
                                            std::shared_ptr<admission::ticket> wait);
    void finish_handler(std::list<run>::iterator it, const message& m, buffer& out, bool failed,
                        const std::pair<errc, std::string>& why);
    // A call that waited for a slot and was refused or cancelled instead (`t` says which).
    void not_granted(std::list<run>::iterator it, const message& m, buffer& out,
                     admission::ticket& t);
    void drain_queue();
    void drop_all();
    const handler_entry* find(std::string_view method) {
        // Inline: a hit in methods_ (below).
        const std::size_t n = method.size();
        if (h_ && n > 0 && n <= sizeof(method_slot::name)) {
            const method_slot& s =
                methods_[(n + static_cast<unsigned char>(method[n - 1])) % methods_.size()];
            if (s.e && s.size == n) {
                std::size_t i = 0;
                while (i < n && s.name[i] == method[i]) ++i;
                if (i == n) return s.e;
            }
        }
        return find_and_remember(method);
    }
    const handler_entry* find_and_remember(std::string_view method);
    struct queued_message {
        message m;
        std::shared_ptr<const call_context> ctx;  // as it arrived (its deadline counts from then)
        std::chrono::steady_clock::time_point at;  // when it was read, if that is needed
        std::size_t wire;  // its size on the wire (max_queued_bytes counts these)
        std::size_t held;  // what it holds in memory (charged to the budget)
    };
    void pop_queued(std::list<queued_message>::iterator it);

    peer& self_;
    const handlers* h_;
    std::size_t max_queued_;
    std::size_t max_queued_bytes_;
    memory_budget* budget_;  // queued messages are charged to it (null: none)
    dispatcher_host& host_;
    peer_counters& c_;
    net::any_io_executor ex_;
    // A list, not a deque: a deque allocates on construction, and most connections never
    // queue a message.
    std::list<queued_message> queue_;
    std::size_t queued_bytes_ = 0;
    std::list<run> runs_;
    std::unordered_map<std::uint32_t, stream_run*> streams_;  // ordo.credit goes to these
    std::unordered_map<std::uint32_t, inbox*> inboxes_;       // ordo.in goes to these
    std::string input_end_;  // input_ended()'s reason
    buffer scratch_{small_buffer};  // responses of plain-function handlers, reused
    // The context of the last request served by a plain function, when no one kept it: the next
    // request's context reuses its memory (read_context).
    std::shared_ptr<call_context> spare_ctx_;
    // The methods this connection called last, by the bytes of their names: most connections
    // call a few methods over and over, and a hit costs a compare of a few bytes instead of a
    // walk of the table comparing strings. Entries stay valid: handlers never erases one (a
    // name registered again keeps its entry, with the new handler in it).
    struct method_slot {
        const handler_entry* e = nullptr;
        std::uint8_t size = 0;
        char name[23];
    };
    std::array<method_slot, 4> methods_{};
    std::uint32_t limit_ticks_ = 0;  // calls counted by a concurrency limit: one in four is timed
    // This connection's seat in a server limit shared among callers (taken at its first call
    // that the limit counts).
    std::shared_ptr<admission::seat> seat_;
    bool serial_busy_ = false;
    bool paused_ = false;
    std::uint32_t pipelined_ = 0;  // pipelined runs out (handler_entry::pipeline)
    bool stopped_ = false;
};

}  // namespace detail
}  // namespace ordo
