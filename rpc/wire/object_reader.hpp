// The checked msgpack reader (object_reader), and the readers of flat values it shares with the
// hand decoder of the envelope: reading msgpack objects from untrusted bytes. Private to
// rpc/wire/read.cpp, its only includer.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "rpc/wire/read.hpp"

namespace ordo::detail {

// The `n`-byte big-endian number after the type byte at `p`.
[[gnu::always_inline]] inline std::uint64_t be_after(const unsigned char* p, int n) noexcept {
    std::uint64_t v = 0;
    for (int i = 1; i <= n; ++i) v = (v << 8) | p[i];
    return v;
}

// read_flat_value's less common types, as the general reader reads them: a uint or int of 8,
// 16, 32 or 64 bits, a float 32 or 64, a bin 8 within max_string_bytes. False for anything
// else, or one not all there.
[[gnu::always_inline]] inline bool read_flat_number_or_bin(const unsigned char*& p,
                                                           const unsigned char* end,
                                                           const limits& l,
                                                           msgpack::object& it) noexcept {
    const unsigned char t = *p;
    const std::size_t left = static_cast<std::size_t>(end - p) - 1;  // after the type byte
    if (t >= 0xcc && t <= 0xd3) {                                    // uint 8..64, int 8..64
        const int n = 1 << (t & 0x03);
        if (left < static_cast<std::size_t>(n)) return false;
        const std::uint64_t v = be_after(p, n);
        std::int64_t s = 0;
        if (t <= 0xcf) {
            it.type = msgpack::type::POSITIVE_INTEGER;
            it.via.u64 = v;
        } else {
            s = n == 1   ? std::int8_t(v)
                : n == 2 ? std::int16_t(v)
                : n == 4 ? std::int32_t(v)
                         : static_cast<std::int64_t>(v);
            it.type = s < 0 ? msgpack::type::NEGATIVE_INTEGER : msgpack::type::POSITIVE_INTEGER;
            it.via.i64 = s;  // a non-negative one reads the same as u64
        }
        p += 1 + n;
        return true;
    }
    if (t == 0xca || t == 0xcb) {
        const int n = t == 0xca ? 4 : 8;
        if (left < static_cast<std::size_t>(n)) return false;
        const std::uint64_t bits = be_after(p, n);
        if (n == 4) {
            const auto b32 = static_cast<std::uint32_t>(bits);
            float f;
            std::memcpy(&f, &b32, 4);
            it.type = msgpack::type::FLOAT32;
            it.via.f64 = f;
        } else {
            double d;
            std::memcpy(&d, &bits, 8);
            it.type = msgpack::type::FLOAT64;
            it.via.f64 = d;
        }
        p += 1 + n;
        return true;
    }
    if (t == 0xc4) {
        if (left < 1) return false;
        const std::size_t len = p[1];
        if (len > l.max_string_bytes || left - 1 < len) return false;
        it.type = msgpack::type::BIN;
        it.via.bin.size = static_cast<std::uint32_t>(len);
        it.via.bin.ptr = reinterpret_cast<const char*>(p + 2);
        p += 2 + len;
        return true;
    }
    return false;
}

// One value of the common params array, borrowed from the bytes: an int of any width, a float,
// a fixstr or str 8, a bin 8, nil or a bool, read at `p` (moved past it). False, with `p` where
// it was, for any other type (a longer str or bin, an ext, an array or map), or one not all
// there before `end` or over max_string_bytes: the general reader then reads the array, and
// says what is wrong if anything is.
// `wide`: also the less common types (read_flat_number_or_bin); else false for those.
template <bool wide>
[[gnu::always_inline]] inline bool read_flat_value(const unsigned char*& p,
                                                   const unsigned char* end, const limits& l,
                                                   msgpack::object& it) noexcept {
    if (p == end) return false;
    const unsigned char t = *p;
    if (t <= 0x7f) {
        it.type = msgpack::type::POSITIVE_INTEGER;
        it.via.u64 = t;
        ++p;
    } else if (t >= 0xe0) {
        it.type = msgpack::type::NEGATIVE_INTEGER;
        it.via.i64 = static_cast<std::int8_t>(t);
        ++p;
    } else if ((t & 0xe0) == 0xa0 || t == 0xd9) {
        std::size_t len = t & 0x1f, head = 1;
        if (t == 0xd9) {
            if (end - p < 2) return false;
            len = p[1];
            head = 2;
        }
        if (len > l.max_string_bytes || static_cast<std::size_t>(end - p) < head + len)
            return false;
        it.type = msgpack::type::STR;
        it.via.str.size = static_cast<std::uint32_t>(len);
        it.via.str.ptr = reinterpret_cast<const char*>(p + head);
        p += head + len;
    } else if (t == 0xc0) {
        it.type = msgpack::type::NIL;
        ++p;
    } else if (t == 0xc2 || t == 0xc3) {
        it.type = msgpack::type::BOOLEAN;
        it.via.boolean = t == 0xc3;
        ++p;
    } else {
        if constexpr (wide)
            return read_flat_number_or_bin(p, end, l, it);
        else
            return false;
    }
    return true;
}

// Decodes one msgpack object into msgpack::object form (what handlers convert from), with its
// arrays and maps in `zone`. str, bin and ext payloads are copied into the zone, or, when
// `borrow` is set, point into the input bytes (which must then outlive the result). Checks every
// length against the bytes left and the limits before allocating, so it is safe on any input,
// not only on what the framer cut.
//
// `partial`: the bytes start a message that may not be all there yet (decode_prefix). Bytes
// missing are then no error but a state (truncated()): from the first byte missing on, every
// read reads nothing and allocates nothing, and the caller declines the message; no exception
// is thrown for a message a read cut. Else bytes missing are malformed input (throws).
class object_reader {
  public:
    /// `objects`: how many objects of the message were read before these bytes (the hand
    /// decoder's envelope), so that max_objects counts the whole message.
    object_reader(std::string_view bytes, const limits& l, msgpack::zone& zone, bool borrow,
                  std::size_t objects = 0, bool partial = false)
        : p_(reinterpret_cast<const unsigned char*>(bytes.data())),
          end_(p_ + bytes.size()),
          begin_(p_),
          l_(l),
          zone_(zone),
          borrow_(borrow),
          partial_(partial),
          objects_(objects) {}

