// The checked msgpack reader (object_reader) and the hand decoder of msgpack-rpc's envelope:
// how ordo reads what comes from the network. rpc/codec.cpp builds messages on them.
#include "rpc/detail/wire_read.hpp"

#include <cstring>
#include <string>

#include "ordo/call.hpp"

namespace ordo {
namespace {

using detail::bad;

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
class object_reader {
  public:
    /// `objects`: how many objects of the message were read before these bytes (the hand
    /// decoder's envelope), so that max_objects counts the whole message.
    object_reader(std::string_view bytes, const limits& l, msgpack::zone& zone, bool borrow,
                  std::size_t objects = 0)
        : p_(reinterpret_cast<const unsigned char*>(bytes.data())),
          end_(p_ + bytes.size()),
          begin_(p_),
          l_(l),
          zone_(zone),
          borrow_(borrow),
          objects_(objects) {}

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
    void need(std::size_t n) const {
        if (static_cast<std::size_t>(end_ - p_) < n) bad("malformed msgpack: truncated object");
    }
    std::uint64_t be(int n) {
        need(static_cast<std::size_t>(n));
        std::uint64_t v = 0;
        for (int i = 0; i < n; ++i) v = (v << 8) | *p_++;
        return v;
    }
    const char* bytes(std::size_t n, const char* what) {
        if (n > l_.max_string_bytes)
            bad(std::string(what) + " of " + std::to_string(n) + " bytes over max_string_bytes");
        need(n);
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
        need(n * bytes_each);  // every entry takes at least one byte: no allocation beyond input
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
        if (++objects_ > l_.max_objects) bad("message has more than max_objects objects");
        need(1);
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
    std::size_t objects_;
};

}  // namespace

namespace detail {

msgpack::object unpack_checked(std::string_view bytes, const limits& l, msgpack::zone& zone,
                               bool borrow) {
    if (bytes.size() > l.max_message_bytes)
        bad("message of " + std::to_string(bytes.size()) + " bytes over max_message_bytes");
    try {
        return object_reader(bytes, l, zone, borrow).read_all();
    } catch (const std::bad_alloc&) {
        bad("message too large to decode");
    }
}

// The envelope that ordo and the msgpack-rpc libraries write, read by hand: a fixarray of 4
// (request, response) or 3 (notification), the kind as a positive fixint, the msgid as a uint
// of up to 32 bits, the method as a fixstr or str 8. The params, or the error and result, are
// then read by object_reader, which counts objects and depth as if it had read the whole
// message, so that a limit broken inside them throws what the general way throws. Anything
// else, valid or not (a method sent as bin, a msgid as uint 64, an envelope over a limit),
// returns 0, and the general way decodes it, or says what is wrong with it.
// `whole`: `bytes` is one message (it throws what the general way throws for an error in the
// params); else a message starts at `bytes` and may end before it or not be all there
// (decode_prefix): the message's size is returned, and the caller declines on a throw.
namespace {

// A msgid as ordo and the msgpack-rpc libraries write it: a positive fixint or a uint 8, 16 or
// 32, at `p` (at least one byte before `end`), moved past it. False for anything else (a
// uint 64 among them: the general way reads it), or one not all there.
[[gnu::always_inline]] inline bool read_small_msgid(const unsigned char*& p,
                                                    const unsigned char* end,
                                                    std::uint32_t& id) noexcept {
    if (*p <= 0x7f) {
        id = *p;
        p += 1;
    } else if (*p == 0xcc && end - p >= 2) {
        id = p[1];
        p += 2;
    } else if (*p == 0xcd && end - p >= 3) {
        id = std::uint32_t(p[1]) << 8 | p[2];
        p += 3;
    } else if (*p == 0xce && end - p >= 5) {
        id =
            std::uint32_t(p[1]) << 24 | std::uint32_t(p[2]) << 16 | std::uint32_t(p[3]) << 8 | p[4];
        p += 5;
    } else {
        return false;
    }
    return true;
}

// A method name sent as a fixstr or str 8 within max_string_bytes, all of it before `end`, at
// `p` (moved past it). False for anything else (a method sent as bin among them).
[[gnu::always_inline]] inline bool read_method(const unsigned char*& p, const unsigned char* end,
                                               const limits& l, std::string_view& method) noexcept {
    if (p == end) return false;
    std::size_t n = 0;
    const unsigned char* q = p;
    if ((*q & 0xe0) == 0xa0) {
        n = *q & 0x1f;
        q += 1;
    } else if (*q == 0xd9 && end - q >= 2) {
        n = q[1];
        q += 2;
    } else {
        return false;
    }
    if (n > l.max_string_bytes || static_cast<std::size_t>(end - q) < n) return false;
    method = {reinterpret_cast<const char*>(q), n};
    p = q + n;
    return true;
}

// The common call, read with no frame to set up and no zone: a request `[0, msgid, method,
// params]` or a notification `[2, method, params]`, with a msgid as read_small_msgid reads it,
// a method as read_method reads it, and params that are a fixarray of flat values
// (read_flat_value<wide>), put in `items`; all of it in `bytes` and within the limits, counted
// as the general reader counts them. 0 for anything else: read_envelope reads it, or says what
// is wrong with it.
template <bool wide>
[[gnu::always_inline]] inline std::size_t read_common_call(std::string_view bytes, const limits& l,
                                                           msgpack::object* items,
                                                           message& m) noexcept {
    const auto* const start = reinterpret_cast<const unsigned char*>(bytes.data());
    const auto* const end = start + std::min(bytes.size(), l.max_message_bytes);
    if (end - start < 4 || l.max_container_length < 4 || l.max_depth < 2 || l.max_objects < 5)
        return 0;
    const unsigned char kind = start[1];
    if (!(start[0] == 0x94 && kind == 0) && !(start[0] == 0x93 && kind == 2)) return 0;
    const auto* p = start + 2;
    std::uint32_t id = 0;
    if (kind == 0 && !read_small_msgid(p, end, id)) return 0;
    std::string_view method;
    if (!read_method(p, end, l, method)) return 0;
    if (p == end || (*p & 0xf0) != 0x90) return 0;
    const std::size_t n = *p & 0x0f;
    // The root, the kind, the msgid of a request, the method, the params and their values.
    const std::size_t objects = (kind == 0 ? 5 : 4) + n;
    if (n > l.max_container_length || objects > l.max_objects) return 0;
    ++p;
    for (std::size_t i = 0; i < n; ++i)
        if (!read_flat_value<wide>(p, end, l, items[i])) return 0;
    m.kind = static_cast<message_kind>(kind);
    m.msgid = id;
    m.method = method;
    m.params.type = msgpack::type::ARRAY;
    m.params.via.array.size = static_cast<std::uint32_t>(n);
    m.params.via.array.ptr = n > 0 ? items : nullptr;
    return static_cast<std::size_t>(p - start);
}

// The common answer, read with no frame to set up: a success `[1, msgid, nil, result]` whose
// msgid is a positive fixint or a uint 8, 16 or 32, and whose result is a positive fixint or a
// str or bin of up to 255 bytes, all of it in `bytes` and within the limits. 0 for anything
// else: read_envelope reads it, or says what is wrong with it.
[[gnu::always_inline]] inline std::size_t read_common_response(std::string_view bytes,
                                                               const limits& l,
                                                               message& m) noexcept {
    const auto* const start = reinterpret_cast<const unsigned char*>(bytes.data());
    const auto* const end = start + std::min(bytes.size(), l.max_message_bytes);
    if (end - start < 5 || start[0] != 0x94 || start[1] != 0x01 || l.max_container_length < 4 ||
        l.max_depth < 1 || l.max_objects < 5)
        return 0;
    const auto* p = start + 2;
    std::uint32_t id;
    if (!read_small_msgid(p, end, id)) return 0;
    if (end - p < 2 || *p != 0xc0) return 0;  // the error: nil; then the result
    ++p;
    const unsigned char t = *p;
    std::size_t head = 1, len = 0;
    msgpack::object o;
    if (t <= 0x7f) {
        o.type = msgpack::type::POSITIVE_INTEGER;
        o.via.u64 = t;
    } else if ((t & 0xe0) == 0xa0) {
        o.type = msgpack::type::STR;
        len = t & 0x1f;
    } else if ((t == 0xd9 || t == 0xc4) && end - p >= 2) {
        o.type = t == 0xd9 ? msgpack::type::STR : msgpack::type::BIN;
        head = 2;
        len = p[1];
    } else {
        return 0;
    }
    if (len > l.max_string_bytes || static_cast<std::size_t>(end - p) < head + len) return 0;
    if (o.type == msgpack::type::STR) {
        o.via.str.size = static_cast<std::uint32_t>(len);
        o.via.str.ptr = reinterpret_cast<const char*>(p + head);
    } else if (o.type == msgpack::type::BIN) {
        o.via.bin.size = static_cast<std::uint32_t>(len);
        o.via.bin.ptr = reinterpret_cast<const char*>(p + head);
    }
    m.kind = message_kind::response;
    m.msgid = id;
    m.result = o;
    return static_cast<std::size_t>(p - start) + head + len;
}

// decode_envelope's body, once for each use (`whole` known).
template <bool whole>
[[gnu::always_inline]] inline std::size_t read_envelope(std::string_view bytes, const limits& l,
                                                        msgpack::zone& z, message& m) {
    if (whole && bytes.size() > l.max_message_bytes) return 0;
    if (!whole && bytes.size() > l.max_message_bytes) bytes = bytes.substr(0, l.max_message_bytes);
    const auto* const start = reinterpret_cast<const unsigned char*>(bytes.data());
    const auto* p = start;
    const auto* const end = p + bytes.size();
    if (bytes.size() < 4 || l.max_container_length < 4 || l.max_depth < 1 || l.max_objects < 5)
        return 0;
    const unsigned char kind = p[1];
    if (!(p[0] == 0x94 && kind <= 1) && !(p[0] == 0x93 && kind == 2)) return 0;
    // The general way first checks that the entries can fit in the bytes left (one byte each).
    if (bytes.size() - 1 < static_cast<std::size_t>(p[0] & 0x0f)) return 0;
    p += 2;
    if (kind != 2) {  // the msgid
        const unsigned char t = *p;
        std::size_t n = 0;  // bytes after the type byte
        if (t <= 0x7f) {
            m.msgid = t;
        } else if (t >= 0xcc && t <= 0xce) {
            n = std::size_t(1) << (t - 0xcc);
            if (static_cast<std::size_t>(end - p) < 1 + n) return 0;
            if (n == 1)
                m.msgid = p[1];
            else if (n == 2)
                m.msgid = std::uint32_t(p[1]) << 8 | p[2];
            else
                m.msgid = std::uint32_t(p[1]) << 24 | std::uint32_t(p[2]) << 16 |
                          std::uint32_t(p[3]) << 8 | p[4];
        } else {
            return 0;
        }
        p += 1 + n;
    }
    if (kind != 1) {  // the method
        if (!read_method(p, end, l, m.method)) return 0;
        // The params: an array (else the general way says that they are not).
        if (p == end || !((*p & 0xf0) == 0x90 || *p == 0xdc || *p == 0xdd)) return 0;
    }
    // Read so far: the root, the kind, and the msgid and method that the kind has.
    std::size_t objects = kind == 0 ? 4 : 3;
    const bool no_error = kind == 1 && p != end && *p == 0xc0;  // a success: nil, then the result
    if (no_error) {
        ++p;
        ++objects;
    }
    const std::string_view rest(reinterpret_cast<const char*>(p),
                                static_cast<std::size_t>(end - p));
    try {
        object_reader r(rest, l, z, true, objects);
        m.kind = static_cast<message_kind>(kind);
        if (m.kind == message_kind::response) {
            if (!no_error) m.error = r.read_one(2);  // else nil, as message's default
            m.result = r.read_one(2);
        } else {
            m.params = r.read_one(2);
        }
        if constexpr (whole) r.expect_end();
        // The whole message as one array too (message::handle), as the general way gives it;
        // decode_prefix leaves it to own(), the only one that needs it then.
        if (!whole) return static_cast<std::size_t>(p - start) + r.consumed();
        const std::uint32_t n = kind == 2 ? 3 : 4;
        auto* items = static_cast<msgpack::object*>(
            z.allocate_align(n * sizeof(msgpack::object), alignof(msgpack::object)));
        std::uint32_t i = 0;
        items[i].type = msgpack::type::POSITIVE_INTEGER;
        items[i++].via.u64 = kind;
        if (m.kind != message_kind::notification) {
            items[i].type = msgpack::type::POSITIVE_INTEGER;
            items[i++].via.u64 = m.msgid;
        }
        if (m.kind == message_kind::response) {
            items[i++] = m.error;
            items[i] = m.result;
        } else {
            items[i].type = msgpack::type::STR;
            items[i].via.str.ptr = m.method.data();
            items[i++].via.str.size = static_cast<std::uint32_t>(m.method.size());
            items[i] = m.params;
        }
        msgpack::object root;
        root.type = msgpack::type::ARRAY;
        root.via.array.size = n;
        root.via.array.ptr = items;
        m.handle.set(root);
    } catch (const std::bad_alloc&) {
        bad("message too large to decode");
    }
    return bytes.size();
}

}  // namespace

std::size_t decode_envelope(std::string_view bytes, const limits& l, msgpack::zone& z, message& m,
                            bool whole) {
    return whole ? read_envelope<true>(bytes, l, z, m) : read_envelope<false>(bytes, l, z, m);
}

namespace {

// decode_prefix's two ways, each with a frame of its own: the common response takes no frame
// set up for the general reader (which cost the one-way path as much as it saved the other).
[[gnu::noinline]] std::size_t read_prefix(std::string_view bytes, const limits& l, msgpack::zone& z,
                                          message& m) noexcept {
    // Cleared only on this way: the common response uses no zone, and what the last message
    // read into it stays there until the next one that may.
    z.clear();
    try {
        return read_envelope<false>(bytes, l, z, m);
    } catch (...) {  // not all there, or something to say: the framer's way says it
        return 0;
    }
}

[[gnu::noinline]] std::size_t read_response_prefix(std::string_view bytes, const limits& l,
                                                   msgpack::zone& z, message& m) noexcept {
    if (const std::size_t n = read_common_response(bytes, l, m)) return n;
    return read_prefix(bytes, l, z, m);
}

// A call whose params have a value of the less common flat types (a wider int, a float, a bin
// 8), out of the common call's way, which tries only the most common ones first; then the
// general way.
[[gnu::noinline]] std::size_t read_other_prefix(std::string_view bytes, const limits& l,
                                                read_area& a, message& m) noexcept {
    if (const std::size_t n = read_common_call<true>(bytes, l, a.items, m)) return n;
    return read_prefix(bytes, l, a.zone, m);
}

}  // namespace

std::size_t decode_prefix(std::string_view bytes, const limits& l, read_area& a,
                          message& m) noexcept {
    m.borrowed = true;
    if (bytes.size() >= 2 && static_cast<unsigned char>(bytes[1]) == 0x01)
        return read_response_prefix(bytes, l, a.zone, m);
    if (const std::size_t n = read_common_call<false>(bytes, l, a.items, m)) return n;
    return read_other_prefix(bytes, l, a, m);
}

}  // namespace detail
}  // namespace ordo
