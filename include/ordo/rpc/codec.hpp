// The msgpack-rpc wire format (docs/protocol.md): encoding the three message kinds, decoding and
// validating one message, and a streaming decoder over byte chunks split anywhere.
#pragma once

#include "ordo/config.hpp"

#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>

#include <msgpack.hpp>

#include "ordo/rpc/detail/msgpack_core.hpp"

#include "ordo/rpc/detail/message_heads.hpp"
#include "ordo/error.hpp"
#include "ordo/limits.hpp"

namespace ordo {

enum class message_kind : std::uint8_t { request = 0, response = 1, notification = 2 };

/// One decoded msgpack-rpc message. The msgpack objects and the method view live in `handle`'s
/// zone: they stay valid as long as this value does (it is move-only).
struct message {
    message_kind kind = message_kind::request;
    std::uint32_t msgid = 0;  ///< request, response
    std::string_view method;  ///< request, notification (sent as str, or as bin by some peers)
    msgpack::object params;   ///< request, notification: always an array
    msgpack::object error;    ///< response: nil on success, else the error object as sent
    msgpack::object result;   ///< response
    /// request: the call's context as ordo peers send it, `[0, msgid, method, params, meta]`
    /// (docs/protocol.md, "Call context"), checked to be a map of str keys to str, bin or (for
    /// reserved keys) unsigned values; nil for a plain request.
    msgpack::object meta;
    msgpack::object_handle handle;
    /// Decoded into a zone owned by someone else (see decode_message with a zone): valid until
    /// that zone is decoded into again. own() makes a copy that owns its memory.
    bool borrowed = false;
};

/// Appends `[0, msgid, method, [args...]]` to `out`.
template <class... Args>
void encode_request(buffer& out, std::uint32_t msgid, std::string_view method,
                    const Args&... args) {
    detail::write_request_head(out, msgid, method);
    msgpack::packer<buffer> p(out);
    p.pack_array(sizeof...(Args));
    (p.pack(args), ...);
}

/// Appends `[2, method, [args...]]` to `out`.
template <class... Args>
void encode_notification(buffer& out, std::string_view method, const Args&... args) {
    detail::write_notification_head(out, method);
    msgpack::packer<buffer> p(out);
    p.pack_array(sizeof...(Args));
    (p.pack(args), ...);
}

/// Appends the success response `[1, msgid, nil, result]` to `out`.
template <class T>
void encode_response(buffer& out, std::uint32_t msgid, const T& result) {
    detail::write_response_head(out, msgid);
    msgpack::pack(out, result);
}

/// Appends `[1, msgid, {"code": code, "message": text}, nil]`: ordo's own error object.
void encode_error_response(buffer& out, std::uint32_t msgid, errc code, std::string_view text);

/// Decodes and validates one whole msgpack object (as cut by the framer) as a msgpack-rpc
/// message. Throws std::system_error(errc::protocol_error) saying what is wrong: not an array,
/// wrong arity, unknown kind, msgid not a uint32, method not a string, params not an array, or a
/// broken limit.
message decode_message(std::string_view bytes, const limits& l = {});
/// The same, decoding into `z` (cleared first, so that its first chunk is reused from message to
/// message instead of allocating a zone per message). The result is borrowed: its strings point
/// into `bytes` and its arrays into `z`, so it is valid while both are. Connections decode every
/// message this way and own() only those they keep past the message's dispatch.
message decode_message(std::string_view bytes, const limits& l, msgpack::zone& z);
/// Makes a borrowed message own its memory (a deep copy); no-op for one that owns it already.
void own(message& m);

namespace detail {
/// What decode_prefix decodes into, reused message after message: a zone for the general
/// reader, and room for the params of the common call (a fixarray of flat values) and for its
/// context (a fixmap of str keys to flat values), which then need no zone at all.
struct read_area {
    explicit read_area(std::size_t zone_chunk = MSGPACK_ZONE_CHUNK_SIZE) : zone(zone_chunk) {}
    msgpack::zone zone;
    msgpack::object items[15];
    msgpack::object_kv pairs[15];
};

/// The message at the start of `bytes`, decoded into `a` as decode_message with a zone does,
/// when it is all there, in the shape ordo and the msgpack-rpc libraries write (fixarray
/// envelope, msgid up to uint32, fixstr or str 8 method), and within every limit the framer
/// checks: returns its size. Else 0, with nothing said: the framer cuts it and decode_message
/// decodes it (or says what is wrong). Connections use it to decode the common message in one
/// pass, without cutting it first. `m` is a message as default-constructed; its handle is left
/// empty (own() copes). It borrows from `bytes` and `a` until `a` is decoded into again.
std::size_t decode_prefix(std::string_view bytes, const limits& l, read_area& a,
                          message& m) noexcept;
}  // namespace detail

/// Streaming decoder: feed() byte chunks split anywhere, take whole messages in order with
/// next(). Memory stays within the limits whatever the length headers announce.
class decoder {
  public:
    explicit decoder(const limits& l = {});
    ~decoder();
    decoder(decoder&&) noexcept;
    decoder& operator=(decoder&&) noexcept;

    void feed(std::string_view chunk);
    /// The next whole message, or nothing when more bytes are needed. Throws on bad input
    /// (errc::protocol_error); after that the decoder is unusable.
    std::optional<message> next();
    /// End of stream: throws errc::protocol_error if a message was cut short.
    void finish() const;

  private:
    struct impl;
    std::unique_ptr<impl> impl_;
};

}  // namespace ordo
