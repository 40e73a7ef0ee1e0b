// What tests read off a URL and a channel.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "ordo/ordo.hpp"

namespace ordo::test {

/// The port of a URL that ends in ":port".
inline std::uint16_t port_of(const std::string& url) {
    return static_cast<std::uint16_t>(std::stoi(url.substr(url.rfind(':') + 1)));
}

/// The ordered connection behind a channel opened by URL (null for a pool or a router).
inline std::shared_ptr<peer> peer_of(const channel& c) {
    return std::dynamic_pointer_cast<peer>(c.impl());
}

}  // namespace ordo::test
