// The machinery of stream calls (ordo/rpc/stream_call.hpp): the caller's queue of items and
// credit (stream_core, stream_state<T>, upload_state<R>), the server's side a writer<T> writes to
// (stream_out), and the server's side a reader<T> reads from (stream_in).
#pragma once

#include "ordo/config.hpp"

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <typeinfo>
#include <utility>

#include <asio/associated_cancellation_slot.hpp>
#include <asio/associated_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/dispatch.hpp>
#include <asio/post.hpp>

#include "ordo/comm/held_body.hpp"
#include "ordo/rpc/call.hpp"
#include "ordo/rpc/channel_impl.hpp"
#include "ordo/rpc/detail/msgpack_core.hpp"
#include "ordo/rpc/detail/pending_call.hpp"
#include "ordo/detail/shutdown_hook.hpp"
#include "ordo/error.hpp"
#include "ordo/net.hpp"

namespace ordo {

namespace detail {

/// One suspended coroutine (its completion handler), parked until another thread wakes it:
/// wake() posts it to its own executor.
class parked {
  public:
    virtual ~parked() = default;
    virtual void wake() = 0;
};

/// Posts `h` to its executor; `work` (tracked work of that executor, or none) ends with it, on
/// that thread. The handler's cancellation slot (if one was installed) is cleared there too,
/// where it is emitted.
template <class H>
void post_handler(H h, net::any_io_executor work = {}) {
    auto ex = net::get_associated_executor(h);
    auto slot = net::get_associated_cancellation_slot(h);
    net::post(ex, [h = std::move(h), w = std::move(work), slot]() mutable {
        if (slot.is_connected()) slot.clear();
        std::move(h)();
    });
}

template <class H>
class parked_handler final : public parked, shutdown_hook {
  public:
    // While parked, the handler counts as work of its executor (as an Asio operation in
    // progress would): its io_context does not run out of work and stop meanwhile.
    explicit parked_handler(H h)
        : shutdown_hook(net::get_associated_executor(h)),
          h_(std::move(h)),
          work_(net::prefer(net::get_associated_executor(h_),
                            net::execution::outstanding_work.tracked)) {}
    // Destroyed on the thread that woke it (a stream's reader, by its connection's), maybe
    // while the destruction of its io_context takes it on another: the hook goes first.
    ~parked_handler() override { unhook(); }

    void wake() override {
        // The handler is taken once: here, or by its io_context's destruction (on_shutdown),
        // whichever comes first. That destruction waits until the post is made.
        int parked = state::parked;
        if (!st_.compare_exchange_strong(parked, state::waking, std::memory_order_acq_rel)) return;
        struct posted {  // also if the post throws (it allocates)
            std::atomic<int>& st;
            ~posted() {
                st.store(state::gone, std::memory_order_release);
                st.notify_all();
            }
        } done{st_};
        // The work goes with the handler, and ends on its own thread: once posted, the handler
        // may run, and its io_context end, before this function returns.
        post_handler(std::move(h_), std::move(work_));
    }

  private:
    enum state : int { parked, waking, gone };

    // The handler's io_context is being destroyed: the handler goes unrun, as Asio's own go.
    void on_shutdown() noexcept override {
        int parked = state::parked;
        if (!st_.compare_exchange_strong(parked, state::gone, std::memory_order_acq_rel)) {
            // Woken on another thread: its post reaches the context before it goes.
            while (st_.load(std::memory_order_acquire) == state::waking) st_.wait(state::waking);
            return shutdown_done();
        }
        auto w = std::move(work_);
        auto h = std::move(h_);
        shutdown_done();  // the waker may destroy this object from here on
    }

