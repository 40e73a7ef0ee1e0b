// copy_small: memcpy for the few bytes of a message head or a small value, without a call.
#pragma once

#include <cstddef>
#include <cstring>

namespace ordo::detail {

/// Copies `n` bytes (the ranges must not overlap). Up to 32 bytes take two copies of a fixed
/// width that may overlap each other (the bytes in between are written twice); more, memcpy.
/// A call to memcpy for a handful of bytes cost more than the copy itself.
[[gnu::always_inline]] inline void copy_small(char* to, const char* from, std::size_t n) noexcept {
    if (n > 32) {
        std::memcpy(to, from, n);
    } else if (n >= 16) {
        std::memcpy(to, from, 16);
        std::memcpy(to + n - 16, from + n - 16, 16);
    } else if (n >= 8) {
        std::memcpy(to, from, 8);
        std::memcpy(to + n - 8, from + n - 8, 8);
    } else if (n >= 4) {
        std::memcpy(to, from, 4);
        std::memcpy(to + n - 4, from + n - 4, 4);
    } else if (n > 0) {
        // 1 to 3 bytes: the first, the middle and the last (some of them the same). Not a
        // loop, which the compiler turns back into a call to memcpy.
        to[0] = from[0];
        to[n / 2] = from[n / 2];
        to[n - 1] = from[n - 1];
    }
}

}  // namespace ordo::detail
