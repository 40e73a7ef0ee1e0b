// Lanes (docs/protocol.md, "Lanes"): order within a lane and not between lanes, and messages
// cut into pieces that the writer interleaves, so that a small message waits for about one
// piece rather than for a whole large message ahead of it.
//
// - lane_id()/lane_name(): lane names, interned once per process; id 0 is the default lane.
// - lane_writer: this side's queues of messages that go as pieces (every message of a named
//   lane; a default-lane message above the piece size, and what follows it on that lane), one
//   queue per lane, and the round robin that hands one piece of each lane in turn to the
//   connection while its output is short.
// - lane_reader: the other side's pieces put back together into whole messages, one message
//   in the making per lane, within the limits.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lib/byte_buffer.hpp"
#include "ordo/limits.hpp"
#include "lib/fifo.hpp"

namespace ordo::detail {

/// Longest lane name, in bytes.
inline constexpr std::size_t max_lane_name_bytes = 64;
/// Most lane names one process may use (each interned for the life of the process).
inline constexpr std::size_t max_lane_names = 4096;

/// The id of lane `name` ("" is the default lane, 0). Thread-safe. Throws rpc_error
/// (bad_arguments) for a name over max_lane_name_bytes or beyond max_lane_names names.
std::uint16_t lane_id(std::string_view name);
/// The name of lane `id` (as lane_id() gave it out). Thread-safe.
const std::string& lane_name(std::uint16_t id);

/// Bytes of a named lane's pieces a sender may have sent and not yet been given credit for
/// (docs/protocol.md "Lanes"), the most a receiver allows.
inline constexpr std::uint64_t lane_window_bytes = std::uint64_t{4} << 20;
/// How long after this side sent another message a lane keeps to the shared window.
inline constexpr std::chrono::milliseconds shared_lane_hold{50};
/// The receiver gives credit (ordo.lane_credit) in steps of this: below the smallest window.
inline constexpr std::uint64_t lane_credit_step = std::uint64_t{64} << 10;
/// What each piece counts against the window beyond its bytes: a lane of tiny messages is held
/// at about 44,000 of them, below the count at which a queue stops a connection's reading.
inline constexpr std::uint64_t piece_overhead_bytes = 64;

/// Appends the head of `[2, "ordo.piece", [lane, remaining, bin(size)]]` to `out`: the piece's
/// `size` bytes follow it.
void write_piece_head(std::string& out, std::string_view lane, std::uint64_t remaining,
                      std::size_t size);

/// This side's pieces. Belongs to the connection's executor.
class lane_writer {
  public:
    /// Takes one piece: its head (write_piece_head) and its bytes, as one message. Throws as
    /// the connection's send does.
    using send_fn = std::function<void(std::string_view head, std::string_view body)>;
    /// How many bytes the connection holds unwritten now.
    using backlog_fn = std::function<std::size_t()>;
    /// A count of the messages this side sent that are not pieces (one that only grows, or
    /// lags behind: a rise is what counts).
    using plain_fn = std::function<std::uint64_t()>;
    using clock = std::chrono::steady_clock;

    /// `shared_window`: a named lane's window while others share the connection
    /// (peer_options::lane_window; 0: 256 KiB; kept within lane_credit_step and
    /// lane_window_bytes).
    lane_writer(std::size_t piece_bytes, send_fn send, backlog_fn backlog, plain_fn plain = {},
                std::uint64_t shared_window = 0)
        : piece_bytes_(piece_bytes ? piece_bytes : std::size_t{64} << 10),
          shared_window_(shared_window == 0
                             ? std::uint64_t{256} << 10
                             : std::clamp(shared_window, lane_credit_step, lane_window_bytes)),
          send_(std::move(send)),
          backlog_(std::move(backlog)),
          plain_(std::move(plain)) {}

