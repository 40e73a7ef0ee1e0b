#include "ordo/rpc/codec.hpp"

#include <cstring>
#include <sstream>
#include <string>

#include "comm/framing.hpp"
#include "ordo/rpc/call.hpp"
#include "ordo/rpc/detail/type_traits.hpp"
#include "rpc/wire/read.hpp"

namespace ordo {
namespace {

const char* type_name(const msgpack::object& o) {
    switch (o.type) {
        case msgpack::type::NIL: return "nil";
        case msgpack::type::BOOLEAN: return "bool";
        case msgpack::type::POSITIVE_INTEGER: return "positive int";
        case msgpack::type::NEGATIVE_INTEGER: return "negative int";
        case msgpack::type::FLOAT32:
        case msgpack::type::FLOAT64: return "float";
        case msgpack::type::STR: return "str";
        case msgpack::type::BIN: return "bin";
        case msgpack::type::ARRAY: return "array";
        case msgpack::type::MAP: return "map";
        case msgpack::type::EXT: return "ext";
    }
    return "unknown type";
}

using detail::bad;

std::uint32_t read_msgid(const msgpack::object& o) {
    if (o.type != msgpack::type::POSITIVE_INTEGER || o.via.u64 > 0xffffffffu)
        bad(std::string("msgid is not a uint32 (got ") + type_name(o) +
            (o.type == msgpack::type::POSITIVE_INTEGER ? " " + std::to_string(o.via.u64) : "") +
            ")");
    return static_cast<std::uint32_t>(o.via.u64);
}

std::string_view read_method(const msgpack::object& o) {
    if (o.type == msgpack::type::STR) return {o.via.str.ptr, o.via.str.size};
    if (o.type == msgpack::type::BIN) return {o.via.bin.ptr, o.via.bin.size};
    bad(std::string("method is not a string (got ") + type_name(o) + ")");
}

void check_arity(const char* kind, std::uint32_t got, std::uint32_t want) {
    if (got != want)
        bad(std::string(kind) + " has " + std::to_string(got) + " elements, expected " +
            std::to_string(want));
}

}  // namespace

void encode_error_response(buffer& out, std::uint32_t msgid, errc code, std::string_view text) {
    detail::write_response_start(out, msgid);
    msgpack::packer<buffer> p(out);
    p.pack_map(2);
    p.pack_str(4).pack_str_body("code", 4).pack_int(static_cast<int>(code));
    p.pack_str(7).pack_str_body("message", 7);
    p.pack_str(static_cast<std::uint32_t>(text.size())).pack_str_body(text.data(), text.size());
    p.pack_nil();
}

namespace {
// Fills m's fields from its root object (m.handle.get()) and checks them.
void read_fields(message& m) {
    const msgpack::object& o = m.handle.get();
    if (o.type != msgpack::type::ARRAY)
        bad(std::string("message is not an array (got ") + type_name(o) + ")");
    const auto& a = o.via.array;
    if (a.size < 3) bad("message has " + std::to_string(a.size) + " elements, expected 3 or 4");
    if (a.ptr[0].type != msgpack::type::POSITIVE_INTEGER || a.ptr[0].via.u64 > 2)
        bad(std::string("unknown message kind (got ") + type_name(a.ptr[0]) +
            (a.ptr[0].type == msgpack::type::POSITIVE_INTEGER
                 ? " " + std::to_string(a.ptr[0].via.u64)
                 : "") +
            ")");
    m.kind = static_cast<message_kind>(a.ptr[0].via.u64);
    switch (m.kind) {
        case message_kind::request:
            // [0, msgid, method, params], or with the call's context after the params.
            if (a.size != 5) check_arity("request", a.size, 4);
            m.msgid = read_msgid(a.ptr[1]);
            m.method = read_method(a.ptr[2]);
            m.params = a.ptr[3];
            if (a.size == 5) {
                m.meta = a.ptr[4];
                if (m.meta.type != msgpack::type::MAP)
                    bad("the context of a call to \"" + std::string(m.method) +
                        "\" is not a map (got " + type_name(m.meta) + ")");
            }
            break;
        case message_kind::response:
            check_arity("response", a.size, 4);
            m.msgid = read_msgid(a.ptr[1]);
            m.error = a.ptr[2];
            m.result = a.ptr[3];
            break;
        case message_kind::notification:
            check_arity("notification", a.size, 3);
            m.method = read_method(a.ptr[1]);
            m.params = a.ptr[2];
            break;
    }
    if (m.kind != message_kind::response && m.params.type != msgpack::type::ARRAY)
        bad(std::string("params of \"") + std::string(m.method) + "\" is not an array (got " +
            type_name(m.params) + ")");
}

}  // namespace

message decode_message(std::string_view bytes, const limits& l) {
    // A zone sized to the message: msgpack's default first chunk is 8 KiB, and one per small
    // message in flight makes the heap grow and shrink (page faults) under load.
    auto zone = std::make_unique<msgpack::zone>(
        std::min<std::size_t>(MSGPACK_ZONE_CHUNK_SIZE, 256 + 2 * bytes.size()));
    const msgpack::object obj = detail::unpack_checked(bytes, l, *zone, false);
    message m;
    m.handle = msgpack::object_handle(obj, std::move(zone));
    read_fields(m);
    detail::check_context(m, l);
    return m;
}

message decode_message(std::string_view bytes, const limits& l, msgpack::zone& z) {
    z.clear();
    message m;
    m.borrowed = true;  // views into `bytes` and `z`
    if (detail::decode_envelope(bytes, l, z, m, true) != 0) return m;
    m = message{};
    m.borrowed = true;
    m.handle.set(detail::unpack_checked(bytes, l, z, true));
    read_fields(m);
    detail::check_context(m, l);
    return m;
}

void own(message& m) {
    if (!m.borrowed) return;
    if (m.handle.get().type != msgpack::type::ARRAY) {
        // From detail::decode_prefix, which makes no array of the whole message: one on the
        // stack, from the fields, is copied.
        msgpack::object items[5];
        std::uint32_t n = 0;
        items[n].type = msgpack::type::POSITIVE_INTEGER;
        items[n++].via.u64 = static_cast<std::uint64_t>(m.kind);
        if (m.kind != message_kind::notification) {
            items[n].type = msgpack::type::POSITIVE_INTEGER;
            items[n++].via.u64 = m.msgid;
        }
        if (m.kind == message_kind::response) {
            items[n++] = m.error;
            items[n++] = m.result;
        } else {
            items[n].type = msgpack::type::STR;
            items[n].via.str.ptr = m.method.data();
            items[n++].via.str.size = static_cast<std::uint32_t>(m.method.size());
            items[n++] = m.params;
            if (m.meta.type != msgpack::type::NIL) items[n++] = m.meta;
        }
        msgpack::object root;
        root.type = msgpack::type::ARRAY;
        root.via.array.size = n;
        root.via.array.ptr = items;
        m.handle = msgpack::clone(root);
    } else {
        m.handle = msgpack::clone(m.handle.get());
    }
    m.borrowed = false;
    read_fields(m);  // the same checks pass on the copy; the views now point into it
}

struct decoder::impl {
    explicit impl(const limits& l) : lim(l), framer(l) {}
    limits lim;
    detail::framer framer;
};

decoder::decoder(const limits& l) : impl_(std::make_unique<impl>(l)) {}
decoder::~decoder() = default;
decoder::decoder(decoder&&) noexcept = default;
decoder& decoder::operator=(decoder&&) noexcept = default;

void decoder::feed(std::string_view chunk) {
    impl_->framer.feed(chunk);
}

std::optional<message> decoder::next() {
    auto bytes = impl_->framer.next();
    if (!bytes) return std::nullopt;
    return decode_message(*bytes, impl_->lim);
}

void decoder::finish() const {
    impl_->framer.finish();
}

namespace detail {

static std::string_view str_of(const msgpack::object& o) {
    return o.type == msgpack::type::STR ? std::string_view(o.via.str.ptr, o.via.str.size)
                                        : std::string_view(o.via.bin.ptr, o.via.bin.size);
}

// A request's context (docs/protocol.md, "Call context"): a map of str keys to str or bin
// values (an unsigned value for reserved "ordo-" keys), within the metadata limits.
void check_context(const message& m, const limits& l) {
    if (m.kind != message_kind::request || m.meta.type == msgpack::type::NIL) return;
    const auto what = [&] { return "the context of a call to \"" + std::string(m.method) + "\" "; };
    const auto& map = m.meta.via.map;
    if (map.size > l.max_metadata_entries)
        bad(what() + "has " + std::to_string(map.size) + " entries, over max_metadata_entries (" +
            std::to_string(l.max_metadata_entries) + ")");
    std::size_t bytes = 0;
    for (std::uint32_t i = 0; i < map.size; ++i) {
        const auto& k = map.ptr[i].key;
        const auto& v = map.ptr[i].val;
        if (k.type != msgpack::type::STR || k.via.str.size == 0)
            bad(what() + "has a key that is not a non-empty str (got " + ordo::type_name(k) + ")");
        const std::string_view key(k.via.str.ptr, k.via.str.size);
        bytes += key.size();
        if (v.type == msgpack::type::STR || v.type == msgpack::type::BIN) {
            bytes += str_of(v).size();
        } else if (!(key.starts_with("ordo-") && v.type == msgpack::type::POSITIVE_INTEGER)) {
            bad(what() + "has a value for \"" + std::string(key.substr(0, 64)) +
                "\" that is not a str or bin (got " + ordo::type_name(v) + ")");
        }
        if (bytes > l.max_metadata_bytes)
            bad(what() + "holds over max_metadata_bytes (" + std::to_string(l.max_metadata_bytes) +
                ") of keys and values");
    }
}

void throw_bad_result(const std::type_info& expected, const msgpack::object& got) {
    // The value as msgpack-c prints it (JSON-like), cut short: enough to recognise it.
    std::ostringstream text;
    text << got;
    std::string shown = text.str();
    constexpr std::size_t max_shown = 60;
    if (shown.size() > max_shown) shown = shown.substr(0, max_shown) + "...";
    throw_error(errc::bad_result, "result does not convert: expected " + type_name(expected) +
                                      ", got " + ordo::type_name(got) + " " + shown);
}

}  // namespace detail

}  // namespace ordo
