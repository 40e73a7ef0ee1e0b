// batched_comm::impl: the state a batched_comm shares with its two coroutines. The writer's
// side is in batched_comm.cpp, the reader's in batched_read.cpp.
#pragma once

#include "ordo/comm/batched_comm.hpp"
#include "ordo/detail/copy_small.hpp"

#include <algorithm>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "comm/framing.hpp"
#include "comm/transports.hpp"
#include "lib/byte_buffer.hpp"
#include "ordo/detail/memory_budget.hpp"
#include "ordo/error.hpp"

namespace ordo {

// Messages back to back, for one write. append() copies a message's parts at the end in one
// step: std::vector's resize() wrote each new byte first (or, with an allocator that leaves
// them as they are, still looped over them), and a small message paid more for that than for
// its copy. A large body given with its owner (append_held) is not copied: it stays where it
// is, between the bytes before and after it, and is written from there.
class byte_queue {
  public:
    byte_queue() noexcept = default;
    byte_queue(const byte_queue&) = delete;
    byte_queue& operator=(const byte_queue&) = delete;
    ~byte_queue() { delete held_; }

    /// Bytes of its messages, held bodies included.
    std::size_t size() const noexcept { return b_.size() + held_bytes_; }
    /// Memory of its own (held bodies are their owners').
    std::size_t capacity() const noexcept { return b_.capacity(); }
    bool empty() const noexcept { return b_.empty() && !held_; }
    /// Whether it holds a body that is not its own (then it is written a piece at a time).
    bool holds() const noexcept { return held_ != nullptr; }
    /// Its own bytes, which are all of it when it holds nothing.
    net::const_buffer own() const noexcept { return net::buffer(b_.data(), b_.size()); }
    void clear() noexcept {
        b_.clear();
        if (held_) drop_held();
    }
    void swap(byte_queue& o) noexcept {
        std::swap(b_, o.b_);
        std::swap(held_, o.held_);
        std::swap(held_bytes_, o.held_bytes_);
    }
    /// Appends `a` then `b`; grows by doubling.
    void append(std::string_view a, std::string_view b) {
        const std::size_t n = a.size() + b.size();
        const std::size_t size = b_.size();
        if (b_.capacity() - size < n) grow(n);
        copy(b_.data() + size, a);
        if (!b.empty()) copy(b_.data() + size + a.size(), b);
        b_.resize_written(size + n);
    }
    /// Appends `head`, then `body` where it is, kept by `keep` until it is cleared.
    void append_held(std::string_view head, std::string_view body,
                     std::unique_ptr<held_body> keep) {
        append(head, {});
        if (!held_) held_ = new held_list;
        held_->push_back({b_.size(), body, std::move(keep)});
        held_bytes_ += body.size();
    }
    /// The bytes from offset `from` of size() up to the next border between its own bytes and
    /// a held body: what one write can take from one place.
    net::const_buffer piece(std::size_t from) const noexcept {
        if (!held_) [[likely]]
            return net::buffer(b_.data() + from, b_.size() - from);
        return piece_among_held(from);
    }
    /// Bytes [begin, end) of size(), copied into one string.
    std::string copy_out(std::size_t begin, std::size_t end) const {
        std::string m;
        m.reserve(end - begin);
        while (begin < end) {
            const auto p = piece(begin);
            const std::size_t n = std::min(p.size(), end - begin);
            m.append(static_cast<const char*>(p.data()), n);
            begin += n;
        }
        return m;
    }
    /// Empties it and gives its memory back (a large buffer to the thread's spares).
    void release() noexcept {
        detail::keep_spare(std::move(b_));
        if (held_) drop_held();
    }

