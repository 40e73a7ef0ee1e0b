// What a fleet source (a replica file's line, an etcd key) may name: the rule both share.
#pragma once

#include <string>
#include <string_view>

namespace ordo::detail {

/// The replica URL for `entry` (a source's line or key, SCHEME://HOST:PORT[?params]) under a
/// route whose transport parameters are `suffix` ("" or "?ca=...&server_name=..."), or, with
/// `why` set, nothing: a source must not weaken the route (docs/security.md). The entry must be
/// tcp:// or tls:// (no unix://, inproc:// or zmq: a fleet names hosts on a network), and tls://
/// when the route has TLS parameters; it may not carry a TLS parameter of its own (ca, cert,
/// key, verify, server_name: those are the route's, always); an entry with parameters of its
/// own takes them instead of the route's others.
std::string fleet_entry_url(std::string_view entry, std::string_view suffix, std::string& why);

}  // namespace ordo::detail
