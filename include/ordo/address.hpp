// Addresses are URLs: scheme://where?key=value&key=value.
#pragma once

#include "ordo/config.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ordo {

/// A parsed address. Schemes with a host and a port (IPv6 hosts in brackets): "tcp", "tls"
/// (TLS over tcp) and "zmq+tcp" (ZeroMQ DEALER/ROUTER over tcp). Schemes with a path: "unix"
/// (unix:///run/app.sock, or unix://relative/path.sock), "zmq+ipc" (the same, through ZeroMQ)
/// and "inproc" (inproc://name: a name within the process, no socket).
struct address {
    std::string scheme;
    std::string host;        ///< tcp: host name or IP literal, without brackets
    std::uint16_t port = 0;  ///< tcp: 0 asks a listener to pick a free port
    std::string path;        ///< unix, zmq+ipc: file system path; inproc: the name
    std::vector<std::pair<std::string, std::string>> params;  ///< query parameters, in order

    /// The value of query parameter `key`, if present (the last one wins).
    std::optional<std::string> param(std::string_view key) const;

    /// True for the schemes addressed by a path or name rather than a host and port.
    bool has_path() const noexcept;

    /// The canonical URL, without parameters ("tcp://127.0.0.1:7000", "tcp://[::1]:7000").
    std::string to_string() const;
};

/// Parses `url`. Throws std::system_error with errc::bad_address naming the URL and what is
/// wrong with it (unknown scheme, missing port, port out of range, empty path...).
address parse_address(std::string_view url);

/// The parameters of a URL's query (`query`: what follows '?'), in order: "a=1&b&&c=" gives
/// {"a", "1"}, {"b", ""}, {"c", ""}. Empty items are skipped; an item "=v" gives an empty
/// name, which the caller refuses. Nothing is percent-decoded.
std::vector<std::pair<std::string, std::string>> query_params(std::string_view query);

}  // namespace ordo