  private:
    struct held {
        std::size_t at;  // offset in b_ that the body follows
        std::string_view body;
        std::unique_ptr<held_body> keep;
    };
    using held_list = std::vector<held>;
    void drop_held() noexcept {
        delete std::exchange(held_, nullptr);
        held_bytes_ = 0;
    }
    static void copy(char* to, std::string_view s) noexcept {
        detail::copy_small(to, s.data(), s.size());
    }
    void grow(std::size_t n) {
        const std::size_t c = std::max(2 * b_.capacity(), b_.size() + n);
        detail::byte_buffer q;
        if (c >= detail::spare_min_bytes) q = detail::take_spare(c, 2 * c);
        q.reserve(c);
        if (!b_.empty()) std::memcpy(q.data(), b_.data(), b_.size());
        q.resize_written(b_.size());
        detail::keep_spare(std::move(b_));
        b_ = std::move(q);
    }
    net::const_buffer piece_among_held(std::size_t from) const noexcept {
        std::size_t pos = 0, own = 0;  // where the next own bytes start, in size() and in b_
        for (const held& h : *held_) {
            const std::size_t own_n = h.at - own;
            if (from < pos + own_n) return net::buffer(b_.data() + own + (from - pos), own_n - (from - pos));
            pos += own_n;
            own = h.at;
            if (from < pos + h.body.size())
                return net::buffer(h.body.data() + (from - pos), h.body.size() - (from - pos));
            pos += h.body.size();
        }
        return net::buffer(b_.data() + own + (from - pos), b_.size() - own - (from - pos));
    }

    detail::byte_buffer b_;
    // Null while it holds no body (the common case: a swap and a check cost one word each).
    held_list* held_ = nullptr;
    std::size_t held_bytes_ = 0;
};

// The state shared by the public object and the two coroutines; the coroutines hold it alive
struct batched_comm::impl : std::enable_shared_from_this<batched_comm::impl> {
    using clock = std::chrono::steady_clock;
    using state = batched_comm::comm_state;
    // The writer's state: writing (none), or asleep until woken (idle), until its interval
    // has passed (interval), or until the peer ends its stream after close() (peer_eof).
    enum class wait { none, idle, interval, peer_eof };
    // The reader's state: reading (or about to), passing on the messages of a read
    // (delivering: what their handlers send is flushed when it is done), parked while its
    // owner pauses it, waiting for room in the memory budget, or done.
    enum class reader { reading, delivering, parked, budget, done };

    impl(std::unique_ptr<transport> tr, comm_options opt, message_fn m, closed_fn c)
        : t(std::move(tr)),
          o(std::move(opt)),
          on_message(std::move(m)),
          on_closed(std::move(c)),
          ex(t->get_executor()),
          writer_wake(ex, clock::time_point::max()),
          changed(t->get_executor(), clock::time_point::max()),
          framer(o.limits) {}

    std::unique_ptr<transport> t;
    comm_options o;
    message_fn on_message;
    taker_fn taker;
    std::function<bool()> on_eof;  // on_end_of_stream
    closed_fn on_closed;
    net::any_io_executor ex;        // the transport's
    net::steady_timer writer_wake;  // the writer sleeps on it; cancel() wakes it
    net::steady_timer changed;      // drain and close waiters sleep on it

    // Messages are kept back to back in one byte vector, with their end offsets beside: one
    // allocation per batch rather than per message, and one contiguous buffer per write.
    byte_queue queue, writing;
    std::vector<std::size_t> queue_ends, writing_ends;
    // Of `writing`, what the kernel took when flush() began the batch; the writer writes the rest.
    std::size_t written = 0;
    // Whether flush() may write (no interval to wait for; the transport has try_write); whether
    // one is posted; whether handlers the reader is passing messages to sent any (flushed when
    // it is done, with no post).
    bool direct = o.interval.count() <= 0, flush_posted = false;
    bool flush_due = false;
    // Whether a batch was taken only in part and the writer is to finish it (woken, or waiting
    // for room: write_in_steps), with no write of its pending; it stays set until the writer
    // runs, even if send() has written everything meanwhile. And the queue's size at which
    // send() next writes what the kernel takes (continue_batch).
    bool room_wait = false;
    std::size_t retry_at = 0;

