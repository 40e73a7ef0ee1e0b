// read_small_msgid: a msgid as msgpack-rpc writers write it, read by hand (the reader's fast
// path, rpc/wire/read.cpp, and the lanes' look for a waiting request, rpc/connection/lanes.cpp).
#pragma once

#include <cstdint>

namespace ordo::detail {

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

}  // namespace ordo::detail