    H h_;
    net::any_io_executor work_;
    std::atomic<int> st_{state::parked};
};

template <class H>
std::unique_ptr<parked> park(H h) {
    return std::make_unique<parked_handler<H>>(std::move(h));
}

/// An item's msgpack bytes: its own, or kept where its connection read them (`kept`).
struct packed_bytes {
    std::string own;
    std::shared_ptr<const kept_bytes> kept;
    std::string_view kept_view;  ///< with `kept`: the item's bytes
    std::string_view view() const noexcept { return kept ? kept_view : std::string_view(own); }
    bool empty() const noexcept { return !kept && own.empty(); }
};

/// The bytes `item` was read from, kept where its connection read them (keep_delivered), with
/// `kept` as their owner; empty, and `item` is to be copied, when they cannot be kept. `item`
/// must end the message being delivered on this thread (an ordo.item's or ordo.in's does), its
/// strs and bins borrowed from it.
std::string_view keep_delivered_item(const msgpack::object& item,
                                     std::shared_ptr<const kept_bytes>& kept);

/// The server's side of one stream, as a handler's writer sees it
/// (rpc/dispatch/dispatcher_stream.cpp). Belongs to the connection's executor.
class stream_out {
  public:
    virtual ~stream_out() = default;
    /// Whether an item may be sent now (a caller that does not stream always may: its items
    /// are collected into one response).
    virtual bool has_credit() const noexcept = 0;
    /// Completes when credit has come. Throws std::system_error(errc::cancelled) when the
    /// handler is cancelled meanwhile.
    virtual net::awaitable<void> wait_credit() = 0;
    /// The buffer to pack one item into; end_item() sends it (or collects it), and returns
    /// false when the item is still to be handed over (hand_over()). begin_item and end_item
    /// throw when the stream has been cancelled, or when a collection outgrows its limit.
    virtual buffer& begin_item() = 0;
    virtual bool end_item() = 0;
    /// begin_item(), an item packed already (`front` then `back`, e.g. a bin's head and its
    /// bytes) written into it, and end_item(); a stream that sends at once copies `front`
    /// behind the item's head and sends `back` from where it is, and `keep` (when given) keeps
    /// `back` there until it is written.
    virtual bool write_packed(std::string_view front, std::string_view back,
                              [[maybe_unused]] std::unique_ptr<held_body> keep) {
        buffer& b = begin_item();
        if (!front.empty()) b.write(front.data(), front.size());
        if (!back.empty()) b.write(back.data(), back.size());
        return end_item();  // `keep` goes as this returns: the item has been copied
    }
    bool write_packed(std::string_view item, std::unique_ptr<held_body> keep) {
        return write_packed({}, item, std::move(keep));
    }
    /// Hands the item packed since begin_item() over to the connection's loop and completes
    /// once it has been sent there (after credit came); throws errc::cancelled when the call
    /// is cancelled meanwhile. Only where end_item() returned false.
    virtual net::awaitable<void> hand_over();
    /// Items written so far.
    virtual std::uint64_t written() const noexcept = 0;
};

/// The items a caller writes to a handler (two-way and client streams), as the handler's reader
/// sees them (rpc/dispatch/dispatcher_stream.cpp). Belongs to the connection's executor.
class stream_in {
  public:
    virtual ~stream_in() = default;
    /// Takes the next item if it can now: true with `item` pointing at it (valid until the next
    /// call), or null once the caller has closed its side and every item has been taken; false
    /// when the reader must wait() first. Throws std::system_error: errc::cancelled once the
    /// call is cancelled (or its connection ends), errc::protocol_error when the caller broke
    /// the credit or miscounted its items, errc::peer_lost when its connection's input ended
    /// first.
    virtual bool try_next(const msgpack::object*& item) = 0;
    /// What take_packed() found: nothing yet (wait() first), an item, or the end.
    enum class took { none, item, end };
    /// try_next() for a reader that passes items on as msgpack bytes (the Python binding):
    /// `packed` gets the item. An item of packed_item_bytes or more is kept as bytes when it
    /// arrives (where its connection read them, when it can: keep_delivered_item), and moved
    /// out here rather than copied again. Throws as try_next().
    virtual took take_packed(packed_bytes& packed) = 0;
    static constexpr std::size_t packed_item_bytes = std::size_t{64} << 10;
    /// Completes when try_next() may have something (an item, the end, a failure).
    virtual net::awaitable<void> wait() = 0;
    /// Items taken so far.
    virtual std::uint64_t taken() const noexcept = 0;
};

/// Throws std::system_error(errc::bad_arguments): item `index` (1-based) of the items written to
/// `method` does not convert to `expected`.
[[noreturn]] void throw_bad_item(std::uint64_t index, const std::type_info& expected,
                                 const std::exception& e);

/// A streaming handler's output as a body on handler_options::run_on sees it: each item is
/// packed on the body's thread and handed to the connection's loop, where it waits for credit
/// and goes out in order; the body's write() suspends until then. rpc/dispatch/offload.cpp.
class offload_out final : public stream_out {
  public:
    /// `loop_side` (on `loop`) outlives this; `stop` is the call's.
    offload_out(stream_out& loop_side, net::any_io_executor loop, std::stop_token stop)
        : loop_side_(loop_side), loop_(std::move(loop)), stop_(std::move(stop)) {}
    bool has_credit() const noexcept override { return true; }  // checked on the loop
    net::awaitable<void> wait_credit() override;
    buffer& begin_item() override;
    bool end_item() override { return false; }
    net::awaitable<void> hand_over() override;
    std::uint64_t written() const noexcept override { return written_; }

