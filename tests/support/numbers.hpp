// Numbered items for stream and call tests.
#pragma once

#include <cstddef>
#include <vector>

namespace ordo::test {

/// 0, 1, ..., n-1: what a counting stream yields.
inline std::vector<int> iota(int n) {
    std::vector<int> v(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = i;
    return v;
}

}  // namespace ordo::test
