// BatchedComm: one ordered, bidirectional connection to one peer (docs/protocol.md, "BatchedComm
// guarantees").
#pragma once

#include "ordo/config.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "ordo/error.hpp"
#include "ordo/limits.hpp"
#include "ordo/net.hpp"
#include "ordo/comm/held_body.hpp"
#include "ordo/comm/transport.hpp"

namespace ordo {

namespace detail {
class memory_budget;
}

/// One write of the writer: when it started, what it carried.
struct write_event {
    std::chrono::steady_clock::time_point start;
    std::size_t messages = 0;
    std::size_t bytes = 0;
};

struct comm_options {
    /// The writer starts a write at most once per interval (a rate limit, not a tick: the first
    /// message after an idle spell goes out at once). 0: write as soon as the previous write is
    /// done, with everything queued meanwhile.
    std::chrono::milliseconds interval{0};
    /// A queue this large is written at once, without waiting for the rest of the interval
    /// (with interval 0, without waiting for the end of the executor's turn).
    std::size_t max_batch_bytes = 64 * 1024;
    /// Above this many buffered bytes, async_drain() waits.
    std::size_t high_water_bytes = std::size_t{4} << 20;
    /// send() refuses (errc::overloaded) a message that would take the buffered bytes above
    /// this. Buffered = taken by send() and not yet written, the write in flight included.
    std::size_t max_buffer_bytes = std::size_t{256} << 20;
    /// Bounds on incoming messages.
    ordo::limits limits;
    /// Most bytes asked of the transport per read. Reads start at 2 KiB, take up to this after
    /// one comes back full, and halve while they come back mostly empty; the read buffer follows
    /// (growing to a message larger than that, and shrinking back once it is taken), so that an
    /// idle connection holds a few KiB, not a read_chunk_bytes buffer.
    std::size_t read_chunk_bytes = 64 * 1024;
    /// After this many messages of one read, if their handlers queued messages (and the writer
    /// is not waiting for its interval), the reader lets the writer run before it goes on:
    /// replies leave while the rest of the read is processed, so both ends work at once instead
    /// of taking turns with whole write batches. 0: the writer waits for the end of the read.
    std::size_t messages_per_turn = 128;
    /// An incomplete message must be complete this long after its first bytes arrived, else
    /// the connection closes with errc::protocol_error (a peer that announces a large message
    /// and goes silent holds no buffer forever). Time the reader spends paused by its owner
    /// does not count. 0: no limit.
    std::chrono::milliseconds message_timeout{30'000};
    /// After close() has flushed and ended the sending direction, how long to wait for the
    /// peer's end of stream before closing anyway.
    std::chrono::milliseconds close_timeout{5000};
    /// Called at the start of every write (tracing, tests). Runs on the comm's executor.
    std::function<void(const write_event&)> on_write;
    /// Called when a write has completed and the owner may send more (ordo::peer hands the
    /// next pieces of its lanes then), while the owner asks for it (batched_comm::want_written).
    /// Never from inside send(); on the comm's executor.
    std::function<void()> on_written;
    /// The memory budget this connection charges its read buffer and its unwritten output to
    /// (set by ordo::server from server_options::memory_budget on the connections it accepts;
    /// null: none). While the budget is used up, the reader still reads into the buffer it has
    /// (or grows it up to 32 KiB), so small messages from any peer are served; it waits for
    /// room before growing the buffer for a larger message, and stops reading while more than
    /// 32 KiB of its own output is unwritten. A wait counts towards message_timeout.
    std::shared_ptr<detail::memory_budget> budget;
    /// Last words: when this side closes the connection for a protocol error or a broken limit
    /// (message_timeout), the message it returns for the code and reason is written after what
    /// is queued, so the peer learns why, and the connection closes once it is written (or
    /// after close_timeout); nothing more is read meanwhile. Empty result or null: the
    /// connection closes at once. (ordo::peer sets it to an ordo.closing notification.)
    std::function<std::string(const std::error_code&, const std::string&)> farewell;
    /// Which messages not written go back in close_result::undelivered: null, all of them;
    /// else those it returns true for (ordo::peer keeps notifications only: its calls fail on
    /// their own, so copying a large unsent output only to drop it would double its memory).
    std::function<bool(std::string_view message)> keep_undelivered;
};

/// Always-on counters. Sent = handed to the transport by a completed write.
struct comm_counters {
    std::uint64_t messages_sent = 0;
    std::uint64_t bytes_sent = 0;
    std::uint64_t messages_received = 0;
    std::uint64_t bytes_received = 0;
    std::uint64_t writes = 0;
    /// Of `writes`, those the kernel took whole at once, from an idle writer, without a wait
    /// (tcp:// and unix:// without comm_options::interval: the common case of a connection
    /// that keeps up).
    std::uint64_t direct_writes = 0;
    std::size_t buffered_bytes = 0;
    std::size_t peak_buffered_bytes = 0;
    /// Memory of the read buffer now (it grows for large messages and bursts, and shrinks back).
    std::size_t read_buffer_bytes = 0;
    /// When bytes last arrived (the epoch if none yet): liveness checks read it.
    std::chrono::steady_clock::time_point last_receive{};
    /// When the write in flight started (the epoch if none is): a write that does not
    /// complete means a peer that does not read.
    std::chrono::steady_clock::time_point write_since{};
    /// Times the reader waited for room in comm_options::budget.
    std::uint64_t budget_waits = 0;