    /// With `partial`: the message is not all there (what was read is not to be used).
    bool truncated() const noexcept { return short_; }

    msgpack::object read_all() {
        msgpack::object o = read_one(1);
        expect_end();
        return o;
    }
    /// The next object, as one at `depth` (the message's root is at depth 1).
    msgpack::object read_one(std::size_t depth) {
        msgpack::object o;
        if (!read_flat_array(o, depth)) read(o, depth);
        return o;
    }
    void expect_end() const {
        if (p_ != end_) bad("bytes left after one msgpack object");
    }
    /// Bytes read so far.
    std::size_t consumed() const noexcept { return static_cast<std::size_t>(p_ - begin_); }

  private:
    // Whether `n` more bytes are there (see the class's comment for when they are not).
    bool need(std::size_t n) {
        if (static_cast<std::size_t>(end_ - p_) >= n) [[likely]]
            return true;
        if (!partial_) bad("malformed msgpack: truncated object");
        short_ = true;
        p_ = end_;
        return false;
    }
    std::uint64_t be(int n) {
        if (!need(static_cast<std::size_t>(n))) return 0;
        std::uint64_t v = 0;
        for (int i = 0; i < n; ++i) v = (v << 8) | *p_++;
        return v;
    }
    const char* bytes(std::size_t n, const char* what) {
        if (n > l_.max_string_bytes)
            bad(std::string(what) + " of " + std::to_string(n) + " bytes over max_string_bytes");
        if (!need(n)) return nullptr;
        const char* src = reinterpret_cast<const char*>(p_);
        p_ += n;
        if (borrow_ || n == 0) return src;
        char* dst = static_cast<char*>(zone_.allocate_no_align(n));
        std::memcpy(dst, src, n);
        return dst;
    }
    std::size_t count(std::uint64_t n, std::size_t bytes_each) {
        if (n > l_.max_container_length)
            bad("container of " + std::to_string(n) + " entries over max_container_length");
        // Every entry takes at least one byte: no allocation beyond the input.
        if (!need(n * bytes_each)) return 0;
        return static_cast<std::size_t>(n);
    }
    void str(msgpack::object& o, std::size_t n) {
        o.type = msgpack::type::STR;
        o.via.str.size = static_cast<std::uint32_t>(n);
        o.via.str.ptr = bytes(n, "str");
    }
    void bin(msgpack::object& o, std::size_t n) {
        o.type = msgpack::type::BIN;
        o.via.bin.size = static_cast<std::uint32_t>(n);
        o.via.bin.ptr = bytes(n, "bin");
    }
    void ext(msgpack::object& o, std::size_t n) {  // the type byte, then n bytes of data
        o.type = msgpack::type::EXT;
        o.via.ext.size = static_cast<std::uint32_t>(n);
        o.via.ext.ptr = bytes(n + 1, "ext");
    }
    void uint(msgpack::object& o, std::uint64_t v) {
        o.type = msgpack::type::POSITIVE_INTEGER;
        o.via.u64 = v;
    }
    void sint(msgpack::object& o, std::int64_t v) {
        if (v >= 0) return uint(o, static_cast<std::uint64_t>(v));
        o.type = msgpack::type::NEGATIVE_INTEGER;
        o.via.i64 = v;
    }
    void array(msgpack::object& o, std::uint64_t n64, std::size_t depth) {
        const std::size_t n = count(n64, 1);
        o.type = msgpack::type::ARRAY;
        o.via.array.size = static_cast<std::uint32_t>(n);
        o.via.array.ptr = nullptr;
        if (n == 0) return;
        auto* items = static_cast<msgpack::object*>(
            zone_.allocate_align(n * sizeof(msgpack::object), alignof(msgpack::object)));
        o.via.array.ptr = items;
        for (std::size_t i = 0; i < n; ++i) read(items[i], depth + 1);
    }
    void map(msgpack::object& o, std::uint64_t n64, std::size_t depth) {
        const std::size_t n = count(n64, 2);
        o.type = msgpack::type::MAP;
        o.via.map.size = static_cast<std::uint32_t>(n);
        o.via.map.ptr = nullptr;
        if (n == 0) return;
        auto* kvs = static_cast<msgpack::object_kv*>(
            zone_.allocate_align(n * sizeof(msgpack::object_kv), alignof(msgpack::object_kv)));
        o.via.map.ptr = kvs;
        for (std::size_t i = 0; i < n; ++i) {
            read(kvs[i].key, depth + 1);
            read(kvs[i].val, depth + 1);
        }
    }

