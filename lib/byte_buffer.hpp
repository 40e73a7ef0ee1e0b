// Owned bytes for large messages, and the thread's spare buffers (ordo/detail/spare_buffers.hpp)
// as such bytes.
#pragma once

#include <cstddef>
#include <cstring>
#include <memory>
#include <string_view>
#include <utility>

#include "ordo/detail/spare_buffers.hpp"

namespace ordo::detail {

/// Bytes with a size and a capacity; the bytes past size() are not initialised.
class byte_buffer {
  public:
    byte_buffer() noexcept = default;
    byte_buffer(std::unique_ptr<char[]> block, std::size_t capacity) noexcept
        : p_(std::move(block)), cap_(p_ ? capacity : 0) {}
    byte_buffer(byte_buffer&& o) noexcept
        : p_(std::move(o.p_)), size_(std::exchange(o.size_, 0)), cap_(std::exchange(o.cap_, 0)) {}
    byte_buffer& operator=(byte_buffer&& o) noexcept {
        p_ = std::move(o.p_);
        size_ = std::exchange(o.size_, 0);
        cap_ = std::exchange(o.cap_, 0);
        return *this;
    }

    char* data() noexcept { return p_.get(); }
    const char* data() const noexcept { return p_.get(); }
    std::size_t size() const noexcept { return size_; }
    std::size_t capacity() const noexcept { return cap_; }
    bool empty() const noexcept { return size_ == 0; }
    std::string_view view() const noexcept { return {p_.get(), size_}; }

    /// Room for `n` bytes in all, keeping the bytes there are.
    void reserve(std::size_t n) {
        if (n <= cap_) return;
        std::unique_ptr<char[]> q(new char[n]);
        if (size_ > 0) std::memcpy(q.get(), p_.get(), size_);
        p_ = std::move(q);
        cap_ = n;
    }
    /// Appends `s`; grows to exactly what is needed (reserve() ahead for a better rule).
    void append(std::string_view s) {
        if (s.empty()) return;
        reserve(size_ + s.size());
        std::memcpy(p_.get() + size_, s.data(), s.size());
        size_ += s.size();
    }
    /// Sets the size (at most the capacity): the bytes up to it were written through data().
    void resize_written(std::size_t n) noexcept { size_ = n; }
    void clear() noexcept { size_ = 0; }
    /// Gives the memory back.
    void release() noexcept {
        p_.reset();
        size_ = cap_ = 0;
    }
    /// Gives the memory up to the caller (`capacity` set), empty after.
    std::unique_ptr<char[]> take_block(std::size_t& capacity) noexcept {
        capacity = std::exchange(cap_, 0);
        size_ = 0;
        return std::move(p_);
    }

  private:
    std::unique_ptr<char[]> p_;
    std::size_t size_ = 0, cap_ = 0;
};

/// A spare buffer (take_spare_block) as a byte_buffer, empty; one with no capacity when there is
/// none.
inline byte_buffer take_spare(std::size_t want, std::size_t most) noexcept {
    std::size_t cap = 0;
    auto p = take_spare_block(want, most, cap);
    return byte_buffer(std::move(p), cap);
}
/// keep_spare_block() for `b`'s memory.
inline void keep_spare(byte_buffer b) noexcept {
    std::size_t cap = 0;
    auto p = b.take_block(cap);
    keep_spare_block(std::move(p), cap);
}

}  // namespace ordo::detail
