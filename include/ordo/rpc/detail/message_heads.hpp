// The bytes of a msgpack-rpc message before its params or result: the one encoder of message
// heads, used by codec.hpp's encode_* functions and by the connections' send paths.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

#include "ordo/detail/copy_small.hpp"

namespace ordo::detail {

// Out is anything msgpack::packer can write to: it has write(const char*, std::size_t).

template <class Out>
void put_be32(Out& out, std::uint32_t v) {
    const char be[4] = {char(v >> 24), char((v >> 16) & 0xff), char((v >> 8) & 0xff),
                        char(v & 0xff)};
    out.write(be, 4);
}

/// A msgpack str: its header, then its bytes.
template <class Out>
void put_str(Out& out, std::string_view s) {
    const auto n = static_cast<std::uint32_t>(s.size());
    if (n < 32) {
        const char h = char(0xa0 | n);
        out.write(&h, 1);
    } else if (n < 256) {
        const char h[2] = {'\xd9', char(n)};
        out.write(h, 2);
    } else if (n < 65536) {
        const char h[3] = {'\xda', char(n >> 8), char(n & 0xff)};
        out.write(h, 3);
    } else {
        out.write("\xdb", 1);
        put_be32(out, n);
    }
    out.write(s.data(), s.size());
}

/// A msgid, in its smallest msgpack form.
template <class Out>
void put_msgid(Out& out, std::uint32_t id) {
    if (id < 128) {
        const char c = char(id);
        out.write(&c, 1);
    } else if (id < 256) {
        const char h[2] = {'\xcc', char(id)};
        out.write(h, 2);
    } else if (id < 65536) {
        const char h[3] = {'\xcd', char(id >> 8), char(id & 0xff)};
        out.write(h, 3);
    } else {
        out.write("\xce", 1);
        put_be32(out, id);
    }
}

/// `[0, msgid, method, ` — the params array follows. The msgid is always 5 bytes (a uint32):
/// a head's length then depends on the method only.
template <class Out>
void write_request_head(Out& out, std::uint32_t msgid, std::string_view method) {
    out.write("\x94\x00\xce", 3);
    put_be32(out, msgid);
    put_str(out, method);
}

/// `[2, method, ` — the params array follows.
template <class Out>
void write_notification_head(Out& out, std::string_view method) {
    out.write("\x93\x02", 2);
    put_str(out, method);
}

/// `[1, msgid, ` — the error object and the result follow.
template <class Out>
void write_response_start(Out& out, std::uint32_t msgid) {
    out.write("\x94\x01", 2);
    put_msgid(out, msgid);
}

/// `[1, msgid, nil, ` — the result follows.
template <class Out>
void write_response_head(Out& out, std::uint32_t msgid) {
    write_response_start(out, msgid);
    out.write("\xc0", 1);
}

/// A head built on the stack: one is made per call and per notification, where a std::string
/// cost an allocation. Methods too long for the inline bytes spill to a string.
class small_head {
  public:
    void write(const char* p, std::size_t n) {
        if (!long_ && n_ + n <= sizeof inline_) {
            copy_small(inline_ + n_, p, n);
            n_ += n;
            return;
        }
        if (!long_) long_.emplace(inline_, n_);
        long_->append(p, n);
    }
    operator std::string_view() const {
        return long_ ? std::string_view(*long_) : std::string_view(inline_, n_);
    }

  private:
    friend small_head request_head(std::uint32_t msgid, std::string_view method);
    friend small_head notification_head(std::string_view method);
    char inline_[48];
    std::size_t n_ = 0;
    std::optional<std::string> long_;
};

/// write_request_head's bytes for a method shorter than 32 bytes (a fixstr), written in place
/// at `p` (room for 8 + method.size()) in one copy instead of four appends; `first` is the
/// array's header (0x94; 0x95 for a request with its context). Where they end.
[[gnu::always_inline]] inline char* put_short_request_head(char* p, char first, std::uint32_t msgid,
                                                           std::string_view method) noexcept {
    p[0] = first;
    p[1] = '\x00';
    p[2] = '\xce';
    p[3] = char(msgid >> 24);
    p[4] = char((msgid >> 16) & 0xff);
    p[5] = char((msgid >> 8) & 0xff);
    p[6] = char(msgid & 0xff);
    p[7] = char(0xa0 | method.size());
    copy_small(p + 8, method.data(), method.size());
    return p + 8 + method.size();
}

inline small_head request_head(std::uint32_t msgid, std::string_view method) {
    small_head h;
    // The common method name (a fixstr that fits inline), written in place.
    if (method.size() < 32 && 8 + method.size() <= sizeof h.inline_) {
        h.n_ = static_cast<std::size_t>(put_short_request_head(h.inline_, '\x94', msgid, method) -
                                        h.inline_);
        return h;
    }
    write_request_head(h, msgid, method);
    return h;
}

inline small_head notification_head(std::string_view method) {
    small_head h;
    // As in request_head: a fixstr method that fits, written in place.
    if (method.size() < 32 && 3 + method.size() <= sizeof h.inline_) {
        char* p = h.inline_;
        p[0] = '\x93';
        p[1] = '\x02';
        p[2] = char(0xa0 | method.size());
        copy_small(p + 3, method.data(), method.size());
        h.n_ = 3 + method.size();
        return h;
    }
    write_notification_head(h, method);
    return h;
}

}  // namespace ordo::detail
