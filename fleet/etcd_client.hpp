// How a request reaches etcd's JSON gateway: base64 for its keys and values, the endpoint, TLS
// files and the token etcd's authentication gave, and one POST that fails with etcd's own
// reason (fleet/etcd.cpp's source and registration both use it).
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "fleet/curl_multi.hpp"
#include "ordo/error.hpp"
#include "ordo/fleet/sources.hpp"

namespace ordo::detail {

std::string base64_encode(std::string_view in);
/// Null if `in` is not base64.
std::optional<std::string> base64_decode(std::string_view in);
/// `e` without trailing slashes.
std::string trimmed_endpoint(std::string e);
/// etcd's own words for a failed request: the gateway answers {"error", "message", "code"}.
std::string etcd_reason(const std::string& body);

// How requests reach one etcd: its endpoint, TLS files, and the token its authentication
// gave (user and password), kept until etcd says it is no longer valid.
struct etcd_client {
    detail::curl_multi& http;
    std::string endpoint;
    etcd_access access;
    std::chrono::milliseconds timeout;
    std::string token;  // from /v3/auth/authenticate

    // A request to `path` with the TLS files and the token.
    detail::http_request request(const char* path) const {
        detail::http_request r;
        r.url = endpoint + path;
        r.label = "etcd";
        r.timeout = timeout;
        r.ca_file = access.ca_file;
        r.cert_file = access.cert_file;
        r.key_file = access.key_file;
        r.authorization = access.token.empty() ? token : access.token;
        return r;
    }

    // With a user and no token yet: asks etcd for one.
    net::awaitable<void> log_in();
};

/// One POST to etcd's gateway: the parsed answer of a 200, else std::system_error naming the
/// URL and etcd's reason. `not_found` is set (and nothing thrown) for etcd's NOT_FOUND (gRPC
/// code 5) when asked for. With a user, a refused token is renewed once.
net::awaitable<nlohmann::json> etcd_call(etcd_client& c, const char* path,
                                         const nlohmann::json& body, bool* not_found = nullptr);

}  // namespace ordo::detail
