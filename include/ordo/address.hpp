// Addresses are URLs: scheme://where?key=value&key=value.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ordo {

/// A parsed address. Schemes known so far: "tcp" (host and port; IPv6 hosts in brackets) and
/// "unix" (path: unix:///run/app.sock, or unix://relative/path.sock).
struct address {
    std::string scheme;
    std::string host;        ///< tcp: host name or IP literal, without brackets
    std::uint16_t port = 0;  ///< tcp: 0 asks a listener to pick a free port
    std::string path;        ///< unix: file system path
    std::vector<std::pair<std::string, std::string>> params;  ///< query parameters, in order

    /// The value of query parameter `key`, if present (the last one wins).
    std::optional<std::string> param(std::string_view key) const;

    /// The canonical URL, without parameters ("tcp://127.0.0.1:7000", "tcp://[::1]:7000").
    std::string to_string() const;
};

/// Parses `url`. Throws std::system_error with errc::bad_address naming the URL and what is
/// wrong with it (unknown scheme, missing port, port out of range, empty path...).
address parse_address(std::string_view url);

}  // namespace ordo
