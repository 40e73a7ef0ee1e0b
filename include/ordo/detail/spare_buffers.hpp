// The large buffers a thread keeps for its next large message.
//
// A buffer of a MiB or more from malloc is often a fresh mapping: its page faults (the kernel
// clearing each page before the first write) cost about as much as copying the message into
// it. A thread that packs, queues or reads large messages gives such a buffer back when it is
// done with it and takes it again for the next message.
#pragma once

#include <cstddef>
#include <memory>

namespace ordo::detail {

/// Buffers smaller than this are left to malloc. Larger ones it maps afresh each time, or
/// reuses only while its own heuristics (the dynamic mmap threshold) happen to allow.
inline constexpr std::size_t spare_min_bytes = std::size_t{256} << 10;

/// One of this thread's spare buffers with a capacity from `want` to `most` bytes (the smallest
/// such), its capacity in `capacity`; null (and `capacity` untouched) when there is none.
std::unique_ptr<char[]> take_spare_block(std::size_t want, std::size_t most,
                                         std::size_t& capacity) noexcept;
/// Keeps `block` of `capacity` bytes for a later take on this thread when it is from
/// spare_min_bytes to 65 MiB (at most 8 buffers, 130 MiB together, the oldest dropped first);
/// frees it otherwise. What a thread keeps stays until it takes it again or ends.
void keep_spare_block(std::unique_ptr<char[]> block, std::size_t capacity) noexcept;

/// A block that another thread will take again (a connection's read buffer that a consumer on
/// another thread kept: ordo::kept_bytes): kept for any thread, at most 2, else freed.
void give_back_block(std::unique_ptr<char[]> block, std::size_t capacity) noexcept;
/// One of those blocks with a capacity from `want` to `most` bytes; null when there is none.
std::unique_ptr<char[]> take_given_back_block(std::size_t want, std::size_t most,
                                              std::size_t& capacity) noexcept;

}  // namespace ordo::detail