    double messages_per_write() const noexcept {
        return writes == 0 ? 0.0 : double(messages_sent) / double(writes);
    }
};

/// How a connection ended.
struct close_result {
    /// errc::closed after close()/abort(); errc::peer_lost when the peer ended the stream, reset
    /// it or a read/write failed; errc::protocol_error on bad input; or the code given to abort().
    std::error_code code;
    /// Human-readable: names the peer and what happened.
    std::string reason;
    /// Messages taken by send() and not written whole, in the order they were sent (those
    /// comm_options::keep_undelivered keeps). A message cut by a failed write is here too: the
    /// peer may have received its first bytes only.
    std::vector<std::string> undelivered;
    /// When the connection ended (its first error, or the end of a close), on the steady clock:
    /// it may be well before on_closed runs, which waits for the event loop.
    std::chrono::steady_clock::time_point at{};
};

/// An ordered, batched connection over one transport.
///
/// - send() never blocks or suspends: it appends to the outgoing buffer, which is written as
///   one batch (see comm_options::interval) once the current handler returns to the executor.
///   When the writer is idle and the transport can (tcp, unix), the batch is written with one
///   non-blocking send(2): by the reader once it has passed on a read's messages (or a turn's,
///   comm_options::messages_per_turn), for what their handlers sent, and otherwise by a posted
///   flush; a queue that reaches comm_options::max_batch_bytes within a turn (outside the
///   reader's passing on) is written at once, by send() itself. The writer coroutine writes
///   what the kernel did not take, and every batch else. The peer receives messages in the
///   order send() was called.
/// - Incoming messages (whole msgpack objects, checked against the limits) are passed in order to
///   the on_message function given at construction.
/// - When the connection ends for any reason, messages not written are handed back in
///   close_result::undelivered (through on_closed and async_wait_closed()).
///
/// Belongs to the transport's executor: every member is called from it, and the callbacks run on
/// it. Not copyable or movable. Destroying it aborts the connection; its coroutines end on their
/// own afterwards without touching the destroyed object.
class batched_comm {
  public:
    /// Receives one whole msgpack object; the view is valid during the call only. The call may
    /// send(), close() or abort(). If it throws, the connection is aborted with the exception's
    /// message (and its code, for a std::system_error).
    using message_fn = std::function<void(std::string_view message)>;
    /// Called once when the connection has ended and both loops have stopped.
    using closed_fn = std::function<void(const close_result&)>;

    batched_comm(std::unique_ptr<transport> t, comm_options options, message_fn on_message,
                 closed_fn on_closed = {});
    ~batched_comm();
    batched_comm(const batched_comm&) = delete;
    batched_comm& operator=(const batched_comm&) = delete;

    /// Starts the reader and writer coroutines. Messages sent before start() are queued.
    void start();

    /// Takes the message at the start of `bytes` (the unread bytes, which may hold less or
    /// more than one message) when it can cut and check it on its own, within `limits` (the
    /// connection's): returns its size, having handled it as on_message would. 0 declines, with
    /// nothing done: the connection cuts the message itself and passes it to on_message. It
    /// must accept only what the connection's own checks would (a layer that decodes messages
    /// anyway saves the connection's pass over them: ordo's rpc layer). It may throw as
    /// on_message does.
    using taker_fn = std::function<std::size_t(std::string_view bytes, const limits& limits)>;
    void take_messages_with(taker_fn f);

