#include "ordo/codec.hpp"

#include <string>

#include "comm/framing.hpp"

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

[[noreturn]] void bad(const std::string& what) {
    throw_error(errc::protocol_error, "ordo: protocol error: " + what);
}

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
    msgpack::packer<buffer> p(out);
    p.pack_array(4).pack_uint8(1).pack_uint32(msgid);
    p.pack_map(2);
    p.pack_str(4).pack_str_body("code", 4).pack_int(static_cast<int>(code));
    p.pack_str(7).pack_str_body("message", 7);
    p.pack_str(static_cast<std::uint32_t>(text.size())).pack_str_body(text.data(), text.size());
    p.pack_nil();
}

message decode_message(std::string_view bytes, const limits& l) {
    message m;
    try {
        // The framer already enforced the limits on these exact bytes; passing them again keeps
        // this function safe when called on bytes that did not come through a framer.
        msgpack::unpack_limit lim(l.max_container_length, l.max_container_length,
                                  l.max_string_bytes, l.max_string_bytes, l.max_string_bytes,
                                  l.max_depth);
        if (bytes.size() > l.max_message_bytes)
            bad("message of " + std::to_string(bytes.size()) + " bytes over max_message_bytes");
        std::size_t off = 0;
        // A zone sized to the message: msgpack's default first chunk is 8 KiB, and one per
        // small message in flight makes the heap grow and shrink (page faults) under load.
        auto zone = std::make_unique<msgpack::zone>(
            std::min<std::size_t>(MSGPACK_ZONE_CHUNK_SIZE, 256 + 2 * bytes.size()));
        msgpack::object obj =
            msgpack::unpack(*zone, bytes.data(), bytes.size(), off, nullptr, nullptr, lim);
        m.handle = msgpack::object_handle(obj, std::move(zone));
        if (off != bytes.size()) bad("bytes left after one msgpack object");
    } catch (const msgpack::unpack_error& e) {
        bad(std::string("malformed msgpack: ") + e.what());
    } catch (const std::bad_alloc&) {
        bad("message too large to decode");
    }
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
            check_arity("request", a.size, 4);
            m.msgid = read_msgid(a.ptr[1]);
            m.method = read_method(a.ptr[2]);
            m.params = a.ptr[3];
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
    return m;
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

}  // namespace ordo