  private:
    stream_out& loop_side_;
    net::any_io_executor loop_;
    std::stop_token stop_;
    buffer item_{small_buffer};
    std::uint64_t written_ = 0;
};

/// The caller's side of one stream, untyped (rpc/streams/stream_call.cpp). Items arrive on the
/// channel's executor; the reader may be on another thread: what both touch is under a mutex.
class stream_core : public std::enable_shared_from_this<stream_core> {
  public:
    /// `window` is clamped to 1 .. max_stream_window; `window_bytes` 0 means no byte limit.
    stream_core(std::string method, std::string remote, net::any_io_executor channel_ex,
                std::uint32_t window, std::uint64_t window_bytes);
    virtual ~stream_core();
    stream_core(const stream_core&) = delete;
    stream_core& operator=(const stream_core&) = delete;

    // ---- the connection's side (the channel's executor) ----
    /// One item, borrowed (valid during the call only), `wire_bytes` long as received.
    virtual void on_item(const msgpack::object& item, std::size_t wire_bytes) = 0;
    /// The connection that sent the call: how to grant more credit, items and bytes (called
    /// from any thread, with the stream's mutex held: it must only post, never block or call
    /// back into the stream).
    void attach(std::function<void(std::uint32_t, std::uint64_t)> grant);
    /// The call completed: the stream ends after the items received, with `ec` if set.
    void end(std::error_code ec, call_outcome& out);
    std::uint32_t window() const noexcept { return window_; }
    std::uint64_t window_bytes() const noexcept { return window_bytes_; }
    /// Lets the window grow toward the path's bandwidth times its round trip, up to `max_bytes`
    /// (call_options::max_window_bytes; before the call starts).
    void grow_toward(std::uint64_t max_bytes);
    bool grows() const noexcept { return max_window_bytes_ > window_bytes_; }
    /// The connection that carries the stream, which its window probes ping (ordo.ping).
    void probe_through(std::weak_ptr<channel_impl> ch);
    /// The window now, in bytes (it may have grown).
    std::uint64_t current_window_bytes() const;
    /// A probe's ordo.ping was answered (`ec`: or failed).
    void on_pong(std::error_code ec);
    net::cancellation_slot slot() { return signal_.slot(); }

    // ---- the reader's side ----
    /// Asks the remote side to stop (ordo.cancel); the reader gets what had arrived, then
    /// errc::cancelled. Does nothing once the stream has ended.
    void cancel();
    std::uint64_t received() const;
    const std::string& method() const noexcept { return method_; }
    const std::string& remote() const noexcept { return remote_; }
    // ---- the writing half (two-way and client streams: the caller writes items too) ----
    /// Whether the caller writes items (docs/protocol.md, "Streams both ways").
    bool writes() const noexcept { return writes_; }
    /// Makes this stream one whose caller writes items (before the call starts).
    void set_writes() noexcept { writes_ = true; }
    /// The connection that sent the call: how to send an item (its packed bytes: ordo.in) and,
    /// with `last` true, the end of the caller's items (the count packed: ordo.in_end). Called
    /// from the writer's thread, never with the stream's mutex held; the bytes are valid during
    /// the call only.
    /// Returns the count of items to end the stream with at once when the caller closed its
    /// side before the call went out (the connection sends it, behind the request).
    /// How the connection sends an item: its bytes are `front` then `item`; `keep`, when not
    /// null, owns a large `item`'s bytes, and the connection may take it to write them from
    /// where they are (held_body).
    using item_sender = std::function<void(std::string_view front, std::string_view item,
                                           bool last, std::unique_ptr<held_body>* keep)>;
    std::optional<std::uint64_t> attach_writer(item_sender send);
    /// ordo.in_credit from the server (the channel's executor): it takes `items` more items and
    /// `bytes` more bytes of them.
    void grant_in(std::uint64_t items, std::uint64_t bytes);
    /// Items written so far (sent or handed to the connection).
    std::uint64_t written() const;
    /// The writer's side (any executor, one writer at a time): the buffer to pack the next item
    /// into (cleared), then write_item() to send it.
    buffer& item_buffer() noexcept {
        item_.clear();
        return item_;
    }
    /// Waits for credit and sends the item packed into item_buffer(); false when the call has
    /// already ended (its answer or its failure came: the reader's next() or finish() says
    /// which). Throws std::logic_error after close_writes(), and
    /// std::system_error(operation_aborted) when the awaiting coroutine is cancelled.
    static net::awaitable<bool> write_item(std::shared_ptr<stream_core> s);
    /// write_item() of `item`, which the caller keeps valid until it completes, instead of
    /// item_buffer()'s (a big item that is packed already is not copied into the buffer).
    static net::awaitable<bool> write_item(std::shared_ptr<stream_core> s, std::string_view item) {
        return write_item_kept(std::move(s), {}, item, nullptr);
    }
    /// The same, where `keep` owns the item's bytes: the connection may take it, and write a
    /// large item from where it is (held_body). `keep` must outlive the write.
    static net::awaitable<bool> write_item(std::shared_ptr<stream_core> s, std::string_view item,
                                           std::unique_ptr<held_body>& keep) {
        return write_item_kept(std::move(s), {}, item, &keep);
    }
    /// The same for an item whose bytes are `front` (copied: a bin's head) then `back` (kept by
    /// `keep`).
    static net::awaitable<bool> write_item(std::shared_ptr<stream_core> s, std::string_view front,
                                           std::string_view back,
                                           std::unique_ptr<held_body>& keep) {
        return write_item_kept(std::move(s), front, back, &keep);
    }
    /// write_item() for a writer without an event loop (ordo::sync_client): blocks the calling
    /// thread until credit has come, or the call has ended (false).
    bool write_item_blocking();
    /// No more items from the caller (ordo.in_end, counting them); once only.
    void close_writes();