    // The params of most calls: a fixarray of numbers, short strings and bytes, nil and bools,
    // borrowed (read_flat_value).
    // Read in one loop, with every check read() makes; anything else (or a broken limit, or
    // bytes missing) leaves nothing read and returns false, and read() takes it from the start.
    bool read_flat_array(msgpack::object& o, std::size_t depth) {
        if (!borrow_ || p_ == end_ || (*p_ & 0xf0) != 0x90) return false;
        const std::size_t n = *p_ & 0x0f;
        if (depth > l_.max_depth || n > l_.max_container_length ||
            objects_ + 1 + n > l_.max_objects || static_cast<std::size_t>(end_ - p_) < 1 + n)
            return false;
        const unsigned char* p = p_ + 1;
        msgpack::object* items = nullptr;
        if (n > 0)
            items = static_cast<msgpack::object*>(
                zone_.allocate_align(n * sizeof(msgpack::object), alignof(msgpack::object)));
        for (std::size_t i = 0; i < n; ++i)
            if (!read_flat_value<true>(p, end_, l_, items[i])) return false;
        o.type = msgpack::type::ARRAY;
        o.via.array.size = static_cast<std::uint32_t>(n);
        o.via.array.ptr = items;
        objects_ += 1 + n;
        p_ = p;
        return true;
    }

