#include "ordo/connect.hpp"

#include <charconv>

namespace ordo {
namespace {

std::size_t number(const address& a, std::string_view url, const std::string& key,
                   const std::string& text) {
    std::size_t v = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (text.empty() || ec != std::errc{} || end != text.data() + text.size())
        throw_error(errc::bad_address, "ordo: invalid address \"" + std::string(url) +
                                           "\": parameter " + key + " must be a number, not \"" +
                                           text + "\"");
    (void)a;
    return v;
}

}  // namespace

net::awaitable<channel> async_connect(std::string_view url) {
    return async_connect(url, peer_options{}, nullptr);
}

net::awaitable<channel> async_connect(std::string_view url, peer_options o, const handlers* h) {
    const address a = parse_address(url);
    bool pooled = false;
    pool_options po;
    std::string kept;  // transport parameters (TLS files...), passed on
    for (const auto& [key, value] : a.params) {
        auto ms = [&] { return std::chrono::milliseconds(number(a, url, key, value)); };
        if (key == "mode") {
            if (value != "ordered" && value != "pooled")
                throw_error(errc::bad_address, "ordo: invalid address \"" + std::string(url) +
                                                   "\": mode must be ordered or pooled");
            pooled = value == "pooled";
        } else if (key == "timeout_ms") {
            o.default_timeout = ms();
        } else if (key == "interval_ms") {
            o.comm.interval = ms();
        } else if (key == "liveness_timeout_ms") {
            o.liveness_timeout = ms();
        } else if (key == "heartbeat_ms") {
            o.heartbeat_interval = ms();
        } else if (key == "max_connections") {
            po.max_connections = std::max<std::size_t>(1, number(a, url, key, value));
        } else if (key == "max_idle") {
            po.max_idle = number(a, url, key, value);
        } else if (key == "idle_timeout_ms") {
            po.idle_timeout = ms();
        } else if (key == "connect_timeout_ms") {
            po.connect_timeout = ms();
        } else if (key == "max_queued") {
            po.max_queued_calls = number(a, url, key, value);
        } else if (is_transport_parameter(key)) {
            kept += (kept.empty() ? "?" : "&") + key + "=" + value;
        } else {
            throw_error(errc::bad_address, "ordo: invalid address \"" + std::string(url) +
                                               "\": unknown parameter \"" + key + "\"");
        }
    }
    // The transport sees the address with its own parameters only.
    const std::string where = a.to_string() + kept;
    auto ex = co_await net::this_coro::executor;
    if (pooled) {
        po.peer = o;
        auto p = make_pool(ex, where, po);
        co_await p->async_warm_up();
        co_return channel(std::move(p));
    }
    auto p = make_peer(co_await async_connect_transport(where, o.transport), std::move(o), h);
    p->start();
    co_return channel(std::move(p));
}

}  // namespace ordo