    state st = state::open;
    wait writer_wait = wait::none;
    reader rd = reader::reading;
    bool started = false, finished = false, detached = false;
    bool paused = false;  // the owner's pause_reading(true): the reader parks at its next step
    bool want_written = false;  // the owner's want_written(true): on_written is called
    net::steady_timer reader_wake{t->get_executor(), clock::time_point::max()};
    bool has_reason = false;
    // hand_over(): where the connection goes once both loops have stopped, and the bytes read
    // past the last message delivered. preload(): bytes to deliver before reading.
    handed_fn handing;
    std::string leftover;
    bool preloaded = false;
    int drain_waiters = 0;
    clock::time_point last_write_start{};
    close_result result;
    comm_counters c;
    detail::framer framer;
    // Reads adapt between these (adapt_read_size).
    const std::size_t max_read_size = std::max<std::size_t>(1, o.read_chunk_bytes);
    const std::size_t min_read_size = std::min<std::size_t>(2048, max_read_size);
    std::size_t read_size = min_read_size;
    // message_timeout: since when the incomplete message now buffered has been waited for
    // (epoch: none is), and the timer that checks it.
    clock::time_point partial_since{};
    net::steady_timer partial_timer{t->get_executor()};
    bool partial_armed = false;
    // comm_options::budget: what this connection has charged to it, whether the reader waits
    // for it, and whether a wake-up is registered with it.
    static constexpr std::size_t budget_floor = 32 * 1024;
    static constexpr std::size_t out_step = 64 * 1024;  // output is charged in these steps
    std::size_t charged_read = 0, charged_out = 0;
    bool budget_registered = false;

    void charge_read() {
        if (o.budget) o.budget->adjust(charged_read, framer.capacity());
    }
    // Output is charged in whole steps, so that send() touches the shared counter once per
    // out_step bytes rather than once per message.
    void charge_out() {
        if (!o.budget) return;
        // What the two output vectors hold, not what is in them: they grow by doubling.
        const std::size_t held = queue.capacity() + writing.capacity();
        const std::size_t want = (held + out_step - 1) / out_step * out_step;
        if (want != charged_out) o.budget->adjust(charged_out, want);
    }

    void set_reason(std::error_code code, std::string reason) {
        if (has_reason) return;
        has_reason = true;
        result.code = code;
        result.reason = std::move(reason);
        result.at = clock::now();
    }

    // Ends the connection now: both loops see it at their next step.
    void fail(std::error_code code, std::string reason);

    // fail() for a fault of the peer's (protocol error, broken limit): with comm_options::
    // farewell, tells the peer why first (after what is queued), reads nothing more, and ends
    // once that is written or close_timeout has passed.
    bool quitting = false;
    net::steady_timer quit_timer{t->get_executor()};
    void fail_telling(std::error_code code, std::string reason);

    void wake_writer() {
        writer_wait = wait::none;
        writer_wake.cancel();
    }

    net::awaitable<void> sleep_writer(wait why, clock::time_point until) {
        writer_wait = why;
        writer_wake.expires_at(until);
        co_await writer_wake.async_wait(use_tuple);
        writer_wait = wait::none;
    }

    void send(std::string_view m, std::string_view body = {});
    // send() of a body that is not copied when it is held_body_bytes or more (see
    // batched_comm::send).
    void send_held(std::string_view head, std::string_view body, std::unique_ptr<held_body> keep);
    static constexpr std::size_t held_body_bytes = std::size_t{64} << 10;
    // send()'s checks (open, within max_buffer_bytes) and its work once a message is queued
    // (inlined into both sends: every message's way out).
    [[gnu::always_inline]] inline void admit(std::size_t size);
    [[gnu::always_inline]] inline void queued(std::size_t size);
    // Writes what the kernel takes of `writing` from `written` on, a piece at a time (held
    // bodies are pieces of their own), without waiting: adds it to `written`.
    [[gnu::always_inline]] void try_write_batch(std::error_code& ec) {
        if (!writing.holds()) [[likely]] {  // one piece
            written += t->try_write(writing.piece(written), ec);
            return;
        }
        for (;;) {
            const auto p = writing.piece(written);
            const std::size_t n = t->try_write(p, ec);
            written += n;
            if (ec || n < p.size() || written == writing.size()) return;
        }
    }

