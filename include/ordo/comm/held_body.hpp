// Bytes kept where they are rather than copied: the owner of a message body that is written
// from where it is (batched_comm::send with a keeper), and a connection's read buffer given up
// to whoever keeps a part of a message in place (keep_delivered). docs/design.md 5.3.
#pragma once

#include <cstddef>
#include <memory>
#include <string_view>

namespace ordo {

/// Keeps a body's bytes where they are, unchanged, until it is destroyed: once the body has been
/// written, or once its connection has ended without it (then on the connection's executor),
/// or at once where the body was copied after all.
class held_body {
  public:
    virtual ~held_body() = default;
};

namespace detail {
class framer;
}

/// A connection's read buffer, given up by the connection to whoever keeps part of a message
/// where it was read (keep_delivered). The part stays valid, and the connection writes no more
/// into it, while this lives.
class kept_bytes {
  public:
    kept_bytes() = default;
    kept_bytes(const kept_bytes&) = delete;
    kept_bytes& operator=(const kept_bytes&) = delete;
    /// Gives its memory back for the connections' next large messages (on any thread).
    ~kept_bytes();

    /// The memory it holds (or will, once its connection has done with the message).
    std::size_t capacity() const noexcept { return capacity_; }

  private:
    friend class detail::framer;
    std::unique_ptr<char[]> block_;  ///< set once the connection has done with the message
    std::size_t capacity_ = 0;
};

/// Parts this big or bigger may be kept (keep_delivered).
inline constexpr std::size_t kept_bytes_min = std::size_t{1} << 20;

/// From within the delivery of a message on the thread that delivers it (a connection's
/// on_message, and so a stream's on_item): keeps `part`, bytes at the end of that message,
/// where they are, by taking the read buffer that holds them. Null, and `part` is to be copied, when no delivery
/// runs on this thread, `part` is not within its connection's read buffer, is shorter than
/// kept_bytes_min, or fills less than half of that buffer.
std::shared_ptr<const kept_bytes> keep_delivered(std::string_view part);

}  // namespace ordo
