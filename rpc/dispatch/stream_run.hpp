// A streaming handler's output on the server's side of a connection (docs/protocol.md,
// "Streams"): what ordo::writer writes to; and a reading handler's input ("Streams both ways"):
// what ordo::reader reads from. Declared here for rpc/dispatch/dispatcher.cpp, which starts
// and cancels such handlers and hands them credit and items; their workings are
// dispatcher_stream.cpp, beside this file.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <string>
#include <utility>

#include "ordo/rpc/stream_call.hpp"
#include "rpc/dispatch/dispatcher.hpp"

namespace ordo::detail {

// One streaming handler's output (ordo::writer writes here). A caller that streams (ordo.stream)
// gets each item at once as ordo.item [msgid, item] while it has credit; any other caller gets
// the items collected into the final response, an array.
class dispatcher::stream_run final : public stream_out {
  public:
    // `window_bytes` 0: no byte limit (a caller that grants items only).
    stream_run(dispatcher& d, std::uint32_t msgid, std::uint32_t window, std::uint64_t window_bytes,
               stream_run** back);
    ~stream_run() override;

    bool has_credit() const noexcept override;
    net::awaitable<void> wait_credit() override;
    buffer& begin_item() override;
    bool end_item() override;
    using stream_out::write_packed;
    bool write_packed(std::string_view front, std::string_view back,
                      std::unique_ptr<held_body> keep) override;

    std::uint64_t written() const noexcept override { return written_; }

    void grant(std::uint64_t n, std::uint64_t bytes);

    // The final response's result: the number of items sent, or the items collected.
    void finish(buffer& out) const;

    // The call was cancelled, or its connection ended: a write waiting for credit ends (also
    // one a body on handler_options::run_on handed over, which Asio cancellation cannot reach
    // here), and later ones throw.
    void cancel();
    bool cancelled = false;

  private:
    [[noreturn]] static void throw_cancelled() {
        throw_error(errc::cancelled, "the stream was cancelled");
    }

    dispatcher& d_;
    std::uint32_t msgid_;
    bool streaming_;
    // Credit in bytes may go below 0: the item that used it up was sent whole.
    static constexpr std::uint64_t max_bytes = std::uint64_t{1} << 62;
    std::uint32_t credit_;
    bool bytes_limited_;
    std::int64_t bytes_credit_;
    stream_run** back_;
    net::steady_timer wake_;
    bool waiting_ = false;
    std::uint64_t written_ = 0;
    buffer item_{small_buffer};
    buffer collected_{small_buffer};
    std::size_t charged_ = 0;
};

// The items a caller writes to one reading handler (ordo.in), queued in order until its reader
// takes them, within the credit this side grants (ordo.in_credit): at most the window of items
// and bytes (one item may take more bytes than were left) are held.
class dispatcher::inbox final : public stream_in {
  public:
    // `grow_to`: the credit may grow toward this many bytes (ordo.stream's sixth element; 0:
    // it stays at the window), at most max_grown_bytes.
    inbox(dispatcher& d, std::uint32_t msgid, inbox** back, std::uint64_t grow_to = 0);
    ~inbox() override;

    bool try_next(const msgpack::object*& item) override;
    took take_packed(packed_bytes& packed) override;
    net::awaitable<void> wait() override;
    // The item taken last: valid until the next call of try_next().
    msgpack::object current_;
    std::uint64_t taken() const noexcept override { return taken_; }

    // The handler is about to start: the caller may write the window.
    void open();
    // ordo.in: one item, borrowed (copied here); `bytes` its size on the wire (0: not known).
    void push(const msgpack::object& item, std::size_t bytes);
    // ordo.in_end: the caller wrote `count` items in all.
    void end(std::uint64_t count);
    // The call was cancelled, or its connection ended: next() throws errc::cancelled.
    void cancel();
    // The caller broke the protocol (errc::protocol_error), or can send no more (peer_lost):
    // the items before it are still read, then next() throws.
    void fail(std::string what, errc code = errc::protocol_error);
    bool closed() const noexcept { return closed_; }

    static constexpr std::uint32_t window = default_stream_window;
    static constexpr std::size_t zone_items = 256, zone_bytes = 64 << 10;
    static constexpr std::uint64_t window_bytes = default_stream_window_bytes;
    // What growth may add to the windows of one connection's reading handlers, together.
    static constexpr std::uint64_t max_grown_bytes = std::uint64_t{64} << 20;

  private:
    // Items are copied into zones of up to 256 items or 64 KiB each (not one allocation per
    // item), and a zone is freed once its items have been taken. An item of packed_item_bytes
    // or more is kept as its bytes instead (packed), in no zone: take_packed() moves them out,
    // and try_next() reads them in place.
    struct held {
        msgpack::object item;
        std::size_t bytes;  // on the wire (credit)
        std::size_t held;   // in memory (the budget)
        packed_bytes packed;
    };
    // Takes the first item off the queue, with its zone's, credit's and budget's bookkeeping.
    held pop();
    struct zone_of_items {
        std::unique_ptr<msgpack::zone> zone;
        std::size_t items = 0, bytes = 0;  // put in
        std::size_t left = 0;              // not yet taken
    };
    void wake();
    // `timed`: the grant is timed while the window may grow (growth's own grants are not).
    void grant(std::uint64_t items, std::uint64_t bytes, bool timed = true);
    // An item that needed a grant came (`before`: the bytes received before it) at `now`. The
    // time from that grant is a round trip when the caller had waited for it, more when it had
    // not; the shortest seen (after the first) is taken as the round trip. The caller waited
    // when the item came within 1.5 round trips of the grant and after a gap of half a round
    // trip since the item before it (a steady writer leaves no such gap). A caller that waited
    // while the reader had taken everything is held back by the window: it doubles, up to
    // grow_to_, within the connection's max_grown_bytes and while the memory budget has room.
    void crossed(std::uint64_t before, bool caught_up, std::chrono::steady_clock::time_point now);
    void grow();

    dispatcher& d_;
    std::uint32_t msgid_;
    inbox** back_;
    std::deque<held> items_;
    std::deque<zone_of_items> zones_;        // items_'s, oldest first
    std::unique_ptr<msgpack::zone> taken_zone_;  // holds what next() returned last
    packed_bytes taken_packed_;  // or its bytes, when it was kept packed (read into taken_zone_)
    std::uint64_t received_ = 0, received_bytes_ = 0;
    std::uint64_t granted_items_ = 0, granted_bytes_ = 0;
    std::uint64_t taken_ = 0;
    std::uint64_t unreported_items_ = 0, unreported_bytes_ = 0;
    std::uint64_t window_items_ = window, window_bytes_ = window_bytes;  // as grown
    std::uint64_t grow_to_ = 0;
    // While the window may grow: the credit in bytes before each grant not yet needed, and when
    // the grant went; the shortest time from a grant to the first item that needed it.
    std::deque<std::pair<std::uint64_t, std::chrono::steady_clock::time_point>> grants_;
    std::chrono::steady_clock::duration round_trip_{};
    std::uint32_t samples_ = 0;
    std::chrono::steady_clock::time_point last_item_{};  // while grants_ are timed
    std::size_t charged_ = 0;  // to the server's memory budget
    bool closed_ = false;     // ordo.in_end came
    bool cancelled_ = false;
    std::string failure_;     // set: an error, thrown once the items before it are read
    errc failure_code_ = errc::protocol_error;
    net::steady_timer wake_;
    bool waiting_ = false;
};

}  // namespace ordo::detail