    std::size_t piece_bytes() const noexcept { return piece_bytes_; }
    /// Whether lane `name` has messages waiting for their pieces to go.
    bool busy(std::string_view name) const noexcept;
    /// Whether lane `name` still has the request `msgid` waiting, in whole or in part.
    bool holds_request(std::string_view name, std::uint32_t msgid) const noexcept;
    bool empty() const noexcept { return bytes_ == 0; }
    /// Bytes of messages waiting (whole, or their pieces not yet sent).
    std::size_t bytes() const noexcept { return bytes_; }
    /// Queues one message (`head` then `body`) on lane `name`, behind what that lane has.
    /// `notification`: a notification's method, kept to report it if it is never sent.
    void push(std::string_view name, std::string_view head, std::string_view body,
              std::string_view notification = {});
    /// The receiver took `bytes` more of lane `name`'s pieces off the wire (ordo.lane_credit).
    /// Throws rpc_error (protocol_error) for credit beyond what was sent.
    void credit(std::string_view name, std::uint64_t bytes);
    /// Hands pieces to the connection, one per lane in turn (a named lane while it has credit:
    /// less than its window sent and not credited), while its backlog is below one piece. A
    /// named lane's window is lane_window_bytes while it has the connection to itself, and
    /// the shared window while this side sent other messages (plain ones, or another
    /// lane's pieces) within shared_lane_hold of `now`. Called when a message is queued, when a
    /// write completes and when credit comes; a call made while one runs returns at once (that
    /// one goes on). Never throws: a piece the connection refuses (full, or ending) stays, for
    /// the next call or for clear().
    void pump(clock::time_point now = clock::now());
    /// The window of lane `name` at `now` (see pump()).
    std::uint64_t window(std::string_view name, clock::time_point now) const noexcept;
    /// Pieces handed to the connection so far.
    std::uint64_t pieces_sent() const noexcept { return pieces_; }
    /// Bytes of lane `name` sent and not yet credited.
    std::uint64_t in_flight(std::string_view name) const noexcept;
    /// The notifications never sent in whole (their methods), and nothing more is sent.
    std::vector<std::string> clear();

  private:
    struct waiting {
        byte_buffer bytes;
        std::size_t sent = 0;      // its bytes already handed over as pieces
        std::string notification;  // a notification's method
    };
    struct lane {
        std::string name;
        fifo<waiting> messages;
        std::uint64_t in_flight = 0;  // a named lane's piece bytes sent and not credited
        clock::time_point sent_at{};  // when it last handed a piece over
    };
    bool ready(const lane& l, clock::time_point now) const noexcept {
        return !l.messages.empty() && (l.name.empty() || l.in_flight < window_of(l, now));
    }
    std::uint64_t window_of(const lane& l, clock::time_point now) const noexcept;
    std::size_t piece_bytes_;
    std::uint64_t shared_window_;
    send_fn send_;
    backlog_fn backlog_;
    plain_fn plain_;
    std::uint64_t plain_seen_ = 0;     // the most plain_() has said
    clock::time_point plain_at_{};     // when it last rose
    std::vector<lane> lanes_;
    std::size_t next_ = 0;  // the lane whose turn is next
    std::size_t bytes_ = 0;
    std::uint64_t pieces_ = 0;
    bool pumping_ = false;
    std::string head_;  // a piece's head, reused
};

/// The other side's pieces. Belongs to the connection's executor.
class lane_reader {
  public:
    /// One piece: `lane`, `remaining` and `bytes` as sent. Returns the whole message once its
    /// last piece is in (valid until the next call, or while `bytes` is for a message of one
    /// piece), or nothing. Throws rpc_error
    /// (protocol_error) naming the limit or the inconsistency: a lane name too long, a message
    /// over limits::max_message_bytes, more than limits::max_lanes lanes with a message in the
    /// making, a piece that says another size than the pieces before it, or more bytes in the
    /// making than limits::max_message_bytes twice over.
    std::optional<std::string_view> take(std::string_view lane, std::uint64_t remaining, std::string_view bytes,
                          const limits& l);
    /// The lane of the message take() returned last.
    const std::string& lane() const noexcept { return done_lane_; }
    /// Counts every message in the making as begun `now` (the time this side did not read, or
    /// had no connection, is not the peer's delay).
    void restart_clocks(std::chrono::steady_clock::time_point now) noexcept;
    /// When the oldest message in the making got its first piece ({} if none is).
    std::chrono::steady_clock::time_point oldest() const noexcept;
    /// Bytes held for messages in the making.
    std::size_t bytes() const noexcept { return held_; }
    void clear() noexcept;

  private:
    struct partial {
        std::string lane;
        byte_buffer bytes;
        std::uint64_t total = 0;
        std::chrono::steady_clock::time_point since;
    };
    static void append(partial& p, std::string_view bytes);
    std::vector<partial> partials_;
    byte_buffer done_;
    std::string done_lane_;
    std::size_t held_ = 0;
};

}  // namespace ordo::detail
