#include "comm/framing.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>

#include "ordo/error.hpp"

namespace ordo::detail {
namespace {

// A big-endian length field of 1, 2 or 4 bytes.
std::uint64_t load_be(const unsigned char* p, int bytes) {
    switch (bytes) {
        case 1: return p[0];
        case 2: return std::uint64_t(p[0]) << 8 | p[1];
        default:
            return std::uint64_t(p[0]) << 24 | std::uint64_t(p[1]) << 16 |
                   std::uint64_t(p[2]) << 8 | p[3];
    }
}

// What one msgpack token is, read from its first byte.
struct token_shape {
    enum kind_t : std::uint8_t { scalar, payload, array, map, invalid } kind;
    std::uint8_t header;        // bytes before the payload, type byte included
    std::uint8_t length_at;     // offset of the big-endian length field (payload, array, map)
    std::uint8_t length_size;   // 0: the length is in the type byte (fix types)
    std::uint8_t fixed_length;  // fix types: the length from the type byte
};

constexpr token_shape classify(unsigned char b) {
    if (b <= 0x7f || b >= 0xe0) return {token_shape::scalar, 1, 0, 0, 0};
    if (b <= 0x8f) return {token_shape::map, 1, 0, 0, std::uint8_t(b & 0x0f)};
    if (b <= 0x9f) return {token_shape::array, 1, 0, 0, std::uint8_t(b & 0x0f)};
    if (b <= 0xbf) return {token_shape::payload, 1, 0, 0, std::uint8_t(b & 0x1f)};
    switch (b) {
        case 0xc0:
        case 0xc2:
        case 0xc3: return {token_shape::scalar, 1, 0, 0, 0};
        case 0xc4: return {token_shape::payload, 2, 1, 1, 0};  // bin 8
        case 0xc5: return {token_shape::payload, 3, 1, 2, 0};
        case 0xc6: return {token_shape::payload, 5, 1, 4, 0};
        case 0xc7: return {token_shape::payload, 3, 1, 1, 0};  // ext 8: length, then type
        case 0xc8: return {token_shape::payload, 4, 1, 2, 0};
        case 0xc9: return {token_shape::payload, 6, 1, 4, 0};
        case 0xca: return {token_shape::scalar, 5, 0, 0, 0};  // float 32
        case 0xcb: return {token_shape::scalar, 9, 0, 0, 0};
        case 0xcc:
        case 0xd0: return {token_shape::scalar, 2, 0, 0, 0};
        case 0xcd:
        case 0xd1: return {token_shape::scalar, 3, 0, 0, 0};
        case 0xce:
        case 0xd2: return {token_shape::scalar, 5, 0, 0, 0};
        case 0xcf:
        case 0xd3: return {token_shape::scalar, 9, 0, 0, 0};
        case 0xd4: return {token_shape::scalar, 3, 0, 0, 0};  // fixext 1: type + 1 byte
        case 0xd5: return {token_shape::scalar, 4, 0, 0, 0};
        case 0xd6: return {token_shape::scalar, 6, 0, 0, 0};
        case 0xd7: return {token_shape::scalar, 10, 0, 0, 0};
        case 0xd8: return {token_shape::scalar, 18, 0, 0, 0};
        case 0xd9: return {token_shape::payload, 2, 1, 1, 0};  // str 8
        case 0xda: return {token_shape::payload, 3, 1, 2, 0};
        case 0xdb: return {token_shape::payload, 5, 1, 4, 0};
        case 0xdc: return {token_shape::array, 3, 1, 2, 0};
        case 0xdd: return {token_shape::array, 5, 1, 4, 0};
        case 0xde: return {token_shape::map, 3, 1, 2, 0};
        case 0xdf: return {token_shape::map, 5, 1, 4, 0};
        default: return {token_shape::invalid, 1, 0, 0, 0};  // 0xc1 is never used
    }
}

// classify() for every byte, computed at compile time: one load per token on the hot path.
constexpr auto shapes = [] {
    std::array<token_shape, 256> t{};
    for (int b = 0; b < 256; ++b) t[std::size_t(b)] = classify(static_cast<unsigned char>(b));
    return t;
}();

const token_shape& shape_of(unsigned char b) {
    return shapes[b];
}

// The size of the message at the start of `p` when all of it is among the `avail` bytes and
// within every limit; else 0. This is the common case (a read brings many whole small
// messages), walked in one tight pass with a fixed stack and no bookkeeping between calls.
// Anything else (a message not complete yet, a broken limit, an invalid byte, nesting deeper
// than the fixed stack) gets 0 and framer::next() walks it again incrementally: that walk raises
// the errors, so each error has one wording, and a message is walked at most twice.
std::size_t whole_message(const unsigned char* p, std::size_t avail, const limits& l) {
    constexpr std::size_t stack_size = 32;
    std::uint64_t left[stack_size];  // entries still expected, per open container
    const std::size_t max_depth = std::min(l.max_depth, stack_size);
    const std::size_t end = std::min(avail, l.max_message_bytes);
    std::size_t depth = 0, pos = 0, objects = 0;
    for (;;) {
        if (pos >= end) return 0;
        const unsigned char b = p[pos];
        // The tokens of most small messages first: one-byte ints, and fixstr (a method name,
        // a short string).
        if (b <= 0x7f || b >= 0xe0) {
            ++pos;
            if (++objects > l.max_objects) return 0;
            while (depth > 0 && --left[depth - 1] == 0) --depth;
            if (depth == 0) return pos;
            continue;
        }
        if ((b & 0xe0) == 0xa0) {
            const std::size_t n = b & 0x1f;
            if (n > l.max_string_bytes || n >= end - pos || ++objects > l.max_objects) return 0;
            pos += 1 + n;
            while (depth > 0 && --left[depth - 1] == 0) --depth;
            if (depth == 0) return pos;
            continue;
        }
        const token_shape& s = shape_of(b);
        if (s.kind == token_shape::invalid || end - pos < std::size_t(s.header)) return 0;
        const std::uint64_t length =
            s.length_size == 0 ? s.fixed_length : load_be(p + pos + s.length_at, s.length_size);
        std::uint64_t size = std::uint64_t(s.header);
        if (s.kind == token_shape::payload) {
            if (length > l.max_string_bytes) return 0;
            size += length;
        }
        if (size > end - pos || ++objects > l.max_objects) return 0;
        pos += size;
        if (s.kind == token_shape::array || s.kind == token_shape::map) {
            if (depth + 1 > max_depth) return 0;
            if (length > 0) {
                const std::uint64_t entries = s.kind == token_shape::map ? length * 2 : length;
                if (length > l.max_container_length || entries > l.max_message_bytes - pos)
                    return 0;
                left[depth++] = entries;
                continue;
            }
        }
        // An item is done: it may complete its container, and that one its own, and so on.
        while (depth > 0 && --left[depth - 1] == 0) --depth;
        if (depth == 0) return pos;
    }
}

}  // namespace

framer::framer(const limits& l) : limits_(l) {}

std::size_t framer::grown_capacity(std::size_t n, std::size_t max_capacity) const noexcept {
    const std::size_t held = end_ - begin_;
    std::size_t c = std::max(std::min(capacity() * 2, max_capacity), held + n);
    // A large str, bin or ext: toward the size of its message, at most four times what arrived
    // at a step, never past it. The steps are the message's size over powers of 4, so that the
    // last growth is from a quarter of it: each growth copies what is held, and growing in 4x
    // steps from 64 KiB would copy a 20 MiB message's first 16 MiB once more at its last step.
    if (need_ > held) {
        std::size_t step = need_;
        while (step > 4 * held) step = step / 4 + (step % 4 != 0);
        c = std::max(held + n, std::min(step, max_capacity));
    }
    return c;
}

void framer::make_room(std::size_t n, std::size_t cap, std::size_t max_capacity) {
    if (begin_ == end_) {
        begin_ = scan_ = end_ = 0;
    } else if (capacity() - end_ < n && begin_ > 0) {
        std::memmove(buf_.data(), buf_.data() + begin_, end_ - begin_);
        scan_ -= begin_;
        end_ -= begin_;
        begin_ = 0;
    }
    if (capacity() - end_ >= n || cap <= capacity()) return;
    // Not zero-filled: only what the transport writes into it is ever read.
    byte_buffer b;
    // A message of known size that a kept block given back holds whole takes it at once: it
    // is memory held already, so nothing is allocated on the strength of a header.
    const std::size_t whole = std::max(need_, end_ + n);
    if (need_ >= kept_bytes_min && whole > cap && whole <= max_capacity) {
        std::size_t c = 0;
        auto p = take_given_back_block(whole, std::min(2 * whole, max_capacity), c);
        if (p) {
            b = byte_buffer(std::move(p), c);
            cap = whole;
        }
    }
    if (!b.capacity() && cap >= spare_min_bytes) {
        const std::size_t most = std::max(cap, std::min(2 * cap, max_capacity));
        b = take_spare(cap, most);
        if (!b.capacity()) {
            std::size_t c = 0;
            auto p = take_given_back_block(cap, most, c);
            if (p) b = byte_buffer(std::move(p), c);
        }
    }
    b.reserve(cap);
    if (end_ > 0) std::memcpy(b.data(), buf_.data(), end_);
    keep_spare(std::move(buf_));
    buf_ = std::move(b);
}

std::span<char> framer::prepare(std::size_t n, std::size_t max_capacity) {
    make_room(n, grown_capacity(n, max_capacity), max_capacity);
    return {buf_.data() + end_, n};
}

std::span<char> framer::read_area_growing(std::size_t n, std::size_t max_capacity) {
    if (n == 0) return {};  // no read: no room
    make_room(required(n), grown_capacity(read_size(n), max_capacity), max_capacity);
    return {buf_.data() + end_, std::min(capacity() - end_, required(n))};
}

void framer::trim(std::size_t cap) {
    if (begin_ != end_ || capacity() <= cap) return;
    // The small one first: the large one freed first would be the top of the heap, which
    // malloc gives back to the system (and faults in again for the next large message).
    byte_buffer b;
    if (cap > 0) b.reserve(cap);
    keep_spare(std::move(buf_));
    buf_ = std::move(b);
    begin_ = scan_ = end_ = 0;
}

}  // namespace ordo::detail