    /// Half-close: told when the peer ends its sending side cleanly (end of stream between
    /// messages). Returning true keeps the connection open for writing: nothing more is read,
    /// what this side sends still goes out, and close() ends it (it then waits for no end of
    /// stream). False (and without it): the connection ends with errc::peer_lost.
    void on_end_of_stream(std::function<bool()> f);

    /// Bytes an earlier owner read from the transport past its last message (hand_over()):
    /// delivered before anything read. Before start() only.
    void preload(std::string_view bytes);

    /// Receives the connection handed over: its transport (null if the connection failed
    /// first) and the bytes read past the last message delivered.
    using handed_fn = std::function<void(std::unique_ptr<transport>, std::string)>;
    /// From on_message: gives the connection up to another owner instead of closing it. No
    /// message after the current one is delivered; once what is queued is written, the reader
    /// and writer stop and `done` runs (on this executor) with the transport. on_closed does
    /// not run, and this object may then be destroyed. If the connection fails first, `done`
    /// gets null (and on_closed does not run either).
    void hand_over(handed_fn done);

    /// Takes one encoded msgpack object for sending. Never blocks or suspends. Throws
    /// std::system_error: errc::overloaded when taking it would exceed max_buffer_bytes (the
    /// message is not taken), or the close reason's code once close()/abort() was called or the
    /// connection ended (errc::closed, errc::peer_lost...).
    void send(std::string_view message);
    /// send() of one message made of `head` followed by `body` (saves a copy when a header is
    /// built separately from an encoded payload).
    void send(std::string_view head, std::string_view body);
    /// send() of `head` and `body` where a body of 64 KiB or more is not copied: it is written
    /// from where it is, and `keep` keeps it there, unchanged, until then (its bytes count
    /// towards max_buffer_bytes as any message's; its memory is its owner's). A smaller one is
    /// copied, and `keep` goes at once.
    void send(std::string_view head, std::string_view body, std::unique_ptr<held_body> keep);

    /// Checks incoming messages against `l` from the next one on (a server holds a stranger
    /// to smaller limits until it knows who it is). On the comm's executor; may be called
    /// from on_message.
    void set_limits(const limits& l);

    /// While paused, the reader takes no more bytes from the transport (messages already read
    /// are still delivered), so that a peer that outruns its handlers meets TCP flow control
    /// instead of unbounded queues. Not paused at start.
    void pause_reading(bool paused);

    /// Whether comm_options::on_written is called after completed writes (off at start: a
    /// connection with nothing waiting to be sent pays nothing for it).
    void want_written(bool on) noexcept;

    /// Waits until the buffered bytes are at or below high_water_bytes. Throws std::system_error
    /// with the close reason if the connection ends first. Cancellation: per-operation
    /// cancellation of the awaiting coroutine is not supported; it completes when the condition
    /// holds or the connection ends.
    net::awaitable<void> async_drain();

    /// Graceful close: refuses further send()s, flushes what is queued (without waiting for the
    /// interval), ends the sending direction, waits up to close_timeout for the peer to end its
    /// side, and closes. Incoming messages are still delivered meanwhile.
    void close();
    /// Closes at once; queued messages and the unwritten part of a write in flight are handed
    /// back. `code` becomes close_result::code.
    void abort(std::error_code code = errc::closed);
    /// abort() with the reason to report in close_result::reason.
    void abort(std::error_code code, std::string reason);

    /// close(), then waits until the connection has ended; yields how it ended.
    net::awaitable<close_result> async_close();
    /// Waits until the connection has ended (for any reason); yields how it ended. Every waiter
    /// gets a copy.
    net::awaitable<close_result> async_wait_closed();

    /// True from close()/abort()/the end of the connection on: send() will throw. Inline:
    /// senders ask it after each send (a write inside send() may have ended the connection).
    bool is_closing() const noexcept { return *state_ != comm_state::open; }
    /// Once the connection has ended (a failed read or write, abort(), the end of a close), how:
    /// the code, reason and time on_closed will report, known at once, inside the send() whose
    /// write failed, say; its undelivered list is complete only in on_closed. Null before.
    const close_result* ended() const noexcept;
    /// The peer's address as a URL.
    const std::string& remote_address() const noexcept;
    const comm_counters& counters() const noexcept;

    struct impl;
    /// The connection's state, as impl keeps it (is_closing() reads it without a call).
    enum class comm_state : unsigned char { open, closing, ended };

  private:
    std::shared_ptr<impl> impl_;
    const comm_state* state_;
};

}  // namespace ordo
