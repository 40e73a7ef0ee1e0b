// Whose connections count together, for caps per address (ordo::server's strangers, the HTTP
// gateway, the TLS listener's handshakes).
#pragma once

#include <string>
#include <string_view>

namespace ordo::detail {

/// For a peer's address as a URL ("tcp://1.2.3.4:5", "tls://[2001:db8::1]:5"): its IPv4
/// address, or its IPv6 /64 ("2001:db8::/64": one host can hold a whole /64, and would
/// otherwise step around a per-address cap; a v4-mapped address counts as IPv4). "" for what
/// has no IP address (unix://, inproc://, zmq).
std::string address_group(std::string_view url);

}  // namespace ordo::detail
