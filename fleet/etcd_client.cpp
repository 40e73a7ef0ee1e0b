// fleet/etcd_client.hpp: base64, etcd's reasons, and its POSTs with renewal of a refused token.
#include "fleet/etcd_client.hpp"

#include <cstdint>
#include <system_error>

namespace ordo::detail {

using json = nlohmann::json;

namespace {

[[noreturn]] void fail(errc code, const std::string& why) {
    throw std::system_error(make_error_code(code), why);
}

// etcd's answer for a token it no longer knows (it restarted, or the token expired): gRPC
// UNAUTHENTICATED (16), or "invalid auth token".
bool token_refused(long status, const json& j) {
    if (status == 401) return true;
    return j.is_object() && (j.value("code", 0) == 16 ||
                             (j.contains("message") && j["message"].is_string() &&
                              j["message"].get<std::string>().find("invalid auth token") !=
                                  std::string::npos));
}

constexpr std::string_view b64_chars =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

}  // namespace

std::string base64_encode(std::string_view in) {
    std::string out;
    out.reserve((in.size() + 2) / 3 * 4);
    std::size_t i = 0;
    for (; i + 2 < in.size(); i += 3) {
        const auto v = (std::uint32_t(std::uint8_t(in[i])) << 16) |
                       (std::uint32_t(std::uint8_t(in[i + 1])) << 8) | std::uint8_t(in[i + 2]);
        for (int shift : {18, 12, 6, 0}) out += b64_chars[(v >> shift) & 63];
    }
    if (const auto rest = in.size() - i; rest > 0) {
        auto v = std::uint32_t(std::uint8_t(in[i])) << 16;
        if (rest == 2) v |= std::uint32_t(std::uint8_t(in[i + 1])) << 8;
        out += b64_chars[(v >> 18) & 63];
        out += b64_chars[(v >> 12) & 63];
        out += rest == 2 ? b64_chars[(v >> 6) & 63] : '=';
        out += '=';
    }
    return out;
}

// Standard base64 with padding, as the gateway writes it; nothing for anything else.
std::optional<std::string> base64_decode(std::string_view in) {
    if (in.size() % 4 != 0) return std::nullopt;
    std::string out;
    out.reserve(in.size() / 4 * 3);
    for (std::size_t i = 0; i < in.size(); i += 4) {
        std::uint32_t v = 0;
        int pad = 0;
        for (std::size_t k = 0; k < 4; ++k) {
            const char c = in[i + k];
            std::uint32_t d = 0;
            if (c == '=' && i + 4 == in.size() && k >= 2) {
                ++pad;
            } else {
                const auto pos = b64_chars.find(c);
                if (pos == std::string_view::npos || pad > 0) return std::nullopt;
                d = static_cast<std::uint32_t>(pos);
            }
            v = (v << 6) | d;
        }
        out += char((v >> 16) & 0xff);
        if (pad < 2) out += char((v >> 8) & 0xff);
        if (pad < 1) out += char(v & 0xff);
    }
    return out;
}

std::string trimmed_endpoint(std::string e) {
    while (!e.empty() && e.back() == '/') e.pop_back();
    return e;
}

// etcd's own words for a failed request: the gateway answers {"error", "message", "code"}.
std::string etcd_reason(const std::string& body) {
    const json j = json::parse(body, nullptr, false);
    if (j.is_object() && j.contains("message") && j["message"].is_string())
        return j["message"].get<std::string>();
    return body.substr(0, 200);
}

net::awaitable<void> etcd_client::log_in() {
    if (access.user.empty() || !token.empty()) co_return;
    detail::http_request r = request("/v3/auth/authenticate");
    r.authorization.clear();
    r.post = nlohmann::json{{"name", access.user}, {"password", access.password}}.dump();
    const detail::http_response a = co_await http.async_request(std::move(r));
    const nlohmann::json j = nlohmann::json::parse(a.body, nullptr, false);
    if (a.status != 200 || !j.is_object() || !j.contains("token") || !j["token"].is_string())
        throw_error(errc::remote_error, "etcd " + endpoint + "/v3/auth/authenticate as '" +
                                     access.user + "' answered HTTP " +
                                     std::to_string(a.status) + ": " + etcd_reason(a.body));
    token = j["token"].get<std::string>();
}

// One POST to etcd's gateway: the parsed answer of a 200, else std::system_error naming the
// URL and etcd's reason. `not_found` is set (and nothing thrown) for etcd's NOT_FOUND (gRPC
// code 5) when asked for. With a user, a refused token is renewed once.
net::awaitable<json> etcd_call(etcd_client& c, const char* path, const json& body,
                               bool* not_found) {
    co_await c.log_in();
    detail::http_request r = c.request(path);
    r.post = body.dump();
    detail::http_response a = co_await c.http.async_request(r);
    json j = json::parse(a.body, nullptr, false);
    if (a.status != 200 && !c.access.user.empty() && token_refused(a.status, j)) {
        c.token.clear();
        co_await c.log_in();
        r.authorization = c.token;
        a = co_await c.http.async_request(std::move(r));
        j = json::parse(a.body, nullptr, false);
    }
    const std::string& endpoint = c.endpoint;
    if (a.status != 200) {
        if (not_found && j.is_object() && j.value("code", 0) == 5) {
            *not_found = true;
            co_return j;
        }
        fail(errc::remote_error, "etcd " + endpoint + path + " answered HTTP " +
                                     std::to_string(a.status) + ": " + etcd_reason(a.body));
    }
    if (!j.is_object())
        fail(errc::protocol_error,
             "etcd " + endpoint + path +
                 " answered something not a JSON object: " + a.body.substr(0, 200));
    co_return j;
}
}  // namespace ordo::detail