    /// For readers without an event loop (ordo::sync_client): blocks the calling thread until
    /// the reader has something to take (an item, or the end) and returns true, or until
    /// `deadline` (none: no limit) has passed with nothing to take and returns false.
    bool wait_ready(std::optional<std::chrono::steady_clock::time_point> deadline);

  protected:
    /// With mu_ held, on success: whether the final response `result` is right for this stream
    /// (empty) or what is wrong with it. A stream's counts the items it sent.
    virtual std::string check_result(const msgpack::object& result);
    /// With mu_ held: the stream fails with errc::protocol_error and `what`, and is cancelled.
    void fail_and_cancel(std::string what);

    struct credit {
        std::uint32_t items = 0;
        std::uint64_t bytes = 0;
    };
    /// With mu_ held: the reader took one item of `bytes`. Returns the credit to grant (items
    /// 0: none yet), to be passed to grant() once mu_ is released.
    credit took_one(std::size_t bytes);
    void grant(credit c);
    /// With mu_ held: whether one more item keeps within the credit granted so far, the window
    /// and every ordo.credit since (docs/protocol.md, "Streams": one item may take more bytes
    /// than were left). What the reader has taken without granting it back yet is not credit:
    /// a server that ignores credit is caught even while the reader keeps up, and cannot fill
    /// this side's memory (at most `window` items, and window_bytes plus one item, queued).
    bool within_credit() const noexcept {
        return received_ < granted_items_ &&
               (window_bytes_ == 0 || received_bytes_ < granted_bytes_);
    }
    /// With mu_ held: one item of `bytes` has been received (within the credit).
    void count_item(std::size_t bytes) {
        ++received_;
        received_bytes_ += bytes;
        if (sampling_) [[unlikely]]
            sample();
    }
    /// With mu_ held: a window probe's sample, as an item arrives (grow_toward).
    void sample();
    /// An item beyond the credit: the stream fails with errc::protocol_error (and is cancelled).
    void over_credit();
    /// With mu_ held: the stream has ended; throws its error, if any.
    void throw_if_failed() const;
    /// An item that does not convert: the stream fails with errc::bad_result (and is cancelled).
    void bad_item(const std::exception& e, const msgpack::object& item);
    /// With mu_ held by the caller of push: takes the waiting reader out, to wake unlocked.
    std::unique_ptr<parked> take_waiter() { return std::move(waiter_); }

    mutable std::mutex mu_;
    bool ended_ = false;
    std::error_code ec_;
    std::string detail_;
    std::unique_ptr<parked> waiter_;
    std::uint64_t received_ = 0;
    std::uint64_t received_bytes_ = 0;

    /// With mu_ held: whether the reader has something to take.
    virtual bool ready_locked() const noexcept = 0;

