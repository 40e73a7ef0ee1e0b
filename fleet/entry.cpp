#include "fleet/entry.hpp"

#include <utility>
#include <vector>

#include "ordo/address.hpp"

namespace ordo::detail {
namespace {

using param = std::pair<std::string, std::string>;

bool is_tls_parameter(std::string_view k) {
    return k == "ca" || k == "cert" || k == "key" || k == "verify" || k == "server_name";
}

}  // namespace

std::string fleet_entry_url(std::string_view entry, std::string_view suffix, std::string& why) {
    why.clear();
    address a, route;
    try {
        a = parse_address(entry);
        route = parse_address("tcp://127.0.0.1:1" + std::string(suffix));
    } catch (const std::exception& e) {
        why = e.what();
        return {};
    }
    bool route_tls = false;
    for (const auto& [k, v] : route.params) route_tls = route_tls || is_tls_parameter(k);
    if (a.scheme != "tcp" && a.scheme != "tls") {
        why = "\"" + std::string(entry) + "\": a fleet entry must be tcp:// or tls://, not " +
              a.scheme + "://";
        return {};
    }
    if (route_tls && a.scheme != "tls") {
        why = "\"" + std::string(entry) + "\": the route is TLS (" + std::string(suffix) +
              "): its entries must be tls://";
        return {};
    }
    for (const auto& [k, v] : a.params)
        if (is_tls_parameter(k)) {
            why = "\"" + std::string(entry) + "\": a fleet entry cannot set " + k +
                  "= (the route's TLS parameters always apply)";
            return {};
        }
    // An entry with parameters of its own takes those instead of the route's, but for the
    // route's TLS parameters, which always apply.
    std::vector<param> merged;
    for (const auto& p : route.params)
        if (a.params.empty() || is_tls_parameter(p.first)) merged.push_back(p);
    merged.insert(merged.end(), a.params.begin(), a.params.end());
    std::string url = a.to_string();
    for (std::size_t i = 0; i < merged.size(); ++i)
        url += (i == 0 ? "?" : "&") + merged[i].first + "=" + merged[i].second;
    return url;
}

}  // namespace ordo::detail