namespace ordo {

kept_bytes::~kept_bytes() {
    detail::give_back_block(std::move(block_), capacity_);
}

}  // namespace ordo

namespace ordo::detail {

std::shared_ptr<kept_bytes> framer::lend(std::string_view part) {
    // As addresses: `part` may come from anywhere.
    const auto b = reinterpret_cast<std::uintptr_t>(buf_.data());
    const auto p = reinterpret_cast<std::uintptr_t>(part.data());
    if (b == 0 || p < b || p - b > end_ || part.size() > end_ - (p - b) ||
        part.size() < capacity() / 2)
        return nullptr;
    // The bytes after the part go on in a buffer of their own: allocated now, so that settle()
    // does not fail (the part ends its message, which is delivered by then).
    const std::size_t after = end_ - (p - b) - part.size();
    if (after > rest_.capacity()) {
        byte_buffer r;
        r.reserve(after);
        rest_ = std::move(r);
    }
    if (!lent_) {
        lent_ = std::make_shared<kept_bytes>();
        lent_->capacity_ = capacity();
    }
    return lent_;
}

void framer::settle() noexcept {
    const std::shared_ptr<kept_bytes> lent = std::move(lent_);
    byte_buffer rest = std::move(rest_);
    if (lent.use_count() == 1) {  // no one kept it after all: the buffer stays
        // Its keeper's reads (on another thread) happened before its reference went.
        std::atomic_thread_fence(std::memory_order_acquire);
        return;
    }
    const std::size_t n = end_ - begin_;  // what follows the messages delivered (usually none)
    if (n > rest.capacity()) rest.reserve(n);  // a part that did not end its message
    if (n > 0) std::memcpy(rest.data(), buf_.data() + begin_, n);
    std::size_t cap = 0;
    lent->block_ = buf_.take_block(cap);
    buf_ = std::move(rest);
    scan_ -= begin_;
    end_ = n;
    begin_ = 0;
}

void framer::commit(std::size_t n) {
    end_ += n;
}

void framer::feed(std::string_view bytes) {
    auto area = prepare(bytes.size());
    if (!bytes.empty()) std::memcpy(area.data(), bytes.data(), bytes.size());
    commit(bytes.size());
}

void framer::fail(const char* what, std::uint64_t value, std::size_t limit) const {
    std::string msg = "ordo: protocol error: ";
    msg += what;
    msg += " (";
    msg += std::to_string(value);
    if (limit != 0) {
        msg += ", limit ";
        msg += std::to_string(limit);
    }
    msg += ")";
    throw_error(errc::protocol_error, msg);
}

void framer::push_container(std::uint64_t entries, std::uint64_t length) {
    if (length > limits_.max_container_length)
        fail("container length over max_container_length", length, limits_.max_container_length);
    // Every entry takes at least one byte: a header that announces more entries than the message
    // may still hold is refused now rather than after waiting for the bytes.
    if (entries > limits_.max_message_bytes - (scan_ - begin_))
        fail("container announces more entries than max_message_bytes can hold", entries,
             limits_.max_message_bytes);
    if (open_.size() + 1 > limits_.max_depth)
        fail("nesting deeper than max_depth", open_.size() + 1, limits_.max_depth);
    open_.push_back(entries);
}

std::optional<std::string_view> framer::next() {
    const auto* data = reinterpret_cast<const unsigned char*>(buf_.data());
    if (scan_ == begin_ && scan_ < end_) {  // at the start of a message: try it whole
        if (const std::size_t n = whole_message(data + begin_, end_ - begin_, limits_)) {
            std::string_view whole(buf_.data() + begin_, n);
            begin_ = scan_ = begin_ + n;
            need_ = 0;
            return whole;
        }
    }
    while (scan_ < end_) {
        const std::size_t avail = end_ - scan_;
        const token_shape& s = shape_of(data[scan_]);
        if (s.kind == token_shape::invalid)
            fail("invalid msgpack type byte 0xc1 at message offset", scan_ - begin_, 0);
        if (avail < std::size_t(s.header)) break;
        std::uint64_t length = s.length_size == 0
                                   ? s.fixed_length
                                   : load_be(data + scan_ + s.length_at, s.length_size);
        std::uint64_t size = std::uint64_t(s.header);
        if (s.kind == token_shape::payload) {
            if (length > limits_.max_string_bytes)
                fail("str/bin/ext length over max_string_bytes", length, limits_.max_string_bytes);
            size += length;
        }
        if (size > limits_.max_message_bytes - (scan_ - begin_))
            fail("message longer than max_message_bytes", scan_ - begin_ + size,
                 limits_.max_message_bytes);
        if (avail < size) {
            need_ = scan_ - begin_ + std::size_t(size);  // within max_message_bytes: checked
            break;
        }
        if (++objects_ > limits_.max_objects)
            fail("more objects in one message than max_objects", objects_, limits_.max_objects);
        scan_ += size;
        bool item_done = true;
        if ((s.kind == token_shape::array || s.kind == token_shape::map) && length > 0) {
            push_container(s.kind == token_shape::map ? length * 2 : length, length);
            item_done = false;
        } else if (s.kind == token_shape::array || s.kind == token_shape::map) {
            if (open_.size() + 1 > limits_.max_depth)
                fail("nesting deeper than max_depth", open_.size() + 1, limits_.max_depth);
        }
        // A finished item completes its container when it was the last entry, and so on up.
        while (item_done && !open_.empty()) {
            if (--open_.back() != 0)
                item_done = false;
            else
                open_.pop_back();
        }
        if (item_done) {
            std::string_view whole(buf_.data() + begin_, scan_ - begin_);
            begin_ = scan_;
            objects_ = 0;
            need_ = 0;
            return whole;
        }
    }
    if (end_ - begin_ > limits_.max_message_bytes)
        fail("message longer than max_message_bytes", end_ - begin_, limits_.max_message_bytes);
    return std::nullopt;
}

void framer::finish() const {
    if (end_ != begin_)
        fail("stream ended inside a message: truncated, bytes buffered", end_ - begin_, 0);
}

}  // namespace ordo::detail