    // An idle writer's work without waking it: posted by send(), so that what one turn of
    // handlers queued leaves together. It writes what the kernel takes at once; the writer
    // writes any rest.
    void flush();
    // A write completed, outside any send(): the owner may send more (comm_options::on_written).
    void notify_written() {
        if (want_written && !detached && st != state::ended && o.on_written) o.on_written();
    }
    // The reader's flush, after the messages of a read or of a turn.
    void flush_delivered() {
        if (rd == reader::delivering) rd = reader::reading;
        if (!flush_due) return;
        flush_due = false;
        flush();
        notify_written();
    }
    // The start and the end of writing one batch (`writing`), whichever of flush() and the
    // writer writes it. end_batch() counts `n` bytes as written; true when `ec` ended the
    // connection.
    void begin_batch(clock::time_point now);
    bool end_batch(std::size_t n, const std::error_code& ec);
    // The writer's way with a batch when the transport has try_write: write what the kernel
    // takes, wait for room, again. True when the connection ended; false when no batch is
    // left, or when the transport cannot wait for room (direct turns false; async_write
    // writes the rest).
    net::awaitable<bool> write_in_steps();
    // send()'s share while the writer waits for room: see batched_comm.cpp.
    void continue_batch();

    // Moves messages [first, ends.size()) of a batch to the undelivered list.
    void hand_back(const byte_queue& bytes, const std::vector<std::size_t>& ends,
                   std::size_t first) {
        std::size_t begin = first == 0 ? 0 : ends[first - 1];
        for (std::size_t i = first; i < ends.size(); ++i) {
            const auto p = bytes.piece(begin);
            if (p.size() >= ends[i] - begin) {  // in one place: copied only when kept
                const std::string_view m(static_cast<const char*>(p.data()), ends[i] - begin);
                if (!o.keep_undelivered || o.keep_undelivered(m))
                    result.undelivered.emplace_back(m);
            } else {  // a held body's message, put together
                std::string m = bytes.copy_out(begin, ends[i]);
                if (!o.keep_undelivered || o.keep_undelivered(m))
                    result.undelivered.push_back(std::move(m));
            }
            begin = ends[i];
        }
    }

    // The two coroutines: the writer (batched_comm.cpp) and the reader (batched_read.cpp).
    net::awaitable<void> write_loop();
    net::awaitable<void> write_batches();
    net::awaitable<void> read_loop();
    net::awaitable<void> read_messages();

    // Passes on the whole messages the framer holds (`took`: any). True when it stopped after
    // messages_per_turn of them so that the writer may run first: yield, then call it again.
    bool deliver_some(bool& took);

    // After the messages of a read were passed on.
    void delivered(bool took);

    // Both loops stopped for hand_over(): the transport goes to its new owner, not closed.
    void hand_over_now();

    struct read_plan {
        std::size_t size;                     // to ask of the transport
        std::size_t max_capacity = SIZE_MAX;  // for the read buffer, if it has to grow
    };

    // By how much a read of `n` would grow the read buffer (framer::capacity_for), and what
    // the budget has left.
    std::size_t grows_by(std::size_t n, std::size_t max_capacity = SIZE_MAX) const noexcept {
        const std::size_t c = framer.capacity_for(n, max_capacity);
        return c > framer.capacity() ? c - framer.capacity() : 0;
    }
    std::size_t budget_room() const noexcept {
        const std::size_t used = o.budget->used();
        return used < o.budget->limit() ? o.budget->limit() - used : 0;
    }

    // What the next read may take under comm_options::budget (see there); waits while it may
    // take nothing. Returns size 0 only when the connection has ended.
    net::awaitable<read_plan> budgeted_read();

    // A full read means a burst: the next read takes up to read_chunk_bytes, so that a burst
    // after an idle spell costs two reads, not a doubling series. Reads under a quarter full
    // halve it, down to 2 KiB: an idle connection waits with a small buffer.
    void adapt_read_size(std::size_t n) {
        if (n == read_size)
            read_size = max_read_size;
        else if (n < read_size / 4)
            read_size = std::max(read_size / 2, min_read_size);
    }

    // After a read: starts or ends the wait for the incomplete message left in the framer (a
    // new one if this read completed others).
    void watch_partial(bool took);
    void check_partial();

    void finish();
};

}  // namespace ordo