    void read(msgpack::object& o, std::size_t depth) {
        if (short_) return;  // (a partial message's bytes ended: nothing more is read)
        if (++objects_ > l_.max_objects) bad("message has more than max_objects objects");
        if (!need(1)) return;
        const unsigned char t = *p_++;
        if (t <= 0x7f) return uint(o, t);
        if (t >= 0xe0) return sint(o, static_cast<std::int8_t>(t));
        if ((t & 0xe0) == 0xa0) return str(o, t & 0x1f);
        if ((t & 0xf0) == 0x90 || (t & 0xf0) == 0x80 || t == 0xdc || t == 0xdd || t == 0xde ||
            t == 0xdf) {
            if (depth > l_.max_depth) bad("nesting deeper than max_depth");
            if ((t & 0xf0) == 0x90) return array(o, t & 0x0f, depth);
            if ((t & 0xf0) == 0x80) return map(o, t & 0x0f, depth);
            if (t == 0xdc) return array(o, be(2), depth);
            if (t == 0xdd) return array(o, be(4), depth);
            if (t == 0xde) return map(o, be(2), depth);
            return map(o, be(4), depth);
        }
        switch (t) {
            case 0xc0: o.type = msgpack::type::NIL; return;
            case 0xc2:
            case 0xc3:
                o.type = msgpack::type::BOOLEAN;
                o.via.boolean = t == 0xc3;
                return;
            case 0xc4: return bin(o, be(1));
            case 0xc5: return bin(o, be(2));
            case 0xc6: return bin(o, be(4));
            case 0xc7: return ext(o, be(1));
            case 0xc8: return ext(o, be(2));
            case 0xc9: return ext(o, be(4));
            case 0xca: {
                const auto bits = static_cast<std::uint32_t>(be(4));
                float f;
                std::memcpy(&f, &bits, 4);
                o.type = msgpack::type::FLOAT32;
                o.via.f64 = f;
                return;
            }
            case 0xcb: {
                const std::uint64_t bits = be(8);
                double d;
                std::memcpy(&d, &bits, 8);
                o.type = msgpack::type::FLOAT64;
                o.via.f64 = d;
                return;
            }
            case 0xcc: return uint(o, be(1));
            case 0xcd: return uint(o, be(2));
            case 0xce: return uint(o, be(4));
            case 0xcf: return uint(o, be(8));
            case 0xd0: return sint(o, static_cast<std::int8_t>(be(1)));
            case 0xd1: return sint(o, static_cast<std::int16_t>(be(2)));
            case 0xd2: return sint(o, static_cast<std::int32_t>(be(4)));
            case 0xd3: return sint(o, static_cast<std::int64_t>(be(8)));
            case 0xd4: return ext(o, 1);
            case 0xd5: return ext(o, 2);
            case 0xd6: return ext(o, 4);
            case 0xd7: return ext(o, 8);
            case 0xd8: return ext(o, 16);
            case 0xd9: return str(o, be(1));
            case 0xda: return str(o, be(2));
            case 0xdb: return str(o, be(4));
        }
        bad("malformed msgpack: reserved type byte 0xc1");
    }

    const unsigned char* p_;
    const unsigned char* end_;
    const unsigned char* begin_;
    const limits& l_;
    msgpack::zone& zone_;
    bool borrow_;
    bool partial_;
    bool short_ = false;
    std::size_t objects_;
};

}  // namespace ordo::detail
