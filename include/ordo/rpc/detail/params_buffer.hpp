// params_buffer, the packed params array of one call, and pack_params, which fills it.
#pragma once

#include "ordo/config.hpp"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <utility>

#include "ordo/detail/copy_small.hpp"
#include "ordo/detail/spare_buffers.hpp"
#include "ordo/rpc/detail/msgpack_core.hpp"

namespace ordo::detail {

/// A call's packed params array: what msgpack::packer needs (write) plus data() and size().
/// The first 112 bytes live in the object itself, so the params of most calls cost no
/// allocation of their own (msgpack's sbuffer always allocated, and a call made two).
class params_buffer {
  public:
    params_buffer() noexcept = default;
    params_buffer(params_buffer&& o) noexcept { take(o); }
    params_buffer& operator=(params_buffer&& o) noexcept {
        if (this != &o) {
            clear();
            take(o);
        }
        return *this;
    }
    params_buffer(const params_buffer&) = delete;
    params_buffer& operator=(const params_buffer&) = delete;
    ~params_buffer() {
        if (heap_) [[unlikely]]
            give_back();
    }

    /// Inline while there is room: msgpack's packer writes its heads in sizes known where it
    /// calls this, and a one-byte head is then one store.
    void write(const char* p, std::size_t n) {
        if (n <= cap_ - size_) [[likely]] {
            copy_small(data() + size_, p, n);
            size_ += n;
            return;
        }
        write_growing(p, n);
    }
    const char* data() const noexcept { return heap_ ? heap_.get() : inline_; }
    char* data() noexcept { return heap_ ? heap_.get() : inline_; }
    std::size_t size() const noexcept { return size_; }
    /// Empties it and frees what it allocated.
    void clear() noexcept {
        if (heap_) give_back();
        heap_.reset();
        cap_ = sizeof inline_;
        size_ = 0;
    }
    params_buffer copy() const {
        params_buffer c;
        c.write(data(), size_);
        return c;
    }

  private:
    [[gnu::noinline]] void write_growing(const char* p, std::size_t n) {
        grow(n);
        std::memcpy(data() + size_, p, n);
        size_ += n;
    }
    void grow(std::size_t n) {
        std::size_t c = std::max(cap_ * 2, size_ + n);
        std::unique_ptr<char[]> h;
        if (c >= spare_min_bytes) h = take_spare_block(c, 2 * c, c);
        if (!h) h.reset(new char[c]);
        std::memcpy(h.get(), data(), size_);
        if (heap_) give_back();
        heap_ = std::move(h);
        cap_ = c;
    }
    // A large buffer (heap_ is set) goes to the thread's spares, for the next large message.
    void give_back() noexcept {
        if (cap_ >= spare_min_bytes) [[unlikely]]
            keep_spare_block(std::move(heap_), cap_);
    }
    void take(params_buffer& o) noexcept {
        if (o.heap_) {
            heap_ = std::move(o.heap_);
            cap_ = o.cap_;
        } else {
            std::memcpy(inline_, o.inline_, o.size_);
        }
        size_ = o.size_;
        o.clear();
    }

    char inline_[112];
    std::unique_ptr<char[]> heap_;
    std::size_t size_ = 0;
    std::size_t cap_ = sizeof inline_;
};

/// Appends the params array of `args` to `b`.
template <class... Args>
void pack_params_into(params_buffer& b, const Args&... args) {
    msgpack::packer<params_buffer> p(b);
    p.pack_array(sizeof...(Args));
    (p.pack(args), ...);
}

template <class... Args>
params_buffer pack_params(const Args&... args) {
    params_buffer b;
    pack_params_into(b, args...);
    return b;
}

}  // namespace ordo::detail