    /// Completes when `ready()` holds (with mu_ held; at once if it does already) and `slot`,
    /// where the coroutine is parked, is woken, or when the awaiting coroutine is cancelled.
    template <class Ready>
    auto park_until(std::unique_ptr<parked>& slot, Ready ready) {
        return net::async_initiate<const net::use_awaitable_t<>&, void()>(
            [this, &slot, ready](auto handler) {
                std::unique_lock lk(mu_);
                if (ready()) {
                    lk.unlock();
                    post_handler(std::move(handler));
                    return;
                }
                auto cs = net::get_associated_cancellation_slot(handler);
                slot = park(std::move(handler));
                if (cs.is_connected())
                    cs.assign([this, &slot](net::cancellation_type) { wake_parked(slot); });
            },
            net::use_awaitable);
    }
    /// Wakes what `slot` holds parked, if anything (a cancellation: emitted on its thread).
    void wake_parked(std::unique_ptr<parked>& slot);

    /// Completes when an item has arrived or the stream has ended (at once if so already), or
    /// when the awaiting coroutine is cancelled (next() then throws, taking nothing).
    auto wait_more() {
        return park_until(waiter_, [this] { return ready_locked(); });
    }
    /// Wakes a parked reader, if any.
    void wake_reader() { wake_parked(waiter_); }

    /// With mu_ held: whether a write may go now (credit), or need not wait (the call ended).
    bool writable_locked() const noexcept {
        return ended_ || (in_items_ < in_granted_items_ && in_bytes_ < in_granted_bytes_);
    }
    /// Completes when write credit has come or the call has ended, or when the awaiting
    /// coroutine is cancelled.
    auto wait_writable() {
        return park_until(write_waiter_, [this] { return writable_locked(); });
    }

  private:
    std::string method_;
    std::string remote_;
    net::any_io_executor channel_ex_;
    std::uint32_t window_;
    std::uint64_t window_bytes_;
    credit unreported_;  // read since the last grant
    // The window plus every grant since: what the server may have sent in all.
    std::uint64_t granted_items_;
    std::uint64_t granted_bytes_;
    std::function<void(std::uint32_t, std::uint64_t)> grant_;
    // Growth (grow_toward): one probe at a time. An ordo.ping sent with a grant measures the
    // round trip; if a third of the window or more arrives in the round trip after its answer,
    // the window doubles (stream_core::sample).
    std::uint64_t max_window_bytes_ = 0;
    std::weak_ptr<channel_impl> probe_ch_;
    bool probing_ = false;   // the ping is out
    bool sampling_ = false;  // counting what arrives in one round trip
    std::chrono::steady_clock::time_point probe_start_;
    std::chrono::steady_clock::duration probe_rtt_{};
    std::uint64_t probe_items_ = 0, probe_bytes_ = 0;  // received when the sample started
    std::uint64_t taken_ = 0;                           // items the reader took
    net::cancellation_signal signal_;
    bool cancel_sent_ = false;
    // The writing half: what the server granted (ordo.in_credit) and what was written.
    bool writes_ = false;
    bool writes_closed_ = false;
    std::uint64_t in_granted_items_ = 0;
    std::uint64_t in_granted_bytes_ = 0;
    std::uint64_t in_items_ = 0;
    std::uint64_t in_bytes_ = 0;
    item_sender send_;
    static net::awaitable<bool> write_item_kept(std::shared_ptr<stream_core> s,
                                                std::string_view front, std::string_view item,
                                                std::unique_ptr<held_body>* keep);
    std::unique_ptr<parked> write_waiter_;
    buffer item_{64};  // the item being written (the writer's alone)
};

template <class T>
class stream_state final : public stream_core {
  public:
    using stream_core::stream_core;

    void on_item(const msgpack::object& item, std::size_t wire_bytes) override {
        std::optional<T> v;
        try {
            if constexpr (std::is_same_v<T, msgpack::object_handle>)
                v.emplace(msgpack::clone(item));  // ordo::value: the raw item, kept
            else
                v.emplace(item.as<T>());
        } catch (const std::exception& e) {
            return bad_item(e, item);
        }
        std::unique_ptr<parked> w;
        {
            std::lock_guard lk(mu_);
            if (ended_) return;
            if (!within_credit()) return over_credit();
            items_.push_back({std::move(*v), wire_bytes});
            count_item(wire_bytes);
            w = take_waiter();
        }
        if (w) w->wake();
    }

