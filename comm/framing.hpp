// Cutting a byte stream into whole msgpack objects, within limits, without decoding them.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "lib/byte_buffer.hpp"
#include "ordo/comm/held_body.hpp"
#include "ordo/limits.hpp"

namespace ordo::detail {

/// Finds msgpack object boundaries in a stream of bytes that arrives in chunks split anywhere.
///
/// The framer owns its buffer: read into prepare(), announce with commit(), then take whole
/// objects with next() until it returns nothing. Each header is checked against the limits as
/// soon as its bytes are in, so a 4 GiB string header fails at once and memory stays within
/// max_message_bytes plus one read chunk. Work is linear in the bytes received: a message found
/// whole in the buffer is cut in one tight pass; otherwise it is scanned incrementally (once more
/// from its start), the scan resumes where it stopped, and a partial token (at most a 9-byte
/// header) is read again at most once per commit.
///
/// Errors are std::system_error with errc::protocol_error and a message saying what was wrong;
/// after one the framer is unusable (the connection must close).
class framer {
  public:
    explicit framer(const limits& l = {});

    /// Checks what is scanned from now on against `l`. Raising limits is safe at any point
    /// (what was scanned passed the lower ones); lowering them applies to headers not yet
    /// scanned.
    void set_limits(const limits& l) noexcept { limits_ = l; }

    /// A writable area of at least `n` bytes at the end of the buffer. Invalidates views
    /// returned by next(). When it has to grow, the buffer doubles, but to no more than
    /// `max_capacity` unless `n` needs more.
    std::span<char> prepare(std::size_t n, std::size_t max_capacity = SIZE_MAX);
    /// prepare() for a read: while the message being cut is known to need more bytes (a
    /// str, bin or ext header announced them), an area for up to all of them, and the buffer
    /// grows toward the message's size (by 4x what is held at a step at most, in steps of its
    /// size over powers of 4, so that little is copied; nothing is allocated on the strength of
    /// a header alone) rather than doubling; the area may then be smaller than `n` when it
    /// holds the rest of the message, and the buffer does not grow past the message for it.
    std::span<char> read_area(std::size_t n, std::size_t max_capacity = SIZE_MAX) {
        // The common case, inline: no message known to need more, and room for the read.
        if (need_ == 0) [[likely]] {
            if (begin_ == end_) begin_ = scan_ = end_ = 0;
            if (capacity() - end_ >= n) return {buf_.data() + end_, n};
        }
        return read_area_growing(n, max_capacity);
    }
    /// Marks `n` bytes written into the area from prepare() as received.
    void commit(std::size_t n);
    /// Copies `bytes` in (prepare + copy + commit).
    void feed(std::string_view bytes);

    /// The next whole object, as a view of its bytes valid until the next prepare() or feed();
    /// nothing when more bytes are needed. Throws on malformed input or a broken limit.
    std::optional<std::string_view> next();

    /// True when the unread bytes start a message that next() has not begun to scan: someone
    /// that can cut and check a message on its own may take it (skip()).
    bool at_message_start() const noexcept { return scan_ == begin_ && begin_ != end_; }
    /// Drops the first `n` unread bytes, a whole message that someone else cut and checked
    /// (only at_message_start()).
    void skip(std::size_t n) noexcept {
        begin_ = scan_ = begin_ + n;
        need_ = 0;
    }

    /// Call at end of stream: throws if an incomplete object is buffered ("truncated").
    void finish() const;

    /// Bytes received but not yet returned by next().
    std::size_t buffered() const noexcept { return end_ - begin_; }
    /// Those bytes (valid until the next prepare() or feed()).
    std::string_view unread() const noexcept { return {buf_.data() + begin_, end_ - begin_}; }
    /// Bytes the buffer holds (its memory).
    std::size_t capacity() const noexcept { return buf_.capacity(); }
    /// The capacity read_area(n, max_capacity) would leave (more than capacity() when it has
    /// to grow).
    std::size_t capacity_for(std::size_t n, std::size_t max_capacity = SIZE_MAX) const noexcept {
        return space() >= required(n) ? capacity() : grown_capacity(read_size(n), max_capacity);
    }
    /// Bytes prepare() can offer without growing the buffer.
    std::size_t space() const noexcept { return capacity() - (end_ - begin_); }
    /// For keep_delivered: the holder that receives the buffer once the messages being
    /// delivered are handled (settle(); the same holder until then), or null when `part` is not
    /// within the buffer or fills less than half of it.
    std::shared_ptr<kept_bytes> lend(std::string_view part);
    bool lending() const noexcept { return lent_ != nullptr; }
    /// Gives the buffer to the holder that lend() made, if anyone else still holds it, and goes
    /// on in a new buffer with the bytes not taken yet.
    void settle() noexcept;

    /// When nothing is buffered and the buffer is larger than `cap` (it grew for a large
    /// message or a burst), gives its memory back down to `cap` bytes (a large buffer to the
    /// thread's spares, lib/byte_buffer.hpp).
    void trim(std::size_t cap);

  private:
    [[noreturn]] void fail(const char* what, std::uint64_t value, std::size_t limit) const;
    void push_container(std::uint64_t entries, std::uint64_t length);
    // Bytes the message being cut is known to need beyond those held (0: none known).
    std::size_t more() const noexcept {
        const std::size_t held = end_ - begin_;
        return need_ > held ? need_ - held : 0;
    }
    // The free space a read of `n` needs: all the message still needs, when that is known
    // and more.
    std::size_t required(std::size_t n) const noexcept { return std::max(more(), n); }
    // What a read of `n` makes the buffer grow for: no more than the message still needs,
    // when that is known (the read then fills the buffer to the message's end, and the next
    // read comes once it is taken).
    std::size_t read_size(std::size_t n) const noexcept {
        const std::size_t m = more();
        return m > 0 ? std::min(n, m) : n;
    }
    std::span<char> read_area_growing(std::size_t n, std::size_t max_capacity);
    // The capacity to grow to for a read of `n` (see read_area()).
    std::size_t grown_capacity(std::size_t n, std::size_t max_capacity) const noexcept;
    // Moves the unread bytes to the front when `n` bytes do not fit after them; then grows to
    // `cap` when they still do not (a spare buffer of up to `max_capacity` may serve).
    void make_room(std::size_t n, std::size_t cap, std::size_t max_capacity);

    limits limits_;
    byte_buffer buf_;                  // its capacity is the framer's; its size is unused
    std::size_t need_ = 0;             // bytes the message being scanned needs, when known
    std::size_t begin_ = 0;            // start of the object being scanned
    std::size_t scan_ = 0;             // next unscanned token
    std::size_t end_ = 0;              // end of received bytes
    std::vector<std::uint64_t> open_;  // entries still expected, per open container
    std::size_t objects_ = 0;          // tokens seen in the current object
    std::shared_ptr<kept_bytes> lent_;  // lend()'s holder, until settle()
    byte_buffer rest_;                  // with lent_: for the bytes after the part lent
};

}  // namespace ordo::detail
