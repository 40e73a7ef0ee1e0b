#include "ordo/address.hpp"

#include <algorithm>

#include <asio/ip/address.hpp>

#include "lib/address_group.hpp"
#include "lib/url_number.hpp"
#include "ordo/error.hpp"
#include "ordo/net.hpp"

namespace ordo {
namespace {

[[noreturn]] void bad(std::string_view url, std::string_view why) {
    throw_error(errc::bad_address,
                "ordo: invalid address \"" + std::string(url) + "\": " + std::string(why));
}

}  // namespace

std::vector<std::pair<std::string, std::string>> query_params(std::string_view query) {
    std::vector<std::pair<std::string, std::string>> params;
    while (!query.empty()) {
        const auto amp = query.find('&');
        const auto item = query.substr(0, amp);
        query = amp == std::string_view::npos ? std::string_view{} : query.substr(amp + 1);
        if (item.empty()) continue;
        const auto eq = item.find('=');
        if (eq == std::string_view::npos)
            params.emplace_back(std::string(item), std::string());
        else
            params.emplace_back(std::string(item.substr(0, eq)), std::string(item.substr(eq + 1)));
    }
    return params;
}

std::optional<std::string> address::param(std::string_view key) const {
    std::optional<std::string> found;
    for (const auto& [k, v] : params)
        if (k == key) found = v;
    return found;
}

bool address::has_path() const noexcept {
    return scheme == "unix" || scheme == "inproc" || scheme == "zmq+ipc";
}

std::string address::to_string() const {
    if (has_path()) return scheme + "://" + path;
    std::string h = host.find(':') != std::string::npos ? "[" + host + "]" : host;
    return scheme + "://" + h + ":" + std::to_string(port);
}

address parse_address(std::string_view url) {
    auto sep = url.find("://");
    if (sep == std::string_view::npos || sep == 0) bad(url, "expected scheme://...");
    address a;
    a.scheme = std::string(url.substr(0, sep));
    auto rest = url.substr(sep + 3);
    auto q = rest.find('?');
    if (q != std::string_view::npos) {
        a.params = query_params(rest.substr(q + 1));
        for (const auto& [key, value] : a.params)
            if (key.empty()) bad(url, "query parameter without a name");
        rest = rest.substr(0, q);
    }
    if (a.has_path()) {
        if (rest.empty()) bad(url, a.scheme == "inproc" ? "empty name" : "empty socket path");
        a.path = std::string(rest);
        return a;
    }
    if (a.scheme != "tcp" && a.scheme != "tls" && a.scheme != "zmq+tcp")
        bad(url, "unknown scheme \"" + a.scheme +
                     "\" (known: tcp, unix, inproc, tls, zmq+tcp, zmq+ipc)");
    std::string_view port;
    if (!rest.empty() && rest.front() == '[') {
        auto close = rest.find(']');
        if (close == std::string_view::npos) bad(url, "unterminated [ in IPv6 host");
        a.host = std::string(rest.substr(1, close - 1));
        rest = rest.substr(close + 1);
        if (rest.empty() || rest.front() != ':') bad(url, "missing :port");
        port = rest.substr(1);
    } else {
        auto colon = rest.rfind(':');
        if (colon == std::string_view::npos) bad(url, "missing :port");
        a.host = std::string(rest.substr(0, colon));
        port = rest.substr(colon + 1);
    }
    if (a.host.empty()) bad(url, "empty host");
    const auto value = detail::parse_unsigned(port);
    if (!value || *value > 65535) bad(url, "port must be a number from 0 to 65535");
    a.port = static_cast<std::uint16_t>(*value);
    return a;
}

namespace detail {

std::string address_group(std::string_view url) {
    const auto scheme_end = url.find("://");
    if (scheme_end == std::string_view::npos) return {};
    const std::string_view scheme = url.substr(0, scheme_end);
    if (scheme != "tcp" && scheme != "tls") return {};
    std::string_view host = url.substr(scheme_end + 3);
    if (!host.empty() && host.front() == '[') {
        const auto close = host.find(']');
        if (close == std::string_view::npos) return {};
        host = host.substr(1, close - 1);
    } else {
        host = host.substr(0, host.rfind(':'));
    }
    std::error_code ec;
    auto a = net::ip::make_address(std::string(host), ec);
    if (ec) return std::string(host);
    if (a.is_v6() && a.to_v6().is_v4_mapped())
        a = net::ip::make_address_v4(net::ip::v4_mapped, a.to_v6());
    if (!a.is_v6()) return a.to_string();
    auto bytes = a.to_v6().to_bytes();
    std::fill(bytes.begin() + 8, bytes.end(), 0);
    return net::ip::address_v6(bytes).to_string() + "/64";
}

}  // namespace detail
}  // namespace ordo