    /// The next item; std::nullopt at the end; throws ordo::rpc_error when the stream failed
    /// (after every item received before the failure has been returned), and
    /// std::system_error(operation_aborted) when the awaiting coroutine is cancelled (no item
    /// is taken then). `s` is held until it completes.
    static net::awaitable<std::optional<T>> next(std::shared_ptr<stream_state> s) {
        std::optional<T> v;
        while (!s->take(v)) {
            co_await s->wait_more();
            auto cs = co_await net::this_coro::cancellation_state;
            if (cs.cancelled() != net::cancellation_type::none)
                throw std::system_error(make_error_code(net::error::operation_aborted),
                                        "ordo: waiting for an item of " + s->method());
        }
        co_return v;
    }

    /// next() for a blocked thread (ordo::sync_client): true with `v` holding the next item,
    /// or empty at the end (throws as next() does when the stream failed); false when
    /// `deadline` passed first (nothing is taken then).
    bool next_until(std::optional<T>& v,
                    std::optional<std::chrono::steady_clock::time_point> deadline) {
        while (!take(v))
            if (!wait_ready(deadline)) return false;
        return true;
    }

  private:
    struct queued {
        T value;
        std::size_t bytes;
    };

    bool ready_locked() const noexcept override { return !items_.empty() || ended_; }

    // True when `v` holds the next item, or the stream ended well (v empty); throws when it
    // failed; false when the reader must wait.
    bool take(std::optional<T>& v) {
        credit c;
        {
            std::lock_guard lk(mu_);
            if (items_.empty()) {
                if (!ended_) return false;
                throw_if_failed();
                return true;
            }
            v.emplace(std::move(items_.front().value));
            const std::size_t bytes = items_.front().bytes;
            items_.pop_front();
            c = took_one(bytes);
        }
        if (c.items) grant(c);
        return true;
    }

    std::deque<queued> items_;
};

/// The caller's side of a client stream (ordo::upload): it writes items, and the final response
/// is the handler's result.
template <class R>
class upload_state final : public stream_core {
  public:
    upload_state(std::string method, std::string remote, net::any_io_executor channel_ex)
        : stream_core(std::move(method), std::move(remote), std::move(channel_ex), 1, 0) {
        set_writes();
    }

    void on_item(const msgpack::object&, std::size_t) override {
        std::lock_guard lk(mu_);
        if (!ended_) fail_and_cancel("the server sent an item on a client stream");
    }

    /// Closes the caller's side (if not yet) and waits for the answer: the handler's result.
    /// Throws ordo::rpc_error when the call failed, errc::bad_result when the result does not
    /// convert.
    static net::awaitable<R> finish(std::shared_ptr<upload_state> s) {
        s->close_writes();
        for (;;) {
            {
                std::lock_guard lk(s->mu_);
                if (s->ended_) {
                    s->throw_if_failed();
                    if constexpr (std::is_void_v<R>)
                        co_return;
                    else
                        co_return s->convert();
                }
            }
            co_await s->wait_more();
            auto cs = co_await net::this_coro::cancellation_state;
            if (cs.cancelled() != net::cancellation_type::none)
                throw std::system_error(make_error_code(net::error::operation_aborted),
                                        "ordo: waiting for the answer of " + s->method());
        }
    }

    /// finish() for a thread without an event loop (ordo::sync_client): blocks until the answer.
    R finish_blocking() {
        close_writes();
        wait_ready(std::nullopt);  // returns once the call has ended
        {
            std::lock_guard lk(mu_);
            throw_if_failed();
        }
        if constexpr (std::is_same_v<R, msgpack::object_handle>)
            return msgpack::clone(result_.get());  // ordo::value: the answer as it came
        else
            return convert();
    }

  private:
    bool ready_locked() const noexcept override { return ended_; }
    std::string check_result(const msgpack::object& result) override {
        result_ = msgpack::clone(result);
        return {};
    }
    auto convert() {
        if constexpr (!std::is_void_v<R>) {
            try {
                return result_.get().template as<R>();
            } catch (const std::exception&) {
                throw_bad_result(typeid(R), result_.get());
            }
        }
    }

    msgpack::object_handle result_;
};

/// The pending call of a stream: its completion ends the stream.
class stream_call final : public pending_call {
  public:
    explicit stream_call(std::shared_ptr<stream_core> s) : s_(std::move(s)) {}
    void complete(std::error_code ec, call_outcome out) override { s_->end(ec, out); }

  private:
    std::shared_ptr<stream_core> s_;
};

/// Sends the streaming call (from any thread: dispatched to the channel's executor).
void start_stream(const std::shared_ptr<channel_impl>& ch, std::shared_ptr<stream_core> s,
                  params_buffer params, call_options o);

}  // namespace detail
}  // namespace ordo
