// Two callers' tokens for servers that authenticate (server_options::authenticate), and the
// peer options that present one.
#pragma once

#include <string>

#include "ordo/ordo.hpp"

namespace ordo::test {

inline const std::string alice_token = "alice-token-0123456789";
inline const std::string bob_token = "bob-token-0123456789ab";

/// Options of a connection that presents `token` (ordo.auth).
inline peer_options as(const std::string& token) {
    peer_options o;
    o.credentials.token = token;
    return o;
}

}  // namespace ordo::test
