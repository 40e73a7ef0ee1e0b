// The hand decoder of msgpack-rpc's envelope, on the checked msgpack reader
// (rpc/wire/object_reader.hpp): how ordo reads what comes from the network. rpc/wire/codec.cpp
// builds messages on them.
#include "rpc/wire/read.hpp"
#include "rpc/wire/msgid.hpp"

#include <cstring>
#include <string>

#include "ordo/rpc/call.hpp"
#include "rpc/wire/object_reader.hpp"

namespace ordo {
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

// A request's context as the common call sends it (docs/protocol.md, "Call context"): a fixmap
// of non-empty str keys to str or bin values (an uint for an "ordo-" key), within the metadata
// limits, its pairs put in `pairs` and counted in `objects`. False for anything else, which the
// general reader then reads, or says what is wrong with.
[[gnu::always_inline]] inline bool read_small_context(const unsigned char*& p,
                                                      const unsigned char* end, const limits& l,
                                                      msgpack::object_kv* pairs,
                                                      std::size_t& objects,
                                                      msgpack::object& meta) noexcept {
    if (p == end || (*p & 0xf0) != 0x80) return false;
    const std::size_t n = *p & 0x0f;
    objects += 1 + 2 * n;
    if (n > l.max_container_length || n > l.max_metadata_entries || objects > l.max_objects)
        return false;
    ++p;
    std::size_t bytes = 0;
    for (std::size_t i = 0; i < n; ++i) {
        auto& kv = pairs[i];
        if (!read_flat_value<false>(p, end, l, kv.key) || kv.key.type != msgpack::type::STR ||
            kv.key.via.str.size == 0)
            return false;
        if (!read_flat_value<true>(p, end, l, kv.val)) return false;
        bytes += kv.key.via.str.size;
        if (kv.val.type == msgpack::type::STR)
            bytes += kv.val.via.str.size;
        else if (kv.val.type == msgpack::type::BIN)
            bytes += kv.val.via.bin.size;
        else if (kv.val.type != msgpack::type::POSITIVE_INTEGER ||
                 std::string_view(kv.key.via.str.ptr, kv.key.via.str.size).substr(0, 5) != "ordo-")
            return false;
        if (bytes > l.max_metadata_bytes) return false;
    }
    meta.type = msgpack::type::MAP;
    meta.via.map.size = static_cast<std::uint32_t>(n);
    meta.via.map.ptr = n > 0 ? pairs : nullptr;
    return true;
}

// The common call, read with no frame to set up and no zone: a request `[0, msgid, method,
// params]` or a notification `[2, method, params]`, with a msgid as read_small_msgid reads it,
// a method as read_method reads it, and params that are a fixarray of flat values
// (read_flat_value<wide>), put in `items`; or a request with its context as read_small_context
// reads it, put in `pairs`; all of it in `bytes` and within the limits, counted as the general
// reader counts them. 0 for anything else: read_envelope reads it, or says what is wrong with
// it.
// `with_context`: only a request with its context; otherwise only one without (each is its
// own code, so that the plain call's way pays nothing for the other).
template <bool wide, bool with_context>
[[gnu::always_inline]] inline std::size_t read_common_call(std::string_view bytes, const limits& l,
                                                           msgpack::object* items,
                                                           msgpack::object_kv* pairs,
                                                           message& m) noexcept {
    const auto* const start = reinterpret_cast<const unsigned char*>(bytes.data());
    const auto* const end = start + std::min(bytes.size(), l.max_message_bytes);
    if (end - start < 4 || l.max_container_length < 4 || l.max_depth < 2 || l.max_objects < 5)
        return 0;
    const unsigned char kind = start[1];
    if constexpr (with_context) {
        if (start[0] != 0x95 || kind != 0 || l.max_container_length < 5) return 0;
    } else {
        if (!(start[0] == 0x94 && kind == 0) && !(start[0] == 0x93 && kind == 2)) return 0;
    }
    const auto* p = start + 2;
    std::uint32_t id = 0;
    if (kind == 0 && !read_small_msgid(p, end, id)) return 0;
    std::string_view method;
    if (!read_method(p, end, l, method)) return 0;
    if (p == end || (*p & 0xf0) != 0x90) return 0;
    const std::size_t n = *p & 0x0f;
    // The root, the kind, the msgid of a request, the method, the params and their values.
    std::size_t objects = (kind == 0 ? 5 : 4) + n;
    if (n > l.max_container_length || objects > l.max_objects) return 0;
    ++p;
    for (std::size_t i = 0; i < n; ++i)
        if (!read_flat_value<wide>(p, end, l, items[i])) return 0;
    if constexpr (with_context) {
        if (!read_small_context(p, end, l, pairs, objects, m.meta)) return 0;
    } else {
        (void)pairs;
    }
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
    // A request with its context (docs/protocol.md, "Call context"): a fifth element, the map.
    const bool with_context = p[0] == 0x95 && kind == 0;
    if (!(p[0] == 0x94 && kind <= 1) && !(p[0] == 0x93 && kind == 2) && !with_context) return 0;
    if (with_context && l.max_container_length < 5) return 0;  // the general way says why
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
        object_reader r(rest, l, z, true, objects, !whole);
        m.kind = static_cast<message_kind>(kind);
        if (m.kind == message_kind::response) {
            if (!no_error) m.error = r.read_one(2);  // else nil, as message's default
            m.result = r.read_one(2);
        } else {
            m.params = r.read_one(2);
            if (with_context) {
                m.meta = r.read_one(2);
                if (!whole && r.truncated()) return 0;
                // What the general way checks (read_fields), said the same way.
                if (m.params.type != msgpack::type::ARRAY || m.meta.type != msgpack::type::MAP)
                    return 0;
            }
        }
        if (!whole && r.truncated()) return 0;  // not all there yet: the framer waits for it
        if constexpr (whole) r.expect_end();
        // After the bytes are all read, as the general way does: an input with bytes past the
        // message and a bad map gets the same error either way.
        if (with_context) check_context(m, l);
        // The whole message as one array too (message::handle), as the general way gives it;
        // decode_prefix leaves it to own(), the only one that needs it then.
        if (!whole) return static_cast<std::size_t>(p - start) + r.consumed();
        const std::uint32_t n = kind == 2 ? 3 : with_context ? 5 : 4;
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
            if (with_context) items[++i] = m.meta;
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
    } catch (...) {  // something to say (a broken limit, bad input): the framer's way says it
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
    if (const std::size_t n = read_common_call<true, false>(bytes, l, a.items, a.pairs, m))
        return n;
    return read_prefix(bytes, l, a.zone, m);
}

// A request with its context (docs/protocol.md, "Call context"): the common ones in one pass,
// then the general way.
[[gnu::noinline]] std::size_t read_context_prefix(std::string_view bytes, const limits& l,
                                                  read_area& a, message& m) noexcept {
    if (const std::size_t n = read_common_call<false, true>(bytes, l, a.items, a.pairs, m))
        return n;
    if (const std::size_t n = read_common_call<true, true>(bytes, l, a.items, a.pairs, m)) return n;
    m.meta = msgpack::object();  // what a failed read_small_context may have left
    return read_prefix(bytes, l, a.zone, m);
}

}  // namespace

std::size_t decode_prefix(std::string_view bytes, const limits& l, read_area& a,
                          message& m) noexcept {
    m.borrowed = true;
    if (bytes.size() >= 2 && static_cast<unsigned char>(bytes[1]) == 0x01)
        return read_response_prefix(bytes, l, a.zone, m);
    if (const std::size_t n = read_common_call<false, false>(bytes, l, a.items, a.pairs, m))
        return n;
    // Asked after the plain call (which declines it at its first byte), so that a plain one
    // pays nothing for it.
    if (!bytes.empty() && static_cast<unsigned char>(bytes[0]) == 0x95)
        return read_context_prefix(bytes, l, a, m);
    return read_other_prefix(bytes, l, a, m);
}

}  // namespace detail
}  // namespace ordo
